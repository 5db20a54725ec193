"""Rank bottleneck hypotheses from a workload file and/or a stored probe run.

How it reasons: the workload (and run) become a table of facts tagged
measured / stated / computed / catalog / derived (knowledge/evidence.py); the
evidence rules in knowledge/rules/*.toml fire on those facts and add weight
to hypothesis ids, or take it away (counter-evidence). The seeds' symptom
table gives modest weights; measurements, and measurements set against the
calculators' predictions, give larger ones, because a measured KV cache at
98 % with preemptions says more than the word "slow".

Confidence is a number 0-1: ``1 - exp(-score / 5)`` of the net rule weight.
It is a strength-of-evidence scale, not a probability: ``level`` is "high"
from 0.65 (several independent measurements agree), "medium" from 0.35, else
"low" (a lead from symptoms alone). Every hypothesis says how to prove it
before anything is changed.

Stdlib + pydantic at module level; the calculators and the run store are
imported when used.
"""

from __future__ import annotations

import math
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwise.knowledge.commands import concretize
from inferwise.knowledge.evidence import Analysis, analyse
from inferwise.knowledge.rule_engine import Finding, evaluate, load_table
from inferwise.knowledge.vocabulary import HYPOTHESES
from inferwise.knowledge.workload import Workload, get_path, load_workload, parse_workload

WORKLOAD_HELP = (
    "The workload: a path to a JSON or TOML workload file, or the JSON text itself (MCP clients "
    "may also pass the object). Fields "
    "(all optional): product, traffic, slo, constraints, deployment, observations, symptoms "
    "(see DESIGN.md). Latencies in ms as percentile objects, e.g. "
    '{"observations": {"ttft_ms": {"p95": 6000}, "queue_depth": 40}, "symptoms": ["ttft_high"]}.'
)
RUN_HELP = (
    "Id of a stored probe run (from `inferwise probe` / list_runs; a unique prefix or 'latest' "
    "works). Its latency distributions, errors and scraped engine metrics are used as measurements."
)
DB_HELP = "Path of the run database (default: the one `inferwise probe` writes)."


from inferwise.knowledge.explain import ExplainResult  # noqa: E402


class DiagnoseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: str | dict[str, Any] | None = Field(default=None, description=WORKLOAD_HELP)
    run: str | None = Field(default=None, description=RUN_HELP)
    db: str | None = Field(default=None, description=DB_HELP)
    limit: int = Field(
        default=8, ge=1, le=24, description="Maximum number of ranked hypotheses to return."
    )
    calibration: str | None = Field(
        default=None, max_length=64, description="Stored calibration for the predictions."
    )


class Hypothesis(BaseModel):
    id: str = Field(description="Hypothesis id from the shared vocabulary.")
    title: str
    confidence: float = Field(
        ge=0, le=1, description="Strength of evidence 0-1 (1 - exp(-score/5)); not a probability."
    )
    level: Literal["high", "medium", "low"] = Field(
        description="high >= 0.65, medium >= 0.35, else low."
    )
    score: float = Field(description="Net rule weight (evidence minus counter-evidence).")
    evidence: list[str] = Field(description="Why it is suspected; each line ends with its sources.")
    counter_evidence: list[str] = Field(default_factory=list)
    how_to_prove: list[str] = Field(description="Checks to run before changing anything.")
    decisive_metric: str = Field(description="The one measurement that settles it.")
    playbooks: list[str] = Field(
        default_factory=list, description="Playbook ids that address it, least complex first."
    )
    docs: list[str] = Field(
        default_factory=list,
        description="Knowledge documents that explain it (`inferwise kb show ID`).",
    )


class CounterEvidence(BaseModel):
    hypothesis: str
    title: str
    evidence: list[str]


class SymptomSeen(BaseModel):
    id: str
    title: str
    source: Literal["stated", "derived"]
    basis: str


class FactUsed(BaseModel):
    name: str = Field(
        description="Dotted fact name (workload path, gpu.*, fit.*, predicted.*, derived.*, run.*)."
    )
    value: float | int | str | bool
    source: Literal["measured", "stated", "derived", "computed", "catalog", "assumed"]
    note: str = ""


class MissingMeasurement(BaseModel):
    field: str = Field(description="Dotted path into the workload file, e.g. observations.ttft_ms.")
    why: str
    how_to_measure: str


class DiagnoseResult(BaseModel):
    explain: ExplainResult | None = Field(
        default=None,
        description="With run: its prediction vs measurement and the gap's causes (needs the deployment).",
    )

    workload_name: str | None = None
    run_id: str | None = None
    summary: str = Field(
        default="",
        description="One-paragraph verdict: the leading cause, or, when the measurements show "
        "no bottleneck, which healthy signs say so (queue, slots, KV cache, preemptions, errors).",
    )
    symptoms: list[SymptomSeen] = Field(
        default_factory=list,
        description="Symptoms stated in the workload or derived from measurement vs SLO.",
    )
    hypotheses: list[Hypothesis] = Field(description="Ranked, most likely first.")
    counter_evidence: list[CounterEvidence] = Field(
        default_factory=list, description="Evidence against hypotheses (including ruled-out ones)."
    )
    facts: list[FactUsed] = Field(
        default_factory=list, description="Measured, computed and catalog facts the reasoning used."
    )
    missing_measurements: list[MissingMeasurement] = Field(
        default_factory=list,
        description="Absent workload fields that would confirm or rule out the leading hypotheses.",
    )
    assumptions: list[str] = Field(default_factory=list)
    notes: list[str] = Field(
        default_factory=list, description="What could not be computed and why."
    )


# --------------------------------------------------------------------------- scoring


def _confidence(score: float) -> tuple[float, str]:
    c = round(1 - math.exp(-max(score, 0.0) / 5.0), 2)
    return c, "high" if c >= 0.65 else "medium" if c >= 0.35 else "low"


def _line(f: Finding) -> str:
    return f"{f.text} [{', '.join(f.sources)}]" if f.sources else f.text


def _guide(hyp: str) -> dict:
    return load_table("hypotheses.toml").get(hyp, {})


def _playbooks(hyp: str) -> list[str]:
    try:
        from inferwise.knowledge.playbooks import playbooks_for
    except ImportError:  # pragma: no cover - playbooks land separately
        return []
    return [p.id for p in playbooks_for(hyp)]


def _docs(hyp: str) -> list[str]:
    """Up to three explaining documents, the playbooks' own documents first."""
    try:
        from inferwise.knowledge.kb import documents_for
        from inferwise.knowledge.playbooks import playbooks_for
    except ImportError:  # pragma: no cover - the knowledge base lands separately
        return []
    explaining = [d.id for d in documents_for(hyp)]
    preferred = [p.doc for p in playbooks_for(hyp) if p.doc in explaining]
    return list(dict.fromkeys([*preferred, *explaining]))[:3]


def proof_steps(a: Analysis, hyp: str, url: str | None = None) -> list[str]:
    """The guide's checks for ``hyp`` with this workload's deployment (and the run's endpoint)
    filled into their commands."""
    if url is None and a.run:
        url = a.run.config.get("url") or None
    return [concretize(step, a, url) for step in _guide(hyp).get("how_to_prove", [])]


def rank(a: Analysis, limit: int = 24) -> tuple[list[Hypothesis], list[CounterEvidence]]:
    findings = evaluate(a.facts)
    for hyp in a.workload.suspected_causes or []:
        findings.setdefault(hyp, []).append(
            Finding("suspected", 1.0, "The team already suspects this cause.", ("stated",))
        )
    ranked: list[Hypothesis] = []
    against: list[CounterEvidence] = []
    order = list(HYPOTHESES)
    for hyp in sorted(
        findings, key=lambda h: (-sum(f.weight for f in findings[h]), order.index(h))
    ):
        fs = findings[hyp]
        score = round(sum(f.weight for f in fs), 2)
        pro = [_line(f) for f in sorted(fs, key=lambda f: -f.weight) if f.weight > 0]
        con = [_line(f) for f in sorted(fs, key=lambda f: f.weight) if f.weight < 0]
        if con:
            against.append(CounterEvidence(hypothesis=hyp, title=HYPOTHESES[hyp], evidence=con))
        if score <= 0 or not pro:
            continue
        conf, level = _confidence(score)
        guide = _guide(hyp)
        ranked.append(
            Hypothesis(
                id=hyp,
                title=HYPOTHESES[hyp],
                confidence=conf,
                level=level,  # type: ignore[arg-type]
                score=score,
                evidence=pro,
                counter_evidence=con,
                how_to_prove=proof_steps(a, hyp),
                decisive_metric=str(guide.get("decisive", "")),
                playbooks=_playbooks(hyp),
                docs=_docs(hyp),
            )
        )
    return ranked[:limit], against


_INTERACTIVE_ONLY = (
    "slo.ttft_ms",
    "slo.itl_ms",
    "slo.tpot_ms",
    "observations.ttft_ms",
    "observations.itl_ms",
    "observations.queue_depth",  # an offline job keeps a queue by design
)


def missing_measurements(
    a: Analysis, hypotheses: list[Hypothesis], baseline_fields: bool = True
) -> list[MissingMeasurement]:
    """Absent fields that matter: the baseline set (``always`` in measurements.toml) and what
    the three leading hypotheses need. Each comes with how to measure it; none is filled in."""
    catalog: dict[str, Any] = load_table("measurements.toml")
    hyp_guides = load_table("hypotheses.toml")
    wanted: dict[str, str] = {}
    for field, entry in catalog.items():
        if baseline_fields and entry.get("always"):
            wanted[field] = ""
    if baseline_fields and a.value("traffic.arrival_rate_rps") is not None:
        wanted["observations.requests_per_s"] = ""  # the rate target needs a measured baseline
    for h in hypotheses[:3]:
        for field in hyp_guides.get(h.id, {}).get("needs", []):
            wanted.setdefault(field, h.id)
    if a.value("fit.default_context_fails"):
        wanted.setdefault("deployment.max_model_len", "")
    if a.value("traffic.mode") == "offline":
        # an offline job is judged by throughput and completion time, not per-token latency
        for field in _INTERACTIVE_ONLY:
            wanted.pop(field, None)
        wanted.setdefault("observations.requests_per_s", "")
    if a.value("constraints.gpus") is not None or (
        a.workload.constraints is not None and a.workload.constraints.gpus
    ):
        wanted.pop("deployment.gpu", None)  # choosing among the allowed GPUs is the plan's job
    out = []
    for field, hyp in wanted.items():
        if _present(a, field):
            continue
        entry = catalog.get(field, {})
        why = entry.get("why", "Needed by the reasoning.")
        if hyp:
            why += f" Needed to confirm or rule out '{hyp}'."
        out.append(
            MissingMeasurement(
                field=field, why=why, how_to_measure=concretize(entry.get("how_to_measure", ""), a)
            )
        )
    return out


def _present(a: Analysis, field: str) -> bool:
    if get_path(a.workload, field) is not None:
        return True
    return any(k == field or k.startswith(field + ".") for k in a.facts)


def facts_used(a: Analysis) -> list[FactUsed]:
    """The facts worth showing: measured, computed, catalog and derived ones (stated values
    are the user's own file)."""
    out = []
    for name, f in sorted(a.facts.items()):
        if f.source == "stated" or name.startswith("symptom."):
            continue
        value = f.value
        if isinstance(value, float):
            value = round(value, 4)
        if not isinstance(value, (int, float, str, bool)):
            continue
        out.append(FactUsed(name=name, value=value, source=f.source, note=f.note))  # type: ignore[arg-type]
    return out


def load_inputs(workload: str | dict[str, Any] | None, run: str | None, db: str | None) -> Workload:
    """The workload to reason on; with only a run, an empty workload (the run supplies the
    measurements). Neither is an input error naming both."""
    from inferwise.calculators.errors import InputError

    if not workload and not run:
        raise InputError(
            "workload",
            "give a workload (file path or JSON text) and/or a stored probe run id",
            "--workload FILE or --run RUN_ID",
        )
    if isinstance(workload, dict):
        return parse_workload(workload)
    return load_workload(workload) if workload else Workload()


def diagnose(req: DiagnoseRequest) -> DiagnoseResult:
    """Rank the likely bottlenecks, with evidence, counter-evidence and how to prove each."""
    from inferwise.knowledge.calibrated import active_calibration, explain_section
    from inferwise.knowledge.sizing import calculation_scope, calibration_scope

    wl = load_inputs(req.workload, req.run, req.db)
    applied, cal_notes = active_calibration(req.calibration, None, wl, req.db)
    with calculation_scope(), calibration_scope(applied):
        a = analyse(wl, req.run, req.db)
    a.notes.extend(cal_notes)
    explained = explain_section(req.run, wl, req.calibration, req.db, a.notes)
    hypotheses, against = rank(a, req.limit)
    notes = list(dict.fromkeys(a.notes))
    if not hypotheses:
        notes.append(
            "No hypothesis has evidence yet: add observations (TTFT/ITL percentiles, queue depth, "
            "KV cache usage, GPU utilisation) or symptoms, or pass a probe run with --run."
        )
    return DiagnoseResult(
        workload_name=wl.name,
        run_id=a.run.run_id if a.run else None,
        summary=verdict(a, hypotheses),
        symptoms=[
            SymptomSeen(id=s.id, title=_symptom_title(s.id), source=s.source, basis=s.basis)  # type: ignore[arg-type]
            for s in a.symptoms
        ],
        hypotheses=hypotheses,
        counter_evidence=against,
        facts=facts_used(a),
        # with nothing to go on, the baseline measurements are what would produce a lead
        missing_measurements=missing_measurements(a, hypotheses, baseline_fields=not hypotheses),
        assumptions=list(dict.fromkeys(a.assumptions)),
        notes=notes,
        explain=explained,
    )


def verdict(a: Analysis, hypotheses: list[Hypothesis]) -> str:
    """The answer in one paragraph. With no hypothesis above "low", say what was measured to be
    healthy, so that a calm run reads as calm rather than as a weak case for some cause."""
    strong = [h for h in hypotheses if h.level != "low"]
    if strong:
        h = strong[0]
        return f"Leading hypothesis: `{h.id}` ({h.title.lower()}), confidence {h.confidence:.2f} ({h.level}); prove it before changing anything."
    healthy = _healthy_signs(a)
    if not healthy:
        lead = (
            f" The only leads are weak (`{'`, `'.join(h.id for h in hypotheses[:3])}`, low confidence)."
            if hypotheses
            else ""
        )
        return "Not enough measured to name a bottleneck." + lead
    text = "No bottleneck in the measurements: " + "; ".join(healthy) + "."
    if hypotheses:
        text += f" Remaining leads are weak (`{'`, `'.join(h.id for h in hypotheses[:3])}`, low confidence)."
    if a.value("run.metric.client_limited"):
        text += (
            " This load did not reach the engine's capacity: raise it step by step "
            f"(`{_sweep_up(a)}`) to find the knee."
        )
    return text


def _sweep_up(a: Analysis) -> str:
    """A concurrency sweep from the run's own load upwards, against the run's own endpoint."""
    cfg = a.run.config if a.run else {}
    c = int(a.value("run.metric.client_concurrency") or 1)
    parts = ["inferwise probe", shlex.quote(str(cfg.get("url") or "http://HOST:PORT"))]
    if cfg.get("model"):
        parts.append(f"--model {shlex.quote(str(cfg['model']))}")
    parts.append("--sweep " + ",".join(str(min(512, c * f)) for f in (1, 2, 4, 8)))
    for key in ("input_tokens", "output_tokens"):
        if cfg.get(key):
            parts.append(f"--{key.replace('_', '-')} {int(cfg[key])}")
    parts.append(f"--requests {max(64, int(cfg.get('requests') or 0))}")
    return " ".join(parts)


def _healthy_signs(a: Analysis) -> list[str]:
    """Measured signs that nothing is saturated, each with its number."""
    out: list[str] = []
    for s in a.symptoms:
        if s.id in ("ttft_normal", "itl_normal"):
            out.append(s.basis)
    if a.value("run.metric.sustained_waiting") is False:
        share, n = a.value("run.metric.requests_waiting_share"), a.value("run.metric.scrapes")
        out.append(
            f"no standing queue (requests waited in {share:.0%} of {n} engine scrapes, median "
            f"{a.value('run.metric.requests_waiting_median'):.0f})"
        )
    elif (
        a.value("observations.queue_depth") is not None and a.value("observations.queue_depth") < 1
    ):
        out.append("no queue (observations.queue_depth < 1)")
    if a.value("run.metric.client_limited") and not a.value("run.metric.sustained_waiting"):
        out.append(
            f"running requests peaked at the probe's own concurrency "
            f"({a.value('run.metric.client_concurrency')}), so the client, not the engine, set the batch"
        )
    elif a.value("run.metric.slots_full") is False:
        out.append(
            f"running requests stayed below the engine's limit of {a.value('run.metric.slot_limit'):.0f}"
        )
    kv = a.value("observations.kv_cache_usage")
    if kv is not None and kv < 0.8:
        out.append(f"KV cache at most {kv:.0%} used" if kv >= 0.01 else "KV cache under 1 % used")
    pre = a.value("observations.preemptions_per_min")
    if pre is not None and pre == 0:
        out.append("no preemptions")
    err = a.value("observations.error_rate")
    if err is not None and err == 0:
        out.append("no failed requests")
    if a.symptoms and any(
        s.id in ("ttft_high", "itl_high", "latency_high", "errors_under_load") for s in a.symptoms
    ):
        return []  # a stated or measured problem: not a healthy picture
    return out


def _symptom_title(sid: str) -> str:
    from inferwise.knowledge.vocabulary import SYMPTOMS

    return SYMPTOMS[sid]
