"""Memory fit for TensorRT-LLM (``trtllm-serve``, NVIDIA NIM's TensorRT-LLM engines).

TensorRT-LLM sizes its KV cache from what is left, not from a budget of the total: after
the weights and the runtime's own buffers are allocated, the KV cache manager takes
``kv_cache_free_gpu_memory_fraction`` (``KvCacheConfig.free_gpu_memory_fraction``,
default 0.9) of the free memory, in blocks of ``tokens_per_block`` tokens (default 32).
vLLM instead takes ``gpu_memory_utilization`` of the total and subtracts its profiled
peak. Here the weights, activation and non-torch figures are the vLLM accounting's (the
same model, the same batch of tokens in flight: ``max_num_tokens``, default 8192), and
the TensorRT-LLM rule is applied to the rest; ``--gpu-memory-utilization`` stands for
the free-memory fraction.

Defaults: TensorRT-LLM docs, "How to change KV cache behavior" (free_gpu_memory_fraction
0.9) and ``trtllm-serve`` / BuildConfig (max_batch_size 2048, max_num_tokens 8192,
tokens_per_block 32), read 2026-12-03. Admission (GUARANTEED_NO_EVICT, a request starts
only when its whole input + output fits) is the step model's, see
``batching_sim.no_evict_admission``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    from .fit import FitResult, PerGpuMemory, _Notes, _Replica

FREE_MEMORY_FRACTION = 0.9
"""KvCacheConfig.free_gpu_memory_fraction: the share of free memory the KV cache takes."""
MAX_BATCH_SIZE = 2048
"""trtllm-serve --max_batch_size default: requests in flight."""
MAX_NUM_TOKENS = 8192
"""trtllm-serve --max_num_tokens default: tokens in one forward pass."""
TOKENS_PER_BLOCK = 32
"""KvCacheConfig.tokens_per_block default."""
GiB = 1 << 30


def estimate_trtllm(r: _Replica) -> FitResult:
    """The fit under TensorRT-LLM's memory rule (module docstring)."""
    from .fit import _Notes, _result, _vllm, token_pool_answer, token_pool_verdict

    if r.arch.is_hybrid_ssm:
        raise InputError(
            "engine",
            f"TensorRT-LLM's Mamba / linear-attention state pools are not modelled for "
            f"'{r.arch.model_type}'; use --engine vllm",
            accepted="vllm",
        )
    req = r.req
    tokens_in_flight = req.max_num_batched_tokens or MAX_NUM_TOKENS
    seqs = decoding_batch_cap(req.max_num_seqs or MAX_BATCH_SIZE, tokens_in_flight, r.notes)
    as_vllm = req.model_copy(
        update={
            "engine": "vllm",
            "engine_version": None,
            "max_num_batched_tokens": tokens_in_flight,
            "max_num_seqs": min(req.max_num_seqs or _vllm_default_seqs(r), tokens_in_flight),
        }
    )
    runtime = _vllm(replace(r, req=as_vllm, notes=_Notes()), None).per_gpu
    fraction = req.gpu_memory_utilization
    free = r.total - (runtime.weights_gib + runtime.activation_gib + runtime.non_torch_gib) * GiB
    kv_bytes = max(0.0, fraction * free)
    block = req.block_size or TOKENS_PER_BLOCK
    tokens = int(kv_bytes // r.kvb.per_gpu) // block * block if r.kvb.per_gpu > 0 else 0
    _note_assumptions(r, fraction, block, tokens_in_flight)
    max_len = r.max_model_len
    fits, conc, verdict = token_pool_verdict(tokens, max_len, "the KV cache")
    return _result(
        r,
        engine="trtllm",
        engine_version=req.engine_version or "1.0 (defaults)",
        engine_rules_version="1.0",
        fits=fits,
        verdict=verdict,
        max_num_batched_tokens=tokens_in_flight,
        max_num_seqs=seqs,
        block_size=block,
        per_gpu=_per_gpu(r, runtime, free, kv_bytes),
        kv_cache_blocks=tokens // block,
        kv_cache_tokens=tokens,
        max_concurrency=round(conc, 4),
        estimated_max_model_len=None,
        answer=token_pool_answer(req, tokens, max_len),
    )


def _vllm_default_seqs(r: _Replica) -> int:
    """The sequences vLLM's accounting profiles the runtime buffers for when the user gives
    no batch size (its own serve default), so the borrowed buffers match vLLM's."""
    from . import engine_policy as ep

    rules = ep.vllm_rules(None)
    _, seqs, _ = ep.vllm_default_batching(
        rules, r.total_gib, r.gpu_id, r.max_model_len, r.arch.uses_mla
    )
    return seqs


def decoding_batch_cap(max_batch_size: int, max_num_tokens: int, notes: _Notes) -> int:
    """Sequences that can decode in one step. TensorRT-LLM accepts a max_batch_size above
    max_num_tokens (MLPerf configs run 2048 and 1536), unlike vLLM, which refuses to
    start; its scheduler then fits at most max_num_tokens tokens, one per decoding
    sequence, into an iteration, so that is the batch the engine reaches."""
    if max_batch_size <= max_num_tokens:
        return max_batch_size
    notes.assumptions.append(
        f"TensorRT-LLM: max_batch_size {max_batch_size:,} is above max_num_tokens "
        f"{max_num_tokens:,}; an iteration holds at most {max_num_tokens:,} tokens, so at most "
        f"{max_num_tokens:,} sequences decode at once (used as the batch cap)"
    )
    return max_num_tokens


def _note_assumptions(r: _Replica, fraction: float, block: int, tokens_in_flight: int) -> None:
    notes = r.notes
    notes.assumptions.append(
        f"TensorRT-LLM: KV cache = {fraction:g} of the memory free after weights and runtime "
        "buffers (kv_cache_free_gpu_memory_fraction; --gpu-memory-utilization stands for it)"
    )
    notes.assumptions.append(
        f"runtime buffers sized as vLLM's profile of {tokens_in_flight:,} tokens in flight "
        "(TensorRT-LLM's own activation and workspace sizes are not modelled separately)"
    )
    if r.req.block_size is None:
        notes.assumptions.append(f"tokens_per_block {block} (TensorRT-LLM default)")
    if r.arch.sliding_window:
        notes.warnings.append(
            "sliding-window layers counted at the full context (TensorRT-LLM's per-window "
            "pools are not modelled): the KV-cache token count is a lower bound"
        )


def _per_gpu(r: _Replica, runtime: PerGpuMemory, free: float, kv_bytes: float) -> PerGpuMemory:
    from .fit import PerGpuMemory

    used = r.total - free + kv_bytes
    return PerGpuMemory(
        total_gib=round(r.total / GiB, 4),
        usable_gib=round(used / GiB, 4),
        weights_gib=runtime.weights_gib,
        activation_gib=runtime.activation_gib,
        non_torch_gib=runtime.non_torch_gib,
        cuda_graph_gib=0.0,
        cuda_graph_in_budget=False,
        kv_cache_gib=round(kv_bytes / GiB, 4),
        headroom_gib=round(max(0.0, r.total - used) / GiB, 4),
    )
