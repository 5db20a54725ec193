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

Stdlib + pydantic at module level.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
)
from inferwise.knowledge.evidence import Analysis, _typical, analyse
from inferwise.knowledge.rule_engine import load_table
from inferwise.knowledge.vocabulary import HYPOTHESES
from inferwise.knowledge.workload import Workload


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
        description="Endpoint base URL to put into the probe commands (default: the placeholder URL).",
    )


class MetricValue(BaseModel):
    metric: str = Field(description="e.g. ttft_ms.p95, itl_ms.p95, requests_per_s, availability.")
    value: float | None = None
    unit: str = ""
    source: Literal["slo", "stated", "measured", "computed", "missing"]
    note: str = ""


class Stage(BaseModel):
    title: str
    variable: str = Field(
        description="The one variable this stage changes ('none' for measurement stages)."
    )
    hypothesis: str | None = Field(default=None, description="Hypothesis id the stage tests.")
    playbook: str | None = None
    complexity: int | None = Field(
        default=None, description="Playbook complexity 1 (flag) .. 5 (architecture)."
    )
    change: str
    measure: list[str]
    decisive_metric: str = ""
    expected_tradeoffs: list[str]
    acceptance: list[str]
    rollback: str


class AcceptanceCriteria(BaseModel):
    quality: list[str]
    tail_latency: list[str]
    reliability: list[str]
    security: list[str]
    cost: list[str]


class FactToVerify(BaseModel):
    claim: str
    source_url: str


class Candidate(BaseModel):
    """One sized deployment option (computed, not measured)."""

    gpu: str
    tensor_parallel_size: int
    fits: bool | None = None
    max_concurrency: float | None = None
    kv_cache_tokens: int | None = None
    predicted_ttft_ms: float | None = None
    predicted_itl_ms: float | None = None
    max_rate_under_slo: float | None = None
    saturation_requests_per_s: float | None = Field(
        default=None, description="Throughput ceiling from `inferwise predict`, ignoring SLOs."
    )
    replicas_needed: int | None = None
    gpus_needed: int | None = None
    within_max_gpus: bool | None = None
    notes: list[str] = Field(default_factory=list)


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
    hypotheses: list[Hypothesis]
    sizing: list[Candidate] = Field(default_factory=list)
    stages: list[Stage]
    acceptance_criteria: AcceptanceCriteria
    facts_to_verify: list[FactToVerify]
    facts: list[FactUsed] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


URL_PLACEHOLDER = "http://HOST:PORT"
ENGINE_DOCS = {
    "vllm": "https://docs.vllm.ai/en/latest/configuration/engine_args/",
    "sglang": "https://docs.sglang.io/docs/advanced_features/server_arguments",
    "tensorrt-llm": "https://nvidia.github.io/TensorRT-LLM/",
    "tgi": "https://huggingface.co/docs/text-generation-inference/index",
    "llama.cpp": "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
    "lmdeploy": "https://lmdeploy.readthedocs.io/en/latest/",
}
METRICS_DOCS = {
    "vllm": "https://docs.vllm.ai/en/latest/design/metrics/",
    "sglang": "https://docs.sglang.io/docs/advanced_features/observability",
}


# --------------------------------------------------------------------------- helpers


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "?"
    text = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{text} {unit}".strip()


def _engine(wl: Workload) -> str:
    return (wl.deployment.engine if wl.deployment and wl.deployment.engine else None) or "vllm"


def _peak_rate(a: Analysis) -> float | None:
    return a.value("derived.peak_rate_rps")


def _slo_items(wl: Workload) -> list[tuple[str, str, float]]:
    out = []
    if wl.slo is None:
        return out
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        pct = getattr(wl.slo, metric)
        if pct is None:
            continue
        for k in ("p50", "p90", "p95", "p99"):
            v = getattr(pct, k)
            if v is not None:
                out.append((metric, k, float(v)))
    return out


def probe_command(a: Analysis, url: str, label: str, rate: float | None = None) -> str:
    """The `inferwise probe` command that reproduces this workload's load shape."""
    wl = a.workload
    parts = ["inferwise probe", url]
    if wl.deployment and wl.deployment.model:
        parts.append(f"--model {wl.deployment.model}")
    rate = rate if rate is not None else a.value("traffic.arrival_rate_rps")
    conc = a.value("traffic.concurrency") or a.value("observations.concurrency")
    if a.value("traffic.mode") == "offline" and label not in ("overload",):
        # offline work is measured saturated (closed loop), not at an arrival rate
        parts.append(f"--concurrency {int(conc or a.value('deployment.max_num_seqs') or 256)}")
    elif rate:
        parts.append(f"--request-rate {rate:g}")
    elif conc:
        parts.append(f"--concurrency {int(conc)}")
    else:
        parts.append("--sweep 1,4,16,64")
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    parts.append(f"--input-tokens {int(inp)}" if inp else "--input-tokens <p50 prompt tokens>")
    parts.append(f"--output-tokens {int(out)}" if out else "--output-tokens <p50 output tokens>")
    shared = a.value("traffic.shared_prefix_fraction")
    if shared:
        parts.append(f"--shared-prefix-fraction {shared:g}")
    parts += ["--requests 500", "--warmup-requests 20"]
    slo = [f"--slo {m}={v:g}" for m, k, v in _slo_items(wl) if k in ("p95", "p99")][:3]
    parts += slo
    parts.append(f"--label stage={label}")
    return " ".join(parts)


# --------------------------------------------------------------------------- targets/baseline


def _targets_and_baseline(a: Analysis) -> tuple[list[MetricValue], list[MetricValue]]:
    wl = a.workload
    targets: list[MetricValue] = []
    baseline: list[MetricValue] = []
    for metric, k, v in _slo_items(wl):
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
    peak = _peak_rate(a)
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
        rps = a.facts.get("observations.requests_per_s")
        cap = a.value("budget.max_rate_under_slo")
        if rps is not None:
            baseline.append(
                MetricValue(
                    metric="requests_per_s", value=float(rps.value), unit="req/s", source="measured"
                )
            )
        elif cap is not None:
            replicas = a.value("derived.replicas") or 1
            baseline.append(
                MetricValue(
                    metric="requests_per_s",
                    value=float(cap) * replicas,
                    unit="req/s",
                    source="computed",
                    note="max rate under the SLO (inferwise budget) x replicas",
                )
            )
        else:
            baseline.append(
                MetricValue(
                    metric="requests_per_s",
                    unit="req/s",
                    source="missing",
                    note="find the knee with a rate sweep",
                )
            )
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
        baseline.append(
            MetricValue(
                metric="cost_usd_per_hour",
                unit="USD/h",
                source="missing",
                note="GPU count x your price per GPU-hour",
            )
        )
    return targets, baseline


# --------------------------------------------------------------------------- sizing (greenfield)


def _sizing(a: Analysis) -> list[Candidate]:
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
    peak = _peak_rate(a)
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
            if fit.result:
                ans = fit.result.get("answer") or {}
                c.fits = bool(fit.result.get("fits"))
                c.max_concurrency = ans.get(
                    "max_concurrency_at_context", fit.result.get("max_concurrency")
                )
                c.kv_cache_tokens = fit.result.get("kv_cache_tokens")
            if c.fits is False:
                cands.append(c)
                continue
            if inp and out:
                pred = run_predict(wl, inp, out, concurrency=1, **over)
                if pred.result:
                    c.predicted_ttft_ms = _typical(pred.result.get("ttft_ms"))
                    c.predicted_itl_ms = _typical(pred.result.get("itl_ms"))
                    sat = (pred.result.get("saturation") or {}).get("max_requests_per_s")
                    c.saturation_requests_per_s = float(sat) if sat else None
                else:
                    c.notes += pred.notes
                if wl.slo is not None:
                    bud = run_budget(wl, inp, out, **over)
                    if bud.result:
                        c.max_rate_under_slo = bud.result.get("max_rate_under_slo")
                        if bud.result.get("feasible") is False:
                            c.notes.append(
                                f"SLO not met at the design load; binding stage: {bud.result.get('binding')}"
                            )
                    else:
                        c.notes += bud.notes
            capacity = c.max_rate_under_slo or c.saturation_requests_per_s
            if capacity and peak:
                c.replicas_needed = max(1, math.ceil(peak / capacity))
                if not c.max_rate_under_slo:
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


# --------------------------------------------------------------------------- stages


_ALREADY_DONE = {
    "prefix_caching": ("deployment.enable_prefix_caching", True),
    "fp8_kv_cache": ("deployment.kv_cache_dtype", "fp8"),
    "warm_pools": ("deployment.scale_to_zero", False),
    "prefix_aware_routing": ("derived.router_locality_aware", True),
}


def _applicable(a: Analysis, pb: Any) -> bool:
    """Skip playbooks that are already in place or cannot apply to this deployment."""
    done = _ALREADY_DONE.get(pb.id)
    if done and a.value(done[0]) == done[1]:
        return False
    if pb.id == "prefix_aware_routing":
        return a.value("derived.replicas") != 1
    if pb.id in ("prefix_caching", "prompt_restructuring"):
        shared = a.value("traffic.shared_prefix_fraction")
        return shared is None or shared >= 0.2
    if pb.id == "weight_quantization":
        q = a.value("deployment.quantization") or a.value("fit.quantization")
        if q and str(q).lower() not in ("none", "auto"):
            return False  # already quantized: the next step is a different format, not this one
    if pb.id == "separate_batch_traffic":
        return bool(a.value("traffic.batch_share")) or a.value("traffic.mode") == "mixed"
    if pb.id == "expert_parallelism":
        fit = a.calcs.get("fit")
        params = (fit.result or {}).get("parameters", {}) if fit else {}
        return bool(params) and params.get("active_per_token", 0) < params.get("total", 0)
    return True


def _knob_lines(pb: Any, engine: str) -> list[Any]:
    mine = [k for k in pb.knobs if k.engine == engine]
    generic = [k for k in pb.knobs if k.engine in ("generic", "kubernetes", "llm-d", "dynamo")]
    return mine or generic or list(pb.knobs[:1])


def _slo_line(a: Analysis) -> str:
    items = [
        f"{m.removesuffix('_ms').upper()} {k} <= {_fmt(v, 'ms')}"
        for m, k, v in _slo_items(a.workload)
    ]
    peak = _peak_rate(a)
    where = f" at the peak rate {_fmt(peak, 'req/s')}" if peak else " at the production load"
    return ("; ".join(items) + where) if items else "the agreed latency targets (none stated yet)"


def _effects(pb: Any) -> list[str]:
    e = pb.effects
    return [
        f"TTFT: {e.ttft}",
        f"ITL: {e.itl}",
        f"Throughput: {e.throughput}",
        f"Memory: {e.memory}",
        f"Quality: {e.quality}",
    ]


def _playbook_stage(a: Analysis, pb: Any, hyp: str, url: str, engine: str) -> Stage:
    knobs = _knob_lines(pb, engine)
    flags = "; ".join(f"`{k.flag}` ({k.engine})" for k in knobs)
    guide = load_table("hypotheses.toml").get(hyp, {})
    measure = [probe_command(a, url, pb.id), *pb.measure]
    return Stage(
        title=pb.title,
        variable=pb.variable,
        hypothesis=hyp,
        playbook=pb.id,
        complexity=pb.complexity,
        change=f"{pb.summary} Change only {pb.variable}: {flags}."
        + (f" Note: {knobs[0].note}" if knobs and knobs[0].note else ""),
        measure=measure,
        decisive_metric=str(guide.get("decisive", "")),
        expected_tradeoffs=[*_effects(pb), *pb.risks],
        acceptance=[
            f"{_slo_line(a)}, compared with the baseline run (`inferwise runs compare BASELINE_RUN NEW_RUN`: the change must exceed run-to-run noise).",
            *pb.acceptance,
        ],
        rollback=pb.rollback,
    )


def _baseline_stage(a: Analysis, url: str, leading: Hypothesis | None) -> Stage:
    wl = a.workload
    dep = wl.deployment
    pinned = ", ".join(
        x
        for x in (
            f"model {dep.model}" if dep and dep.model else "model revision",
            f"engine {dep.engine} {dep.engine_version or '(pin the version)'}"
            if dep and dep.engine
            else "engine and version",
            f"GPU {dep.gpu}" if dep and dep.gpu else "GPU type and count",
            "precision, engine flags, prompt mix, output limits and load shape",
        )
    )
    measure = [
        probe_command(a, url, "baseline"),
        "Repeat the run 3 times to know the run-to-run noise; keep the engine's /metrics scraped alongside (vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc, vllm:num_preemptions_total, vllm:prefix_cache_hits_total).",
        "Run the product quality eval on the same deployment (the reference for every later stage).",
    ]
    if leading is not None:
        n = len(leading.how_to_prove)
        measure += [
            f"Proof of '{leading.id}' ({i}/{n}, before changing anything): {step}"
            for i, step in enumerate(leading.how_to_prove, 1)
        ]
    return Stage(
        title="Reproducible baseline" + (f" and proof of '{leading.id}'" if leading else ""),
        variable="none (measurement only)",
        hypothesis=leading.id if leading else None,
        change=f"Nothing. Pin {pinned}; warm up, then measure.",
        measure=measure,
        decisive_metric=leading.decisive_metric
        if leading
        else "TTFT/ITL/E2E percentiles and goodput at the production load",
        expected_tradeoffs=[
            "Costs GPU time only; no user impact when run against a staging replica."
        ],
        acceptance=[
            "Three repeated runs agree within a few percent on TTFT p50/p95 and ITL p50 (else find the noise source first).",
            "Every missing measurement listed above that the stage can measure is filled into the workload file.",
            *(
                [
                    f"The decisive metric ({leading.decisive_metric}) confirms or rules out '{leading.id}'."
                ]
                if leading
                else []
            ),
        ],
        rollback="Nothing to roll back.",
    )


def _budget_command(a: Analysis, model: str, gpu: str) -> str:
    """A runnable `inferwise budget` line with the workload's own SLOs, lengths and rate."""
    parts = [f"inferwise budget --model {model} --gpu {gpu} --tensor-parallel-size N"]
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    if inp and out:
        parts.append(f"--input-tokens {int(inp)} --output-tokens {int(out)}")
    p95_in = _pct_value(a, "traffic.input_tokens.p95")
    if p95_in:
        parts.append(f"--input-tokens-p95 {int(p95_in)}")
    rate = a.value("traffic.arrival_rate_rps")
    if rate:
        parts.append(f"--request-rate {rate:g}")
    ptm = a.value("traffic.peak_to_mean")
    if ptm:
        parts.append(f"--peak-to-mean {ptm:g}")
    for metric, k, v in _slo_items(a.workload):
        if metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            parts.append(f"--slo-{metric.replace('_', '-')} {k}={v:g}")
    return " ".join(parts)


def _pct_value(a: Analysis, name: str) -> float | None:
    v = a.value(name)
    return float(v) if isinstance(v, (int, float)) else None


def _sizing_stage(a: Analysis, cands: list[Candidate]) -> Stage:
    wl = a.workload
    dep = wl.deployment
    model = dep.model if dep and dep.model else "<model>"
    gpus = (wl.constraints.gpus if wl.constraints and wl.constraints.gpus else None) or (
        [dep.gpu] if dep and dep.gpu else ["<gpu>"]
    )
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    ctx = a.value("derived.input_tokens_p95")
    cmds = []
    for g in gpus[:2]:
        cmds.append(
            f"inferwise fit --model {model} --gpu {g} --tensor-parallel-size N"
            + (
                f" --context-tokens {int(ctx + (out or 0))}"
                if ctx
                else " --context-tokens <p95 prompt + output>"
            )
        )
        cmds.append(
            f"inferwise predict --model {model} --gpu {g} --tensor-parallel-size N"
            + (
                f" --input-tokens {int(inp)} --output-tokens {int(out)}"
                if inp and out
                else " --input-tokens <p50> --output-tokens <p50>"
            )
            + " --concurrency 1"
        )
        cmds.append(_budget_command(a, model, g))
    fitting = [c for c in cands if c.fits]
    accept = [
        "A candidate fits with KV room for the peak concurrency and the SLO is feasible (`budget` feasible: true)."
    ]
    if wl.constraints and wl.constraints.max_gpus:
        accept.append(
            f"GPUs needed at peak (replicas x TP) <= constraints.max_gpus = {wl.constraints.max_gpus}."
        )
    if fitting:
        best = fitting[0]
        accept.append(
            f"Computed so far: {best.gpu} with TP={best.tensor_parallel_size} fits (max concurrency {_fmt(best.max_concurrency)}); confirm with the baseline."
        )
    return Stage(
        title="Size candidate deployments (computed, before any GPU is rented)",
        variable="none (computation only)",
        change="Nothing deployed yet: compute memory fit, latency and capacity for each allowed GPU and tensor-parallel degree.",
        measure=cmds,
        decisive_metric="fit.fits, fit.max_concurrency and budget.max_rate_under_slo per candidate",
        expected_tradeoffs=[
            "Larger TP lowers ITL and raises KV room but adds communication and GPUs; more replicas add capacity at linear cost."
        ],
        acceptance=accept,
        rollback="Nothing to roll back.",
    )


def _validation_stage(a: Analysis, url: str, changes: list[Stage]) -> Stage:
    peak = _peak_rate(a)
    over = peak * 1.5 if peak else None
    measure = [
        probe_command(a, url, "combined", rate=peak) + "   (at the peak rate)",
        probe_command(a, url, "overload", rate=over) + "   (overload: 1.5x peak)"
        if over
        else "An overload run at 1.5x the highest rate measured.",
        "The product quality eval on the combined configuration.",
        "Cold start: restart one replica and probe with --warmup-requests 0; scale-up and rollback drills.",
    ]
    return Stage(
        title="Combined end-to-end validation",
        variable="none (all accepted changes together)",
        change="Deploy every change that passed its own stage, together, to a canary replica; changes interact (e.g. a larger token budget shrinks the KV cache), so attribution per stage does not prove the sum.",
        measure=measure,
        decisive_metric="goodput at the SLO and the tail percentiles at peak, plus the quality eval",
        expected_tradeoffs=[
            "Interactions can cancel gains measured alone; rerun the stage that regressed in isolation."
        ],
        acceptance=[
            f"{_slo_line(a)} with all changes applied.",
            "Quality eval not below the floor; error rate and cost within the acceptance criteria below.",
            "Canary metrics match the staging run before the full rollout.",
        ],
        rollback="Redeploy the pinned baseline configuration (keep its image and flags until the new one has run a full peak period).",
    )


def _stages(
    a: Analysis,
    hyps: list[Hypothesis],
    leading: Hypothesis | None,
    url: str,
    greenfield: bool,
    cands: list[Candidate],
    max_stages: int,
) -> list[Stage]:
    from inferwise.knowledge.playbooks import playbooks_for

    engine = _engine(a.workload)
    head: list[Stage] = []
    if greenfield:
        head.append(_sizing_stage(a, cands))
    head.append(_baseline_stage(a, url, leading))
    room = max(1, max_stages - len(head) - 1)
    order = (
        [leading, *[h for h in hyps if leading is None or h.id != leading.id]]
        if leading
        else list(hyps)
    )
    picked: list[tuple[Any, str, int]] = []
    variables: set[str] = set()
    for rank_i, h in enumerate(order[:3]):
        if h is None:
            continue
        taken = 0
        for pb in playbooks_for(h.id):
            if (
                taken >= (2 if rank_i == 0 else 1)
                or not _applicable(a, pb)
                or pb.variable in variables
            ):
                continue
            picked.append((pb, h.id, rank_i))
            variables.add(pb.variable)
            taken += 1
    picked.sort(key=lambda t: (t[0].complexity, t[2]))
    middle = [_playbook_stage(a, pb, hyp, url, engine) for pb, hyp, _ in picked[:room]]
    if not middle:
        middle.append(
            Stage(
                title="Load sweep to find the knee",
                variable="offered load (request rate)",
                change="Raise the request rate step by step on the baseline configuration; nothing else changes.",
                measure=[
                    probe_command(a, url, "sweep").replace(
                        "--request-rate", "--sweep 0.5,1,2,4 --request-rate"
                    )
                ],
                decisive_metric="the rate where goodput stops growing and TTFT p95 crosses its target",
                expected_tradeoffs=["Overload runs fill queues; run against staging."],
                acceptance=[
                    "The knee is above the peak rate with the headroom the availability target needs."
                ],
                rollback="Nothing to roll back.",
            )
        )
    return [*head, *middle, _validation_stage(a, url, middle)]


# --------------------------------------------------------------------------- acceptance


def _acceptance(a: Analysis, stages: list[Stage]) -> AcceptanceCriteria:
    wl = a.workload
    quality: list[str] = []
    floor = wl.product.quality_floor if wl.product else None
    risky = [s.title for s in stages if s.playbook and _quality_effect(s.playbook)]
    if floor:
        quality.append(
            f"Quality floor: {floor}; measured on the product's eval set after every stage that can change outputs."
        )
    else:
        quality.append(
            "No quality floor stated (product.quality_floor): define the eval set and minimum score before stage 1; no speed change ships without it."
        )
    if risky:
        quality.append(
            "Stages that can change outputs and need the eval: " + "; ".join(risky) + "."
        )
    quality.append(
        "Stages that claim no quality effect (caching, scheduling, routing) keep greedy outputs identical on a fixed regression prompt set."
    )

    tail: list[str] = []
    for m, k, v in _slo_items(wl):
        tail.append(
            f"{m.removesuffix('_ms').upper()} {k} <= {_fmt(v, 'ms')}, measured client-side by `inferwise probe` with the production prompt mix."
        )
    peak = _peak_rate(a)
    if a.value("traffic.mode") == "offline" and peak:
        tail.insert(
            0,
            f"Offline: sustained throughput >= {peak:g} req/s ({peak * 3600:,.0f} requests per hour) with the GPUs saturated; per-request latency matters only through the job's completion time.",
        )
    elif peak and tail:
        tail.append(
            f"All of the above hold at the peak rate of {_fmt(peak, 'req/s')} (mean {_fmt(a.value('traffic.arrival_rate_rps'), 'req/s')} x peak_to_mean {a.value('traffic.peak_to_mean') or 1:g}), not only at the mean."
        )
    if tail:
        tail.append(
            "Goodput (requests meeting every target per second) not below the baseline; compare p99 too, not only p95."
        )
    else:
        tail.append(
            "No latency SLO stated (slo.ttft_ms, slo.itl_ms, slo.e2e_ms): agree the targets first; until then report p50/p95/p99 against the baseline."
        )
    if wl.traffic and wl.traffic.agentic_steps:
        tail.append(
            f"For agentic flows measure whole tasks ({wl.traffic.agentic_steps} LLM/tool calls each), including tool latency and retries."
        )

    rel: list[str] = []
    if wl.slo and wl.slo.availability:
        downtime = (1 - wl.slo.availability) * 30 * 24 * 60
        rel.append(
            f"Availability >= {wl.slo.availability:g} ({downtime:.0f} min of downtime per 30 days); survive the loss of one replica at peak."
        )
    if wl.slo and wl.slo.error_rate is not None:
        rel.append(
            f"Error rate <= {wl.slo.error_rate:.2%} at peak (failed / all requests, by class)."
        )
    else:
        rel.append("Error rate at peak stated and met (slo.error_rate is missing).")
    over = f"{peak * 1.5:,.1f} req/s" if peak else "1.5x the peak"
    if a.value("traffic.mode") == "offline":
        rel.append(
            "Failed items are retried a bounded number of times and then listed; after a worker or replica loss the job resumes without redoing finished items."
        )
    else:
        rel.append(
            f"Overload at {over}: bounded queue, fast HTTP 429 rejections instead of timeouts, recovery within a minute after the burst; client retries capped."
        )
    if wl.deployment and wl.deployment.scale_to_zero:
        rel.append(
            "Cold start from zero measured and within the TTFT target for the first request, or a minimum of one warm replica kept."
        )
    rel.append("Rollback to the pinned baseline rehearsed once before the rollout.")

    sec: list[str] = []
    c = wl.constraints
    if c and c.data_residency:
        sec.append(
            f"Data residency '{c.data_residency}': GPUs, logs, run stores and any KV offload tier stay in {c.data_residency} regions."
        )
    if c and c.privacy:
        sec.append(f"Privacy: {c.privacy}.")
    if c and c.license:
        sec.append(
            f"Model license '{c.license}' permits this use; recorded with the model revision."
        )
    elif wl.deployment and wl.deployment.model:
        sec.append(
            f"The license of {wl.deployment.model} checked against the product's use (constraints.license is not stated)."
        )
    if a.value("traffic.shared_prefix_fraction") or any(
        s.playbook in ("prefix_caching", "prefix_aware_routing", "kv_offload") for s in stages
    ):
        sec.append(
            "Prefix/KV cache reuse never crosses tenants: shared prefixes hold no tenant data, or the cache is salted per tenant."
        )
    sec.append(
        "Prompts and outputs are not logged or stored by probes (store_text off); API keys come from environment variables, never images or logs."
    )

    cost: list[str] = []
    if c and c.budget_usd_per_hour is not None:
        cost.append(
            f"Serving cost <= {c.budget_usd_per_hour:g} USD/h at peak capacity, including idle and redundant replicas."
        )
        tps = a.value("observations.output_tokens_per_s")
        if tps:
            per_m = c.budget_usd_per_hour / (tps * 3600 / 1e6)
            cost.append(
                f"At the measured {tps:,.0f} output tokens/s that budget is {per_m:,.2f} USD per million output tokens; a change must not raise it."
            )
        else:
            cost.append(
                "Cost per million output tokens (budget / measured output tokens per hour) reported for the baseline and every stage."
            )
    else:
        cost.append(
            "No budget stated (constraints.budget_usd_per_hour): report GPU-hours per 1,000 successful requests for each stage."
        )
    if c and c.max_gpus:
        cost.append(f"At most {c.max_gpus} GPUs in total (constraints.max_gpus).")
    cost.append("Compare cost per successful request at the SLO (goodput), not per raw token.")
    return AcceptanceCriteria(
        quality=quality, tail_latency=tail, reliability=rel, security=sec, cost=cost
    )


def _quality_effect(playbook_id: str) -> bool:
    from inferwise.knowledge.playbooks import get_playbook

    q = get_playbook(playbook_id).effects.quality.strip().lower()
    return not (q.startswith("0") or q in ("none", ""))


# --------------------------------------------------------------------------- facts


def _facts_to_verify(a: Analysis, stages: list[Stage]) -> list[FactToVerify]:
    from inferwise.knowledge.playbooks import get_playbook
    from inferwise.knowledge.sizing import model_source_url

    out: list[FactToVerify] = []
    seen: set[tuple[str, str]] = set()

    def add(claim: str, url: str) -> None:
        if url and (claim, url) not in seen:
            seen.add((claim, url))
            out.append(FactToVerify(claim=claim, source_url=url))

    g = a.gpu
    if g is not None:
        add(
            f"{g.name}: {g.memory_gb_vendor:g} GB memory, {g.memory_bandwidth_gb_per_s:,.0f} GB/s memory bandwidth, "
            f"{g.interconnect} at {g.interconnect_bandwidth_gb_per_s:g} GB/s per direction (vendor figures).",
            g.source_url,
        )
    dep = a.workload.deployment
    if dep and dep.model:
        url = model_source_url(dep.model)
        if url and url.startswith("https://huggingface.co/"):
            add(
                f"{dep.model}: license, intended use and recommended serving settings (model card).",
                f"https://huggingface.co/{dep.model}",
            )
        if url and url.startswith("http"):
            add(
                f"{dep.model} architecture (layers, KV heads, context length) as in its config.json; check the model card for license and recommended settings.",
                url,
            )
    engine = _engine(a.workload)
    version = dep.engine_version if dep and dep.engine_version else "the deployed version"
    if engine in ENGINE_DOCS:
        add(
            f"{engine} defaults (chunked prefill, prefix caching, max-num-seqs, token budget) for {version}; they change between releases.",
            ENGINE_DOCS[engine],
        )
    if engine in METRICS_DOCS:
        add(
            f"{engine} metric names used in this plan (queue, running, KV usage, preemptions, prefix-cache hits) for {version}.",
            METRICS_DOCS[engine],
        )
    for s in stages:
        if not s.playbook:
            continue
        pb = get_playbook(s.playbook)
        for k in _knob_lines(pb, engine):
            add(f"{k.engine} `{k.flag}`: {k.note or pb.summary}", k.doc)
    return out


# --------------------------------------------------------------------------- entry point


def _is_greenfield(a: Analysis) -> bool:
    return a.run is None and not any(k.startswith("observations.") for k in a.facts)


def plan_experiments(req: PlanRequest) -> PlanResult:
    """The full plan for a workload (and optional stored run); see the module docstring."""
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
        from inferwise.knowledge.diagnosis import _guide, _playbooks

        g = _guide(req.hypothesis)
        leading = Hypothesis(
            id=req.hypothesis,
            title=HYPOTHESES[req.hypothesis],
            confidence=0.0,
            level="low",
            score=0.0,
            evidence=["Chosen by the user; no evidence in the workload yet."],
            how_to_prove=list(g.get("how_to_prove", [])),
            decisive_metric=str(g.get("decisive", "")),
            playbooks=_playbooks(req.hypothesis),
        )
        hyps = [leading, *hyps]
    elif leading is not None:
        hyps = [leading, *[h for h in hyps if h.id != leading.id]]

    cands = _sizing(a) if greenfield else []
    url = req.url or URL_PLACEHOLDER
    stages = _stages(a, hyps, leading, url, greenfield, cands, req.max_stages)
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
            f"Sizing and probe commands use input {int(inp)} / output {int(out)} tokens per request (the workload's p50), with the p95 for context length."
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
        assumptions.append(
            f"Agentic flow: latency targets and probes here are per LLM call; each task makes "
            f"{wl.traffic.agentic_steps} calls, so budget whole tasks with `inferwise budget` "
            "--agent-steps (tool latencies and retries included) before accepting."
        )
    if not hyps:
        assumptions.append(
            "No bottleneck hypothesis has evidence yet; the plan establishes the measurements that will produce one."
        )
    notes = [n for n in a.notes if not (cands and n.startswith("The calculators were not run"))]
    notes = list(dict.fromkeys(notes + [n for c in cands for n in c.notes]))

    return PlanResult(
        workload_name=wl.name,
        mode="greenfield" if greenfield else "diagnostic",
        assumptions=list(dict.fromkeys(assumptions)),
        missing_measurements=missing_measurements(a, hyps),
        targets=targets,
        baseline=baseline,
        leading_hypothesis=leading.id if leading else None,
        hypotheses=hyps[:6],
        sizing=cands,
        stages=stages,
        acceptance_criteria=_acceptance(a, stages),
        facts_to_verify=_facts_to_verify(a, stages),
        facts=facts_used(a),
        notes=notes,
    )
