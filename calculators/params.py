"""Parameter counts and weight bytes, per component and per GPU.

Counting is done per module as the engine builds it (vLLM's model files:
``vllm/model_executor/models/{llama,qwen3,gemma3,mixtral,qwen3_moe,
deepseek_v2,gpt_oss,falcon,llama4,glm4_moe,minimax_m2}.py``), because per-GPU memory depends on *how* each
module is split, not only on its size:

* column/row-parallel linears (q, o, MLP, experts, MLA ``q_b``/``kv_b``/``o``)
  are divided by tensor parallelism;
* k/v projections are divided by TP while ``num_kv_heads >= tp`` and
  replicated (one head per rank) below that, like vLLM's ``QKVParallelLinear``;
* norms, MoE routers and MLA's ``q_a``/``kv_a`` down-projections are
  replicated on every rank;
* embeddings and ``lm_head`` are vocabulary-parallel, the vocabulary padded
  to a multiple of 64 (vLLM ``DEFAULT_VOCAB_PADDING_SIZE``);
* pipeline parallelism gives each stage a contiguous slice of layers
  (vLLM ``get_pp_indices``: the remainder goes to the stages before the last),
  the embedding to the first stage and ``lm_head`` + final norm to the last.

* vision towers count as one tensor-parallel part (vLLM builds them from parallel
  linears), their projector replicated or split as the family's ``VisionSpec``
  says; towers read in ``vision.py`` bring their own count.

Public API: :func:`count_parameters` -> :class:`ParamCounts`;
:func:`weight_bytes` -> :class:`WeightBytes`; :func:`pp_layer_split`.
Stdlib only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from .architecture import ModelArchitecture
from .quantization import QuantScheme

FP32_BYTES = 4
"""Bytes of a float32 parameter (routers vLLM keeps in float32)."""

VOCAB_PADDING = 64
"""vLLM ``DEFAULT_VOCAB_PADDING_SIZE`` (vllm/model_executor/layers/vocab_parallel_embedding.py)."""

CATEGORIES = (
    "embedding",
    "lm_head",
    "attention",
    "dense_mlp",
    "routed_experts",
    "shared_experts",
    "router",
    "norms",
    "vision",
    "ssm",
)


class _Part(NamedTuple):
    """One module (or a group of identical ones) of the model.

    A named tuple, not a dataclass: a model has a few hundred of them and a
    tuple is built several times faster (this runs on every fit request).
    """

    category: str
    params: int
    split: str
    """``tp`` divided by tensor parallelism; ``kv`` k/v heads (replicated
    below tp); ``vocab`` vocabulary-parallel; ``rep`` replicated."""
    module: str
    """HF-style module name, matched against quantization ignore lists."""
    quantizable: bool
    layer: int | None = None
    """Decoder layer index; None for embedding, lm_head, final norm, vision."""


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of the whole model (not per GPU)."""

    total: int
    active_per_token: int
    """Parameters one token passes through: everything except the routed
    experts it is not sent to (k of E experts per MoE layer)."""
    embedding: int
    lm_head: int
    """0 when tied to the embedding."""
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    vision: int
    ssm: int = 0
    """Mamba / Gated DeltaNet mixers of a hybrid model (projections, conv, A, D, dt, norm)."""

    def as_dict(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in ("total", "active_per_token", *CATEGORIES)}


@dataclass(frozen=True)
class WeightBytes:
    """Weight memory. ``total_bytes`` is the whole model at its storage
    format; ``per_gpu_bytes`` is the most loaded rank (what decides fit)."""

    total_bytes: int
    by_category: dict[str, int]
    per_gpu_bytes: int
    per_stage_bytes: tuple[int, ...]
    """One entry per pipeline stage (all TP ranks of a stage hold the same)."""
    quantized_params: int
    unquantized_params: int
    notes: tuple[str, ...] = field(default=())


def pp_layer_split(num_layers: int, pp: int) -> list[range]:
    """Layer ranges per pipeline stage, as vLLM's ``get_pp_indices``
    (vllm/distributed/utils.py): equal shares, the remainder added one each
    to the stages just before the last."""
    if pp <= 1:
        return [range(num_layers)]
    base = num_layers // pp
    sizes = [base] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def _vision_parts(arch: ModelArchitecture) -> list[_Part]:
    v = arch.vision
    if v is None:
        return []
    if v.tower_params is not None:  # counted by the family's own layout (vision.py)
        return [
            _Part("vision", v.tower_params, "tp", "vision_tower", False),
            _Part("vision", v.projector_params, v.projector_split, "multi_modal_projector", False),
        ]
    h, i = v.hidden_size, v.intermediate_size
    patches = (v.image_size // v.patch_size) ** 2
    if v.gated_mlp:  # Pixtral: no biases, RMSNorm, gated MLP, RoPE
        embed = v.num_channels * v.patch_size**2 * h + h
        per_layer = 4 * h * h + 3 * h * i + 2 * h
        post = 0
    else:  # SigLIP / CLIP: biased linears, LayerNorm (weight + bias)
        embed = v.num_channels * v.patch_size**2 * h + h
        embed += patches * h if v.position_embeddings else 0
        per_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
        post = 2 * h
    tower = embed + v.num_layers * per_layer + post
    return [
        _Part("vision", tower, "tp", "vision_tower", False),
        _Part("vision", v.projector_params, "rep", "multi_modal_projector", False),
    ]


def _attention_parts(arch: ModelArchitecture, i: int) -> list[_Part]:
    h, hd = arch.hidden_size, arch.head_dim
    pre = f"model.layers.{i}.self_attn"
    if arch.mla is not None:
        m = arch.mla
        heads = arch.num_attention_heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        parts: list[_Part] = []
        if m.q_lora_rank:
            parts += [
                _Part("attention", h * m.q_lora_rank, "rep", f"{pre}.q_a_proj", True, i),
                _Part("norms", m.q_lora_rank, "rep", f"{pre}.q_a_layernorm", False, i),
                _Part("attention", m.q_lora_rank * heads * qk, "tp", f"{pre}.q_b_proj", True, i),
            ]
        else:
            parts.append(_Part("attention", h * heads * qk, "tp", f"{pre}.q_proj", True, i))
        parts += [
            _Part(
                "attention",
                h * (m.kv_lora_rank + m.qk_rope_head_dim),
                "rep",
                f"{pre}.kv_a_proj_with_mqa",
                True,
                i,
            ),
            _Part("norms", m.kv_lora_rank, "rep", f"{pre}.kv_a_layernorm", False, i),
            _Part(
                "attention",
                m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim),
                "tp",
                f"{pre}.kv_b_proj",
                True,
                i,
            ),
            _Part("attention", heads * m.v_head_dim * h, "tp", f"{pre}.o_proj", True, i),
        ]
        return parts + _indexer_parts(arch, i)
    q = arch.num_attention_heads * hd
    kv = arch.num_kv_heads * hd
    q_out = 2 * q if arch.attn_output_gate else q  # Qwen3-Next: queries and a gate per head
    parts = [
        _Part("attention", h * q_out, "tp", f"{pre}.q_proj", True, i),
        _Part("attention", 2 * h * kv, "kv", f"{pre}.k_proj", True, i),
        _Part("attention", q * h, "tp", f"{pre}.o_proj", True, i),
    ]
    if arch.attention_bias:
        parts += [
            _Part("attention", q, "tp", f"{pre}.q_proj.bias", False, i),
            _Part("attention", 2 * kv, "kv", f"{pre}.k_proj.bias", False, i),
        ]
    if arch.o_bias:
        parts.append(_Part("attention", h, "rep", f"{pre}.o_proj.bias", False, i))
    if arch.qk_norm:
        parts.append(_Part("norms", 2 * hd, "rep", f"{pre}.q_norm", False, i))
    if arch.qk_norm_full_width:  # MiniMax-M2: sharded like q and k
        parts += [
            _Part("norms", q, "tp", f"{pre}.q_norm", False, i),
            _Part("norms", kv, "kv", f"{pre}.k_norm", False, i),
        ]
    if arch.attention_sinks:
        parts.append(_Part("attention", arch.num_attention_heads, "tp", f"{pre}.sinks", False, i))
    return parts


def _indexer_parts(arch: ModelArchitecture, i: int) -> list[_Part]:
    """DeepSeek-V3.2's indexer, replicated on every rank (ReplicatedLinear in vLLM)."""
    ix, m = arch.indexer, arch.mla
    if ix is None or m is None or not m.q_lora_rank:
        return []
    h, pre = arch.hidden_size, f"model.layers.{i}.self_attn.indexer"
    return [
        _Part("attention", m.q_lora_rank * ix.n_heads * ix.head_dim, "rep", f"{pre}.wq_b", True, i),
        _Part("attention", h * ix.head_dim, "rep", f"{pre}.wk", True, i),
        _Part("norms", 2 * ix.head_dim, "rep", f"{pre}.k_norm", False, i),
        _Part("attention", h * ix.n_heads, "rep", f"{pre}.weights_proj", False, i),
    ]


def _mlp_parts(arch: ModelArchitecture, i: int) -> list[_Part]:
    h = arch.hidden_size
    pre = f"model.layers.{i}.mlp"
    moe = arch.moe
    if moe is None or i not in moe.moe_layers:
        inter, mats = arch.intermediate_size, arch.mlp_matrices
        parts = [_Part("dense_mlp", mats * h * inter, "tp", f"{pre}.down_proj", True, i)]
        if arch.mlp_bias:
            bias = (mats - 1) * inter + h
            parts.append(_Part("dense_mlp", bias, "tp", f"{pre}.down_proj.bias", False, i))
        return parts
    e, inter = moe.num_experts, moe.moe_intermediate_size
    experts = e * 3 * h * inter
    parts = [_Part("routed_experts", experts, "tp", f"{pre}.experts.0.down_proj", True, i)]
    if moe.expert_bias:
        parts.append(
            _Part("routed_experts", e * (2 * inter + h), "tp", f"{pre}.experts.bias", False, i)
        )
    router_name = f"{pre}.router" if moe.router_bias else f"{pre}.gate"
    parts.append(_Part("router", h * e, "rep", router_name, False, i))
    if moe.router_bias:
        parts.append(_Part("router", e, "rep", f"{router_name}.bias", False, i))
    if moe.router_correction_bias:
        parts.append(_Part("router", e, "rep", f"{pre}.gate.e_score_correction_bias", False, i))
    if moe.shared_expert_intermediate_size:
        s = moe.shared_expert_intermediate_size
        name = f"{pre}.shared_expert" if moe.shared_expert_gate else f"{pre}.shared_experts"
        parts.append(_Part("shared_experts", 3 * h * s, "tp", f"{name}.down_proj", True, i))
        if moe.shared_expert_gate:
            parts.append(_Part("router", h, "rep", f"{pre}.shared_expert_gate", False, i))
    return parts


def _ssm_parts(arch: ModelArchitecture, i: int) -> list[_Part]:
    """One Mamba-1, Mamba-2 or Gated DeltaNet mixer as vLLM builds it
    (layers/mamba/mamba_mixer.py, mamba_mixer2.py, models/qwen3_next.py): the
    projections, the depthwise conv, A/D/dt and the gated norm, split by tensor
    parallelism except Mamba-1's small norms and DeltaNet's per-head norm."""
    s = arch.ssm
    assert s is not None
    h, pre = arch.hidden_size, f"model.layers.{i}.mixer"
    conv = s.conv_dim * s.conv_kernel + (s.conv_dim if s.conv_bias else 0)
    if s.kind == "gated_deltanet":
        key, value = s.num_k_heads * s.head_k_dim, s.num_heads * s.head_dim
        return [
            _Part("ssm", h * (2 * key + 2 * value), "tp", f"{pre}.in_proj_qkvz", True, i),
            _Part("ssm", h * 2 * s.num_heads, "tp", f"{pre}.in_proj_ba", True, i),
            _Part("ssm", conv + 2 * s.num_heads, "tp", f"{pre}.conv1d", False, i),
            _Part("ssm", s.head_dim, "rep", f"{pre}.norm", False, i),
            _Part("ssm", value * h, "tp", f"{pre}.out_proj", True, i),
        ]
    d = s.intermediate_size
    if s.kind == "mamba1":
        in_proj = h * 2 * d + (2 * d if s.proj_bias else 0)
        x_proj = d * (s.dt_rank + 2 * s.state_size)
        dt_proj = s.dt_rank * d + d
        return [
            _Part("ssm", in_proj, "tp", f"{pre}.in_proj", True, i),
            _Part("ssm", conv, "tp", f"{pre}.conv1d", False, i),
            _Part("ssm", x_proj + dt_proj, "tp", f"{pre}.x_proj", True, i),
            _Part("ssm", d * s.state_size + d, "tp", f"{pre}.A", False, i),
            _Part("ssm", s.dt_rank + 2 * s.state_size, "rep", f"{pre}.dt_layernorm", False, i),
            _Part("ssm", d * h + (h if s.proj_bias else 0), "tp", f"{pre}.out_proj", True, i),
        ]
    in_width = d + s.conv_dim + s.num_heads  # gate z, conv input x/B/C, time step dt
    return [
        _Part(
            "ssm", h * in_width + (in_width if s.proj_bias else 0), "tp", f"{pre}.in_proj", True, i
        ),
        _Part("ssm", conv, "tp", f"{pre}.conv1d", False, i),
        _Part("ssm", 3 * s.num_heads + d, "tp", f"{pre}.A", False, i),  # A, D, dt_bias, norm
        _Part("ssm", d * h + (h if s.proj_bias else 0), "tp", f"{pre}.out_proj", True, i),
    ]


def _layer_parts(arch: ModelArchitecture, i: int) -> list[_Part]:
    """The mixer (attention, a state-space layer or nothing) and the MLP/MoE of layer i."""
    kind = arch.layer_kinds[i]
    if kind in ("mamba", "linear"):
        parts = _ssm_parts(arch, i)
    elif kind == "mlp":
        parts = []
    else:
        parts = _attention_parts(arch, i)
    if arch.ffn_layers is None or i in arch.ffn_layers:
        parts += _mlp_parts(arch, i)
    return parts


_KEY_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(ModelArchitecture)
    if f.name not in ("quantization_config", "notes")
)
"""Every architecture field but the checkpoint's quantization_config (a dict,
not hashable; the scheme is a separate argument) and the notes. Taking all
the others, rather than the few the module list reads today, keeps the memo
right when a field is added and read later."""


def _hashable(key: tuple) -> tuple | None:
    """``key``, or None (do not memoise) when a part of it cannot be hashed."""
    try:
        hash(key)
    except TypeError:
        return None
    return key


_LAST_KEY: tuple = (None, None)
"""(architecture, its key) of the last call: a fit request passes the same
object a dozen times, and building and hashing the key is most of a lookup."""


def _layout_key(arch: ModelArchitecture) -> tuple | None:
    """The memo key of an architecture (see ``_KEY_FIELDS``)."""
    global _LAST_KEY
    last_arch, last_key = _LAST_KEY  # one read: another thread may replace the pair
    if last_arch is arch:
        return last_key
    key = _hashable(tuple(getattr(arch, name) for name in _KEY_FIELDS))
    _LAST_KEY = (arch, key)
    return key


_CACHE_SIZE = 64
"""Distinct architectures (or weight layouts) kept; a fit request touches a few."""

_PARTS_CACHE: dict[tuple, tuple[_Part, ...]] = {}


def _remember(cache: dict, key: object, value: object) -> None:
    """Bounded memo: start over when full. ``clear`` and item assignment are
    atomic, so MCP worker threads may share these caches without a lock."""
    if key is None:
        return
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value


def clear_caches() -> None:
    """Forget the memoised module lists, counts and weight splits (benchmarks
    use it to time a first request; results never depend on it)."""
    for cache in (_PARTS_CACHE, _COUNTS_CACHE, _WEIGHTS_CACHE):
        cache.clear()


def _parts(arch: ModelArchitecture) -> tuple[_Part, ...]:
    """The module list, built once per distinct architecture.

    A fit request asks for it a dozen times (the request and each recomputed
    alternative, weights at runtime and checkpoint layout); the list depends
    only on the architecture, never on the deployment.
    """
    key = _layout_key(arch)
    parts = _PARTS_CACHE.get(key) if key is not None else None
    if parts is None:
        parts = tuple(_build_parts(arch))
        _remember(_PARTS_CACHE, key, parts)
    return parts


def _build_parts(arch: ModelArchitecture) -> list[_Part]:
    h, v = arch.hidden_size, arch.vocab_size
    norm = 2 * h if arch.norm_bias else h  # LayerNorm: weight and bias
    parts = [_Part("embedding", v * h, "vocab", "model.embed_tokens", False)]
    for i in range(arch.num_layers):
        parts += _layer_parts(arch, i)
        parts.append(
            _Part(
                "norms",
                arch.norms_per_layer * norm,
                "rep",
                f"model.layers.{i}.input_layernorm",
                False,
                i,
            )
        )
    parts.append(_Part("norms", norm, "rep", "model.norm", False))
    if not arch.tie_word_embeddings:
        parts.append(_Part("lm_head", v * h, "vocab", "lm_head", False))
    parts += _vision_parts(arch)
    return parts


_COUNTS_CACHE: dict[tuple, ParamCounts] = {}


def count_parameters(arch: ModelArchitecture) -> ParamCounts:
    """Parameter counts by component for the whole model (immutable, so shared per architecture)."""
    key = _layout_key(arch)
    counts = _COUNTS_CACHE.get(key) if key is not None else None
    if counts is None:
        counts = _count_parameters(arch)
        _remember(_COUNTS_CACHE, key, counts)
    return counts


def _count_parameters(arch: ModelArchitecture) -> ParamCounts:
    by = dict.fromkeys(CATEGORIES, 0)
    for p in _parts(arch):
        by[p.category] += p.params
    total = sum(by.values())
    active = total
    if arch.moe is not None and arch.moe.num_experts:
        active = (
            total
            - by["routed_experts"]
            + by["routed_experts"] * arch.moe.experts_per_token // arch.moe.num_experts
        )
    return ParamCounts(total=total, active_per_token=active, **by)


def replicated_matmul_params(arch: ModelArchitecture, tp: int) -> float:
    """Matmul parameters that tensor parallelism does not split, counted once for every rank
    beyond the first: MLA's low-rank query and KV down-projections (``ReplicatedLinear`` in
    vLLM and SGLang), MoE routers, DeepSeek-V3.2's indexer, and K/V heads kept on several
    ranks once ``tp`` exceeds them. Every rank multiplies each token by them in full, so the
    step's FLOPs and weight reads grow by this much over an even split (DeepSeek-R1 at TP 8:
    about a sixth more per-rank GEMM work than 1/8 of the model)."""
    if tp <= 1:
        return 0.0
    return sum(
        _per_rank_params(p, arch, tp) * tp - p.params
        for p in _parts(arch)
        if p.category in ("attention", "router") and p.split in ("rep", "kv")
    )


def _per_rank_params(p: _Part, arch: ModelArchitecture, tp: int) -> float:
    if p.split == "rep":
        return p.params
    if p.split == "tp":
        return p.params / tp
    if p.split == "kv":
        kv = arch.num_kv_heads
        return p.params / kv * max(1, kv // tp)
    # vocab-parallel: padded vocabulary divided by tp
    padded = -(-arch.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    return p.params / arch.vocab_size * padded / tp


def _mxfp4_padding(
    arch: ModelArchitecture, alignment: tuple[int, int] = (256, 128), tp: int = 1
) -> float:
    """vLLM's MXFP4 MoE kernels on Ampere/Hopper (Marlin, triton) pad expert
    matrices: hidden size to a multiple of 256 and the expert intermediate
    size to a multiple of 128 (vllm/model_executor/layers/quantization/mxfp4.py).
    With gpt-oss (2880 -> 3072 and 2944) this reproduces the logged "Model
    loading took" within 0.5 % (65.97 GiB for gpt-oss-120b, vllm#23278;
    13.72 GiB for gpt-oss-20b, myoceane.fr), where the unpadded checkpoint is
    7 % smaller."""
    if arch.moe is None:
        return 1.0
    # the intermediate size is padded per tensor-parallel rank (2880 / 4 = 720
    # -> 768 at TP 4: gpt-oss-120b loads 17.22 GiB per A100, dennislee22 logs)
    h, i = arch.hidden_size, arch.moe.moe_intermediate_size / tp
    ah, ai = alignment
    return (-(-h // ah) * ah / h) * (-(-i // ai) * ai / i)


def weight_bytes(
    arch: ModelArchitecture,
    scheme: QuantScheme,
    dtype_bytes: float,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    runtime_layout: bool = True,
    mxfp4_alignment: tuple[int, int] = (256, 128),
) -> WeightBytes:
    """Bytes of weights in memory, whole model and per GPU.

    ``runtime_layout`` applies the engine's in-memory padding (MXFP4 experts);
    False gives the checkpoint's own size. ``mxfp4_alignment`` is the
    (hidden, intermediate) padding of the engine's MXFP4 MoE kernel
    (``engine_policy.mxfp4_alignment``).

    Quantizable linears use ``scheme.bytes_per_param`` unless the scheme
    skips them (ignore lists, experts-only formats); everything else is
    stored at ``dtype_bytes``.

    Memoised on the architecture's layout and the other arguments: a fit
    request asks for the same split several times (each recomputed
    alternative that keeps the parallelism and format). Every caller gets
    its own ``by_category`` dict.
    """
    layout = _layout_key(arch)
    key = layout and _hashable(
        (
            layout,
            scheme,
            dtype_bytes,
            type(dtype_bytes),  # 2 and 2.0 hash alike but sum differently
            tensor_parallel_size,
            pipeline_parallel_size,
            runtime_layout,
            tuple(mxfp4_alignment),
        )
    )
    wb = _WEIGHTS_CACHE.get(key) if key is not None else None
    if wb is None:
        wb = _weight_bytes(
            arch,
            scheme,
            dtype_bytes,
            tensor_parallel_size,
            pipeline_parallel_size,
            runtime_layout,
            mxfp4_alignment,
        )
        _remember(_WEIGHTS_CACHE, key, wb)
    return dataclasses.replace(wb, by_category=dict(wb.by_category))


_WEIGHTS_CACHE: dict[tuple, WeightBytes] = {}


def _weight_bytes(
    arch: ModelArchitecture,
    scheme: QuantScheme,
    dtype_bytes: float,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    runtime_layout: bool,
    mxfp4_alignment: tuple[int, int],
) -> WeightBytes:
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    stages = pp_layer_split(arch.num_layers, pp)
    stage_of = {}
    for s, r in enumerate(stages):
        for i in r:
            stage_of[i] = s
    by = dict.fromkeys(CATEGORIES, 0.0)
    per_stage = [0.0] * pp
    notes: list[str] = list(scheme.notes)
    expert_pad = rank_pad = 1.0
    if scheme.method == "mxfp4" and runtime_layout:
        expert_pad = _mxfp4_padding(arch, mxfp4_alignment)
        rank_pad = _mxfp4_padding(arch, mxfp4_alignment, tp)
        if expert_pad > 1.0:
            notes.append(
                f"MXFP4 expert matrices padded by the engine's MoE kernel (+{expert_pad - 1:.1%} expert memory)"
            )
    q_params = u_params = 0
    for p in _parts(arch):
        quantized = (
            scheme.is_quantized
            and p.quantizable
            and (not scheme.experts_only or p.category == "routed_experts")
            and not scheme.skips(p.module)
        )
        bpp = scheme.bytes_per_param if quantized else dtype_bytes
        if p.category == "router" and arch.moe is not None and arch.moe.router_fp32:
            bpp = FP32_BYTES
        rank_bpp = bpp
        if quantized and p.category == "routed_experts":
            bpp *= expert_pad
            rank_bpp *= rank_pad
        if quantized:
            q_params += p.params
        else:
            u_params += p.params
        by[p.category] += p.params * bpp
        if p.layer is not None:
            stage = stage_of[p.layer]
        elif p.category in ("lm_head",) or p.module == "model.norm":
            stage = pp - 1
        else:
            stage = 0
        per_stage[stage] += _per_rank_params(p, arch, tp) * rank_bpp
    if arch.tie_word_embeddings and pp > 1:
        # The last stage needs its own copy of the tied matrix for lm_head.
        emb = next(p for p in _parts(arch) if p.category == "embedding")
        per_stage[-1] += _per_rank_params(emb, arch, tp) * dtype_bytes
    return WeightBytes(
        total_bytes=int(round(sum(by.values()))),
        by_category={k: int(round(v)) for k, v in by.items()},
        per_gpu_bytes=int(round(max(per_stage))),
        per_stage_bytes=tuple(int(round(x)) for x in per_stage),
        quantized_params=q_params,
        unquantized_params=u_params,
        notes=tuple(notes),
    )
