"""The experiment plan: the response format the seeds require, from a workload (and a run).

Order of the answer, and why:

1. assumptions and missing measurements: what the plan rests on, and what
   must be measured (with the command or metric) before trusting it;
2. targets beside the baseline: the SLOs and what is measured (or, before
   any measurement, computed and labelled so);
3. the ranked hypotheses and how to prove the leading one;
4. stages that each change one variable, least complex first (playbook
   complexity), opened by a baseline (and, for a new service, sizing) and
   closed by a combined end-to-end validation, because optimisations
   interact;
5. acceptance criteria built from this workload's own numbers;
6. facts to verify, with the official pages they came from.

The parts live in modules named for them: plan_parts (output models, helpers),
plan_sizing (greenfield candidates), plan_stages, plan_acceptance (criteria and
facts to verify). Stdlib + pydantic at module level.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferwise.knowledge.diagnosis import (
    DB_HELP,
    RUN_HELP,
    WORKLOAD_HELP,
    FactUsed,
    Hypothesis,
    MissingMeasurement,
    facts_used,
    load_inputs,
    missing_measurements,
    rank,
    verdict,
)
from inferwise.knowledge.evidence import Analysis, analyse
from inferwise.knowledge.plan_acceptance import acceptance_criteria, facts_to_verify
from inferwise.knowledge.plan_parts import (
    URL_PLACEHOLDER,
    AcceptanceCriteria,
    Candidate,
    FactToVerify,
    MetricValue,
    Stage,
    fmt_value,
    peak_rate,
    slo_items,
)
from inferwise.knowledge.plan_sizing import cheapest_alternative, size_candidates
from inferwise.knowledge.plan_stages import build_stages
from inferwise.knowledge.quality_gate import with_quality_gate
from inferwise.knowledge.vocabulary import HYPOTHESES

__all__ = [
    "AcceptanceCriteria",
    "Candidate",
    "FactToVerify",
    "MetricValue",
    "PlanRequest",
    "PlanResult",
    "Stage",
    "plan_experiments",
]


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: str | dict[str, Any] | None = Field(default=None, description=WORKLOAD_HELP)
    run: str | None = Field(default=None, description=RUN_HELP)
    db: str | None = Field(default=None, description=DB_HELP)
    hypothesis: str | None = Field(
        default=None,
        description="Force the leading hypothesis (a hypothesis id, e.g. queueing) instead of the top-ranked one.",
    )
    max_stages: int = Field(
        default=6,
        ge=3,
        le=10,
        description="Most stages in the plan, baseline and validation included.",
    )
    url: str | None = Field(
        default=None,
        max_length=2048,
        description="Endpoint base URL to put into the probe commands (default: the placeholder URL).",
    )
    calibration: str | None = Field(
        default=None,
        max_length=64,
        description="Stored calibration for the predictions (default with run: fitted from the run when it can be).",
    )

    @field_validator("url")
    @classmethod
    def _command_url(cls, v: str | None) -> str | None:
        """The URL is printed into commands a user (or an assistant) copies and runs: an
        http(s) URL without credentials or shell characters, checked for form only."""
        from inferwise.calculators.errors import InputError
        from inferwise.probes.policy import command_url

        try:
            return None if v is None else command_url(v)
        except InputError as e:  # pydantic names the field itself
            raise ValueError(
                e.message + (f" (accepted: {e.accepted})" if e.accepted else "")
            ) from None


class PlanResult(BaseModel):
    workload_name: str | None = None
    mode: Literal["greenfield", "diagnostic"] = Field(
        description="greenfield: nothing measured yet, the plan starts by sizing; diagnostic: measurements exist."
    )
    assumptions: list[str]
    missing_measurements: list[MissingMeasurement]
    targets: list[MetricValue]
    baseline: list[MetricValue] = Field(description="Same metrics as targets, where known.")
    leading_hypothesis: str | None = None
    summary: str = Field(
        default="",
        description="One-paragraph verdict, as in `inferwise diagnose` (says when the measurements show no bottleneck).",
    )
    hypotheses: list[Hypothesis]
    sizing: list[Candidate] = Field(default_factory=list)
    cheapest_meeting_slo: Candidate | None = Field(
        default=None,
        description="Diagnostic mode: the cheapest fleet of the same model on the same GPU type "
        "that meets the SLO (inferwise recommend), to set beside the current deployment.",
    )
    stages: list[Stage]
    acceptance_criteria: AcceptanceCriteria
    facts_to_verify: list[FactToVerify]
    facts: list[FactUsed] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- targets/baseline


def _targets_and_baseline(a: Analysis) -> tuple[list[MetricValue], list[MetricValue]]:
    wl = a.workload
    targets: list[MetricValue] = []
    baseline: list[MetricValue] = []
    for metric, k, v in slo_items(wl):
        name = f"{metric}.{k}"
        targets.append(MetricValue(metric=name, value=v, unit="ms", source="slo"))
        fact = a.facts.get(f"observations.{name}")
        if fact is not None:
            baseline.append(
                MetricValue(
                    metric=name,
                    value=float(fact.value),
                    unit="ms",
                    source="measured",
                    note=fact.note,
                )
            )
            continue
        pred = a.facts.get(f"predicted.{name}")
        if pred is not None:
            baseline.append(
                MetricValue(
                    metric=name,
                    value=float(pred.value),
                    unit="ms",
                    source="computed",
                    note=f"inferwise predict {pred.note}; measure it",
                )
            )
        else:
            baseline.append(
                MetricValue(
                    metric=name, unit="ms", source="missing", note="measure in the baseline stage"
                )
            )
    peak = peak_rate(a)
    if peak is not None:
        targets.append(
            MetricValue(
                metric="requests_per_s",
                value=peak,
                unit="req/s",
                source="stated",
                note="peak = mean x peak_to_mean, sustained under the SLO",
            )
        )
        baseline.append(_rate_baseline(a))
    if wl.slo is not None and wl.slo.error_rate is not None:
        targets.append(MetricValue(metric="error_rate", value=wl.slo.error_rate, source="slo"))
        err = a.facts.get("observations.error_rate")
        baseline.append(
            MetricValue(metric="error_rate", value=float(err.value), source="measured")
            if err is not None
            else MetricValue(metric="error_rate", source="missing")
        )
    if wl.slo is not None and wl.slo.availability is not None:
        targets.append(MetricValue(metric="availability", value=wl.slo.availability, source="slo"))
        baseline.append(
            MetricValue(metric="availability", source="missing", note="from production monitoring")
        )
    if wl.constraints is not None and wl.constraints.budget_usd_per_hour is not None:
        targets.append(
            MetricValue(
                metric="cost_usd_per_hour",
                value=wl.constraints.budget_usd_per_hour,
                unit="USD/h",
                source="stated",
                note="upper bound",
            )
        )
        baseline.append(_cost_baseline(wl))
    return targets, baseline


def _cost_baseline(wl: Any) -> MetricValue:
    """The stated deployment's cost at the price `recommend` would use (the user's price from
    constraints.gpu_prices_usd_per_hour, else the shipped on-demand table)."""
    from inferwise.calculators.catalog import get_gpu
    from inferwise.calculators.errors import InputError
    from inferwise.calculators.prices import price_for, resolve_overrides

    missing = MetricValue(
        metric="cost_usd_per_hour",
        unit="USD/h",
        source="missing",
        note="GPU count x your price per GPU-hour",
    )
    d = wl.deployment
    if d is None or not d.gpu:
        return missing
    try:
        gpu = get_gpu(d.gpu).id
        user = (wl.constraints.gpu_prices_usd_per_hour or {}) if wl.constraints else {}
        price = price_for(gpu, resolve_overrides(user, "constraints.gpu_prices_usd_per_hour"))
    except InputError:
        return missing
    if price is None:
        return missing
    per_replica = d.num_gpus or (d.tensor_parallel_size or 1) * (d.pipeline_parallel_size or 1)
    gpus = per_replica * (d.replicas or 1)
    return MetricValue(
        metric="cost_usd_per_hour",
        value=gpus * price.usd_per_gpu_hour,
        unit="USD/h",
        source="computed",
        note=f"{gpus} x {gpu} at ${price.usd_per_gpu_hour:g}/GPU-hour ({price.source.split(',')[0]})",
    )


def _rate_baseline(a: Analysis) -> MetricValue:
    """Measured throughput, else the one computed capacity the diagnosis also quotes
    (derived.capacity_rps); when no rate meets the SLO, say so and give the saturation rate
    instead of a capacity of 0."""
    rps = a.facts.get("observations.requests_per_s")
    if rps is not None:
        return MetricValue(
            metric="requests_per_s",
            value=float(rps.value),
            unit="req/s",
            source="measured",
            note=rps.note,
        )
    sat = a.value("derived.saturation_rps")
    lower = (
        f"; a lower bound: the deployment already serves the mean {a.value('traffic.arrival_rate_rps'):g} req/s with almost no queue"
        if a.value("derived.capacity_underestimated")
        else ""
    )
    if a.value("derived.no_rate_meets_slo"):
        where = (
            f"; saturation at {fmt_value(sat, 'req/s')} ({a.facts['derived.saturation_rps'].note})"
            if sat
            else ""
        )
        return MetricValue(
            metric="requests_per_s",
            unit="req/s",
            source="computed",
            note=f"no rate meets the SLO at this deployment (`inferwise budget` max_rate_under_slo = 0){where}{lower}",
        )
    cap = a.value("derived.capacity_rps")
    if cap is not None:
        return MetricValue(
            metric="requests_per_s",
            value=float(cap),
            unit="req/s",
            source="computed",
            note=str(a.value("derived.capacity_basis")) + lower,
        )
    return MetricValue(
        metric="requests_per_s",
        unit="req/s",
        source="missing",
        note="find the knee with a rate sweep",
    )


# --------------------------------------------------------------------------- entry point


def agentic_note(a: Analysis, steps: int) -> str:
    """Agentic flows: which targets are per call and which per task, with the budget command
    that checks the task (an e2e target with agent steps applies to the whole task)."""
    from inferwise.knowledge.commands import concretize

    e2e = [f"p{k[1:]}={v:g}" for m, k, v in slo_items(a.workload) if m == "e2e_ms"]
    cmd = concretize(
        "`inferwise budget --agent-steps @task.json --concurrency 1"
        + "".join(f" --slo-e2e-ms {x}" for x in e2e)
        + "`",
        a,
    )
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    example = (
        f'[{{"name": "plan", "input_tokens": {int(inp)}, "output_tokens": {int(out)}}}, '
        '{"name": "search", "kind": "tool", "latency_ms": 300}, ...]'
        if inp and out
        else '[{"name": "plan", "input_tokens": ..., "output_tokens": ...}, {"name": "search", "kind": "tool", "latency_ms": ...}, ...]'
    )
    return (
        f"Agentic flow: TTFT/ITL targets and the probe runs here are per LLM call; the E2E target "
        f"applies to a whole task of {steps} LLM and tool calls, so the probes do not check it. "
        f"Budget the task with {cmd}, where task.json lists the steps in order, e.g. {example}."
    )


def _length_source(a: Analysis) -> str:
    if a.value("traffic.input_tokens.p50") is not None:
        return "the workload's p50"
    return "the stored run's probe settings; state traffic.input_tokens and traffic.output_tokens for production lengths"


def _is_greenfield(a: Analysis) -> bool:
    return a.run is None and not any(k.startswith("observations.") for k in a.facts)


def plan_experiments(req: PlanRequest) -> PlanResult:
    """The full plan for a workload (and optional stored run); see the module docstring."""
    from inferwise.knowledge.calibrated import active_calibration
    from inferwise.knowledge.sizing import calculation_scope, calibration_scope

    wl = load_inputs(req.workload, req.run, req.db)
    applied, notes = active_calibration(req.calibration, req.run, wl, req.db)
    with calculation_scope(), calibration_scope(applied):
        result = _plan(req)
    result.assumptions[:0] = notes
    return result


def _plan(req: PlanRequest) -> PlanResult:
    from inferwise.calculators.errors import InputError

    if req.hypothesis is not None and req.hypothesis not in HYPOTHESES:
        raise InputError(
            "hypothesis", f"unknown hypothesis id {req.hypothesis!r}", ", ".join(HYPOTHESES)
        )
    wl = load_inputs(req.workload, req.run, req.db)
    a = analyse(wl, req.run, req.db)
    greenfield = _is_greenfield(a)
    if greenfield:
        a.put("derived.greenfield", True, "derived")
    hyps, _ = rank(a)
    leading = (
        next((h for h in hyps if h.id == req.hypothesis), None)
        if req.hypothesis
        else (hyps[0] if hyps else None)
    )
    if req.hypothesis and leading is None:
        from inferwise.knowledge.diagnosis import _guide, _playbooks, proof_steps

        g = _guide(req.hypothesis)
        leading = Hypothesis(
            id=req.hypothesis,
            title=HYPOTHESES[req.hypothesis],
            confidence=0.0,
            level="low",
            score=0.0,
            evidence=["Chosen by the user; no evidence in the workload yet."],
            how_to_prove=proof_steps(a, req.hypothesis, req.url),
            decisive_metric=str(g.get("decisive", "")),
            playbooks=_playbooks(req.hypothesis),
        )
        hyps = [leading, *hyps]
    elif leading is not None:
        hyps = [leading, *[h for h in hyps if h.id != leading.id]]

    cands = size_candidates(a) if greenfield else []
    cheapest = None if greenfield else cheapest_alternative(a)
    run_url = a.run.config.get("url") if a.run else None
    url = req.url or run_url or URL_PLACEHOLDER
    stages = with_quality_gate(
        a, build_stages(a, hyps, leading, url, greenfield, cands, req.max_stages)
    )
    targets, baseline = _targets_and_baseline(a)

    assumptions = list(a.assumptions)
    if greenfield:
        assumptions.insert(
            0,
            "Nothing has been measured yet: every baseline number below is computed (labelled 'computed') or missing, never measured.",
        )
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    if inp and out:
        assumptions.append(
            f"Sizing and probe commands use input {int(inp)} / output {int(out)} tokens per request ({_length_source(a)}), with the p95 for context length."
        )
    if (
        a.workload.deployment
        and a.workload.deployment.tensor_parallel_size is None
        and "fit" in a.calcs
        and a.calcs["fit"].result is not None
    ):
        assumptions.append(
            "deployment.tensor_parallel_size is not stated: tensor parallelism 1 is assumed for computations on the stated deployment."
        )
    if wl.traffic is not None and wl.traffic.agentic_steps:
        assumptions.append(agentic_note(a, wl.traffic.agentic_steps))
    if not hyps:
        assumptions.append(
            "No bottleneck hypothesis has evidence yet; the plan establishes the measurements that will produce one."
        )
    notes = [n for n in a.notes if not (cands and n == a.calculators_skipped)]
    notes = list(dict.fromkeys(notes + [n for c in cands for n in c.notes]))

    return PlanResult(
        workload_name=wl.name,
        mode="greenfield" if greenfield else "diagnostic",
        assumptions=list(dict.fromkeys(assumptions)),
        missing_measurements=missing_measurements(a, hyps),
        targets=targets,
        baseline=baseline,
        leading_hypothesis=leading.id if leading else None,
        summary=verdict(a, hyps),
        hypotheses=hyps[:6],
        sizing=cands,
        cheapest_meeting_slo=cheapest,
        stages=stages,
        acceptance_criteria=acceptance_criteria(a, stages),
        facts_to_verify=facts_to_verify(a, stages),
        facts=facts_used(a),
        notes=notes,
    )
