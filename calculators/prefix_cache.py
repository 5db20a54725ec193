"""Prefix caching as a what-if: prefill only the prompt tokens the cache misses.

With automatic prefix caching (vLLM's default since V1, SGLang's RadixAttention) a
request whose prompt starts with blocks already in the KV cache skips their prefill:
the engine computes only the missed tokens, but their attention still reads the
cached ones. The cached blocks are shared: every running request that uses one
prefix holds it once, so hits also make room in the cache. The price is that the
prefixes themselves live in the cache, and when the running requests need that room
the engine evicts them (LRU) and the hit rate falls: the capacity limit.

The hit rate is the share of prompt tokens served from cache, as vLLM reports it
(``vllm:prefix_cache_hits / vllm:prefix_cache_queries``) and as a workload's
``traffic.shared_prefix_fraction`` describes it. The simulation charges each
request's prefill for ``(1 - hit) x input`` tokens, holds
``distinct prefixes x hit x mean input`` tokens for the shared prefixes, and runs
the same load without hits to say what the cache buys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from .batching_sim import KvCached

MAX_DISTINCT_PREFIXES = 100_000


class PrefixCacheFields(BaseModel):
    """The prefix-caching flags shared by predict and budget."""

    prefix_cache_hit_rate: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Share of prompt tokens served from the prefix cache (their prefill is "
        "skipped); null = no hits.",
    )
    prefix_cache_distinct_prefixes: int = Field(
        default=1,
        ge=1,
        le=MAX_DISTINCT_PREFIXES,
        description="Distinct shared prefixes the hits come from (system prompts, documents); "
        "the cache holds each once.",
    )


class PrefixCacheResult(BaseModel):
    """What the prefix cache buys at this load, against the same load without hits."""

    hit_rate: float = Field(description="The hit rate asked for (share of prompt tokens).")
    effective_hit_rate: float = Field(
        description="The hit rate the cache can hold beside the running requests."
    )
    cached_tokens_per_request: float
    prefill_work_saved_share: float = Field(
        description="Share of prompt tokens not computed (prefill GEMM work saved)."
    )
    shared_prefix_kv_tokens: int = Field(
        description="KV cache tokens the shared prefixes occupy (taken off the capacity)."
    )
    ttft_ms_p50_without_cache: float
    ttft_speedup: float = Field(description="TTFT p50 without hits / with hits.")
    output_tokens_per_s_without_cache: float
    throughput_speedup: float = Field(description="Output tokens/s with hits / without.")
    notes: list[str]


@dataclass(frozen=True)
class PrefixPlan:
    """The hits one simulation runs with, and how they were derived."""

    hit_rate: float
    effective_hit_rate: float
    cached: KvCached
    notes: tuple[str, ...]


def plan_hits(
    req: Any, model: Any, inp: Any, out: Any, concurrency: int | None
) -> PrefixPlan | None:
    """The cached tokens per request at the asked hit rate, limited by what the cache can
    keep beside the running requests; None when no hit rate is given."""
    import numpy as np

    hit = getattr(req, "prefix_cache_hit_rate", None)
    if hit is None:
        return None
    mean_in, mean_out = float(np.mean(inp)), float(np.mean(out))
    distinct = req.prefix_cache_distinct_prefixes
    batch = _running_batch(model, req, hit, mean_in, mean_out, concurrency)
    kept, in_use = _prefixes_kept(
        model, distinct, hit * mean_in, batch, (1 - hit) * mean_in + mean_out / 2
    )
    effective = hit * kept / distinct
    notes: list[str] = []
    if kept < distinct - 0.5:
        notes.append(
            f"about {batch:.0f} running requests use {in_use:.0f} of the {distinct:,} shared "
            f"prefixes at once and the cache keeps about {kept:.0f} of them: the others are "
            f"evicted between uses, so the hit rate falls from {hit:.0%} to about {effective:.0%}"
        )
    tokens = np.floor(effective * np.asarray(inp, dtype=float)).astype(np.int64)
    shared = int(in_use * hit * mean_in)
    return PrefixPlan(hit, effective, KvCached(tokens, False, shared), tuple(notes))


def _running_batch(
    model: Any, req: Any, hit: float, mean_in: float, mean_out: float, concurrency: int | None
) -> float:
    """Requests running at once: a closed loop's concurrency, else Little's law on the
    rate and an idle-engine service time (two fixed-point rounds), within the limits."""
    ctx = mean_in + mean_out / 2
    room = model.context_capacity_tokens(ctx)
    cap_batch = max(1.0, room / max(1.0, (1 - hit) * mean_in + mean_out))
    limit = min(float(model.max_num_seqs), cap_batch)
    rate = getattr(req, "request_rate", None)
    if concurrency is not None or rate is None or math.isinf(rate):
        return min(limit, float(concurrency or limit))
    batch = 1.0
    for _ in range(2):
        service_ms = model.prefill_ms(max(1, int((1 - hit) * mean_in)))
        service_ms += mean_out * model.decode_ms(max(1, round(batch)), ctx)
        batch = min(limit, max(1.0, rate * service_ms / 1e3))
    return batch


def _prefixes_kept(
    model: Any, distinct: int, prefix_tokens: float, batch: float, own_tokens: float
) -> tuple[float, float]:
    """(prefixes the cache holds, prefixes in use), equally popular prefixes: those in use
    by a running request stay (reference-counted blocks); the rest stay only in the free
    room the running requests leave, until LRU eviction needs it."""
    in_use = distinct * (1.0 - (1.0 - 1.0 / distinct) ** batch) if distinct > 1 else 1.0
    free = model.kv_capacity_tokens - in_use * prefix_tokens - batch * own_tokens
    idle_kept = min(distinct - in_use, max(0.0, free) / prefix_tokens) if prefix_tokens else 0.0
    return in_use + idle_kept, in_use


def compare(
    plan: PrefixPlan, inp: Any, ttft_p50_ms: float, tokens_per_s: float, baseline: Any
) -> PrefixCacheResult:
    """The cached run beside the same load without hits (``baseline``: its stats)."""
    import numpy as np

    cached = np.asarray(plan.cached.tokens, dtype=float)
    total = float(np.sum(inp)) or 1.0
    base_ttft = float(np.nanpercentile(baseline.ttft_ms, 50))
    base_tps = float(baseline.output_tokens_per_s)
    return PrefixCacheResult(
        hit_rate=plan.hit_rate,
        effective_hit_rate=plan.effective_hit_rate,
        cached_tokens_per_request=float(cached.mean()),
        prefill_work_saved_share=float(cached.sum()) / total,
        shared_prefix_kv_tokens=int(plan.cached.shared_kv_tokens),
        ttft_ms_p50_without_cache=base_ttft,
        ttft_speedup=base_ttft / ttft_p50_ms if ttft_p50_ms > 0 else 1.0,
        output_tokens_per_s_without_cache=base_tps,
        throughput_speedup=tokens_per_s / base_tps if base_tps > 0 else 1.0,
        notes=[
            *plan.notes,
            "hits skip the prefill of the cached tokens; their attention still reads them",
            "the hit rate is taken as given: it is the workload's (its repeated prefixes), "
            "measure it as vllm:prefix_cache_hits / vllm:prefix_cache_queries",
        ],
    )
