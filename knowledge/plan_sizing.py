"""Greenfield sizing: candidate deployments (GPU x tensor parallelism) computed with the
calculators before anything is rented or measured. Every figure is computed, never measured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferwise.calculators.budget import NO_LOAD_MEETS
from inferwise.knowledge.evidence import Analysis, _typical
from inferwise.knowledge.plan_parts import Candidate, peak_rate

if TYPE_CHECKING:
    from inferwise.calculators.fit import FitResult


def _fit_into(c: Candidate, fit: FitResult, default_context: bool) -> None:
    """The memory fit's answer for one candidate (GPU x TP)."""
    ans = fit.answer
    c.fits = fit.fits
    if not c.fits and ans is not None and ans.fits and default_context:
        # only the model's default context fails to start; the load fits
        c.fits = True
        longest = ans.max_context_at_concurrency
        c.notes.append(
            "set --max-model-len"
            + (f" <= {int(longest):,}" if longest else "")
            + f" (the default {fit.max_model_len:,} does not fit)"
        )
    c.max_concurrency = ans.max_concurrency_at_context if ans is not None else fit.max_concurrency
    c.kv_cache_tokens = fit.kv_cache_tokens


@dataclass(frozen=True)
class _Sizing:
    """The workload's figures every candidate is sized with."""

    inp: float | None
    out: float | None
    context: int | None
    conc: float | None
    peak: float | None
    max_gpus: int | None


def size_candidates(a: Analysis) -> list[Candidate]:
    """The recommender's top fleets where the workload states enough to search (a rate,
    lengths, targets); else fit (and predict/budget where lengths are known) for each
    allowed GPU x TP degree."""
    from inferwise.knowledge.sizing import gpu_info

    wl = a.workload
    if wl.deployment is None or not wl.deployment.model:
        return []
    recommended = _recommended(a)
    if recommended:
        return recommended
    gpus = list(
        dict.fromkeys(
            (wl.constraints.gpus if wl.constraints and wl.constraints.gpus else [])
            + ([wl.deployment.gpu] if wl.deployment.gpu else [])
        )
    )
    if not gpus:
        return []
    max_gpus = wl.constraints.max_gpus if wl.constraints else None
    tps = (
        [wl.deployment.tensor_parallel_size] if wl.deployment.tensor_parallel_size else [1, 2, 4, 8]
    )
    tps = [t for t in tps if max_gpus is None or t <= max_gpus]
    out = a.value("derived.output_tokens_p50")
    p95_in = a.value("derived.input_tokens_p95")
    sizing = _Sizing(
        inp=a.value("derived.input_tokens_p50"),
        out=out,
        context=int(p95_in + (out or 0)) if p95_in else None,
        conc=a.value("traffic.concurrency"),
        peak=peak_rate(a),
        max_gpus=max_gpus,
    )
    cands: list[Candidate] = []
    for gpu in gpus[:4]:
        g, note = gpu_info(gpu)
        if g is None:
            cands.append(Candidate(gpu=gpu, tensor_parallel_size=0, notes=[note or "unknown GPU"]))
            continue
        cands += _candidates_on(wl, g, gpu, tps, sizing)
    return cands


def _candidates_on(wl: Any, g: Any, gpu: str, tps: list[int], sizing: _Sizing) -> list[Candidate]:
    """The candidates on one GPU type, from the smallest tensor-parallel degree up: larger
    degrees only add communication once one fits with room (unless TP is stated)."""
    if not tps:
        return [
            Candidate(
                gpu=g.id,
                tensor_parallel_size=0,
                notes=["no tensor-parallel degree within constraints.max_gpus"],
            )
        ]
    out: list[Candidate] = []
    for tp in tps:
        c = _candidate(wl, g, gpu, tp, sizing)
        out.append(c)
        if (
            c.fits
            and wl.deployment.tensor_parallel_size is None
            and c.max_concurrency
            and c.max_concurrency >= (sizing.conc or 1) * 1.0
            and tp >= 2
        ):
            break
    return out


def _candidate(wl: Any, g: Any, gpu: str, tp: int, sizing: _Sizing) -> Candidate:
    """One GPU x TP: its memory fit, then (if it fits) latency, capacity and replicas."""
    from inferwise.knowledge.sizing import run_fit

    over = {"gpu": gpu, "tensor_parallel_size": tp, "num_gpus": None}
    c = Candidate(gpu=g.id, tensor_parallel_size=tp)
    conc = sizing.conc
    fit = run_fit(wl, sizing.context, int(conc) if conc else None, **over)
    c.notes += fit.notes
    if fit.result is not None:
        _fit_into(c, fit.result, wl.deployment.max_model_len is None)
    if c.fits is False:
        return c
    if sizing.inp and sizing.out:
        _latency_into(c, wl, sizing.inp, sizing.out, over)
    _replicas_into(c, tp, sizing)
    c.notes = list(dict.fromkeys(c.notes))
    return c


def _latency_into(c: Candidate, wl: Any, inp: float, out: float, over: dict[str, Any]) -> None:
    """Predicted latency of a request alone, and the budget's rate under the SLO."""
    from inferwise.knowledge.sizing import run_budget, run_predict

    pred = run_predict(wl, inp, out, concurrency=1, **over)
    if pred.result is not None:
        c.predicted_ttft_ms = _typical(pred.result.ttft_ms)
        c.predicted_itl_ms = _typical(pred.result.itl_ms)
        sat = pred.result.saturation.max_requests_per_s
        c.saturation_requests_per_s = float(sat) if sat else None
    else:
        c.notes += pred.notes
    if wl.slo is None:
        return
    bud = run_budget(wl, inp, out, **over)
    if bud.result is None:
        c.notes += bud.notes
        return
    c.max_rate_under_slo = bud.result.max_rate_under_slo
    # the budget puts the whole peak on one replica; missing the SLO there
    # is what replicas_needed answers. Only "no rate at all" is news.
    if c.max_rate_under_slo == 0:
        c.notes.append(f"no rate meets the SLO on one replica: {NO_LOAD_MEETS}")


def _replicas_into(c: Candidate, tp: int, sizing: _Sizing) -> None:
    """Replicas for the peak at the candidate's capacity, and the GPUs they take."""
    # no rate meets the SLO on one replica: more replicas cannot fix a per-request
    # latency, so there is no replica count to give (the table says "none")
    capacity = (
        None if c.max_rate_under_slo == 0 else c.max_rate_under_slo or c.saturation_requests_per_s
    )
    if not (capacity and sizing.peak):
        return
    c.replicas_needed = max(1, math.ceil(sizing.peak / capacity))
    if c.max_rate_under_slo is None:
        c.notes.append("replicas from the saturation throughput (no SLO check): a lower bound")
    c.gpus_needed = c.replicas_needed * tp
    if sizing.max_gpus is not None:
        c.within_max_gpus = c.gpus_needed <= sizing.max_gpus
        if not c.within_max_gpus:
            c.notes.append(f"needs {c.gpus_needed} GPUs > constraints.max_gpus {sizing.max_gpus}")


PLAN_TOP = 3
"""Fleets the plan's sizing table shows (``inferwise recommend`` lists more)."""


def cheapest_alternative(a: Analysis) -> Candidate | None:
    """The cheapest fleet of the running model on its GPU type that meets the SLO (or none)."""
    wl = a.workload
    if wl.deployment is None or not wl.deployment.model or not wl.deployment.gpu:
        return None
    found = _recommended(a, gpus=[wl.deployment.gpu], top=1)
    return found[0] if found and found[0].meets_slo else None


def _recommended(a: Analysis, gpus: list[str] | None = None, top: int = 0) -> list[Candidate]:
    """``inferwise recommend`` on the workload, its candidates as the plan's table; empty when
    the workload lacks what the search needs (the plan then sizes by fit alone)."""
    from inferwise.calculators.errors import InputError
    from inferwise.knowledge.recommending import RecommendRequest, recommend_deployment

    wl = a.workload
    if wl.slo is None or wl.traffic is None or not wl.traffic.arrival_rate_rps:
        return []
    gpus = (
        gpus
        or (wl.constraints.gpus if wl.constraints and wl.constraints.gpus else [])
        or ([wl.deployment.gpu] if wl.deployment and wl.deployment.gpu else [])
    )
    data = wl.model_dump(
        exclude_none=True, include={"product", "traffic", "slo", "constraints", "deployment"}
    )
    try:
        result = recommend_deployment(
            RecommendRequest(
                workload=data, gpus=gpus[:4], model=[wl.deployment.model], top=PLAN_TOP
            )
        )
    except InputError:
        return []
    return [_from_recommendation(c) for c in result.candidates]


def _from_recommendation(c: Any) -> Candidate:
    return Candidate(
        gpu=c.gpu,
        tensor_parallel_size=c.tensor_parallel_size,
        fits=True,
        kv_cache_tokens=c.kv_cache_tokens,
        predicted_ttft_ms=c.predicted.ttft_ms.p95,
        predicted_itl_ms=c.predicted.itl_ms.p95 if c.predicted.itl_ms else None,
        max_rate_under_slo=c.max_rate_under_slo_per_replica,
        replicas_needed=c.replicas + c.spare_replicas,
        gpus_needed=c.total_gpus,
        within_max_gpus=not any(n.startswith("over constraints.max_gpus") for n in c.notes),
        quantization=c.quantization,
        kv_cache_dtype=c.kv_cache_dtype,
        max_model_len=c.max_model_len,
        usd_per_hour=c.usd_per_hour,
        meets_slo=c.meets_slo,
        serve_command=c.serve_command,
        notes=[
            "inferwise recommend: p95 latencies at the design load; "
            + ("meets every target" if c.meets_slo else "misses a target"),
            *c.notes[:2],
        ],
    )
