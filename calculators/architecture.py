"""A model's architecture, normalised from its Hugging Face ``config.json``.

Every calculator (parameters, weight bytes, KV cache, performance) reads the
same few facts: layer count, attention layout per layer, MLP and MoE sizes,
MLA ranks, vision tower. Config files spell these facts differently per
family (``n_routed_experts`` vs ``num_local_experts`` vs ``num_experts``),
so this module translates each supported family once, and refuses families
it does not know instead of guessing: a generic formula applied to an
unknown layout is exactly how public calculators end up 10-100 % off.

Public API (stable, used by ``params``, ``kv_cache``, ``fit`` and the
performance predictor):

* :func:`from_config` ``(config, overrides=None) -> ModelArchitecture``;
  raises :class:`~inferwise.calculators.errors.InputError` (field ``model``)
  for unsupported architectures, missing or malformed fields.
* :class:`ModelArchitecture` and its parts :class:`MoESpec`, :class:`MLASpec`,
  :class:`VisionSpec`; ``layer_kinds`` holds one :data:`LayerKind` per layer.
* :data:`SUPPORTED_MODEL_TYPES`.

Vision-language wrappers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL and its MoE, LLaVA-NeXT,
InternVL ``internvl_chat``, Phi-3/3.5-vision, Gemma 3, Mistral 3) are read with
their language model's family; their towers are counted in ``vision.py``.
Llama-3.2-Vision (``mllama``) and the Transformers-native ``internvl`` layout fail
closed, naming why.

Stdlib only (imported by the MCP server at start-up).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import vision
from .errors import InputError
from .files import loads_json

LayerKind = Literal["full", "sliding", "mla"]
"""Attention of one decoder layer: ``full`` (causal, whole context),
``sliding`` (local window of ``sliding_window`` tokens), ``mla`` (DeepSeek
multi-head latent attention: one compressed latent per token)."""

# model_type -> family handler name. A family shares one parameter layout.
_FAMILIES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "phi3": "llama",
    "granite": "llama",
    "olmo2": "llama",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3_text": "gemma",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen_moe",
    "qwen3_moe": "qwen_moe",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "kimi_k2": "deepseek",
    "gpt_oss": "gpt_oss",
    "mistral3": "llama",
    "llava": "llama",
    # vision-language models: the language model's layout, plus a tower (vision.py)
    "qwen2_vl": "llama",
    "qwen2_5_vl": "llama",
    "qwen3_vl": "llama",
    "qwen3_vl_moe": "qwen_moe",
    "llava_next": "llama",
    "internvl_chat": "llama",
    "phi3_v": "llama",
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))

_REFUSED_VLMS: dict[str, str] = {
    "mllama": (
        "Llama-3.2-Vision ('mllama') is not supported: its cross-attention layers keep a KV "
        "cache per image (the vision encoder's tokens, not the text tokens), which this fit "
        "does not model"
    ),
    "internvl": (
        "the Transformers-native InternVL layout ('internvl', vision tower 'internvl_vision') "
        "is not modelled; the original OpenGVLab checkpoints ('internvl_chat') are"
    ),
}
"""Vision-language layouts refused with the reason, rather than counted wrongly."""

_VLM_TEXT_TYPES: dict[str, frozenset[str]] = {
    "internvl_chat": frozenset({"internlm2", "qwen2", "llama", "phi3"}),
    "llava_next": frozenset({"llama", "mistral", "qwen2"}),
}
"""Language models the wrappers are read with (others fail closed)."""

# Vision towers whose parameter layout is a standard pre-norm ViT
# (attention q/k/v/o with bias, two-matrix MLP, two norms per layer).
_VIT_TYPES = {"siglip_vision_model", "clip_vision_model", "pixtral"}

# Defaults of the transformers config classes, for fields real config.json
# files omit (e.g. google/gemma-3-12b-it states no vocab_size or head_dim).
# Copied from transformers' configuration_<model>.py signatures.
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"vocab_size": 256000, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma2": {
        "vocab_size": 256000,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
    },
    "gemma3_text": {
        "vocab_size": 262208,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    "siglip_vision_model": {
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
    },
}


def _with_defaults(cfg: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    out = dict(_CLASS_DEFAULTS.get(model_type, {}))
    out.update({k: v for k, v in cfg.items() if v is not None})
    return out


OVERRIDE_HINT = (
    "pass a config.json whose fields use a supported layout, or override fields with "
    "--hf-overrides KEY=VALUE (e.g. model_type=llama, num_key_value_heads=8, head_dim=128)"
)


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts layout. Sizes are per expert."""

    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    moe_layers: tuple[int, ...]
    """Indices of decoder layers whose MLP is the MoE block (others are dense
    MLPs of ``ModelArchitecture.intermediate_size``)."""
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    """Total width of the shared expert(s) (DeepSeek: n_shared x moe size)."""
    shared_expert_gate: bool = False
    """Qwen2-MoE scales the shared expert by a sigmoid gate (hidden -> 1)."""
    expert_bias: bool = False
    """gpt-oss experts carry biases."""
    router_bias: bool = False
    router_correction_bias: bool = False
    """DeepSeek-V3 ``e_score_correction_bias`` (one float per expert)."""


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention ranks."""

    q_lora_rank: int | None
    """``None``: queries are projected directly (DeepSeek-V2-Lite)."""
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class VisionSpec:
    """A ViT-style vision tower and the projector into the text model."""

    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    patch_size: int
    image_size: int
    num_channels: int = 3
    projector_params: int = 0
    """Parameters of the multimodal projector (family-specific, counted here
    because only the family handler knows its layout)."""
    gated_mlp: bool = False
    """Pixtral's vision MLP is gated (three matrices, no bias)."""
    position_embeddings: bool = True
    family: str = ""
    """Which processor sizes the images (``vision.max_image_shape``); empty where
    vLLM's multimodal profiling is not modelled (Pixtral)."""
    tower_params: int | None = None
    """Tower parameters counted by the family's own layout (``vision.py``); None:
    the generic SigLIP/CLIP/Pixtral formula in ``params``."""
    projector_split: str = "rep"
    """``tp`` where vLLM shards the projector (column/row-parallel linears)."""
    layout: Any = None
    """The family's ``vision.TowerLayout`` (shapes for the profiling run)."""
    image_facts: tuple[tuple[str, Any], ...] = ()
    """Processor facts from config.json the largest image depends on (hashable)."""


@dataclass(frozen=True)
class ModelArchitecture:
    """The facts the calculators need, one spelling for every family.

    Sizes are for the whole model (not split by tensor parallelism);
    ``layer_kinds[i]`` is the attention of decoder layer ``i``.
    """

    model_type: str
    family: str
    """Layout handler: llama, gemma, mixtral, qwen_moe, deepseek, gpt_oss."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    torch_dtype: str | None
    """Checkpoint dtype as the config states it (``bfloat16``...), or None."""
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    vision: VisionSpec | None = None
    quantization_config: dict[str, Any] | None = None
    attention_bias: bool = False
    """Bias on q/k/v (Qwen2, gpt-oss); o_proj bias only where ``o_bias``."""
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    """Per-head RMSNorm on q and k (Qwen3, Gemma 3)."""
    norms_per_layer: int = 2
    """RMSNorm vectors of ``hidden_size`` per decoder layer (Gemma 2/3: 4)."""
    attention_sinks: bool = False
    """gpt-oss learns one sink logit per head and layer."""
    architectures: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    """What was inferred rather than read (shown as assumptions)."""

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def uses_mla(self) -> bool:
        return self.mla is not None

    @property
    def q_size(self) -> int:
        """Width of the query projection output (all heads)."""
        return self.num_attention_heads * self.head_dim

    def layers_of_kind(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)


# --------------------------------------------------------------------------- reading fields


MAX_CONFIG_INT = 1 << 40
"""Above any count a config states (tokens, parameters per layer, ...)."""
CONFIG_INT_LIMITS = {
    "num_hidden_layers": 1024,
    "num_attention_heads": 16384,
    "num_key_value_heads": 16384,
    "hidden_size": 1 << 20,
    "head_dim": 1 << 14,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 30,
    "intermediate_size": 1 << 22,
    "moe_intermediate_size": 1 << 22,
    "num_experts": 1 << 16,
    "n_routed_experts": 1 << 16,
    "num_local_experts": 1 << 16,
}
"""Fields whose size scales the work of a fit (per-layer tables, per-expert sums): the
largest real values are far below these (Llama-3.1-405B: 126 layers; Llama 4 Scout: a
10M-token window), and a billion layers would only exhaust memory."""


class _Reader:
    """Typed access to a config dict that names the missing field on failure."""

    def __init__(self, cfg: Mapping[str, Any], where: str):
        self.cfg = cfg
        self.where = where

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int(self, key: str, default: int | None = None, *alternatives: str) -> int:
        for k in (key, *alternatives):
            value = self.cfg.get(k)
            if value is not None:
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or value != int(value)
                ):
                    raise InputError(
                        "model",
                        f"config field '{self.where}{k}' must be an integer, got {_clip(value)}",
                    )
                if int(value) < 0:
                    raise InputError(
                        "model", f"config field '{self.where}{k}' must not be negative"
                    )
                limit = CONFIG_INT_LIMITS.get(k, MAX_CONFIG_INT)
                if int(value) > limit:
                    raise InputError(
                        "model",
                        f"config field '{self.where}{k}' is {_clip(value)}; no real model "
                        f"has more than {limit:,}",
                    )
                return int(value)
        if default is not None:
            return default
        raise InputError(
            "model",
            f"config lacks the field '{self.where}{key}' needed for this architecture; "
            f"add it to config.json or pass --hf-overrides {key}=VALUE",
        )

    def pos(self, key: str, default: int | None = None, *alternatives: str) -> int:
        value = self.int(key, default, *alternatives)
        if value <= 0:
            raise InputError(
                "model", f"config field '{self.where}{key}' must be positive, got {value}"
            )
        return value

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InputError(
                "model", f"config field '{self.where}{key}' must be true or false, got {value!r}"
            )
        return value


def _parse_override(value: Any) -> Any:
    """CLI overrides arrive as strings; JSON gives them their type (strictly: `1e309`,
    NaN or a 5,000-digit integer stay the string they were, and are refused as such)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = loads_json(value, "hf_overrides")
    except InputError:
        return value
    return value if isinstance(parsed, float) and not math.isfinite(parsed) else parsed


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text_key(config: Mapping[str, Any]) -> str | None:
    """Where a multimodal config keeps its language model: ``text_config``, or
    ``llm_config`` (InternVL); None when the text fields are at the top level."""
    for key in ("text_config", "llm_config"):
        if isinstance(config.get(key), dict):
            return key
    return None


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model under ``text_config`` (or ``llm_config``)."""
    key = _text_key(config)
    text = config.get(key) if key else None
    if isinstance(text, dict):
        merged = dict(text)
        # Some checkpoints state these only at the top level.
        for key in ("tie_word_embeddings", "torch_dtype", "dtype", "vocab_size"):
            if key not in merged and key in config:
                merged[key] = config[key]
        return merged
    return dict(config)


# --------------------------------------------------------------------------- layer kinds


def _layer_kinds_from_types(layer_types: Any, n: int, r: _Reader) -> tuple[LayerKind, ...]:
    if not isinstance(layer_types, list) or len(layer_types) != n:
        raise InputError(
            "model", f"config field '{r.where}layer_types' must list one entry per layer ({n})"
        )
    kinds: list[LayerKind] = []
    for t in layer_types:
        if t == "full_attention":
            kinds.append("full")
        elif t == "sliding_attention":
            kinds.append("sliding")
        else:
            raise InputError(
                "model",
                f"layer type '{t}' in '{r.where}layer_types' is not supported "
                "(supported: full_attention, sliding_attention)",
            )
    return tuple(kinds)


def _gemma_layer_kinds(
    model_type: str, cfg: Mapping[str, Any], n: int, r: _Reader
) -> tuple[LayerKind, ...]:
    """Gemma 2 alternates local/global starting with local; Gemma 3 has five
    local layers per global one (``sliding_window_pattern``), as in the HF
    and vLLM model code; newer configs list ``layer_types`` explicitly."""
    if cfg.get("layer_types") is not None:
        return _layer_kinds_from_types(cfg["layer_types"], n, r)
    if model_type == "gemma":
        return ("full",) * n
    if model_type == "gemma2":
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
    pattern = r.int("sliding_window_pattern", 6)
    return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(n))


# --------------------------------------------------------------------------- vision


def _vision_spec(
    config: Mapping[str, Any], text_hidden: int, family_type: str
) -> VisionSpec | None:
    if family_type in _VLM_LAYOUTS:
        return _vlm_vision_spec(config, text_hidden, family_type)
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        return None
    vtype = str(vc.get("model_type", ""))
    if not vtype and family_type == "gemma3":
        vtype = "siglip_vision_model"
    vc = _with_defaults(vc, vtype)
    if vtype not in _VIT_TYPES:
        raise InputError(
            "model",
            f"vision tower '{vtype or 'unknown'}' of '{family_type}' is not supported "
            f"(supported: {', '.join(sorted(_VIT_TYPES))}); {OVERRIDE_HINT}",
        )
    r = _Reader(vc, "vision_config.")
    hidden = r.pos("hidden_size")
    patch = r.pos("patch_size")
    image = r.pos("image_size")
    channels = r.pos("num_channels", 3)
    if family_type == "gemma3":
        # Gemma3MultiModalProjector: RMSNorm(vision hidden) + matrix vision->text.
        projector = hidden + hidden * text_hidden
    elif family_type == "mistral3":
        # Mistral3: RMSNorm, patch merger (hidden*s^2 -> hidden), 2-layer MLP.
        merge = int(config.get("spatial_merge_size", 2))
        bias = bool(config.get("multimodal_projector_bias", False))
        projector = hidden + hidden * merge * merge * hidden
        projector += hidden * text_hidden + text_hidden * text_hidden
        if bias:
            projector += 2 * text_hidden
    else:
        # LLaVA-style two-layer MLP projector with biases.
        projector = hidden * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden
    profiled = family_type if family_type in ("gemma3", "llava") else ""
    return VisionSpec(
        model_type=vtype,
        num_layers=r.pos("num_hidden_layers"),
        hidden_size=hidden,
        intermediate_size=r.pos("intermediate_size"),
        num_attention_heads=r.pos("num_attention_heads"),
        patch_size=patch,
        image_size=image,
        num_channels=channels,
        projector_params=projector,
        gated_mlp=vtype == "pixtral",
        position_embeddings=vtype != "pixtral",
        family=profiled,
        image_facts=vision.image_facts(profiled, {**config, "vision_config": vc})
        if profiled
        else (),
    )


def _vlm_layout(config: Mapping[str, Any], text_hidden: int, model_type: str) -> Any:
    """The tower layout of a family read in ``vision.py``."""
    vc = config.get("vision_config")
    if model_type == "phi3_v":
        return vision.phi3_v_layout(config, text_hidden)
    if not isinstance(vc, dict):
        raise InputError("model", f"'{model_type}' config lacks 'vision_config'")
    if model_type == "qwen2_vl":
        return vision.qwen2_vl_layout(vc, text_hidden)
    if model_type == "qwen2_5_vl":
        return vision.qwen2_5_vl_layout(vc, text_hidden)
    if model_type in ("qwen3_vl", "qwen3_vl_moe"):
        return vision.qwen3_vl_layout(vc, text_hidden)
    if model_type == "internvl_chat":
        ratio = config.get("downsample_ratio", 0.5)
        if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise InputError("model", "config field 'downsample_ratio' must be in (0, 1]")
        return vision.intern_vit_layout(vc, text_hidden, float(ratio))
    # llava_next: CLIP or SigLIP tower, LLaVA projector plus the image_newline vector
    vtype = str(vc.get("model_type", "clip_vision_model"))
    if vtype != "clip_vision_model":
        raise InputError(
            "model",
            f"vision tower '{vtype}' of 'llava_next' is not supported (supported: clip_vision_model)",
        )
    tower, h, inter, depth = vision.clip_layout(_with_defaults(vc, vtype))
    bias = bool(config.get("multimodal_projector_bias", True))
    projector = h * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
    if config.get("use_image_newline_parameter", True):
        projector += text_hidden
    return vision.TowerLayout(tower, projector, h, inter, depth, False, 3 * 14 * 14, 1)


_VLM_LAYOUTS = frozenset(
    {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "llava_next", "internvl_chat", "phi3_v"}
)


def _vlm_notes(config: Mapping[str, Any], model_type: str) -> list[str]:
    """What the tower count includes that vLLM may not load."""
    layer = config.get("vision_feature_layer", -2 if model_type == "llava_next" else None)
    if model_type == "phi3_v":
        layer = (config.get("img_processor") or {}).get("layer_idx", -2)
    if isinstance(layer, int) and layer < -1:
        return [
            f"vision tower counted whole (the checkpoint's layers); vLLM builds it only up to "
            f"vision_feature_layer {layer}, so it loads {-layer - 1} tower layer(s) fewer than counted here"
        ]
    return []


def _vlm_vision_spec(config: Mapping[str, Any], text_hidden: int, model_type: str) -> VisionSpec:
    layout = _vlm_layout(config, text_hidden, model_type)
    facts = vision.image_facts(model_type, config)
    d = dict(facts)
    return VisionSpec(
        model_type=str((config.get("vision_config") or {}).get("model_type") or model_type),
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        intermediate_size=layout.intermediate_size,
        num_attention_heads=1,
        patch_size=int(d.get("patch_size", 14)),
        image_size=int(d.get("image_size", 0)),
        projector_params=layout.projector_params,
        gated_mlp=layout.gated_mlp,
        family=model_type,
        tower_params=layout.tower_params,
        # vLLM builds these projectors from column/row-parallel linears
        projector_split="tp",
        layout=layout,
        image_facts=facts,
    )


# --------------------------------------------------------------------------- families


def _moe_layers_qwen(r: _Reader, n: int) -> tuple[int, ...]:
    only_dense = r.cfg.get("mlp_only_layers") or []
    step = r.pos("decoder_sparse_step", 1)
    return tuple(i for i in range(n) if i not in only_dense and (i + 1) % step == 0)


def _moe_layers_deepseek(r: _Reader, n: int) -> tuple[int, ...]:
    first_dense = r.int("first_k_dense_replace", 0)
    freq = r.pos("moe_layer_freq", 1)
    return tuple(i for i in range(n) if i >= first_dense and i % freq == 0)


@dataclass
class _Parsed:
    """What every family's reader starts from: the text config and the fields all share."""

    r: _Reader
    text: dict[str, Any]
    text_type: str
    n: int
    common: dict[str, Any]
    notes: list[str]
    vision: Any
    raw: Mapping[str, Any] = field(default_factory=dict)
    """The whole config (wrapper fields such as vision_feature_layer)."""


def from_config(
    config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> ModelArchitecture:
    """Normalise a Hugging Face ``config.json`` dict.

    ``overrides`` (vLLM's ``--hf-overrides``) replace top-level fields first
    and are also applied to ``text_config`` when there is one, so a user can
    supply a missing fact or declare an unknown ``model_type`` to share a
    supported layout. String values are parsed as JSON when they parse.

    Fails closed: an unknown ``model_type`` or a missing needed field is an
    ``InputError`` on field ``model`` naming the field and the fix.
    """
    if not isinstance(config, Mapping):
        raise InputError("model", "config must be a JSON object (a Hugging Face config.json)")
    cfg = dict(config)
    parsed = {str(k): _parse_override(v) for k, v in (overrides or {}).items()}
    cfg.update(parsed)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError("model", f"config lacks 'model_type'; {OVERRIDE_HINT}")
    if model_type in _REFUSED_VLMS:
        raise InputError("model", f"{_REFUSED_VLMS[model_type]}; {OVERRIDE_HINT}")
    family = _FAMILIES.get(model_type)
    if family is None:
        raise InputError(
            "model",
            f"architecture '{model_type}' is not supported; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}; {OVERRIDE_HINT}",
        )
    return _READERS[family](_parse_common(cfg, parsed, model_type, family))


def _parse_common(
    cfg: dict[str, Any], parsed: dict[str, Any], model_type: str, family: str
) -> _Parsed:
    """The language model's config (``text_config`` for multimodal ones) and the fields
    every family has: layers, widths, heads, vocabulary, context, dtype, quantization."""
    text = _text_config(cfg)
    text_key = _text_key(cfg)
    if text_key:
        text.update({k: v for k, v in parsed.items() if k != "model_type"})
        if "model_type" not in text and model_type == "gemma3":
            text["model_type"] = "gemma3_text"
    _check_vlm_text(model_type, text)
    text_type = str(text.get("model_type", model_type))
    if model_type in _VLM_LAYOUTS and text_type in _VLM_TEXT_DEFAULTS:
        text = {**_VLM_TEXT_DEFAULTS[text_type], **{k: v for k, v in text.items() if v is not None}}
    text = _with_defaults(text, text_type)
    where = f"{text_key}." if text_key else ""
    r = _Reader(text, where)
    n = r.pos("num_hidden_layers")
    hidden = r.pos("hidden_size")
    heads = r.pos("num_attention_heads")
    kv_heads = r.pos("num_key_value_heads", heads)
    head_dim = r.pos("head_dim", hidden // heads if hidden % heads == 0 else None)
    vocab = r.pos("vocab_size")
    max_pos = r.pos("max_position_embeddings", None, "seq_length", "n_positions")
    dtype = (
        text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype")
    )
    if model_type in _VLM_LAYOUTS:
        # the wrapper's dtype is the checkpoint's (re-saved text_configs may say float32)
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or dtype
    tie = r.bool("tie_word_embeddings", family == "gemma")
    quant = cfg.get("quantization_config") or text.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise InputError("model", "config field 'quantization_config' must be an object")
    notes: list[str] = []
    if dtype is None:
        notes.append("config states no torch_dtype; weights taken as bfloat16 (what vLLM loads)")
    common: dict[str, Any] = dict(
        model_type=model_type,
        family=family,
        num_layers=n,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        max_position_embeddings=max_pos,
        torch_dtype=str(dtype) if dtype else None,
        quantization_config=dict(quant) if quant else None,
        architectures=tuple(str(a) for a in cfg.get("architectures") or ()),
    )
    if heads % kv_heads != 0:
        raise InputError(
            "model",
            f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})",
        )
    return _Parsed(
        r=r,
        text=text,
        text_type=str(text.get("model_type", model_type)),
        n=n,
        common=common,
        notes=notes,
        vision=_vision_spec(cfg, hidden, model_type),
        raw=cfg,
    )


_VLM_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
    },
}
"""MistralConfig defaults (transformers configuration_mistral.py) for the sparse
``text_config`` of LLaVA-NeXT checkpoints (llava-hf/llava-v1.6-mistral-7b-hf states
only what differs). Applied to vision-language wrappers only; ``sliding_window``
is left out on purpose (vLLM reads the checkpoint's)."""


def _check_vlm_text(model_type: str, text: Mapping[str, Any]) -> None:
    """A wrapper's language model must be one this module reads with the wrapper's family."""
    allowed = _VLM_TEXT_TYPES.get(model_type)
    text_type = str(text.get("model_type", ""))
    if allowed is not None and text_type not in allowed:
        raise InputError(
            "model",
            f"'{model_type}' with a '{text_type or 'unknown'}' language model is not supported "
            f"(supported: {', '.join(sorted(allowed))}); {OVERRIDE_HINT}",
        )


_QWEN2_TEXT = frozenset({"qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text"})
"""Qwen2-style language models: q/k/v biases, no o bias."""
_QK_NORM_TEXT = frozenset({"qwen3", "qwen3_vl", "qwen3_vl_text"})
_QK_NORM_MOE_TEXT = frozenset({"qwen3_moe", "qwen3_vl_moe", "qwen3_vl_moe_text"})


# --------------------------------------------------------------------------- one reader per family


def _read_llama(p: _Parsed) -> ModelArchitecture:
    """Llama, Mistral, Qwen2/3, Phi-3 and their kin: dense decoders, optional windows."""
    r, text, n = p.r, p.text, p.n
    kinds: tuple[LayerKind, ...]
    if text.get("layer_types") is not None:
        kinds = _layer_kinds_from_types(text["layer_types"], n, r)
    else:
        kinds = ("full",) * n
        if r.bool("use_sliding_window") and text.get("sliding_window"):
            # Qwen2: layers from max_window_layers on use the window.
            start = r.int("max_window_layers", 0)
            kinds = tuple("sliding" if i >= start else "full" for i in range(n))
        elif p.text_type in ("mistral", "phi3", "phi3_v") and text.get("sliding_window"):
            p.notes.append(
                f"config sets sliding_window={text['sliding_window']} without layer_types; "
                "modelled as full attention on every layer (vLLM V1 only honours per-layer windows)"
            )
    qwen2 = p.text_type in _QWEN2_TEXT
    bias = r.bool("attention_bias", qwen2) or r.bool("bias")
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=kinds,
        sliding_window=r.int("sliding_window", 0) or None if "sliding" in kinds else None,
        attention_bias=bias,
        o_bias=bias and not qwen2,
        mlp_bias=r.bool("mlp_bias"),
        qk_norm=p.text_type in _QK_NORM_TEXT,
        vision=p.vision,
        notes=tuple(p.notes) + tuple(_vlm_notes(p.raw, p.common["model_type"])),
    )


def _read_gemma(p: _Parsed) -> ModelArchitecture:
    r = p.r
    kinds = _gemma_layer_kinds(p.text_type, p.text, p.n, r)
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=kinds,
        sliding_window=r.pos("sliding_window") if "sliding" in kinds else None,
        attention_bias=r.bool("attention_bias"),
        o_bias=r.bool("attention_bias"),
        qk_norm=p.text_type in ("gemma3", "gemma3_text"),
        norms_per_layer=2 if p.text_type == "gemma" else 4,
        vision=p.vision,
        notes=tuple(p.notes),
    )


def _read_mixtral(p: _Parsed) -> ModelArchitecture:
    r, n = p.r, p.n
    moe = MoESpec(
        num_experts=r.pos("num_local_experts"),
        experts_per_token=r.pos("num_experts_per_tok"),
        moe_intermediate_size=r.pos("intermediate_size"),
        moe_layers=tuple(range(n)),
    )
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=("full",) * n,
        moe=moe,
        notes=tuple(p.notes),
    )


def _read_qwen_moe(p: _Parsed) -> ModelArchitecture:
    r, n = p.r, p.n
    shared = r.int("shared_expert_intermediate_size", 0)
    moe = MoESpec(
        num_experts=r.pos("num_experts"),
        experts_per_token=r.pos("num_experts_per_tok"),
        moe_intermediate_size=r.pos("moe_intermediate_size"),
        moe_layers=_moe_layers_qwen(r, n),
        num_shared_experts=1 if shared else 0,
        shared_expert_intermediate_size=shared,
        shared_expert_gate=bool(shared),
    )
    qwen2 = p.text_type == "qwen2_moe"
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=("full",) * n,
        moe=moe,
        attention_bias=r.bool("attention_bias", qwen2) or qwen2,
        qk_norm=p.text_type in _QK_NORM_MOE_TEXT,
        vision=p.vision,
        notes=tuple(p.notes),
    )


def _read_deepseek(p: _Parsed) -> ModelArchitecture:
    """DeepSeek V2/V3 (and Kimi's layout): MLA attention, routed plus shared experts."""
    r, text, n = p.r, p.text, p.n
    n_shared = r.int("n_shared_experts", 0)
    moe_size = r.pos("moe_intermediate_size")
    routed = r.int("n_routed_experts", 0)
    moe = None
    if routed:
        moe = MoESpec(
            num_experts=routed,
            experts_per_token=r.pos("num_experts_per_tok"),
            moe_intermediate_size=moe_size,
            moe_layers=_moe_layers_deepseek(r, n),
            num_shared_experts=n_shared,
            shared_expert_intermediate_size=n_shared * moe_size,
            router_correction_bias=text.get("topk_method") == "noaux_tc",
        )
    q_lora = text.get("q_lora_rank")
    mla = MLASpec(
        q_lora_rank=int(q_lora) if q_lora else None,
        kv_lora_rank=r.pos("kv_lora_rank"),
        qk_rope_head_dim=r.pos("qk_rope_head_dim"),
        qk_nope_head_dim=r.pos("qk_nope_head_dim"),
        v_head_dim=r.pos("v_head_dim"),
    )
    if r.int("num_nextn_predict_layers", 0):
        p.notes.append(
            "the checkpoint also holds multi-token-prediction layers, which vLLM loads "
            "only for speculative decoding; they are not counted"
        )
    common = {**p.common, "head_dim": mla.qk_nope_head_dim + mla.qk_rope_head_dim}
    return ModelArchitecture(
        **common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=("mla",) * n,
        moe=moe,
        mla=mla,
        notes=tuple(p.notes),
    )


def _read_gpt_oss(p: _Parsed) -> ModelArchitecture:
    """gpt-oss: alternating sliding/full attention with sinks, biased experts."""
    r, text, n = p.r, p.text, p.n
    if text.get("layer_types") is not None:
        kinds = _layer_kinds_from_types(text["layer_types"], n, r)
    else:
        kinds = tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
    moe = MoESpec(
        num_experts=r.pos("num_local_experts", None, "num_experts"),
        experts_per_token=r.pos("num_experts_per_tok", None, "experts_per_token"),
        moe_intermediate_size=r.pos("intermediate_size"),
        moe_layers=tuple(range(n)),
        expert_bias=True,
        router_bias=True,
    )
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=kinds,
        sliding_window=r.pos("sliding_window") if "sliding" in kinds else None,
        moe=moe,
        attention_bias=True,
        o_bias=True,
        attention_sinks=True,
        notes=tuple(p.notes),
    )


_READERS: dict[str, Callable[[_Parsed], ModelArchitecture]] = {
    "llama": _read_llama,
    "gemma": _read_gemma,
    "mixtral": _read_mixtral,
    "qwen_moe": _read_qwen_moe,
    "deepseek": _read_deepseek,
    "gpt_oss": _read_gpt_oss,
}
"""One reader per family in ``_FAMILIES``; a new family is a new reader and a row here."""
