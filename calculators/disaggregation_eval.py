"""What a P:D split buys: the disaggregated replica beside aggregated replicas on the
same GPUs, its pools' utilisation, the link it needs, and the load where it starts
to pay. The simulation itself is in :mod:`.disaggregation`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .disaggregation import (
    SCAN,
    WORTH_IT_GAIN,
    AggregatedComparison,
    DisaggregationResult,
    LoadPoint,
    Outcome,
    Split,
    link_of,
    run_load,
)

Aggregated = Callable[[float], AggregatedComparison]
"""The aggregated replicas' figures at a multiple of the design load."""


@dataclass(frozen=True)
class DesignLoad:
    concurrency: int | None
    request_rate: float | None
    burstiness: float
    seed: int

    def scaled(self, m: float) -> DesignLoad:
        if self.concurrency is not None:
            return DesignLoad(max(1, round(self.concurrency * m)), None, self.burstiness, self.seed)
        rate = self.request_rate
        scaled = rate * m if rate is not None and math.isfinite(rate) else rate
        return DesignLoad(None, scaled, self.burstiness, self.seed)

    @property
    def value(self) -> float:
        if self.concurrency is not None:
            return float(self.concurrency)
        return float(self.request_rate) if self.request_rate is not None else math.inf


def design_load(req: Any) -> DesignLoad:
    conc = req.concurrency
    if conc is None and req.request_rate is None:
        conc = 1
    return DesignLoad(conc, req.request_rate, req.burstiness, req.seed)


def evaluate(
    req: Any,
    model: Any,
    split: Split,
    arrays: tuple[Any, Any, Any],
    aggregated: Aggregated,
) -> tuple[Outcome, DisaggregationResult]:
    """The disaggregated run at the design load and its comparison (``arrays``: inputs,
    outputs, prefix-cache hits or None)."""
    import numpy as np

    inp, out, cached = arrays
    link = link_of(req, model, split)
    load = design_load(req)
    outcome = run_load(model, split, link, inp, out, load, cached)
    agg = aggregated(1.0)
    rate = _completed_per_s(outcome)
    caps = capacities(model, float(np.mean(inp)), float(np.mean(out)))
    scan = _scan(req, model, split, link, arrays, aggregated)
    gain, ttft_ratio = _gain(outcome, agg)
    transfer = outcome.transfer_ms[np.isfinite(outcome.transfer_ms)]
    result = DisaggregationResult(
        prefill_workers=split.prefill,
        decode_workers=split.decode,
        gpus=split.gpus,
        kv_bytes_per_token=float(model.shape.kv_bytes_per_token),
        kv_transfer_gbps=link.gbps,
        kv_transfer_ms_p50=float(np.percentile(transfer, 50)) if len(transfer) else 0.0,
        kv_transfer_ms_p95=float(np.percentile(transfer, 95)) if len(transfer) else 0.0,
        kv_transfer_gbps_needed=rate
        / split.prefill
        * float(np.mean(inp))
        * link.bytes_per_token
        * 8
        / 1e9,
        link_utilization=min(1.0, outcome.link_busy_ms / max(1e-9, outcome.duration_ms)),
        prefill_utilization=rate / (split.prefill * caps[0]),
        decode_utilization=rate / (split.decode * caps[1]),
        balanced_split=_balanced(split.workers, *caps),
        aggregated=agg,
        itl_p95_gain=gain,
        ttft_p95_ratio=ttft_ratio,
        worth_it=_worth_it(gain, ttft_ratio),
        break_even=_break_even(scan, load),
        scan=scan,
        notes=_notes(req, split, link),
    )
    return outcome, result


def _completed_per_s(o: Outcome) -> float:
    import numpy as np

    done = int(np.isfinite(o.e2e_ms).sum())
    return done / (o.duration_ms / 1e3) if o.duration_ms > 0 else 0.0


def capacities(model: Any, mean_in: float, mean_out: float) -> tuple[float, float]:
    """Requests/s one worker sustains: a prefill worker packing prompts into full chunks,
    a decode worker at the batch its KV cache and max_num_seqs allow."""
    per_step = max(1, int(model.max_num_batched_tokens // max(1.0, mean_in)))
    tokens = per_step * mean_in
    step_ms = model.step_ms(tokens, 0, 0, prefill_pairs=per_step * mean_in**2 / 2, sampled=per_step)
    if mean_in > model.max_num_batched_tokens:
        step_ms = model.prefill_ms(int(mean_in))
    prefill_rps = per_step / (step_ms / 1e3)
    room = model.context_capacity_tokens(mean_in + mean_out / 2.0)
    batch = max(1, min(model.max_num_seqs, int(room // (mean_in + mean_out))))
    decode_ms = mean_out * model.decode_ms(batch, mean_in + mean_out / 2)
    return prefill_rps, batch / (decode_ms / 1e3)


def _balanced(workers: int, prefill_rps: float, decode_rps: float) -> str:
    """The P:D split of the same workers whose pools sustain the same rate."""
    share = (1 / prefill_rps) / (1 / prefill_rps + 1 / decode_rps)
    p = min(workers - 1, max(1, round(workers * share)))
    return f"{p}:{workers - p}"


def _gain(o: Outcome, agg: AggregatedComparison) -> tuple[float | None, float]:
    from .predict import percentiles, weighted_percentiles

    itl = weighted_percentiles(o.itl_values, o.itl_weights)
    ttft = percentiles(o.ttft_ms)
    gain = agg.itl_ms_p95 / itl.p95 if itl and agg.itl_ms_p95 and itl.p95 > 0 else None
    ratio = ttft.p95 / agg.ttft_ms_p95 if ttft and agg.ttft_ms_p95 > 0 else math.inf
    return gain, ratio


def _worth_it(gain: float | None, ttft_ratio: float) -> bool:
    """Pays when decodes get markedly smoother without a TTFT much worse, or when TTFT
    gets markedly better (prefill no longer waits behind decodes) at no ITL cost."""
    if gain is None:
        return False
    return (gain >= WORTH_IT_GAIN and ttft_ratio <= 1.2) or (ttft_ratio <= 0.8 and gain >= 1.0)


def _scan(
    req: Any, model: Any, split: Split, link: Any, arrays: Any, aggregated: Aggregated
) -> list[LoadPoint]:
    """The gain at a few multiples of the design load (fewer requests each)."""
    inp, out, cached = arrays
    n = min(len(inp), 300)
    sub = None if cached is None else replace(cached, tokens=cached.tokens[:n])
    points = []
    for m in SCAN:
        load = design_load(req).scaled(m)
        o = run_load(model, split, link, inp[:n], out[:n], load, sub)
        gain, ratio = _gain(o, aggregated(m))
        points.append(LoadPoint(load=load.value, itl_p95_gain=gain, ttft_p95_ratio=ratio))
    return points


def _break_even(scan: list[LoadPoint], load: DesignLoad) -> str:
    """Where along the load scan the split starts to pay, in words."""
    unit = "concurrency" if load.concurrency is not None else "requests/s"
    paying = [p for p in scan if _worth_it(p.itl_p95_gain, p.ttft_p95_ratio)]
    loads = ", ".join(f"{p.load:.3g}" for p in scan)
    if not paying:
        return _no_break_even(scan, f"{unit} {loads} per replica")
    first = paying[0]
    if first is scan[0]:
        return f"disaggregation pays from the lowest load scanned ({unit} {first.load:.3g} per replica) up"
    return (
        f"disaggregation starts to pay at about {unit} {first.load:.3g} per replica; below it "
        "aggregated chunked prefill is as good"
    )


def _no_break_even(scan: list[LoadPoint], where: str) -> str:
    """No load pays outright: name the trade the split makes instead, if it makes one."""
    smoother = [p for p in scan if (p.itl_p95_gain or 0) >= WORTH_IT_GAIN]
    faster_first = [p for p in scan if p.ttft_p95_ratio <= 0.8]
    if smoother:
        best = max(smoother, key=lambda p: p.itl_p95_gain or 0)
        return (
            f"at the loads scanned ({where}) the split buys ITL p95 (up to x"
            f"{best.itl_p95_gain:.2f}) only at a TTFT cost (x{best.ttft_p95_ratio:.2f} there): "
            "worth it where ITL binds and TTFT has room"
        )
    if faster_first:
        return (
            f"at the loads scanned ({where}) the split buys TTFT p95 (prompts no longer queue "
            "behind decodes) at an ITL cost: worth it only where TTFT binds"
        )
    return f"aggregated chunked prefill is as good at every load scanned ({where})"


def _notes(req: Any, split: Split, link: Any) -> list[str]:
    notes = [
        f"{split.prefill} prefill + {split.decode} decode workers of {split.gpus_per_worker} GPU(s) "
        f"each ({split.gpus} GPUs), compared with {split.workers} aggregated replicas",
        "requests round-robin over each pool; the decode worker emits the first token",
    ]
    if req.kv_transfer_gbps is None:
        notes.append(
            f"KV link {link.gbps:g} Gbit/s per worker assumed (400 Gbit/s per GPU); set "
            "kv_transfer_gbps to your fabric's per-direction rate"
        )
    if req.concurrency is not None:
        notes.append("closed loop: the rate C clients offer found by Little's law (fixed point)")
    return notes


def aggregated_share(req: Any, split: Split, m: float = 1.0) -> Any:
    """The request as one of P + D aggregated replicas sharing ``m`` x its load."""
    load = design_load(req).scaled(m)
    if load.concurrency is not None:
        return req.model_copy(
            update={"concurrency": max(1, math.ceil(load.concurrency / split.workers))}
        )
    rate = load.request_rate
    if rate is not None and math.isfinite(rate):
        return req.model_copy(update={"request_rate": rate / split.workers})
    return req


def for_predict(req: Any, model: Any, split: Split, design_run: Any) -> tuple[Outcome, Any]:
    """The disaggregated outcome for predict, with its comparison against aggregated
    replicas (``design_run``: predict's aggregated run at the design load's share)."""
    import numpy as np

    from .predict import default_num_requests, run_load, weighted_percentiles, workload_arrays
    from .prefix_cache import plan_hits

    def aggregated(m: float) -> AggregatedComparison:
        run = design_run if m == 1.0 else run_load(aggregated_share(req, split, m), model, 200)
        itl = weighted_percentiles(run.stats.itl_values, run.stats.itl_weights)
        return AggregatedComparison(
            replicas=split.workers,
            ttft_ms_p95=float(np.percentile(run.stats.ttft_ms, 95)),
            itl_ms_p95=itl.p95 if itl else None,
            output_tokens_per_s=run.stats.output_tokens_per_s * split.workers,
        )

    load = design_load(req)
    n = req.num_requests or default_num_requests(load.concurrency, load.request_rate)
    inp, out = workload_arrays(req, n, getattr(req, "max_model_len", None))
    per_worker = None if load.concurrency is None else max(1, load.concurrency // split.prefill)
    hits = plan_hits(req, model, inp, out, per_worker)
    return evaluate(req, model, split, (inp, out, hits and hits.cached), aggregated)
