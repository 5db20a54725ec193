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
  :class:`VisionSpec`, :class:`SSMSpec` (the Mamba / Gated DeltaNet layers of
  hybrid models); ``layer_kinds`` holds one :data:`LayerKind` per layer.
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

LayerKind = Literal["full", "sliding", "chunked", "mla", "mamba", "linear", "mlp"]
"""Sequence mixer of one decoder layer: ``full`` (causal attention, whole
context), ``sliding`` (local window of ``sliding_window`` tokens), ``chunked``
(Llama 4's chunked local attention: a token attends within its chunk of
``attention_chunk_size`` tokens), ``mla`` (DeepSeek multi-head latent attention:
one compressed latent per token), ``mamba`` (Mamba-1/Mamba-2 state-space layer)
and ``linear`` (Gated DeltaNet linear attention); these two keep a fixed state per
sequence instead of per-token KV (vLLM ``MambaSpec``). ``mlp``: a block with no
sequence mixer at all (Nemotron-H's MLP layers), which caches nothing."""

ATTENTION_KINDS: frozenset[str] = frozenset({"full", "sliding", "chunked", "mla"})
"""Layer kinds that cache K/V (or a latent) per token."""
STATE_KINDS: frozenset[str] = frozenset({"mamba", "linear"})
"""Layer kinds that hold one recurrent state per sequence."""

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
    "falcon": "falcon",
    "RefinedWeb": "falcon",
    "RefinedWebModel": "falcon",
    "llama4": "llama4",
    "llama4_text": "llama4",
    "deepseek_v32": "deepseek",
    "glm4_moe": "glm_moe",
    "minimax_m2": "minimax_m2",
    "jamba": "jamba",
    "nemotron_h": "nemotron_h",
    "granitemoehybrid": "granite_hybrid",
    "qwen3_next": "qwen3_next",
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
_NOT_MODELLED: dict[str, str] = {
    "falcon_h1": "Falcon-H1 runs attention and Mamba-2 side by side in every layer (both a "
    "KV cache and a state per layer); that parallel layout is not modelled yet",
    "bamba": "Bamba's Mamba-2 hybrid layout is not modelled yet (supported hybrids: jamba, "
    "nemotron_h, granitemoehybrid, qwen3_next)",
    "zamba2": "Zamba2's shared-attention hybrid layout is not modelled yet",
    "mamba": "pure state-space models are not modelled",
    "mamba2": "pure state-space models are not modelled",
}
"""Known families refused with the reason, rather than as an unknown model_type."""

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
    router_fp32: bool = False
    """The router (and its correction bias) is held in float32 whatever the model
    dtype (vLLM glm4_moe.py ``nn.Linear(..., dtype=torch.float32)``, minimax_m2.py
    ``params_dtype=torch.float32``)."""


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
class IndexerSpec:
    """DeepSeek-V3.2's lightning indexer (sparse attention): a small per-layer
    scorer whose keys are cached next to the MLA latent.

    Weights, per layer (vLLM ``Indexer`` in vllm/model_executor/models/deepseek_v2.py):
    ``wq_b`` (q_lora_rank -> n_heads x head_dim), ``wk`` (hidden -> head_dim),
    ``k_norm`` (LayerNorm of head_dim, weight and bias), ``weights_proj``
    (hidden -> n_heads); all replicated on every tensor-parallel rank."""

    n_heads: int
    head_dim: int
    topk: int
    cache_bytes_per_token: int
    """Key cache per token and layer: ``head_dim`` FP8 values plus one float32
    scale per ``quant_block_size`` (128) values, uint8 (DeepseekV32IndexerCache:
    ``head_dim + head_dim // quant_block_size * 4`` = 132 bytes), whatever
    --kv-cache-dtype is, and not split by tensor parallelism."""


INDEXER_QUANT_BLOCK = 128
"""vLLM ``Indexer.quant_block_size`` (deepseek_v2.py): one fp32 scale per 128 FP8 values."""


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
class SSMSpec:
    """The recurrent (state-space or linear-attention) layers of a hybrid model.

    One spec per model: every ``mamba``/``linear`` layer has this shape. Field
    names follow vLLM's ``MambaStateShapeCalculator``
    (vllm/model_executor/layers/mamba/mamba_utils.py), which sizes the state.
    """

    kind: Literal["mamba1", "mamba2", "gated_deltanet"]
    conv_kernel: int
    intermediate_size: int = 0
    """Mamba inner width (``expand x hidden``; Mamba-2: heads x head_dim)."""
    state_size: int = 0
    """SSM state per channel (Mamba ``d_state``)."""
    num_heads: int = 0
    """Mamba-2 heads; Gated DeltaNet value heads."""
    head_dim: int = 0
    """Mamba-2 head dim; Gated DeltaNet value head dim."""
    n_groups: int = 0
    """Mamba-2 B/C groups."""
    dt_rank: int = 0
    """Mamba-1 rank of the time-step projection."""
    num_k_heads: int = 0
    """Gated DeltaNet key heads."""
    head_k_dim: int = 0
    """Gated DeltaNet key head dim."""
    conv_bias: bool = False
    proj_bias: bool = False
    """Bias on the in/out projections."""
    ssm_state_dtype: str | None = None
    """The temporal state dtype the config states (``mamba_ssm_cache_dtype``,
    e.g. float32 for Nemotron Nano 2); None: vLLM's ``auto`` (model dtype)."""

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution (its state width), whole model."""
        if self.kind == "gated_deltanet":
            return 2 * self.num_k_heads * self.head_k_dim + self.num_heads * self.head_dim
        if self.kind == "mamba2":
            return self.intermediate_size + 2 * self.n_groups * self.state_size
        return self.intermediate_size


@dataclass(frozen=True)
class ModelArchitecture:
    """The facts the calculators need, one spelling for every family.

    Sizes are for the whole model (not split by tensor parallelism);
    ``layer_kinds[i]`` is the attention of decoder layer ``i``.
    """

    model_type: str
    family: str
    """Layout handler: llama, gemma, mixtral, qwen_moe, deepseek, gpt_oss, falcon,
    llama4, glm_moe, minimax_m2, jamba, nemotron_h, granite_hybrid, qwen3_next."""
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
    qk_norm_full_width: bool = False
    """MiniMax-M2 normalises the whole q (heads x head_dim) and k (kv_heads x
    head_dim) projections with one RMSNorm each, instead of per head."""
    mlp_matrices: int = 3
    """Matrices of a dense MLP: 3 (gated SwiGLU), 2 (Falcon's GELU MLP, Nemotron-H relu2)."""
    norm_bias: bool = False
    """LayerNorm with a bias (Falcon): every norm holds two vectors, not one."""
    attention_chunk_size: int | None = None
    """Llama 4: tokens per chunk of the ``chunked`` layers."""
    indexer: IndexerSpec | None = None
    """DeepSeek-V3.2 sparse-attention indexer (None for every other model)."""
    ssm: SSMSpec | None = None
    """Shape of the ``mamba``/``linear`` layers of a hybrid model."""
    ffn_layers: tuple[int, ...] | None = None
    """Layers that have an MLP or MoE block; None: every layer (Nemotron-H
    gives each layer one block: a mixer or an MLP)."""
    attn_output_gate: bool = False
    """Qwen3-Next: q_proj also emits a per-head output gate (twice the width)."""
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

    @property
    def attention_layers(self) -> int:
        """Layers that attend over cached tokens (and so hold KV): every ATTENTION_KINDS layer."""
        return sum(1 for k in self.layer_kinds if k in ATTENTION_KINDS)

    @property
    def is_hybrid_ssm(self) -> bool:
        """Some layers keep a per-sequence recurrent state (Mamba, DeltaNet)."""
        return self.ssm is not None and any(k in STATE_KINDS for k in self.layer_kinds)


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


def parse_override(value: Any) -> Any:
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
    if family_type == "llama4_text":
        return None  # text-only fit asked for (see _read_llama4)
    if family_type == "llama4":
        raise InputError(
            "model",
            f"vision tower '{vtype or 'unknown'}' of 'llama4' is not modelled (its weights and "
            "vLLM's encoder budget are not counted); to fit the language model alone pass "
            "--hf-overrides model_type=llama4_text",
        )
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
    has_vision_config: bool = False
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
    parsed = {str(k): parse_override(v) for k, v in (overrides or {}).items()}
    cfg.update(parsed)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError("model", f"config lacks 'model_type'; {OVERRIDE_HINT}")
    if model_type in _REFUSED_VLMS:
        raise InputError("model", f"{_REFUSED_VLMS[model_type]}; {OVERRIDE_HINT}")
    family = _FAMILIES.get(model_type)
    if model_type in _NOT_MODELLED:
        raise InputError("model", f"architecture '{model_type}': {_NOT_MODELLED[model_type]}")
    if family is None:
        raise InputError(
            "model",
            f"architecture '{model_type}' is not supported; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}; {OVERRIDE_HINT}",
        )
    if family == "falcon":
        cfg = _falcon_fields(cfg, model_type)
    return _READERS[family](_parse_common(cfg, parsed, model_type, family))


FALCON_DEFAULT_MAX_POSITIONS = 2048
"""transformers' FalconConfig default, and vLLM's fallback for a config naming no
context length (falcon-40b's config.json names none)."""


def _falcon_fields(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Falcon's three spellings mapped onto the common field names.

    ``RefinedWeb`` (the first falcon-40b/180b configs), ``RefinedWebModel``
    (falcon-7b's) and ``falcon`` (transformers' FalconConfig) name layers
    ``n_layer``, heads ``n_head``, KV heads ``n_head_kv``, as transformers'
    ``attribute_map`` translates them. The KV head count follows vLLM's
    FalconAttention: the new decoder architecture (Falcon-40B/180B; every
    ``RefinedWeb`` checkpoint has its ``ln_attn``/``ln_mlp`` tensors) reads
    ``num_kv_heads``; otherwise ``multi_query`` means one KV head (Falcon-7B) and
    its absence one per query head.
    """
    out = dict(cfg)
    for old, new in (
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("n_head_kv", "num_kv_heads"),
        ("n_embed", "hidden_size"),
    ):
        if out.get(new) is None and out.get(old) is not None:
            out[new] = out[old]
    if out.get("new_decoder_architecture") is None:
        out["new_decoder_architecture"] = model_type == "RefinedWeb"
    r = _Reader(out, "")
    heads = r.pos("num_attention_heads")
    if out.get("num_key_value_heads") is None:
        if r.bool("new_decoder_architecture"):
            out["num_key_value_heads"] = r.pos("num_kv_heads", heads)
        elif r.bool("multi_query", model_type == "falcon"):
            out["num_key_value_heads"] = 1
        else:
            out["num_key_value_heads"] = heads
    if out.get("max_position_embeddings") is None:
        out["max_position_embeddings"] = FALCON_DEFAULT_MAX_POSITIONS
        out["_max_positions_defaulted"] = True
    return out


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
    # Falcon: vLLM ties lm_head to the embedding when the config says nothing
    # ("previous Falcon model doesn't have tie_word_embeddings config", falcon.py).
    tie = r.bool("tie_word_embeddings", family in ("gemma", "falcon"))
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
        has_vision_config=isinstance(cfg.get("vision_config"), dict),
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


def _qwen_moe_spec(r: _Reader, n: int) -> MoESpec:
    """Qwen's MoE block (Qwen2/3-MoE, Qwen3-Next): routed experts and an optional gated
    shared expert."""
    shared = r.int("shared_expert_intermediate_size", 0)
    return MoESpec(
        num_experts=r.pos("num_experts"),
        experts_per_token=r.pos("num_experts_per_tok"),
        moe_intermediate_size=r.pos("moe_intermediate_size"),
        moe_layers=_moe_layers_qwen(r, n),
        num_shared_experts=1 if shared else 0,
        shared_expert_intermediate_size=shared,
        shared_expert_gate=bool(shared),
    )


def _read_qwen_moe(p: _Parsed) -> ModelArchitecture:
    r, n = p.r, p.n
    moe = _qwen_moe_spec(r, n)
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
    _mtp_note(r, p.notes)
    common = {**p.common, "head_dim": mla.qk_nope_head_dim + mla.qk_rope_head_dim}
    return ModelArchitecture(
        **common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=("mla",) * n,
        moe=moe,
        mla=mla,
        indexer=_indexer_spec(r, p.text_type, mla),
        notes=tuple(p.notes),
    )


def _indexer_spec(r: _Reader, model_type: str, mla: MLASpec) -> IndexerSpec | None:
    """DeepSeek-V3.2's indexer (``index_n_heads``, ``index_head_dim``, ``index_topk``);
    vLLM builds it for ``deepseek_v32`` only, so the fields are required there."""
    if model_type != "deepseek_v32":
        return None
    if mla.q_lora_rank is None:
        raise InputError(
            "model", "deepseek_v32's indexer projects from the query latent: set q_lora_rank"
        )
    head_dim = r.pos("index_head_dim")
    if head_dim % INDEXER_QUANT_BLOCK:
        raise InputError(
            "model",
            f"config field 'index_head_dim' ({head_dim}) is not a multiple of vLLM's "
            f"indexer quantisation block ({INDEXER_QUANT_BLOCK}); that cache layout is not modelled",
        )
    return IndexerSpec(
        n_heads=r.pos("index_n_heads"),
        head_dim=head_dim,
        topk=r.pos("index_topk"),
        cache_bytes_per_token=head_dim + head_dim // INDEXER_QUANT_BLOCK * 4,
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


def _read_falcon(p: _Parsed) -> ModelArchitecture:
    """Falcon (vLLM falcon.py): fused QKV, a two-matrix GELU MLP of ``ffn_hidden_size``
    (4 x hidden by default), LayerNorms with biases: two per layer in the new decoder
    architecture (``ln_attn``, ``ln_mlp``; ``num_ln_in_parallel_attn``), one with
    parallel attention (Falcon-7B), two otherwise. ``bias`` puts biases on every linear."""
    r, text, n = p.r, p.text, p.n
    hidden = p.common["hidden_size"]
    if r.bool("new_decoder_architecture"):
        norms = r.pos("num_ln_in_parallel_attn", 2)
    else:
        norms = 1 if r.bool("parallel_attn", True) else 2
    if r.bool("alibi"):
        p.notes.append("ALiBi positions (no RoPE); the KV cache is the same")
    if text.get("_max_positions_defaulted"):
        p.notes.append(
            f"config names no context length; {FALCON_DEFAULT_MAX_POSITIONS} tokens "
            "(transformers' FalconConfig default, which vLLM reads)"
        )
    bias = r.bool("bias")
    common = {**p.common, "head_dim": hidden // p.common["num_attention_heads"]}
    return ModelArchitecture(
        **common,
        intermediate_size=r.pos("ffn_hidden_size", 4 * hidden),
        layer_kinds=("full",) * n,
        attention_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        mlp_matrices=2,
        norm_bias=True,
        norms_per_layer=norms,
        notes=tuple(p.notes),
    )


LLAMA4_NOPE_INTERVAL = 4
"""transformers' Llama4TextConfig: without ``no_rope_layers`` every 4th layer is a
no-RoPE (global) layer, ``no_rope_layer_interval = 4``."""


def _llama4_layer_kinds(r: _Reader, n: int) -> tuple[LayerKind, ...]:
    """vLLM llama4.py: a layer with ``no_rope_layers[i] == 0`` (NoPE) attends to the
    whole context; every other layer uses chunked local attention when the config
    sets ``attention_chunk_size``."""
    nope = r.cfg.get("no_rope_layers")
    if not nope:  # None or [] (Scout's config.json): transformers fills in the default
        nope = [int((i + 1) % LLAMA4_NOPE_INTERVAL != 0) for i in range(n)]
    if not isinstance(nope, list) or len(nope) != n or any(v not in (0, 1) for v in nope):
        raise InputError(
            "model",
            f"config field '{r.where}no_rope_layers' must list 0 or 1 for each of the {n} layers",
        )
    if not r.has("attention_chunk_size"):
        return ("full",) * n
    return tuple("full" if v == 0 else "chunked" for v in nope)


def _read_llama4(p: _Parsed) -> ModelArchitecture:
    """Llama 4 (vLLM llama4.py): chunked local attention on 3 of 4 layers, MoE on the
    layers where ``(i + 1) % interleave_moe_layer_step == 0`` (every layer for Scout,
    every other for Maverick) with one routed expert per token plus a shared expert of
    the expert size (``intermediate_size``); the other layers are dense MLPs of
    ``intermediate_size_mlp``. The q/k norm is a weightless L2 norm (no parameters)."""
    r, n = p.r, p.n
    step = r.int("interleave_moe_layer_step", 1)
    moe_layers = tuple(i for i in range(n) if step > 0 and (i + 1) % step == 0)
    expert = r.pos("intermediate_size")
    moe = MoESpec(
        num_experts=r.pos("num_local_experts"),
        experts_per_token=r.pos("num_experts_per_tok"),
        moe_intermediate_size=expert,
        moe_layers=moe_layers,
        num_shared_experts=1,
        shared_expert_intermediate_size=expert,
    )
    kinds = _llama4_layer_kinds(r, n)
    if p.has_vision_config:
        p.notes.append(
            "language model only: a vision tower in the checkpoint is not counted "
            "(model_type llama4_text)"
        )
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size_mlp", expert),
        layer_kinds=kinds,
        attention_chunk_size=r.pos("attention_chunk_size") if "chunked" in kinds else None,
        moe=moe,
        attention_bias=r.bool("attention_bias"),
        o_bias=r.bool("attention_bias"),
        notes=tuple(p.notes),
    )


def _mtp_note(r: _Reader, notes: list[str]) -> None:
    if r.int("num_nextn_predict_layers", 0):
        notes.append(
            "the checkpoint also holds multi-token-prediction layers, which vLLM loads "
            "only for speculative decoding; they are not counted"
        )


def _read_glm_moe(p: _Parsed) -> ModelArchitecture:
    """GLM-4.5 / 4.6 (vLLM glm4_moe.py): GQA attention with q/k/v biases
    (``attention_bias``), optional per-head q/k RMSNorm (``use_qk_norm``), RoPE on
    ``partial_rotary_factor`` of each head (no effect on memory); the first
    ``first_k_dense_replace`` layers dense, the rest MoE with ``n_routed_experts``,
    ``n_shared_experts`` shared experts of the expert size and a sigmoid router with
    an ``e_score_correction_bias``. MTP layers are not loaded for serving."""
    r, n = p.r, p.n
    size = r.pos("moe_intermediate_size")
    shared = r.int("n_shared_experts", 0)
    first_dense = r.int("first_k_dense_replace", 0)
    moe = MoESpec(
        num_experts=r.pos("n_routed_experts"),
        experts_per_token=r.pos("num_experts_per_tok"),
        moe_intermediate_size=size,
        moe_layers=tuple(range(first_dense, n)),
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared * size,
        router_correction_bias=True,
        router_fp32=True,
    )
    _mtp_note(r, p.notes)
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=("full",) * n,
        moe=moe,
        attention_bias=r.bool("attention_bias"),
        qk_norm=r.bool("use_qk_norm"),
        notes=tuple(p.notes),
    )


def _read_minimax_m2(p: _Parsed) -> ModelArchitecture:
    """MiniMax-M2 (vLLM minimax_m2.py): GQA attention (``attention_bias`` on q/k/v, off
    in the released config), one RMSNorm over the whole q and one over the whole k
    projection (MiniMaxText01RMSNormTP, built on every layer whatever ``use_qk_norm``
    says), RoPE on ``rotary_dim`` of each head (no effect on memory); every layer MoE
    (``num_local_experts``, ``intermediate_size`` each, no shared expert) with a
    router and, where ``use_routing_bias`` (vLLM's default: off), an
    ``e_score_correction_bias``. MTP modules are skipped when loading."""
    r, n = p.r, p.n
    moe = MoESpec(
        num_experts=r.pos("num_local_experts"),
        experts_per_token=r.pos("num_experts_per_tok"),
        moe_intermediate_size=r.pos("intermediate_size"),
        moe_layers=tuple(range(n)),
        router_correction_bias=r.bool("use_routing_bias"),
        router_fp32=True,
    )
    if r.int("num_mtp_modules", 0):
        p.notes.append(
            "the checkpoint also holds multi-token-prediction modules, which vLLM does "
            "not load for serving; they are not counted"
        )
    return ModelArchitecture(
        **p.common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=("full",) * n,
        moe=moe,
        attention_bias=r.bool("attention_bias"),
        qk_norm_full_width=True,
        notes=tuple(p.notes),
    )


# --------------------------------------------------------------------------- hybrid Mamba / linear attention


def _kinds_from_names(
    names: Any, n: int, r: _Reader, field_name: str, mapping: Mapping[str, LayerKind]
) -> tuple[LayerKind, ...]:
    """One layer kind per entry of a config's per-layer list (``layer_types``...)."""
    if not isinstance(names, list) or len(names) != n:
        raise InputError(
            "model", f"config field '{r.where}{field_name}' must list one entry per layer ({n})"
        )
    kinds: list[LayerKind] = []
    for name in names:
        kind = mapping.get(str(name))
        if kind is None:
            raise InputError(
                "model",
                f"layer type '{name}' in '{r.where}{field_name}' is not supported "
                f"(supported: {', '.join(sorted(mapping))})",
            )
        kinds.append(kind)
    return tuple(kinds)


def _hybrid_common(p: _Parsed, kinds: tuple[LayerKind, ...]) -> dict[str, Any]:
    """Hybrids cache K/V only in their attention layers; a model without any is refused
    (pure Mamba models are not modelled)."""
    if not any(k in ATTENTION_KINDS for k in kinds):
        raise InputError(
            "model",
            f"'{p.common['model_type']}' config has no attention layer; pure state-space "
            "models are not modelled (vLLM sizes them differently)",
        )
    return dict(p.common)


def _read_jamba(p: _Parsed) -> ModelArchitecture:
    """Jamba (AI21): Mamba-1 layers with attention every ``attn_layer_period`` layers,
    MoE every ``expert_layer_period`` layers (HF JambaConfig, vLLM jamba.py)."""
    r, n, h = p.r, p.n, p.common["hidden_size"]
    a_period, a_offset = r.pos("attn_layer_period", 8), r.int("attn_layer_offset", 4)
    e_period, e_offset = r.pos("expert_layer_period", 2), r.int("expert_layer_offset", 1)
    kinds: tuple[LayerKind, ...] = tuple(
        "full" if i % a_period == a_offset else "mamba" for i in range(n)
    )
    experts = r.int("num_experts", 16)
    moe = None
    if experts > 1:
        moe = MoESpec(
            num_experts=experts,
            experts_per_token=r.pos("num_experts_per_tok", 2),
            moe_intermediate_size=r.pos("intermediate_size"),
            moe_layers=tuple(i for i in range(n) if i % e_period == e_offset),
        )
    ssm = SSMSpec(
        kind="mamba1",
        conv_kernel=r.pos("mamba_d_conv", 4),
        intermediate_size=r.pos("mamba_expand", 2) * h,
        state_size=r.pos("mamba_d_state", 16),
        dt_rank=r.pos("mamba_dt_rank", math.ceil(h / 16)),
        conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False),
    )
    return ModelArchitecture(
        **_hybrid_common(p, kinds),
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=kinds,
        moe=moe,
        ssm=ssm,
        notes=tuple(p.notes),
    )


_NEMOTRON_PATTERN: dict[str, LayerKind] = {"M": "mamba", "*": "full", "-": "mlp"}
_NEMOTRON_BLOCKS: dict[str, LayerKind] = {"mamba": "mamba", "attention": "full", "mlp": "mlp"}


def _nemotron_kinds(r: _Reader, n: int) -> tuple[LayerKind, ...]:
    """Nemotron-H states its layers as ``hybrid_override_pattern`` (M mamba, * attention,
    - MLP, E MoE) or, in newer configs, as ``layers_block_type`` names."""
    blocks = r.cfg.get("layers_block_type")
    pattern = r.cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and (blocks is None or len(pattern) == n):
        names: list[str] = list(pattern)
        field_name, mapping = "hybrid_override_pattern", _NEMOTRON_PATTERN
    elif blocks is not None:
        names, field_name, mapping = blocks, "layers_block_type", _NEMOTRON_BLOCKS
    else:
        raise InputError(
            "model",
            f"config lacks '{r.where}hybrid_override_pattern' (or layers_block_type), "
            "which says which Nemotron-H layers are Mamba, attention or MLP",
        )
    if "E" in names or "moe" in names:
        raise InputError(
            "model",
            "Nemotron-H MoE layers ('E' / 'moe', Nemotron 3) are not modelled yet; "
            "supported layer types: Mamba, attention, MLP (Nemotron-H 8B/47B/56B, Nano 2)",
        )
    return _kinds_from_names(names, n, r, field_name, mapping)


def _read_nemotron_h(p: _Parsed) -> ModelArchitecture:
    """Nemotron-H: each layer is one block (Mamba-2, attention or a relu2 MLP) with one
    RMSNorm (vLLM nemotron_h.py)."""
    r, n = p.r, p.n
    kinds = _nemotron_kinds(r, n)
    heads, head_dim = r.pos("mamba_num_heads"), r.pos("mamba_head_dim")
    ssm = SSMSpec(
        kind="mamba2",
        conv_kernel=r.pos("conv_kernel", 4),
        intermediate_size=heads * head_dim,
        state_size=r.pos("ssm_state_size"),
        num_heads=heads,
        head_dim=head_dim,
        n_groups=r.pos("n_groups", 8),
        conv_bias=r.bool("use_conv_bias", True),
        proj_bias=r.bool("use_bias", False),
        ssm_state_dtype=_config_ssm_dtype(r, p.notes),
    )
    common = _hybrid_common(p, kinds)
    common["head_dim"] = r.pos("head_dim", common["head_dim"], "attention_head_dim")
    return ModelArchitecture(
        **common,
        intermediate_size=r.pos("intermediate_size"),
        layer_kinds=kinds,
        ssm=ssm,
        ffn_layers=tuple(i for i, k in enumerate(kinds) if k == "mlp"),
        mlp_matrices=2,
        mlp_bias=r.bool("mlp_bias"),
        attention_bias=r.bool("attention_bias"),
        o_bias=r.bool("attention_bias"),
        norms_per_layer=1,
        notes=tuple(p.notes),
    )


def _config_ssm_dtype(r: _Reader, notes: list[str]) -> str | None:
    """A config-stated SSM state dtype (Nemotron Nano 2: float32), said as an assumption."""
    value = r.cfg.get("mamba_ssm_cache_dtype")
    if value in (None, "auto"):
        return None
    if value not in ("float32", "bfloat16", "float16"):
        raise InputError(
            "model",
            f"config field 'mamba_ssm_cache_dtype' is {value!r}; expected float32/bfloat16/float16",
        )
    notes.append(
        f"SSM state kept in {value}, as config.json's mamba_ssm_cache_dtype says (vLLM "
        "--mamba-ssm-cache-dtype); override with --hf-overrides mamba_ssm_cache_dtype=auto "
        "if the server runs the default"
    )
    return str(value)


def _read_granite_hybrid(p: _Parsed) -> ModelArchitecture:
    """Granite 4.0 H (granitemoehybrid): Mamba-2 and attention layers listed in
    ``layer_types``; every layer has a MoE block plus a shared MLP, or only the shared
    MLP when there are no experts (vLLM granitemoehybrid.py)."""
    r, n, h = p.r, p.n, p.common["hidden_size"]
    kinds = _kinds_from_names(
        r.cfg.get("layer_types"), n, r, "layer_types", {"mamba": "mamba", "attention": "full"}
    )
    shared = r.int("shared_intermediate_size", 0)
    experts = r.int("num_local_experts", 0)
    moe = None
    if experts:
        moe = MoESpec(
            num_experts=experts,
            experts_per_token=r.pos("num_experts_per_tok"),
            moe_intermediate_size=r.pos("intermediate_size"),
            moe_layers=tuple(range(n)),
            num_shared_experts=1 if shared else 0,
            shared_expert_intermediate_size=shared,
        )
    ssm = SSMSpec(
        kind="mamba2",
        conv_kernel=r.pos("mamba_d_conv", 4),
        intermediate_size=r.pos("mamba_expand", 2) * h,
        state_size=r.pos("mamba_d_state"),
        num_heads=r.pos("mamba_n_heads"),
        head_dim=r.pos("mamba_d_head"),
        n_groups=r.pos("mamba_n_groups", 1),
        conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False),
        ssm_state_dtype=_config_ssm_dtype(r, p.notes),
    )
    if ssm.num_heads * ssm.head_dim != ssm.intermediate_size:
        raise InputError(
            "model",
            f"mamba_n_heads x mamba_d_head ({ssm.num_heads} x {ssm.head_dim}) must equal "
            f"mamba_expand x hidden_size ({ssm.intermediate_size})",
        )
    return ModelArchitecture(
        **_hybrid_common(p, kinds),
        intermediate_size=shared if not experts else r.pos("intermediate_size"),
        layer_kinds=kinds,
        moe=moe,
        ssm=ssm,
        attention_bias=r.bool("attention_bias"),
        o_bias=r.bool("attention_bias"),
        notes=tuple(p.notes),
    )


def _read_qwen3_next(p: _Parsed) -> ModelArchitecture:
    """Qwen3-Next: Gated DeltaNet linear attention with a gated full-attention layer every
    ``full_attention_interval`` layers, MoE with a gated shared expert (vLLM qwen3_next.py)."""
    r, text, n = p.r, p.text, p.n
    if text.get("layer_types") is not None:
        kinds = _kinds_from_names(
            text["layer_types"],
            n,
            r,
            "layer_types",
            {"linear_attention": "linear", "full_attention": "full"},
        )
    else:
        interval = r.pos("full_attention_interval", 4)
        kinds = tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(n))
    moe = _qwen_moe_spec(r, n)
    ssm = SSMSpec(
        kind="gated_deltanet",
        conv_kernel=r.pos("linear_conv_kernel_dim", 4),
        num_heads=r.pos("linear_num_value_heads"),
        head_dim=r.pos("linear_value_head_dim"),
        num_k_heads=r.pos("linear_num_key_heads"),
        head_k_dim=r.pos("linear_key_head_dim"),
    )
    if ssm.num_heads % ssm.num_k_heads:
        raise InputError(
            "model",
            f"linear_num_value_heads ({ssm.num_heads}) must be a multiple of "
            f"linear_num_key_heads ({ssm.num_k_heads})",
        )
    p.notes.append(
        "the checkpoint's multi-token-prediction layer (mtp.*) is loaded by vLLM only for "
        "speculative decoding; it is not counted"
    )
    return ModelArchitecture(
        **_hybrid_common(p, kinds),
        intermediate_size=r.pos("intermediate_size", moe.moe_intermediate_size),
        layer_kinds=kinds,
        moe=moe,
        ssm=ssm,
        attention_bias=r.bool("attention_bias"),
        qk_norm=True,
        attn_output_gate=r.bool("attn_output_gate", True),
        notes=tuple(p.notes),
    )


_READERS: dict[str, Callable[[_Parsed], ModelArchitecture]] = {
    "llama": _read_llama,
    "gemma": _read_gemma,
    "mixtral": _read_mixtral,
    "qwen_moe": _read_qwen_moe,
    "deepseek": _read_deepseek,
    "gpt_oss": _read_gpt_oss,
    "falcon": _read_falcon,
    "llama4": _read_llama4,
    "glm_moe": _read_glm_moe,
    "minimax_m2": _read_minimax_m2,
    "jamba": _read_jamba,
    "nemotron_h": _read_nemotron_h,
    "granite_hybrid": _read_granite_hybrid,
    "qwen3_next": _read_qwen3_next,
}
"""One reader per family in ``_FAMILIES``; a new family is a new reader and a row here."""
