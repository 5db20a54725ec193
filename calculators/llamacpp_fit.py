"""Memory fit for llama.cpp's llama-server, from a GGUF file's header.

llama.cpp allocates differently from vLLM: it does not fill a memory budget with KV
blocks but allocates exactly the context it is given (``-c``, padded to 256 cells),
split over ``-np`` slots (one stream per slot, or one shared pool with
``--kv-unified``, the default when the slot count is left on auto, which is 4). Each
cell holds every layer's K and V rows in the cache types ``--cache-type-k/v``
(f16 by default; q8_0 / q4_0 blocks at 34 / 18 bytes per 32 values). Layers with a
sliding window (Gemma 2/3, gpt-oss, Cohere 2) get a second, smaller cache of
``min(n_ctx_seq, n_swa x (slots if unified else 1) + n_ubatch)`` cells unless
``--swa-full``. With several GPUs, ``--split-mode layer`` deals whole layers to the
devices; the token embeddings stay in host memory. When ``-c`` is not given the
server starts from the model's training context and its ``--fit`` step shortens it
(down to 4,096 per stream) until every device keeps a 1,024 MiB margin free.

Rules read in the llama.cpp source vendored by llama-cpp-python 0.3.36
(src/llama-context.cpp: n_ctx padding and n_ctx_seq; src/llama-kv-cache.cpp and
llama-kv-cache-iswa.cpp: cache tensors and the SWA size; tools/server/server.cpp:
auto slots = 4 with a unified cache; common/fit.cpp: margins and context reduction;
src/llama-model.cpp: input layer on the CPU, layer split).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import InputError
from .gguf_file import GgufModel, load_gguf

if TYPE_CHECKING:
    from .fit import (
        FitRequest,
        FitResult,
        PerGpuMemory,
        Quantity,
        QuestionAnswer,
        Suggestion,
        _Notes,
    )

GiB = 1 << 30
MiB = 1 << 20
CELL_PAD = 256
AUTO_SLOTS = 4
FIT_MARGIN_BYTES = 1024 * MiB
FIT_MIN_CTX_PER_STREAM = 4096
DEFAULT_UBATCH = 512
DEFAULT_BATCH = 2048
OLD_LOGITS_BUILD = 6699
"""The newest llama.cpp build whose published CUDA log (gpt-oss-20b, build 6699) still
shows a compute buffer holding a whole ubatch of logits; the vendored build reserves one
output per sequence (src/llama-context.cpp sched_reserve: ``n_outputs = n_seqs``)."""
CUDA_CONTEXT_GIB = 0.35
"""CUDA context and cuBLAS workspace a llama-server process holds per device outside
its own buffers (not in its logs; nvidia-smi shows it). Assumed."""

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""--cache-type-k/-v values llama-server accepts (common/arg.cpp kv_cache_types)."""

SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gpt-oss": (2, False),
    "cohere2": (4, False),
    "exaone4": (4, False),
}
"""Architectures whose layers alternate sliding-window and full attention, with the
period llama.cpp sets when the file states no ``attention.sliding_window_pattern``
(src/models/<arch>.cpp ``load_swa_pattern``): in each period the last layer is full."""

PLAIN_ATTENTION = {
    "llama", "mistral3", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "phi3", "gemma",
    "granite", "granitemoe", "olmo2", "command-r", "starcoder2", "internlm2", "glm4",
    "glm4moe", "minimax-m2", "falcon", "exaone", "deepseek", "stablelm", "phi2",
    *SWA_PATTERNS,
}  # fmt: skip
"""GGUF architectures whose KV cache is the standard per-layer K and V rows."""

NOT_MODELLED = {
    "deepseek2": "multi-head latent attention (its compressed KV cache)",
    "llama4": "chunked local attention",
}


@dataclass(frozen=True)
class Shape:
    """What llama.cpp's KV cache and split read from the header."""

    n_layer: int
    n_embd: int
    n_ctx_train: int
    kv_heads: tuple[int, ...]
    head_k: int
    head_v: int
    swa_layers: tuple[bool, ...]
    n_swa: int
    n_vocab: int
    n_ff: int
    n_head: int = 0
    n_ff_active: int = 0
    """FFN width one token passes through: the dense n_ff, or the used experts'
    (expert_used_count x expert_feed_forward_length) for MoE models."""


@dataclass(frozen=True)
class Settings:
    """llama-server's flags that size its memory, resolved to what it would use."""

    n_ctx: int
    n_ctx_seq: int
    slots: int
    unified: bool
    n_ubatch: int
    type_k: str
    type_v: str
    flash_attn: bool
    swa_full: bool
    ctx_auto: bool
    ubatch_logits: bool = False
    """Older builds reserve the logits of a whole ubatch (see ``OLD_LOGITS_BUILD``)."""


# --------------------------------------------------------------------------- header


def shape_of(model: GgufModel) -> Shape:
    """The hyper-parameters; architectures whose cache is not plain K/V fail closed."""
    arch = model.architecture
    if arch in NOT_MODELLED:
        raise InputError(
            "model", f"llama.cpp fit of '{arch}' is not modelled: {NOT_MODELLED[arch]}"
        )
    if arch not in PLAIN_ATTENTION or any(k.startswith(f"{arch}.ssm.") for k in model.metadata):
        raise InputError(
            "model",
            f"llama.cpp fit of GGUF architecture '{arch}' is not modelled (recurrent, hybrid or "
            "unknown cache layout)",
            accepted=", ".join(sorted(PLAIN_ATTENTION)),
        )
    n_layer = _int(model, "block_count")
    n_embd = _int(model, "embedding_length")
    heads = _per_layer(model, "attention.head_count", n_layer)
    kv_heads = _per_layer(model, "attention.head_count_kv", n_layer, default=heads)
    n_head = max(heads)
    head_k = _int(model, "attention.key_length", n_embd // n_head)
    head_v = _int(model, "attention.value_length", head_k)
    n_swa = _int(model, "attention.sliding_window", 0)
    n_ff = max(_per_layer(model, "feed_forward_length", n_layer, default=(0,) * n_layer))
    return Shape(
        n_layer=n_layer,
        n_embd=n_embd,
        n_ctx_train=_int(model, "context_length"),
        kv_heads=kv_heads,
        head_k=head_k,
        head_v=head_v,
        swa_layers=_swa_layers(model, n_layer, n_swa),
        n_swa=n_swa,
        n_vocab=model.vocab_size or 0,
        n_ff=n_ff,
        n_head=n_head,
        n_ff_active=_active_ffn(model, n_ff),
    )


def _active_ffn(model: GgufModel, dense_ff: int) -> int:
    used = int(model.hparam("expert_used_count", 0) or 0)
    expert_ff = int(model.hparam("expert_feed_forward_length", 0) or 0)
    return max(dense_ff, used * expert_ff) if used and expert_ff else dense_ff


def _int(model: GgufModel, key: str, default: int | None = None) -> int:
    value = model.hparam(key, default)
    if isinstance(value, list):
        value = max(value) if value else None
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(
            "model", f"GGUF lacks '{model.architecture}.{key}' (or it is not a number)"
        )
    if value < 0 or value > 1 << 31:
        raise InputError("model", f"GGUF field '{model.architecture}.{key}' is out of range")
    return int(value)


def _per_layer(
    model: GgufModel, key: str, n_layer: int, default: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    value = model.hparam(key)
    if value is None and default is not None:
        return default
    if isinstance(value, list):
        if len(value) != n_layer or not all(isinstance(v, int) and v >= 0 for v in value):
            raise InputError(
                "model", f"GGUF field '{model.architecture}.{key}' must list {n_layer} counts"
            )
        return tuple(int(v) for v in value)
    return (_int(model, key),) * n_layer


def _swa_layers(model: GgufModel, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    if n_swa <= 0 or model.architecture not in SWA_PATTERNS:
        return (False,) * n_layer
    stated = model.hparam("attention.sliding_window_pattern")
    if isinstance(stated, list) and len(stated) == n_layer:
        return tuple(bool(v) for v in stated)
    period, dense_first = SWA_PATTERNS[model.architecture]
    if isinstance(stated, int) and stated >= 0:
        period = stated
    if dense_first:
        return tuple(period == 0 or i % period != 0 for i in range(n_layer))
    return tuple(period == 0 or i % period < period - 1 for i in range(n_layer))


# --------------------------------------------------------------------------- the cache


def cache_type_bytes(type_name: str) -> float:
    """Bytes per cached value of a --cache-type (ggml block size and bytes)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name.upper()]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return size / block


def pad(n: int, to: int = CELL_PAD) -> int:
    return -(-n // to) * to


def settings_for(
    shape: Shape,
    *,
    ctx_size: int | None,
    parallel: int | None,
    kv_unified: bool | None,
    ubatch_size: int | None,
    type_k: str,
    type_v: str,
    flash_attn: bool,
    swa_full: bool,
) -> Settings:
    """The context, slots and streams llama-server would use (before its --fit step)."""
    slots = parallel or AUTO_SLOTS
    unified = kv_unified if kv_unified is not None else parallel is None
    streams = 1 if unified else slots
    ctx_auto = not ctx_size
    n_ctx = ctx_size or shape.n_ctx_train * streams
    n_ctx = pad(n_ctx)
    if unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = pad(n_ctx // slots)
        n_ctx = n_ctx_seq * slots
    # n_batch = min(-c as given, -b) before the padding (llama-context.cpp), so a short
    # -c also shortens the ubatch
    n_ubatch = min(ubatch_size or DEFAULT_UBATCH, DEFAULT_BATCH, ctx_size or n_ctx)
    return Settings(
        n_ctx, n_ctx_seq, slots, unified, n_ubatch, type_k, type_v, flash_attn, swa_full, ctx_auto
    )


def cells(shape: Shape, s: Settings) -> tuple[int, int]:
    """KV cells (all streams) of the full-attention and of the sliding-window layers."""
    streams = 1 if s.unified else s.slots
    if s.swa_full or not any(shape.swa_layers):
        swa = s.n_ctx_seq
    else:
        swa = pad(min(s.n_ctx_seq, shape.n_swa * (s.slots if s.unified else 1) + s.n_ubatch))
    return s.n_ctx_seq * streams, swa * streams


def layer_cell_bytes(shape: Shape, s: Settings, layer: int) -> float:
    """K and V bytes one cell costs in one layer."""
    kv = shape.kv_heads[layer]
    return kv * shape.head_k * cache_type_bytes(s.type_k) + kv * shape.head_v * cache_type_bytes(
        s.type_v
    )


def kv_bytes_per_layer(shape: Shape, s: Settings) -> list[int]:
    """Each layer's KV buffer, bytes (llama_kv_cache: size = ... MiB)."""
    full, swa = cells(shape, s)
    return [
        int(round(layer_cell_bytes(shape, s, i) * (swa if shape.swa_layers[i] else full)))
        for i in range(shape.n_layer)
    ]


# --------------------------------------------------------------------------- devices


def device_of_layer(layer: int, n_layer: int, devices: int) -> int:
    """--split-mode layer with equal devices: layer il (the output is layer n_layer) goes
    to the first device whose cumulative share exceeds il / (n_layer + 1)."""
    return min(devices - 1, layer * devices // (n_layer + 1))


def weight_bytes_per_device(model: GgufModel, shape: Shape, devices: int) -> tuple[list[int], int]:
    """Weights on each GPU and in host memory. ``token_embd`` stays on the CPU (llama.cpp
    never offloads the input layer); with tied embeddings the output matrix is a second
    copy of it on the last layer's device."""
    per = [0] * devices
    host = 0
    out_dev = device_of_layer(shape.n_layer, shape.n_layer, devices)
    has_output = any(t.name == "output.weight" for t in model.tensors)
    for t in model.tensors:
        if t.layer is not None:
            per[device_of_layer(t.layer, shape.n_layer, devices)] += t.n_bytes
        elif t.name.startswith("token_embd"):
            host += t.n_bytes
            if not has_output and t.name == "token_embd.weight":
                per[out_dev] += t.n_bytes
        else:
            per[out_dev] += t.n_bytes
    return per, host


def kv_bytes_per_device(layer_bytes: list[int], n_layer: int, devices: int) -> list[int]:
    per = [0] * devices
    for i, b in enumerate(layer_bytes):
        per[device_of_layer(i, n_layer, devices)] += b
    return per


def compute_buffer_bytes(shape: Shape, s: Settings, holds_output: bool) -> int:
    """The device's compute buffer (llama_context: CUDA0 compute buffer size): ggml's
    allocator reuses memory within a step's graph, so the buffer is the widest moment of
    one ubatch of ``u`` tokens, plus the attention mask over the stream's cells that
    lives through the whole graph:

    * mask: ``u x n_ctx_seq`` in f16 with flash attention, f32 without;
    * FFN: ``u x (3 n_ff + min(n_ff, 4 n_embd))`` floats (gate, up, their product, and
      the residual stream's copies);
    * attention: ``u x 5 n_embd`` floats with flash attention; without it the scores
      ``u x n_ctx_seq x n_head`` floats plus ``u x 5.5 n_embd``;
    * the logits: this build reserves the graph with ``n_outputs = n_seq_max`` (one token
      per sequence, in a host output buffer), so the vocabulary does not count; builds up
      to ``OLD_LOGITS_BUILD`` reserved ``n_vocab x u`` floats on the output device.

    Measured on llama-server's CPU backend for 40 shapes and settings
    (tests/data/llamacpp_compute_buffers.toml); the CUDA backend adds its own scratch
    (cuBLAS, flash-attention tiles), so this is the floor there."""
    u, ctx = s.n_ubatch, s.n_ctx_seq
    ff = shape.n_ff_active
    mask = u * ctx * (2 if s.flash_attn else 4)
    ffn = u * 4 * (3 * ff + min(ff, 4 * shape.n_embd))
    if s.flash_attn:
        attn = u * 4 * 5 * shape.n_embd
    else:
        attn = u * 4 * (ctx * shape.n_head + 5.5 * shape.n_embd)
    logits = u * 4 * shape.n_vocab if holds_output and s.ubatch_logits else 0
    return int(mask + max(ffn, attn, logits))


# --------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's charges, bytes."""

    weights: int
    kv: int
    compute: int
    context: int

    @property
    def used(self) -> int:
        return self.weights + self.kv + self.compute + self.context


def device_memory(
    model: GgufModel, shape: Shape, s: Settings, devices: int
) -> tuple[list[DeviceMemory], int]:
    """Every GPU's weights, KV, compute buffer and CUDA context; and the host weights."""
    weights, host = weight_bytes_per_device(model, shape, devices)
    kv = kv_bytes_per_device(kv_bytes_per_layer(shape, s), shape.n_layer, devices)
    out_dev = device_of_layer(shape.n_layer, shape.n_layer, devices)
    context = int(CUDA_CONTEXT_GIB * GiB)
    return [
        DeviceMemory(weights[d], kv[d], compute_buffer_bytes(shape, s, d == out_dev), context)
        for d in range(devices)
    ], host


def auto_context(
    model: GgufModel, shape: Shape, s: Settings, devices: int, total: float
) -> tuple[Settings, str | None]:
    """llama-server's --fit step for an unset -c: shorten the context linearly between the
    training context and 4,096 per stream until every device keeps the 1,024 MiB margin
    (common/fit.cpp), aligned to 256 cells per stream. Returns the settings it would
    start with and a sentence saying what it did (None when nothing changed)."""
    streams = 1 if s.unified else s.slots
    free = total - FIT_MARGIN_BYTES

    def at(n_ctx: int) -> Settings:
        return _with_ctx(s, n_ctx)

    def worst(n_ctx: int) -> int:
        mems, _ = device_memory(model, shape, at(n_ctx), devices)
        return max(m.used for m in mems)

    if worst(s.n_ctx) <= free:
        return s, None
    low = min(s.n_ctx, FIT_MIN_CTX_PER_STREAM * streams)
    if worst(low) > free:
        return at(low), (
            f"the --fit step would shorten the context to its minimum {low:,} and still not "
            "keep 1,024 MiB free; llama-server then moves layers to the CPU"
        )
    used_max, used_min = worst(s.n_ctx), worst(low)
    n_ctx = low + int((s.n_ctx - low) * (free - used_min) / max(1, used_max - used_min))
    align = CELL_PAD * streams
    n_ctx = max(n_ctx - n_ctx % align, low)
    return at(n_ctx), (
        f"-c unset: llama-server's --fit step shortens the context from {s.n_ctx:,} to "
        f"{n_ctx:,} cells to keep 1,024 MiB free per GPU"
    )


def _with_ctx(s: Settings, n_ctx: int) -> Settings:
    n_ctx = pad(n_ctx)
    if s.unified:
        return replace(s, n_ctx=n_ctx, n_ctx_seq=n_ctx, n_ubatch=min(s.n_ubatch, n_ctx))
    seq = pad(n_ctx // s.slots)
    return replace(s, n_ctx=seq * s.slots, n_ctx_seq=seq, n_ubatch=min(s.n_ubatch, n_ctx))


def parameter_counts(model: GgufModel) -> tuple[int, int, dict[str, int]]:
    """Total and per-token parameters (experts scaled by used / total), and by component."""
    n_expert = int(model.hparam("expert_count", 0) or 0)
    n_used = int(model.hparam("expert_used_count", 0) or 0)
    parts: dict[str, int] = {}
    routed = 0
    for t in model.tensors:
        part = _component(t.name)
        parts[part] = parts.get(part, 0) + t.n_elements
        if "_exps" in t.name:
            routed += t.n_elements
    total = sum(parts.values())
    active = total
    if n_expert and n_used:
        active = total - routed + routed * n_used // n_expert
    return total, active, parts


def _component(name: str) -> str:
    if name.startswith("token_embd"):
        return "embeddings"
    if name.startswith("output."):
        return "lm_head"
    if "_exps" in name or "shexp" in name or "ffn_gate_inp" in name:
        return "experts"
    if ".attn_" in name and "norm" not in name:
        return "attention"
    if ".ffn_" in name and "norm" not in name:
        return "mlp"
    return "norms_and_other"


def estimate_llamacpp(req: FitRequest, with_suggestions: bool = True) -> FitResult:
    """The fit of llama-server serving ``req.model`` (a GGUF file) on ``req``'s GPUs."""
    from .fit import _gpu_memory, _Notes

    if req.tensor_parallel_size != 1 or req.pipeline_parallel_size != 1:
        raise InputError(
            "tensor_parallel_size",
            "llama.cpp deals whole layers to the GPUs (--split-mode layer); give --num-gpus N",
            accepted="1",
        )
    model = _load(req)
    shape = shape_of(model)
    notes = _Notes()
    gpu, total_gib = _gpu_memory(req, notes)
    devices = req.num_gpus or 1
    if devices > shape.n_layer + 1:
        raise InputError(
            "num_gpus",
            f"{devices} GPUs for {shape.n_layer} layers and the output: llama.cpp deals whole "
            "layers, so some would hold nothing",
            accepted=f"1..{shape.n_layer + 1}",
        )
    if not req.ctx_size and shape.n_ctx_train <= 0:
        raise InputError("ctx_size", "the GGUF states no training context; give -c N")
    settings = _settings(req, shape, notes)
    start = settings
    if settings.ctx_auto:
        settings, said = auto_context(model, shape, settings, devices, total_gib * GiB)
        if said:
            notes.assumptions.append(said)
    mems, host = device_memory(model, shape, settings, devices)
    label = gpu.id if gpu else f"custom-{total_gib:g}gib"
    fitted = _Fitted(model, shape, settings, mems, host, total_gib * GiB, label)
    result = _result(req, fitted, notes)
    if start.n_ctx != settings.n_ctx:
        result.estimated_max_model_len = settings.n_ctx_seq
    if with_suggestions:
        result.suggestions = _suggestions(req, result)
    return result


def _load(req: FitRequest) -> GgufModel:
    from .gguf_file import is_gguf_spec

    if not is_gguf_spec(req.model):
        raise InputError(
            "model",
            "llama.cpp serves GGUF files: give a path to a .gguf file or a Hub spec "
            "REPO:QUANT (e.g. bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M)",
        )
    return load_gguf(req.model, req.revision)


def _build_number(version: str | None) -> int | None:
    """A llama.cpp build named as ``b6699`` or ``6699`` (None for anything else)."""
    import re

    m = re.fullmatch(r"b?(\d{3,6})", (version or "").strip())
    return int(m.group(1)) if m else None


def _settings(req: FitRequest, shape: Shape, notes: _Notes) -> Settings:
    type_k = req.cache_type_k or "f16"
    type_v = req.cache_type_v or "f16"
    flash = req.flash_attn != "off"
    if type_v not in ("f16", "bf16", "f32") and not flash:
        raise InputError(
            "cache_type_v",
            f"a quantized V cache ({type_v}) needs flash attention; drop --flash-attn off",
        )
    if req.parallel is None:
        notes.assumptions.append(
            f"-np unset: llama-server's auto slots, {AUTO_SLOTS} sharing one unified KV cache"
        )
    if req.flash_attn == "auto":
        notes.assumptions.append("flash attention on (llama.cpp's auto on CUDA GPUs)")
    old_build = _build_number(req.engine_version)
    ubatch_logits = old_build is not None and old_build <= OLD_LOGITS_BUILD
    if ubatch_logits:
        notes.assumptions.append(
            f"llama.cpp build {old_build} reserves the logits of a whole ubatch in the compute buffer"
        )
    notes.assumptions.append("every layer on the GPUs (-ngl all); token embeddings in host memory")
    s = settings_for(
        shape,
        ctx_size=req.ctx_size,
        parallel=req.parallel,
        kv_unified=req.kv_unified,
        ubatch_size=req.ubatch_size,
        type_k=type_k,
        type_v=type_v,
        flash_attn=flash,
        swa_full=req.swa_full,
    )
    s = replace(s, ubatch_logits=ubatch_logits)
    if s.n_ctx_seq > shape.n_ctx_train:
        notes.warnings.append(
            f"context per slot {s.n_ctx_seq:,} exceeds the training context "
            f"{shape.n_ctx_train:,} (llama.cpp warns: possible training context overflow)"
        )
    return s


@dataclass(frozen=True)
class _Fitted:
    """One llama-server deployment, sized: what the result is assembled from."""

    model: GgufModel
    shape: Shape
    s: Settings
    mems: list[DeviceMemory]
    host: int
    total: float
    gpu_label: str

    @property
    def worst(self) -> DeviceMemory:
        return max(self.mems, key=lambda m: m.used)

    @property
    def fits(self) -> bool:
        """Every GPU keeps the --fit step's 1,024 MiB free (below it llama-server, with its
        default --fit on, moves layers to the CPU even when -c is given)."""
        return all(d.used <= self.total - FIT_MARGIN_BYTES for d in self.mems)


def _result(req: FitRequest, f: _Fitted, notes: _Notes) -> FitResult:
    from .fit import FitResult, ParameterCounts

    s, m = f.s, f.worst
    total_params, active, parts = parameter_counts(f.model)
    full_cells, _ = cells(f.shape, s)
    per_token = sum(
        layer_cell_bytes(f.shape, s, i) for i in range(f.shape.n_layer) if not f.shape.swa_layers[i]
    )
    notes.quantities += _quantities(f)
    return FitResult(
        model=req.model,
        model_source="hub" if f.model.source.startswith("http") else "path",
        model_revision=f.model.revision,
        gpu=f.gpu_label,
        engine="llama.cpp",
        engine_version=req.engine_version or "llama-cpp-python 0.3.36",
        engine_rules_version="llama.cpp vendored by llama-cpp-python 0.3.36",
        fits=f.fits,
        verdict=_verdict(f.fits, m, f.total, s),
        num_gpus=len(f.mems),
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        max_model_len=s.n_ctx_seq,
        max_num_batched_tokens=min(DEFAULT_BATCH, s.n_ctx),
        max_num_seqs=s.slots,
        block_size=1,
        dtype=f.model.file_type,
        kv_cache_dtype=f"K {s.type_k}, V {s.type_v}",
        quantization=f"gguf {f.model.file_type}",
        parameters=ParameterCounts(total=total_params, active_per_token=active, by_component=parts),
        weights_bytes_total=f.model.total_bytes,
        checkpoint_bytes=f.model.total_bytes,
        per_gpu=_per_gpu(m, f.total),
        kv_bytes_per_token=int(round(_per_token_on(f, f.mems.index(m)))),
        kv_bytes_per_token_total=int(round(per_token)),
        kv_bytes_per_token_per_layer=_per_layer_kind(f.shape, s),
        kv_cache_blocks=full_cells,
        kv_cache_tokens=full_cells,
        max_concurrency=round(full_cells / s.n_ctx_seq, 4) if s.n_ctx_seq else 0.0,
        answer=_answer(req, s, notes),
        quantities=notes.quantities,
        assumptions=notes.assumptions,
        warnings=notes.warnings,
        suggestions=[],
    )


def _per_token_on(f: _Fitted, device: int) -> float:
    """KV bytes one cell of the full-attention layers costs on one GPU (its layers only)."""
    n, devices = f.shape.n_layer, len(f.mems)
    return sum(
        layer_cell_bytes(f.shape, f.s, i)
        for i in range(n)
        if not f.shape.swa_layers[i] and device_of_layer(i, n, devices) == device
    )


def _per_gpu(m: DeviceMemory, total: float) -> PerGpuMemory:
    from .fit import PerGpuMemory, _gib

    return PerGpuMemory(
        total_gib=_gib(total),
        usable_gib=_gib(total),
        weights_gib=_gib(m.weights),
        activation_gib=_gib(m.compute),
        non_torch_gib=_gib(m.context),
        cuda_graph_gib=0.0,
        cuda_graph_in_budget=True,
        kv_cache_gib=_gib(m.kv),
        headroom_gib=_gib(max(0, total - m.used)),
    )


def _per_layer_kind(shape: Shape, s: Settings) -> dict[str, int]:
    """KV bytes per cell of one layer of each kind (the first of its kind)."""
    out: dict[str, int] = {}
    for i, is_swa in enumerate(shape.swa_layers):
        out.setdefault("sliding" if is_swa else "full", int(round(layer_cell_bytes(shape, s, i))))
    return dict(sorted(out.items()))


def _quantities(f: _Fitted) -> list[Quantity]:
    from .fit import Quantity

    s = f.s
    full_cells, swa_cells = cells(f.shape, s)
    window = f"; window layers {swa_cells:,} cells" if any(f.shape.swa_layers) else ""
    return [
        Quantity(
            name="weights_gib",
            provenance="measured",
            detail=f"{f.model.total_bytes / GiB:.2f} GiB, measured from the GGUF header's tensor "
            f"table ({len(f.model.tensors):,} tensors, {f.model.file_type}); "
            f"{f.host / GiB:.2f} GiB of token embeddings stay in host memory",
        ),
        Quantity(
            name="kv_cache_gib",
            provenance="computed",
            detail=f"{full_cells:,} cells x K {s.type_k} + V {s.type_v}{window} "
            "(llama.cpp allocates exactly -c, padded to 256)",
        ),
        Quantity(
            name="activation_gib",
            provenance="assumed",
            detail=f"compute buffer for a {s.n_ubatch}-token ubatch, modelled (see "
            "llamacpp_fit.compute_buffer_bytes)",
        ),
        Quantity(
            name="non_torch_gib",
            provenance="assumed",
            detail=f"CUDA context ~{CUDA_CONTEXT_GIB} GiB",
        ),
    ]


def _verdict(fits: bool, m: DeviceMemory, total: float, s: Settings) -> str:
    if not fits and m.used <= total:
        return (
            f"Does not fit on the GPUs alone: the fullest needs {m.used / GiB:.2f} GiB of its "
            f"{total / GiB:.2f} GiB, leaving less than the 1,024 MiB llama-server's --fit step "
            "(on by default) keeps free, so it moves layers to the CPU; shorten -c, quantize "
            "the cache or add a GPU (or start with -fit off and no margin)."
        )
    if fits:
        return (
            f"Fits: {s.n_ctx:,} KV cells ({s.slots} slot(s), up to {s.n_ctx_seq:,} tokens each"
            f"{', one shared pool' if s.unified else ''}); {(total - m.used) / GiB:.2f} GiB free "
            "on the fullest GPU."
        )
    return (
        f"Does not fit: weights, KV cache and buffers need {m.used / GiB:.2f} GiB on the fullest "
        f"GPU, more than its {total / GiB:.2f} GiB; llama-server's --fit step (on by default) "
        "moves layers to the CPU (slow), and with -fit off it fails to allocate."
    )


def _answer(req: FitRequest, s: Settings, notes: _Notes) -> QuestionAnswer | None:
    from .fit import QuestionAnswer

    if req.context_tokens is None and req.concurrency is None:
        return None
    ctx = req.context_tokens or s.n_ctx_seq
    conc = req.concurrency or 1
    if conc > s.slots:
        notes.warnings.append(
            f"--concurrency {conc} exceeds the {s.slots} slot(s) (-np): llama-server queues "
            "the rest; raise -np"
        )
    if ctx > s.n_ctx_seq:
        notes.warnings.append(
            f"--context-tokens {ctx:,} exceeds a slot's {s.n_ctx_seq:,} tokens: such requests "
            "are refused or shifted; raise -c"
        )
    if s.unified:
        at_ctx = min(s.slots, s.n_ctx // ctx) if ctx <= s.n_ctx_seq else 0
        at_conc = min(s.n_ctx_seq, s.n_ctx // conc) if conc <= s.slots else 0
    else:
        at_ctx = s.slots if ctx <= s.n_ctx_seq else 0
        at_conc = s.n_ctx_seq if conc <= s.slots else 0
    return QuestionAnswer(
        context_tokens=ctx,
        concurrency=conc,
        fits=at_ctx >= conc,
        max_concurrency_at_context=at_ctx,
        max_context_at_concurrency=at_conc,
    )


def _longest_context(req: FitRequest) -> int | None:
    """-c as the --fit step would set it for this deployment (None: not even its minimum)."""
    from .fit import FitRequest

    data = {k: v for k, v in req.model_dump(exclude_unset=True).items() if k != "ctx_size"}
    auto = estimate_llamacpp(FitRequest.model_validate(data), with_suggestions=False)
    return auto.kv_cache_tokens if auto.fits else None


def _suggestions(req: FitRequest, base: FitResult) -> list[Suggestion]:
    """Recompute with one change: a q8_0 cache, half the context, one more GPU."""
    from .fit import FitRequest, Suggestion

    options: list[tuple[str, str, dict[str, object], str]] = []
    if (req.cache_type_k or "f16") == "f16":
        options.append(
            (
                "quantize the KV cache to q8_0",
                "--cache-type-k q8_0 --cache-type-v q8_0",
                {"cache_type_k": "q8_0", "cache_type_v": "q8_0"},
                "about half the KV memory; small quality risk, needs flash attention",
            )
        )
    if not base.fits and req.ctx_size:
        longest = _longest_context(req)
        if longest:
            options.append(
                (
                    f"the longest context that fits, {longest:,} cells",
                    f"-c {longest}",
                    {"ctx_size": longest},
                    "shorter requests (what llama-server's --fit step would choose)",
                )
            )
    if base.kv_cache_tokens > 2 * CELL_PAD:
        half = base.kv_cache_tokens // 2
        options.append(
            (f"halve the context to {half:,}", f"-c {half}", {"ctx_size": half}, "shorter requests")
        )
    options.append(
        (
            "add a GPU",
            f"--num-gpus {base.num_gpus + 1}",
            {"num_gpus": base.num_gpus + 1},
            "one more GPU; layers split across them",
        )
    )
    out = []
    for change, flags, update, cost in options:
        data = {**req.model_dump(exclude_unset=True), **update}
        try:
            alt = estimate_llamacpp(FitRequest.model_validate(data), with_suggestions=False)
        except (InputError, ValueError):
            continue
        out.append(Suggestion.of(change, flags, alt, cost))
    return out
