"""Greenfield sizing: candidate deployments (GPU x tensor parallelism) computed with the
calculators before anything is rented or measured. Every figure is computed, never measured."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

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


def size_candidates(a: Analysis) -> list[Candidate]:
    """Fit (and predict/budget where lengths are known) for each allowed GPU x TP degree."""
    from inferwise.knowledge.sizing import gpu_info, run_budget, run_fit, run_predict

    wl = a.workload
    if wl.deployment is None or not wl.deployment.model:
        return []
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
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    p95_in = a.value("derived.input_tokens_p95")
    context = int(p95_in + (out or 0)) if p95_in else None
    conc = a.value("traffic.concurrency")
    peak = peak_rate(a)
    cands: list[Candidate] = []
    for gpu in gpus[:4]:
        g, note = gpu_info(gpu)
        if g is None:
            cands.append(Candidate(gpu=gpu, tensor_parallel_size=0, notes=[note or "unknown GPU"]))
            continue
        found_fit = False
        for tp in tps:
            over = {"gpu": gpu, "tensor_parallel_size": tp, "num_gpus": None}
            c = Candidate(gpu=g.id, tensor_parallel_size=tp)
            fit = run_fit(wl, context, int(conc) if conc else None, **over)
            c.notes += fit.notes
            if fit.result is not None:
                _fit_into(c, fit.result, wl.deployment.max_model_len is None)
            if c.fits is False:
                cands.append(c)
                continue
            if inp and out:
                pred = run_predict(wl, inp, out, concurrency=1, **over)
                if pred.result is not None:
                    c.predicted_ttft_ms = _typical(pred.result.ttft_ms)
                    c.predicted_itl_ms = _typical(pred.result.itl_ms)
                    sat = pred.result.saturation.max_requests_per_s
                    c.saturation_requests_per_s = float(sat) if sat else None
                else:
                    c.notes += pred.notes
                if wl.slo is not None:
                    bud = run_budget(wl, inp, out, **over)
                    if bud.result is not None:
                        c.max_rate_under_slo = bud.result.max_rate_under_slo
                        # the budget puts the whole peak on one replica; missing the SLO there
                        # is what replicas_needed answers. Only "no rate at all" is news.
                        if c.max_rate_under_slo == 0:
                            c.notes.append(f"no rate meets the SLO on one replica: {NO_LOAD_MEETS}")
                    else:
                        c.notes += bud.notes
            # no rate meets the SLO on one replica: more replicas cannot fix a per-request
            # latency, so there is no replica count to give (the table says "none")
            capacity = (
                None
                if c.max_rate_under_slo == 0
                else c.max_rate_under_slo or c.saturation_requests_per_s
            )
            if capacity and peak:
                c.replicas_needed = max(1, math.ceil(peak / capacity))
                if c.max_rate_under_slo is None:
                    c.notes.append(
                        "replicas from the saturation throughput (no SLO check): a lower bound"
                    )
                c.gpus_needed = c.replicas_needed * tp
                if max_gpus is not None:
                    c.within_max_gpus = c.gpus_needed <= max_gpus
                    if not c.within_max_gpus:
                        c.notes.append(
                            f"needs {c.gpus_needed} GPUs > constraints.max_gpus {max_gpus}"
                        )
            c.notes = list(dict.fromkeys(c.notes))
            cands.append(c)
            if c.fits:
                found_fit = True
                if (
                    wl.deployment.tensor_parallel_size is None
                    and c.max_concurrency
                    and c.max_concurrency >= (conc or 1) * 1.0
                    and tp >= 2
                ):
                    break  # larger TP only adds communication once this one fits with room
        if not found_fit and not tps:
            cands.append(
                Candidate(
                    gpu=g.id,
                    tensor_parallel_size=0,
                    notes=["no tensor-parallel degree within constraints.max_gpus"],
                )
            )
    return cands
