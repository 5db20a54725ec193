"""Prefill/decode disaggregation as a what-if: two pools, a KV transfer between them.

In an aggregated engine every step mixes decodes with prefill chunks, so a long
prompt arriving stretches the inter-token gaps of everyone decoding (chunked
prefill bounds the damage, it does not remove it). Disaggregation (DistServe,
vLLM's NixlConnector, SGLang's PD mode, Dynamo, llm-d) runs prompts on prefill
workers and decodes on decode workers: decodes see no prefill interference, but
each request pays a KV transfer over the network, the two pools must be sized to
each other's rates, and at small scale the worker granularity wastes GPUs.

The model, per replica of P prefill and D decode workers (each one worker of the
deployment's TP x PP GPUs):

1. the prefill pool: requests round-robin over P workers, each simulated as an
   engine that computes the prompt and samples the first token;
2. the transfer: ``input tokens x KV bytes per token / link rate`` (MLA and FP8 KV
   included through the model's KV size), queued FIFO on each prefill worker's
   link, plus a fixed latency per transfer;
3. the decode pool: requests round-robin over D workers in the order their KV
   arrives, each simulated with the prompt's KV already in its cache (it holds it
   from admission) and one step to emit the first token.

TTFT = prefill queue + prefill + transfer + decode queue + the first decode step.
A closed loop (fixed concurrency) is found as a fixed point of Little's law: the
rate that C clients offer is C / mean E2E. The comparison is with P + D aggregated
replicas of the same deployment sharing the same load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from .batching_sim import KvCached, poisson_arrivals_ms, simulate
from .errors import InputError

MAX_WORKERS = 64
"""Per pool; more is a fleet, not a replica."""
MAX_GPUS = 2048
DEFAULT_LINK_GBPS_PER_GPU = 400.0
"""One 400 Gb/s NIC per GPU (ConnectX-7 class), as in H100/H200 HGX nodes; each GPU of a
TP worker sends its shard of the KV over its own NIC."""
WORTH_IT_GAIN = 1.1
"""ITL p95 gain below which disaggregation is within the model's error of aggregated."""
SCAN = (0.25, 0.5, 1.0, 2.0)
"""Load multiples at which the break-even is looked for."""


class DisaggregationFields(BaseModel):
    """The disaggregation flags of predict."""

    disaggregate: str | None = Field(
        default=None,
        pattern=r"^\s*\d{1,4}\s*:\s*\d{1,4}\s*$",
        description="P:D prefill and decode workers per replica, each worker the deployment's "
        "TP x PP GPUs; null = aggregated.",
    )
    kv_transfer_gbps: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        description="KV transfer link per worker, Gbit/s per direction; default 400 per GPU.",
    )
    kv_transfer_latency_ms: float = Field(
        default=1.0, ge=0, le=10_000, description="Fixed cost per KV transfer (setup, first byte)."
    )


@dataclass(frozen=True)
class Split:
    prefill: int
    decode: int
    gpus_per_worker: int

    @property
    def workers(self) -> int:
        return self.prefill + self.decode

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


def parse_split(req: Any, max_gpus: int = MAX_GPUS) -> Split | None:
    """The P:D split of the request, checked against the worker and GPU limits."""
    if req.disaggregate is None:
        return None
    p, d = (int(x) for x in req.disaggregate.split(":"))
    if not (1 <= p <= MAX_WORKERS and 1 <= d <= MAX_WORKERS):
        raise InputError(
            "disaggregate", f"{req.disaggregate}: each pool needs 1 to {MAX_WORKERS} workers", "P:D"
        )
    split = Split(p, d, req.tensor_parallel_size * req.pipeline_parallel_size)
    if split.gpus > max_gpus:
        raise InputError(
            "disaggregate",
            f"{req.disaggregate} with {split.gpus_per_worker} GPUs per worker needs {split.gpus} "
            f"GPUs, more than the {max_gpus} allowed",
        )
    return split


class AggregatedComparison(BaseModel):
    """The same GPUs as P + D aggregated replicas sharing the load."""

    replicas: int
    ttft_ms_p95: float
    itl_ms_p95: float | None
    output_tokens_per_s: float


class LoadPoint(BaseModel):
    load: float = Field(description="Requests/s, or concurrency for a closed loop, per replica.")
    itl_p95_gain: float | None
    ttft_p95_ratio: float


class DisaggregationResult(BaseModel):
    """What the P:D split buys against aggregated replicas on the same GPUs."""

    prefill_workers: int
    decode_workers: int
    gpus: int
    kv_bytes_per_token: float = Field(description="KV bytes moved per prompt token (all layers).")
    kv_transfer_gbps: float
    kv_transfer_ms_p50: float
    kv_transfer_ms_p95: float
    kv_transfer_gbps_needed: float = Field(
        description="Mean Gbit/s each prefill worker's link carries at this load."
    )
    link_utilization: float = Field(description="Busiest prefill link's busy share.")
    prefill_utilization: float = Field(description="Offered prefill work / the pool's capacity.")
    decode_utilization: float = Field(description="Offered decode work / the pool's capacity.")
    balanced_split: str = Field(description="P:D with the same workers that matches the rates.")
    aggregated: AggregatedComparison
    itl_p95_gain: float | None = Field(description="Aggregated ITL p95 / disaggregated.")
    ttft_p95_ratio: float = Field(description="Disaggregated TTFT p95 / aggregated.")
    worth_it: bool
    break_even: str
    scan: list[LoadPoint]
    notes: list[str]


@dataclass
class Outcome:
    """Per-request results of one disaggregated simulation (ms, numpy arrays)."""

    arrival_ms: Any
    ttft_ms: Any
    e2e_ms: Any
    queue_ms: Any
    transfer_ms: Any
    itl_values: Any
    itl_weights: Any
    output_tokens: Any
    duration_ms: float
    link_busy_ms: float
    """Busy time of the busiest prefill link."""

    @property
    def output_tokens_per_s(self) -> float:
        import numpy as np

        done = np.isfinite(self.e2e_ms)
        if self.duration_ms <= 0:
            return 0.0
        return float(self.output_tokens[done].sum()) / (self.duration_ms / 1e3)


@dataclass(frozen=True)
class Link:
    gbps: float
    latency_ms: float
    bytes_per_token: float

    def ms(self, tokens: Any) -> Any:
        return tokens * self.bytes_per_token * 8.0 / (self.gbps * 1e9) * 1e3


def link_of(req: Any, model: Any, split: Split) -> Link:
    gbps = req.kv_transfer_gbps or DEFAULT_LINK_GBPS_PER_GPU * split.gpus_per_worker
    return Link(float(gbps), float(req.kv_transfer_latency_ms), model.shape.kv_bytes_per_token)


def run_open(
    model: Any, split: Split, link: Link, inp: Any, out: Any, arrivals: Any, cached: Any = None
) -> Outcome:
    """Both pools and the transfer for requests arriving at ``arrivals`` (sorted, ms)."""
    import numpy as np

    inp, out, arrivals = (np.asarray(a) for a in (inp, out, arrivals))
    first_done, pf_queue = _prefill_pool(model, split.prefill, inp, arrivals, cached)
    ready, transfer, busy = _transfer(link, split.prefill, first_done, inp)
    first, done, dq, itl_v, itl_w = _decode_pool(model, split.decode, inp, out, ready)
    finite = done[np.isfinite(done)]
    return Outcome(
        arrival_ms=arrivals,
        ttft_ms=first - arrivals,
        e2e_ms=done - arrivals,
        queue_ms=pf_queue + dq,
        transfer_ms=transfer,
        itl_values=itl_v,
        itl_weights=itl_w,
        output_tokens=np.maximum(out, 1),
        duration_ms=float(finite.max() - arrivals.min()) if len(finite) else 0.0,
        link_busy_ms=busy,
    )


def _prefill_pool(
    model: Any, workers: int, inp: Any, arrivals: Any, cached: KvCached | None
) -> tuple[Any, Any]:
    """Each prompt computed on its prefill worker (round robin) and its first token sampled:
    (absolute time the KV is complete, queue time) per request."""
    import numpy as np

    n = len(inp)
    done, queue = np.full(n, np.nan), np.full(n, np.nan)
    for w in range(workers):
        idx = np.arange(w, n, workers)
        if not len(idx):
            continue
        hits = None
        if cached is not None:
            hits = KvCached(np.asarray(cached.tokens)[idx], False, cached.shared_kv_tokens)
        res = simulate(model, inp[idx], np.ones(len(idx)), arrival_ms=arrivals[idx], cached=hits)
        done[idx] = arrivals[idx] + res.ttft_ms
        queue[idx] = res.queue_ms
    return done, queue


def _transfer(link: Link, workers: int, ready_at: Any, inp: Any) -> tuple[Any, Any, float]:
    """FIFO on each prefill worker's link: (absolute arrival at the decode pool, transfer
    ms including the wait for the link, the busiest link's busy ms)."""
    import numpy as np

    n = len(inp)
    arrive = np.full(n, np.nan)
    wire = link.ms(np.asarray(inp, dtype=float))
    busiest = 0.0
    for w in range(workers):
        idx = np.arange(w, n, workers)
        idx = idx[np.argsort(ready_at[idx], kind="stable")]
        free = -math.inf
        for i in idx:
            if not math.isfinite(ready_at[i]):
                continue
            start = max(ready_at[i], free)
            free = start + wire[i]
            arrive[i] = free + link.latency_ms
        busiest = max(busiest, float(np.nansum(wire[idx])))
    return arrive, arrive - ready_at, busiest


def _decode_pool(
    model: Any, workers: int, inp: Any, out: Any, ready: Any
) -> tuple[Any, Any, Any, Any, Any]:
    """Decodes round robin over the decode workers in KV-arrival order, each request's
    prompt KV in the cache from admission: (first token, done, queue, ITL values and
    weights), absolute times."""
    import numpy as np

    n = len(inp)
    first, done, queue = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    order = np.argsort(np.where(np.isfinite(ready), ready, np.inf), kind="stable")
    order = order[np.isfinite(ready[order])]
    values, weights = [], []
    for w in range(workers):
        idx = order[w::workers]
        if not len(idx):
            continue
        kv = KvCached(np.asarray(inp)[idx] - 1, own=True)
        res = simulate(model, inp[idx], out[idx], arrival_ms=ready[idx], cached=kv)
        first[idx] = ready[idx] + res.ttft_ms
        done[idx] = ready[idx] + res.e2e_ms
        queue[idx] = res.queue_ms
        values.append(res.itl_values)
        weights.append(res.itl_weights)
    cat = np.concatenate if values else (lambda _: np.array([]))
    return first, done, queue, cat(values), cat(weights)


def run_load(
    model: Any, split: Split, link: Link, inp: Any, out: Any, load: Any, cached: Any = None
) -> Outcome:
    """The disaggregated replica under predict's load: an open loop's arrivals, everything
    at once (offline), or a closed loop's rate found by Little's law."""
    import numpy as np

    n = len(inp)
    if load.concurrency is None:
        rate = load.request_rate
        if rate is None or math.isinf(rate):
            arrivals = np.zeros(n)
        else:
            arrivals = poisson_arrivals_ms(n, rate, load.burstiness, seed=load.seed)
        return run_open(model, split, link, inp, out, arrivals, cached)
    return _closed_loop(model, split, link, inp, out, load.concurrency, cached)


def _closed_loop(
    model: Any, split: Split, link: Link, inp: Any, out: Any, concurrency: int, cached: Any
) -> Outcome:
    """C clients offer C / mean E2E requests/s: iterate the rate to that fixed point, with
    evenly spaced arrivals (a benchmark's clients do not arrive in bursts)."""
    import numpy as np

    n = len(inp)
    service_ms = model.prefill_ms(int(np.mean(inp))) + float(np.mean(out)) * model.decode_ms(
        max(1, concurrency // max(1, split.decode)), float(np.mean(inp))
    )
    rate = concurrency / max(1e-6, service_ms / 1e3)
    outcome = None
    for _ in range(4):
        outcome = run_open(model, split, link, inp, out, np.arange(n) / rate * 1e3, cached)
        e2e = float(np.nanmean(outcome.e2e_ms))
        implied = concurrency / max(1e-6, e2e / 1e3)
        if abs(implied / rate - 1.0) < 0.03:
            break
        rate = math.sqrt(rate * implied)  # damped: the queue's response is steep
    assert outcome is not None
    return outcome


def as_sim_result(o: Outcome, inp: Any, out: Any) -> Any:
    """The disaggregated outcome in the simulation's own result type, so the budget's
    client-side arithmetic reads it as it reads an aggregated run (engine counters that
    belong to one engine are zero)."""
    import numpy as np

    from .batching_sim import SimResult

    out = np.maximum(np.asarray(out, dtype=np.int64), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (o.e2e_ms - o.ttft_ms) / (out - 1), np.nan)
    return SimResult(
        arrival_ms=o.arrival_ms,
        queue_ms=o.queue_ms,
        ttft_ms=o.ttft_ms,
        e2e_ms=o.e2e_ms,
        tpot_ms=tpot,
        itl_values=o.itl_values,
        itl_weights=o.itl_weights,
        input_tokens=np.asarray(inp, dtype=np.int64),
        output_tokens=out,
        completed=int(np.isfinite(o.e2e_ms).sum()),
        rejected=int((~np.isfinite(o.e2e_ms)).sum()),
        duration_ms=o.duration_ms,
        steps=0,
        preemptions=0,
        mean_decode_batch=0.0,
        max_running=0,
        peak_kv_tokens=0,
    )


def capacity_per_s(model: Any, split: Split, mean_in: float, mean_out: float) -> float:
    """Requests/s the replica sustains: the slower of its two pools."""
    from .disaggregation_eval import capacities

    prefill_rps, decode_rps = capacities(model, mean_in, mean_out)
    return min(split.prefill * prefill_rps, split.decode * decode_rps)
