"""Vision towers of vision-language models, and what vLLM profiles for them.

Two facts per tower matter for memory:

* its parameters (and the projector's), counted from ``vision_config`` the way
  the Hugging Face modeling code lays the modules out, because a published
  checkpoint total is what these counts are tested against;
* the largest image it can be asked to encode (tokens after the projector and
  patches through the ViT), because vLLM's start-up profiling runs the encoder
  on a dummy batch of such images (``profile_run`` in
  vllm/v1/worker/gpu_model_runner.py) and the peak of that run is subtracted
  from the KV-cache budget like the text model's.

The image-size facts come from each family's processor (the preprocessor's
``max_pixels`` for Qwen2-VL/2.5-VL, ``size.longest_edge`` for Qwen3-VL, the
``image_grid_pinpoints`` for LLaVA-NeXT, ``max_dynamic_patch`` tiles for
InternVL, ``num_crops`` for Phi-3.5-vision, ``mm_tokens_per_image`` for
Gemma 3) with their published defaults, overridable as vLLM does with
``--mm-processor-kwargs``.

Public API: :func:`family_vision_spec` (config -> VisionSpec for the families
read here), :func:`max_image_shape` (tokens and patches of the largest image),
:func:`encoder_peak_bytes`, :func:`mm_profile_items`. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InputError

QWEN2_VL_MAX_PIXELS = 12_845_056
"""Qwen2-VL / Qwen2.5-VL preprocessor_config.json ``max_pixels`` (= 16384 x 28 x 28):
at most 16,384 tokens per image, the budget vLLM logs for these models
("Encoder cache will be initialized with a budget of 16384 tokens, and profiled
with 1 image items of the maximum feature size", vllm#27706)."""
QWEN3_VL_MAX_PIXELS = 16_777_216
"""Qwen3-VL preprocessor ``size.longest_edge`` (pixels; = 16384 x 32 x 32): 16,384
tokens per image at patch 16 and 2 x 2 merging."""
INTERNVL_MAX_DYNAMIC_PATCH = 12
"""InternVL's default tile limit (config ``max_dynamic_patch``), plus a thumbnail tile
when ``use_thumbnail``."""
PHI3V_NUM_CROPS = 4
"""Phi-3.5-vision preprocessor ``num_crops`` default."""

PROCESSOR_KWARGS = {
    "qwen2_vl": ("max_pixels",),
    "qwen2_5_vl": ("max_pixels",),
    "qwen3_vl": ("max_pixels",),
    "qwen3_vl_moe": ("max_pixels",),
    "internvl_chat": ("max_dynamic_patch",),
    "phi3_v": ("num_crops",),
}
"""--mm-processor-kwargs keys each family's max-image computation reads."""


VIDEO_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
"""Families whose vLLM processors also take video (the rest: images only)."""


def modalities(family: str) -> tuple[str, ...]:
    """The non-text modalities vLLM registers for a family's processor."""
    return ("image", "video") if family in VIDEO_FAMILIES else ("image",)


@dataclass(frozen=True)
class TowerLayout:
    """A vision tower's parameter count and the shapes its profiling run needs."""

    tower_params: int
    projector_params: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    gated_mlp: bool
    patch_input_dim: int
    """Values per patch fed in (channels x temporal x patch x patch)."""
    patches_per_token: int
    """ViT patches merged into one language-model token (merge^2, or 1/downsample^2)."""
    rotary: bool = False
    """The tower's attention applies 2-D rotary embeddings (Qwen-VL), which copies q/k."""


def _ln(h: int) -> int:
    return 2 * h


def _linear(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def _vit_blocks(h: int, inter: int, depth: int, norm: int, gated: bool) -> int:
    """Pre-norm ViT blocks with fused biased qkv, biased proj and MLP."""
    mlp = (
        2 * _linear(h, inter) + _linear(inter, h)
        if gated
        else _linear(h, inter) + _linear(inter, h)
    )
    return depth * (2 * norm + _linear(h, 3 * h) + _linear(h, h) + mlp)


class _V:
    """Typed reads from a vision_config, naming the missing field."""

    def __init__(self, cfg: Mapping[str, Any], where: str):
        self.cfg, self.where = cfg, where

    def pos(self, key: str, default: int | None = None, *alternatives: str) -> int:
        for k in (key, *alternatives):
            v = self.cfg.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise InputError(
                        "model", f"config field '{self.where}{k}' must be a positive integer"
                    )
                return v
        if default is not None:
            return default
        raise InputError(
            "model",
            f"config lacks the field '{self.where}{key}' needed for this vision tower; "
            f"add it to config.json or pass --hf-overrides",
        )


def _qwen_patching(r: _V, patch_default: int, channels: str, alias: str) -> tuple[int, ...]:
    """Qwen-VL patch embedding: channels, frames per temporal patch, patch side and the
    merger's spatial merge (defaults as each family's config class; the channel field's
    spelling differs between families, the other one accepted)."""
    return (
        r.pos(channels, 3, alias),
        r.pos("temporal_patch_size", 2),
        r.pos("patch_size", patch_default),
        r.pos("spatial_merge_size", 2),
    )


def qwen2_vl_layout(vc: Mapping[str, Any], text_hidden: int) -> TowerLayout:
    """Qwen2-VL (HF Qwen2VisionTransformerPretrainedModel): Conv3d patch embedding
    without bias, LayerNorm blocks with a QuickGELU MLP of ``embed_dim x mlp_ratio``,
    and a merger (LayerNorm, 4E -> 4E -> text hidden)."""
    r = _V(vc, "vision_config.")
    e = r.pos("embed_dim")
    inter = e * r.pos("mlp_ratio", 4)
    depth = r.pos("depth")
    c, t, p, m = _qwen_patching(r, 14, "in_chans", "in_channels")
    out = r.pos("hidden_size", text_hidden)
    tower = c * t * p * p * e + _vit_blocks(e, inter, depth, _ln(e), False)
    merger = _ln(e) + _linear(e * m * m, e * m * m) + _linear(e * m * m, out)
    return TowerLayout(tower, merger, e, inter, depth, False, c * t * p * p, m * m, rotary=True)


def qwen2_5_vl_layout(vc: Mapping[str, Any], text_hidden: int) -> TowerLayout:
    """Qwen2.5-VL (HF Qwen2_5_VisionTransformerPretrainedModel): RMSNorm blocks with a
    biased gated SiLU MLP, window attention, merger RMSNorm + 4E -> 4E -> out_hidden."""
    r = _V(vc, "vision_config.")
    e = r.pos("hidden_size")
    inter = r.pos("intermediate_size")
    depth = r.pos("depth")
    c, t, p, m = _qwen_patching(r, 14, "in_chans", "in_channels")
    out = r.pos("out_hidden_size", text_hidden)
    tower = c * t * p * p * e + _vit_blocks(e, inter, depth, e, True)
    merger = e + _linear(e * m * m, e * m * m) + _linear(e * m * m, out)
    return TowerLayout(tower, merger, e, inter, depth, True, c * t * p * p, m * m, rotary=True)


def qwen3_vl_layout(vc: Mapping[str, Any], text_hidden: int) -> TowerLayout:
    """Qwen3-VL (HF Qwen3VLVisionModel): biased Conv3d patch embedding, learned
    position embeddings (``num_position_embeddings``), LayerNorm blocks with a
    GELU MLP, the merger (LayerNorm E, 4E -> 4E -> out) and one DeepStack merger
    per ``deepstack_visual_indexes`` entry (LayerNorm over 4E, same two linears)."""
    r = _V(vc, "vision_config.")
    e = r.pos("hidden_size")
    inter = r.pos("intermediate_size")
    depth = r.pos("depth")
    c, t, p, m = _qwen_patching(r, 16, "in_channels", "in_chans")
    out = r.pos("out_hidden_size", text_hidden)
    pos = r.pos("num_position_embeddings")
    deepstack = vc.get("deepstack_visual_indexes") or []
    if not isinstance(deepstack, list):
        raise InputError(
            "model", "config field 'vision_config.deepstack_visual_indexes' must be a list"
        )
    tower = _linear(c * t * p * p, e) + pos * e + _vit_blocks(e, inter, depth, _ln(e), False)
    mm = e * m * m
    merger = _ln(e) + _linear(mm, mm) + _linear(mm, out)
    merger += len(deepstack) * (_ln(mm) + _linear(mm, mm) + _linear(mm, out))
    return TowerLayout(tower, merger, e, inter, depth, False, c * t * p * p, m * m, rotary=True)


def intern_vit_layout(vc: Mapping[str, Any], text_hidden: int, downsample: float) -> TowerLayout:
    """InternViT (OpenGVLab modeling_intern_vit.py): biased Conv2d patch embedding,
    class token and position embeddings, blocks with qkv (bias per ``qkv_bias``),
    optional q/k RMSNorm over the full width (``qk_normalization``), LayerNorm or
    RMSNorm (``norm_type``), layer scales ls1/ls2; no final norm. The projector
    ``mlp1``: LayerNorm(E/d^2), E/d^2 -> text hidden -> text hidden."""
    r = _V(vc, "vision_config.")
    e = r.pos("hidden_size")
    inter = r.pos("intermediate_size")
    depth = r.pos("num_hidden_layers")
    c, p, img = r.pos("num_channels", 3), r.pos("patch_size"), r.pos("image_size")
    if vc.get("norm_type", "rms_norm") not in ("rms_norm", "layer_norm"):
        raise InputError("model", f"InternViT norm_type '{vc.get('norm_type')}' is not supported")
    norm = e if vc.get("norm_type", "rms_norm") == "rms_norm" else 2 * e
    qkv_bias = bool(vc.get("qkv_bias", True))
    patches = (img // p) ** 2
    embed = _linear(c * p * p, e) + e + (patches + 1) * e
    block = 2 * norm + _linear(e, 3 * e, qkv_bias) + _linear(e, e)
    block += _linear(e, inter) + _linear(inter, e) + 2 * e  # MLP and layer scales
    if vc.get("qk_normalization"):
        block += 2 * e
    tower = embed + depth * block
    wide = round(e / (downsample * downsample))
    projector = _ln(wide) + _linear(wide, text_hidden) + _linear(text_hidden, text_hidden)
    return TowerLayout(
        tower, projector, e, inter, depth, False, c * p * p, round(1 / downsample**2)
    )


CLIP_VIT_L_336 = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
    "num_channels": 3,
}
"""openai/clip-vit-large-patch14-336 vision_config (huggingface.co/openai/clip-vit-large-patch14-336/
blob/main/config.json), the tower Phi-3-vision's ``img_processor.model_name`` names."""


def clip_layout(vc: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """CLIP vision transformer (HF CLIPVisionTransformer): patch Conv2d without bias,
    class embedding, patches + 1 position embeddings, pre- and post-LayerNorm.
    Returns (params, hidden, intermediate, layers)."""
    r = _V(vc, "vision_config.")
    h, inter, depth = r.pos("hidden_size"), r.pos("intermediate_size"), r.pos("num_hidden_layers")
    c, p, img = r.pos("num_channels", 3), r.pos("patch_size"), r.pos("image_size")
    patches = (img // p) ** 2
    embed = c * p * p * h + h + (patches + 1) * h
    return embed + 2 * _ln(h) + _vit_blocks(h, inter, depth, _ln(h), False), h, inter, depth


def phi3_v_layout(cfg: Mapping[str, Any], text_hidden: int) -> TowerLayout:
    """Phi-3/3.5-vision (HF Phi3ImageEmbedding): CLIP ViT-L/14-336 (its config is not
    in config.json; ``img_processor.model_name`` names it), the HD separators
    ``glb_GN`` and ``sub_GN`` (4 x image_dim_out each) and the ``mlp`` projection
    4D -> text hidden -> text hidden."""
    proc = cfg.get("img_processor")
    if not isinstance(proc, dict):
        raise InputError("model", "phi3_v config lacks 'img_processor'")
    name = str(proc.get("model_name", ""))
    if name != "openai/clip-vit-large-patch14-336":
        raise InputError(
            "model",
            f"phi3_v image processor '{name or 'unknown'}' is not supported "
            "(supported: openai/clip-vit-large-patch14-336)",
        )
    embd = cfg.get("embd_layer") or {}
    if embd.get("projection_cls", "mlp") != "mlp" or not embd.get("use_hd_transform", True):
        raise InputError(
            "model", "phi3_v: only the HD transform with an MLP projection is supported"
        )
    tower, h, inter, depth = clip_layout(CLIP_VIT_L_336)
    d = int(proc.get("image_dim_out", h))
    projector = 2 * 4 * d + _linear(4 * d, text_hidden) + _linear(text_hidden, text_hidden)
    return TowerLayout(tower, projector, h, inter, depth, False, 3 * 14 * 14, 1)


# --------------------------------------------------------------------------- profiling


def image_facts(family: str, cfg: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The config facts ``max_image_shape`` reads, as a hashable tuple of pairs."""
    vc = cfg.get("vision_config") or {}
    facts: dict[str, Any] = {}
    for key in ("patch_size", "spatial_merge_size", "image_size"):
        if isinstance(vc.get(key), int):
            facts[key] = vc[key]
    for key in ("max_dynamic_patch", "use_thumbnail", "downsample_ratio", "mm_tokens_per_image"):
        if cfg.get(key) is not None:
            facts[key] = cfg[key]
    pinpoints = cfg.get("image_grid_pinpoints")
    if pinpoints is not None:
        try:
            facts["image_grid_pinpoints"] = tuple((int(h), int(w)) for h, w in pinpoints)
        except (TypeError, ValueError):
            raise InputError(
                "model", "config field 'image_grid_pinpoints' must list [height, width] pairs"
            ) from None
    if family == "phi3_v":
        facts.update(patch_size=14, image_size=336)
    return tuple(sorted(facts.items()))


def max_image_shape(
    family: str, facts: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any]
) -> tuple[int, int, str]:
    """(tokens, ViT patches, how) of the largest image one item can be.

    vLLM sizes its dummy images with the processor's own limits
    (``get_image_size_with_most_features``), so these follow the processors."""
    allowed = PROCESSOR_KWARGS.get(family, ())
    unknown = sorted(set(mm_processor_kwargs) - set(allowed))
    if unknown:
        raise InputError(
            "mm_processor_kwargs",
            f"{', '.join(unknown)} not modelled for '{family}'",
            accepted=", ".join(allowed) or "none for this family",
        )
    kw = {k: _positive_kwarg(k, v) for k, v in mm_processor_kwargs.items()}
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        qwen3 = family.startswith("qwen3")
        p = int(facts.get("patch_size", 16 if qwen3 else 14))
        m = int(facts.get("spatial_merge_size", 2))
        pixels = kw.get("max_pixels", QWEN3_VL_MAX_PIXELS if qwen3 else QWEN2_VL_MAX_PIXELS)
        tokens = max(1, pixels // (p * m) ** 2)
        return tokens, tokens * m * m, f"max_pixels {pixels:,} / ({p} x {m})^2 pixels per token"
    if family == "internvl_chat":
        tiles = kw.get(
            "max_dynamic_patch", int(facts.get("max_dynamic_patch", INTERNVL_MAX_DYNAMIC_PATCH))
        )
        if facts.get("use_thumbnail", True) and tiles > 1:
            tiles += 1
        side = int(facts["image_size"]) // int(facts["patch_size"])
        per_tile = int(side * side * float(facts.get("downsample_ratio", 0.5)) ** 2)
        return tiles * per_tile, tiles * (side * side + 1), f"{tiles} tiles x {per_tile} tokens"
    if family == "phi3_v":
        crops = kw.get("num_crops", PHI3V_NUM_CROPS)
        grids = [(h, w) for h in range(1, crops + 1) for w in range(1, crops // h + 1)]
        best = max((h * w + 1) * 144 + 1 + (h + 1) * 12 for h, w in grids)
        tiles = max(h * w for h, w in grids)
        return best, (tiles + 1) * 577, f"HD transform, num_crops {crops}"
    if family == "llava_next":
        img = int(facts["image_size"])
        side = img // int(facts["patch_size"])
        best, tiles = 0, 1
        for h, w in facts.get("image_grid_pinpoints") or ((img, img),):
            rows, cols = h // img * side, w // img * side
            tokens = side * side + rows * cols + rows  # base + unpadded grid + newline per row
            if tokens > best:
                best, tiles = tokens, (h // img) * (w // img)
        return best, (tiles + 1) * (side * side + 1), "largest image_grid_pinpoints resolution"
    if family == "gemma3":
        tokens = int(facts.get("mm_tokens_per_image", 256))
        side = int(facts.get("image_size", 896)) // int(facts.get("patch_size", 14))
        return tokens, side * side, f"mm_tokens_per_image {tokens} (pan-and-scan off)"
    if family == "llava":
        side = int(facts["image_size"]) // int(facts["patch_size"])
        return side * side, side * side + 1, "one image_size image"
    raise InputError(
        "model",
        f"vLLM's multimodal profiling (the largest image) is not modelled for '{family or 'this tower'}'; "
        'pass limit_mm_per_prompt {"image": 0, "video": 0} to serve it text-only',
    )


def _positive_kwarg(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError("mm_processor_kwargs", f"{key} must be a positive integer, got {value!r}")
    return value


def mm_profile_items(
    max_tokens_per_item: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    limit_per_prompt: int,
    v1: bool,
) -> tuple[int, int]:
    """(encoder budget in tokens, dummy items profiled).

    V1: ``compute_encoder_budget`` (vllm/v1/core/encoder_cache_manager.py) takes
    ``max(max_num_batched_tokens, max tokens per item)`` for both the compute and
    the cache budget; ``profile_run`` (vllm/v1/worker/gpu_model_runner.py) encodes
    ``budget // tokens per item`` items of the largest size, at most
    ``max_num_seqs x limit`` and at least one. V0 (vllm/worker/model_runner.py
    ``profile_run``) builds ``max(1, min(max_num_seqs, max_num_batched_tokens //
    (limit x tokens per item)))`` dummy sequences holding ``limit`` items each."""
    budget = max(max_num_batched_tokens, max_tokens_per_item)
    if not v1:
        per_seq = max(1, limit_per_prompt) * max_tokens_per_item
        seqs = max(1, min(max_num_seqs, max_num_batched_tokens // per_seq))
        return budget, seqs * max(1, limit_per_prompt)
    items = max(1, min(budget // max_tokens_per_item, max_num_seqs * limit_per_prompt))
    return budget, items


def encoder_peak_bytes(
    layout: TowerLayout,
    patches: int,
    act_bytes: float,
    tensor_parallel_size: int,
) -> int:
    """Peak torch memory of one encoder forward over ``patches`` patches.

    The widest moment of a pre-norm ViT layer (what lives then, read in vLLM's
    vision modules), per patch in model-dtype values, with the input pixels
    (float32 from the processor, then cast to the model dtype) alive throughout:

    * MLP: the residual and its normed copy, the up (and gate) projections and
      the activation (``2h + 2I``, gated ``2h + 3I``);
    * attention without rotary (CLIP, SigLIP, InternViT): residual, q/k/v and the
      output (``h + 4h``; memory-efficient attention keeps no score matrix);
    * attention with 2-D rotary (Qwen2/2.5/3-VL, vllm/model_executor/models/
      qwen2_5_vl.py ``Qwen2_5_VisionAttention.forward``): residual, the fused qkv
      output (kept by its views), contiguous q/k/v copies, the concatenated q/k,
      its rotated copy and the float32 temporaries of the rotation (``h + 14h``).

    Outputs of column-parallel linears are split by tensor parallelism. A model of
    the shapes, not a measurement: no public log separates the encoder's peak."""
    tp = tensor_parallel_size
    h, inter = layout.hidden_size, layout.intermediate_size
    attention = h + (14 if layout.rotary else 4) * h / tp
    mlp = 2 * h + (3 if layout.gated_mlp else 2) * inter / tp
    per_patch = max(attention, mlp) * act_bytes + layout.patch_input_dim * (4 + act_bytes)
    return int(math.ceil(patches * per_patch))
