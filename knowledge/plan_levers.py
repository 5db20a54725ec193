"""What a serving-lever stage of the plan is predicted to buy, before anyone measures it.

The plan's stages for prefix caching, speculative decoding and prefill/decode
disaggregation used to list the playbook's qualitative effects only. When the
workload names a deployment the calculators can model, the stage now also says
what `inferwise predict` expects at the workload's own load with that lever on,
next to the command that reproduces the number, so the experiment has a stated
expectation to confirm or refute.
"""

from __future__ import annotations

from typing import Any

from inferwise.knowledge.evidence import Analysis
from inferwise.knowledge.sizing import run_predict

LEVERS = ("prefix_caching", "prompt_restructuring", "speculative_decoding", "pd_disaggregation")
SPEC_METHOD = "eagle3"
"""The drafter the prediction assumes (published chat acceptance; measure yours)."""


def lever_lines(a: Analysis, playbook_id: str) -> list[str]:
    """The predicted effect of the playbook's lever at the workload's load, or why there is
    none; empty for playbooks that are not one of :data:`LEVERS`."""
    if playbook_id not in LEVERS:
        return []
    base = a.calcs.get("predict")
    if base is None or base.result is None:
        return [f"Predicted: not computed ({_why_not(a)})."]
    load = _load_of(base.request)
    if playbook_id in ("prefix_caching", "prompt_restructuring"):
        return _prefix(a, load)
    if playbook_id == "speculative_decoding":
        return _speculative(a, load)
    return _disaggregation(a, load)


def _why_not(a: Analysis) -> str:
    return a.calculators_skipped or "the workload names no deployment the calculators can model"


def _load_of(request: dict[str, Any]) -> dict[str, Any]:
    """The lengths and load predict ran the workload at, as run_predict's arguments."""
    keys = ("input_tokens", "output_tokens", "concurrency", "request_rate")
    return {k: request[k] for k in keys if request.get(k) is not None}


def _prefix(a: Analysis, load: dict[str, Any]) -> list[str]:
    """The workload's shareable prefix as hits, against the hit rate measured now (none
    when caching is off or nothing was measured)."""
    target = a.value("traffic.shared_prefix_fraction")
    now = a.value("observations.prefix_cache_hit_rate") or 0.0
    if target is None or target <= now:
        return [
            "Predicted: give traffic.shared_prefix_fraction (the share of prompt tokens that "
            "repeats) above the measured hit rate for the expected TTFT and throughput gain."
        ]
    after = run_predict(a.workload, **load, prefix_cache_hit_rate=float(target))
    before = run_predict(a.workload, **load, prefix_cache_hit_rate=float(now))
    if after.result is None or before.result is None:
        notes = "; ".join(after.notes + before.notes) or "predict failed"
        return [f"Predicted: not computed ({notes})."]
    pc = after.result.prefix_cache
    t0, t1 = before.result.ttft_ms.p50, after.result.ttft_ms.p50
    tps = after.result.output_tokens_per_s / max(1e-9, before.result.output_tokens_per_s)
    return [
        f"Predicted at the workload's load, prompt-token hit rate {now:.0%} -> "
        f"{pc.effective_hit_rate:.0%}: TTFT p50 {t0:,.0f} -> {t1:,.0f} ms (x{t0 / max(t1, 1e-9):.2f}), "
        f"output tokens/s x{tps:.2f} (`inferwise predict ... --prefix-cache-hit-rate {target:g}`)."
    ]


def _speculative(a: Analysis, load: dict[str, Any]) -> list[str]:
    out = run_predict(a.workload, **load, speculative_method=SPEC_METHOD)
    spec = out.result.speculative if out.result else None
    if spec is None:
        return [f"Predicted: not computed ({'; '.join(out.notes) or 'predict failed'})."]
    verdict = (
        "worth trying"
        if spec.throughput_speedup > 1.05
        else "not worth it at this load (the verify step is compute-bound)"
    )
    return [
        f"Predicted with {SPEC_METHOD.upper()} (K={spec.num_speculative_tokens}, published chat "
        f"acceptance {spec.tokens_per_step:.2f} tokens/step; yours may differ): ITL x"
        f"{spec.itl_speedup:.2f}, throughput x{spec.throughput_speedup:.2f}: {verdict}"
        f" (`inferwise predict ... --speculative-method {SPEC_METHOD}`)."
    ]


def _disaggregation(a: Analysis, load: dict[str, Any]) -> list[str]:
    out = run_predict(a.workload, **load, disaggregate="1:1")
    d = out.result.disaggregation if out.result else None
    if d is None:
        return [f"Predicted: not computed ({'; '.join(out.notes) or 'predict failed'})."]
    gain = f"x{d.itl_p95_gain:.2f}" if d.itl_p95_gain else "n/a"
    return [
        f"Predicted for 1 prefill + 1 decode worker against 2 aggregated replicas: ITL p95 "
        f"{gain}, TTFT p95 x{d.ttft_p95_ratio:.2f}, {'worth it' if d.worth_it else 'not worth it'}; "
        f"{d.break_even}; balanced split {d.balanced_split}; the link carries "
        f"{d.kv_transfer_gbps_needed:.1f} Gbit/s (`inferwise predict ... --disaggregate 1:1`)."
    ]
