"""The fact table diagnosis and planning reason on.

Everything known about a workload is flattened into named facts, each tagged
with where it came from, so that an output can say which numbers were
measured, stated, computed or assumed:

* ``traffic.*``, ``slo.*``, ``deployment.*`` ...  stated in the workload file;
* ``observations.*``  measured (the workload's observations, or a stored probe
  run's summary and scraped engine metrics when the workload lacks them);
* ``gpu.*``  from the GPU catalog;
* ``fit.*``, ``predicted.*``, ``budget.*``  computed by the calculators;
* ``derived.*``  arithmetic on the above (ratios against SLOs or predictions);
* ``symptom.<id>``  stated in ``symptoms`` or derived from measurement vs SLO;
* ``run.*``  a probe run's error classes and engine-metric extremes.

A fact that nobody measured is simply absent; rules never fire on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from inferwise.calculators.errors import InputError
from inferwise.knowledge.rule_engine import Fact
from inferwise.knowledge.sizing import (
    CalcOutcome,
    can_size,
    gpu_info,
    run_budget,
    run_fit,
    run_predict,
)
from inferwise.knowledge.vocabulary import SYMPTOMS
from inferwise.knowledge.workload import Percentiles, Slo, Workload

if TYPE_CHECKING:
    from inferwise.calculators.fit import FitResult
    from inferwise.probes.summary import ProbeSummary

LATENCY_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
PCTS = ("p50", "p90", "p95", "p99")

# Thresholds used only when the workload gives no SLO and no prediction is
# available; every use is reported in the assumptions.
GENERIC_TTFT_HIGH_MS = 2000.0
GENERIC_TTFT_OK_MS = 500.0
GENERIC_ITL_HIGH_MS = 100.0
GENERIC_ITL_OK_MS = 50.0
GPU_UTIL_LOW = 0.4
LONG_PROMPT_P95_TOKENS = 4000
LONG_PROMPT_P50_TOKENS = 2000


@dataclass
class SymptomBasis:
    id: str
    source: str
    """``stated`` (the workload's symptoms list) or ``derived`` (from measurement)."""
    basis: str


@dataclass
class Analysis:
    workload: Workload
    facts: dict[str, Fact] = field(default_factory=dict)
    symptoms: list[SymptomBasis] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    calculators_skipped: str | None = None
    """The note saying why the calculators were not run on the stated deployment."""
    calcs: dict[str, CalcOutcome[Any]] = field(default_factory=dict)
    run: LoadedRun | None = None
    gpu: Any | None = None

    def put(self, name: str, value: Any, source: str, note: str = "") -> None:
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return  # a ratio of a huge and a tiny figure is no fact to reason on
        self.facts[name] = Fact(value, source, note)

    def value(self, name: str) -> Any:
        f = self.facts.get(name)
        return None if f is None else f.value


# --------------------------------------------------------------------------- workload


def _flatten(prefix: str, data: Any, out: dict[str, Any]) -> None:
    if isinstance(data, dict):
        for k, v in data.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif data is not None:
        out[prefix] = data


def _workload_facts(a: Analysis) -> None:
    flat: dict[str, Any] = {}
    _flatten("", a.workload.model_dump(exclude_none=True, mode="json"), flat)
    for name, value in flat.items():
        if isinstance(value, list) or name in ("name", "observations.note"):
            continue
        source = "measured" if name.startswith("observations.") else "stated"
        a.put(name, value, source)


# --------------------------------------------------------------------------- probe runs


_TIMEOUT_CLASSES = ("read_timeout", "total_timeout", "connect_timeout", "stalled")
_SERVER_CLASSES = ("http_5xx", "stream_cut", "server_error_event", "malformed_sse")


@dataclass(frozen=True)
class LoadedRun:
    """A stored run reduced to what the reasoning uses: its summary, the probe's settings
    (config), labels, meta and the engine metrics normalised per scrape (probes/prom.py
    concept names, as (t_s, value) series)."""

    run_id: str
    status: str
    summary: ProbeSummary
    config: dict[str, Any]
    labels: dict[str, str]
    meta: dict[str, Any]
    series: dict[str, list[tuple[float, float]]]


def load_run(run_id: str, db: str | None) -> LoadedRun:
    """The stored run `run_id` (or its prefix) as a :class:`LoadedRun`."""
    from inferwise.probes.prom import Sample, normalize
    from inferwise.probes.store import RunStore
    from inferwise.probes.summary import ProbeSummary

    store = RunStore(db, create=False) if db else RunStore(create=False)
    with store:
        try:
            run_id = store.resolve(run_id)
        except InputError as exc:  # the store names its own argument run_id; ours is `run`
            raise InputError("run", exc.message, exc.accepted) from None
        run = store.get_run(run_id)
        points = store.metric_samples(run_id)
    by_time: dict[float, list[Any]] = {}
    for p in points:
        by_time.setdefault(p.t_s, []).append(Sample(name=p.name, labels=p.labels, value=p.value))
    series: dict[str, list[tuple[float, float]]] = {}
    for t in sorted(by_time):
        for concept, value in normalize(by_time[t]).items():
            series.setdefault(concept, []).append((t, value))
    return LoadedRun(
        run_id=run.run_id,
        status=run.status,
        summary=run.summary or ProbeSummary(),
        config=run.config,
        labels=run.labels,
        meta=run.meta,
        series=series,
    )


def _with_run_slo(workload: Workload, run: LoadedRun) -> Workload:
    """The probe's --slo limits stand in for latency targets the workload does not state.

    A probe SLO is a per-request limit; it is read as the p95 target, as the probe's goodput
    report and the demo's plan read it. Without this, a run probed with --slo is judged against
    generic thresholds and planned with "no targets stated"."""
    limits = {
        m: float(v)
        for m, v in (run.config.get("slo") or {}).items()
        if m in LATENCY_METRICS and isinstance(v, (int, float))
    }
    slo = workload.slo.model_dump(exclude_none=True) if workload.slo else {}
    added = {m: {"p95": v} for m, v in limits.items() if not slo.get(m)}
    if not added:
        return workload
    return workload.model_copy(update={"slo": Slo.model_validate({**slo, **added})})


def _run_facts(a: Analysis, run: LoadedRun) -> None:
    """Fill observations.* the workload lacks from the run, and add run.* facts."""
    note = f"probe run {run.run_id}"
    run_model = run.labels.get("model")
    deployment = a.workload.deployment
    if run_model and deployment is not None and deployment.model and run_model != deployment.model:
        a.notes.append(
            f"Probe run {run.run_id} measured model {run_model!r}, the workload deploys "
            f"{deployment.model!r}: its measurements fill what the workload does not state, "
            "so check that they describe the same deployment."
        )
    _summary_facts(a, run, note)
    _series_facts(a, run, note)
    for length in ("input_tokens", "output_tokens"):
        setting = run.config.get(length)
        if a.value(f"traffic.{length}.p50") is None and setting:
            a.put(f"derived.{length}_p50", float(setting), "measured", note + " (probe setting)")


def _fill(a: Analysis, name: str, value: Any, note: str) -> None:
    """A measured observation, unless the workload states it already."""
    if value is not None and f"observations.{name}" not in a.facts:
        a.put(f"observations.{name}", value, "measured", note)


def _summary_facts(a: Analysis, run: LoadedRun, note: str) -> None:
    """Latency distributions, throughput, errors, cold start and client health."""
    s, src = run.summary, "measured"
    obs = a.workload.observations
    for metric in LATENCY_METRICS:
        if obs is not None and getattr(obs, metric) is not None:
            continue
        dist = getattr(s, metric)
        for k in (*PCTS, "mean", "max"):
            if getattr(dist, k) is not None:
                a.put(f"observations.{metric}.{k}", float(getattr(dist, k)), src, note)
    _fill(a, "requests_per_s", s.request_throughput, note)
    _fill(a, "output_tokens_per_s", s.output_token_throughput, note)
    if s.completed + s.failed:
        _fill(a, "error_rate", s.failed / (s.completed + s.failed), note)
    errors = s.errors
    for cls, n in errors.items():
        a.put(f"run.errors.{cls}", int(n), src, note)
    timeouts = sum(int(errors.get(c, 0)) for c in _TIMEOUT_CLASSES)
    a.put("run.errors.timeouts", timeouts or None, src, note)
    server = sum(int(errors.get(c, 0)) for c in _SERVER_CLASSES)
    a.put("run.errors.server", server or None, src, note)
    warm_p50 = s.ttft_ms.p50
    if s.cold is not None and s.cold.ttft_ms and warm_p50:
        a.put("run.cold_over_warm_ttft", s.cold.ttft_ms / warm_p50, src, note)
    if s.ttft_ms.mean and warm_p50:  # a tail of a few very slow first tokens lifts the mean
        a.put("run.ttft_mean_over_p50", s.ttft_ms.mean / warm_p50, src, note)
    a.put("run.prompt_lengths_narrow", _narrow_prompt_lengths(run.config), "derived", note)
    if s.client_health.saturated:
        a.put("run.client_saturated", True, src, note)
        a.assumptions.append(
            f"The probe client was saturated during run {run.run_id}; its latencies are upper bounds."
        )


def _narrow_prompt_lengths(config: dict[str, Any]) -> bool | None:
    """Whether a probe's synthetic prompts were all about one length (fixed, or a spread of at
    most 25 %), so that TTFT does not vary with the prompt; None where the run does not say
    (a dataset, a trace, an imported file)."""
    if config.get("dataset") or config.get("trace") or "input_distribution" not in config:
        return None
    spread = float(config.get("input_spread") or 0.0)
    return config["input_distribution"] == "fixed" or spread <= 0.25


def _series_facts(a: Analysis, run: LoadedRun, note: str) -> None:
    """What the engine's own metrics showed over the run: queue, running, KV, preemptions,
    prefix-cache hits and whether the slots were full."""
    src, series = "measured", run.series

    def values(concept: str) -> list[float]:
        return [v for _, v in series.get(concept, [])]

    waiting, running, kv = (
        values("requests_waiting"),
        values("requests_running"),
        values("kv_cache_usage"),
    )
    if waiting:
        # A single scrape catches requests between admission and the next engine step: only
        # waiting that persists across the run (median, share of scrapes) is a queue.
        a.put("run.metric.requests_waiting_max", max(waiting), src, note)
        a.put("run.metric.requests_waiting_median", median(waiting), src, note)
        share = sum(1 for w in waiting if w >= 1) / len(waiting)
        a.put("run.metric.requests_waiting_share", share, src, note)
        a.put("run.metric.scrapes", len(waiting), src, note)
        a.put(
            "run.metric.sustained_waiting",
            len(waiting) >= 2 and (share >= 0.5 or median(waiting) >= 1),
            "derived",
            note,
        )
        _fill(a, "queue_depth", median(waiting), note)
    if running:
        a.put("run.metric.requests_running_max", max(running), src, note)
        _fill(a, "concurrency", sum(running) / len(running), note)
    if kv:
        a.put("run.metric.kv_cache_usage_max", max(kv), src, note)
        _fill(a, "kv_cache_usage", max(kv), note)
    _counter_facts(a, series, note)
    _slot_facts(a, run, series, note)


def _counter_facts(a: Analysis, series: dict[str, list[tuple[float, float]]], note: str) -> None:
    """Rates from the engine's counters: preemptions per minute, prefix-cache hit rate."""
    pre = series.get("preemptions", [])
    if len(pre) >= 2 and pre[-1][0] > pre[0][0]:
        per_min = max(0.0, pre[-1][1] - pre[0][1]) / ((pre[-1][0] - pre[0][0]) / 60)
        _fill(a, "preemptions_per_min", per_min, note)
    hits, queries = series.get("prefix_cache_hits", []), series.get("prefix_cache_queries", [])
    if len(hits) >= 2 and len(queries) >= 2 and queries[-1][1] > queries[0][1]:
        rate = (hits[-1][1] - hits[0][1]) / (queries[-1][1] - queries[0][1])
        _fill(a, "prefix_cache_hit_rate", rate, note)
    elif series.get("prefix_cache_hit_rate"):
        hr = [v for _, v in series["prefix_cache_hit_rate"]]
        _fill(a, "prefix_cache_hit_rate", sum(hr) / len(hr), note)


_SLOT_LABELS = ("max_num_seqs", "max-num-seqs", "n_parallel", "parallel", "slots")


def _slot_limit(a: Analysis, run: LoadedRun) -> tuple[float | None, str]:
    """The engine's own limit on running requests, where something states it: the workload's
    deployment.max_num_seqs, the slot count the server reported to the probe (llama.cpp's
    /props total_slots, stored in the run's meta), or a run label (``--label slots=4``,
    ``max_num_seqs=64``). Never the probe's concurrency: that is the client."""
    cap = a.value("deployment.max_num_seqs")
    if isinstance(cap, (int, float)) and cap > 0:
        return float(cap), "deployment.max_num_seqs"
    server = run.meta.get("server") or {}
    stated = server.get("max_num_seqs")
    if isinstance(stated, (int, float)) and stated > 0:
        return float(
            stated
        ), f"the server's own report ({server.get('engine', 'engine')} slots: {int(stated)})"
    labels = run.labels
    for key in _SLOT_LABELS:
        try:
            value = float(labels.get(key, ""))
        except ValueError:
            continue
        if value > 0:
            return value, f"run label {key}={labels[key]}"
    return None, ""


def _slot_facts(
    a: Analysis, run: LoadedRun, series: dict[str, list[tuple[float, float]]], note: str
) -> None:
    """Whether the engine's running slots were full while requests waited.

    Slots are called full only against a known limit (stated max_num_seqs or slot count), or
    when the running count sits on a plateau below what the probe offered while a queue
    stands behind it across the run. A running count equal to the probe's own closed-loop
    concurrency says the *client* capped the batch, not the engine."""
    running = series.get("requests_running", [])
    waiting = dict(series.get("requests_waiting", []))
    if not running:
        return
    cfg = run.config
    client = cfg.get("concurrency") if not cfg.get("request_rate") else None
    run_max = max(v for _, v in running)
    if client:
        a.put("run.metric.client_concurrency", int(client), "measured", note + " (probe setting)")
    if client and run_max >= float(client):
        a.put("run.metric.client_limited", True, "derived", note)
    cap, basis = _slot_limit(a, run)
    queued = [r for t, r in running if waiting.get(t, 0) >= 1]
    if cap is not None:
        a.put("run.metric.slot_limit", cap, "derived", basis)
        a.put("run.metric.slot_limit_basis", basis, "derived")
        busy = median(queued) if queued else run_max
        a.put("run.metric.slots_full", busy >= 0.95 * cap, "derived", note)
        # A closed loop that keeps more requests in flight than the engine has slots makes
        # the difference wait at every moment: queueing by construction, however short the
        # run (a short run's scrapes can miss most of the queue).
        if client and float(client) > cap and busy >= 0.95 * cap:
            a.put("run.metric.queued_by_design", float(client) - cap, "derived", note)
        return
    # No stated limit: a plateau (most scrapes at the maximum) with a standing queue, and the
    # probe offering more than the plateau, shows where the engine stops admitting.
    at_max = sum(1 for _, r in running if r >= run_max) / len(running)
    plateau = (
        len(running) >= 3
        and at_max >= 0.5
        and bool(a.value("run.metric.sustained_waiting"))
        and not a.value("run.metric.client_limited")
    )
    if plateau:
        a.put("run.metric.slot_limit", run_max, "derived", note)
        a.put(
            "run.metric.slot_limit_basis",
            "plateau of the running count while requests waited",
            "derived",
        )
        a.put("run.metric.slots_full", True, "derived", note)


# --------------------------------------------------------------------------- derived


def _pct(a: Analysis, prefix: str, key: str) -> float | None:
    v = a.value(f"{prefix}.{key}")
    return float(v) if isinstance(v, (int, float)) else None


def _over_slo(a: Analysis, metric: str) -> tuple[float, str] | None:
    """The worst observed/target ratio over the percentiles both give."""
    worst: tuple[float, str] | None = None
    for k in PCTS:
        obs, slo = _pct(a, f"observations.{metric}", k), _pct(a, f"slo.{metric}", k)
        if obs is not None and slo:
            r = obs / slo
            if worst is None or r > worst[0]:
                worst = (r, k)
    return worst


def _tail(a: Analysis, prefix: str) -> float | None:
    """The tail of the distribution under `prefix` (stated or measured), by the workload's
    own rule (:meth:`Percentiles.tail`)."""
    values = {k: _pct(a, prefix, k) for k in Percentiles.model_fields}
    tail = Percentiles.model_construct(**values).tail()
    return tail[1] if tail else None


def _lengths(a: Analysis) -> None:
    p50 = _pct(a, "traffic.input_tokens", "p50") or a.value("derived.input_tokens_p50")
    p95 = next(
        (v for k in ("p95", "p99", "p90") if (v := _pct(a, "traffic.input_tokens", k)) is not None),
        None,
    )
    if p50 is not None:
        a.put(
            "derived.input_tokens_p50",
            p50,
            a.facts.get("derived.input_tokens_p50", Fact(0, "stated")).source,
        )
    if p95 is not None:
        a.put("derived.input_tokens_p95", p95, "stated")
    elif p50 is not None:
        a.put("derived.input_tokens_p95", p50, "stated", "only p50 known")
    if p50 is not None or p95 is not None:
        long = (p95 or 0) >= LONG_PROMPT_P95_TOKENS or (p50 or 0) >= LONG_PROMPT_P50_TOKENS
        a.put("derived.long_prompts", long, "derived")
    out50 = _pct(a, "traffic.output_tokens", "p50") or a.value("derived.output_tokens_p50")
    if out50 is not None:
        a.put("derived.output_tokens_p50", out50, "stated")


def _deployment_derived(a: Analysis) -> None:
    dep = a.workload.deployment
    if dep is None:
        return
    tp = dep.tensor_parallel_size or 1
    pp = dep.pipeline_parallel_size or 1
    a.put("derived.tp", tp, "stated" if dep.tensor_parallel_size else "assumed")
    a.put("derived.pp", pp, "stated" if dep.pipeline_parallel_size else "assumed")
    a.put("derived.world_size", tp * pp, "derived")
    if dep.replicas is not None:
        a.put("derived.replicas", dep.replicas, "stated")
    if dep.router is not None:
        a.put(
            "derived.router_locality_blind", dep.router in ("round_robin", "least_loaded"), "stated"
        )
        a.put(
            "derived.router_locality_aware",
            dep.router in ("prefix_aware", "session_sticky"),
            "stated",
        )
    gpu, note = gpu_info(dep.gpu)
    if note:
        a.assumptions.append(note)
    if gpu is not None:
        a.gpu = gpu
        a.put("gpu.name", gpu.name, "catalog")
        a.put("gpu.interconnect", gpu.interconnect, "catalog")
        a.put("gpu.memory_total_gib", gpu.memory_total_gib, "catalog")
        a.put("gpu.memory_bandwidth_gb_per_s", gpu.memory_bandwidth_gb_per_s, "catalog")
        a.put("derived.tp_over_pcie", tp >= 2 and gpu.interconnect == "pcie", "catalog")


def _observation_derived(a: Analysis) -> None:
    for metric in LATENCY_METRICS:
        r = _over_slo(a, metric)
        if r is not None:
            a.put(f"derived.{metric.removesuffix('_ms')}_over_slo", r[0], "derived", r[1])
    p50, p99 = _pct(a, "observations.itl_ms", "p50"), _pct(a, "observations.itl_ms", "p99")
    if p99 is None:
        p99 = _pct(a, "observations.itl_ms", "p95")
    if p50 and p99 is not None:
        a.put("derived.itl_tail_ratio", p99 / p50, "derived")
    t50, t99 = _pct(a, "observations.ttft_ms", "p50"), _pct(a, "observations.ttft_ms", "p99")
    if t50 and t99 is not None:
        a.put("derived.ttft_tail_ratio", t99 / t50, "derived")
    q, c = a.value("observations.queue_depth"), a.value("observations.concurrency")
    if q is not None and c:
        a.put("derived.queue_per_running", q / c, "derived")
    cap = a.value("deployment.max_num_seqs")
    if c is not None and cap:
        a.put("derived.running_below_seq_cap", c < 0.9 * cap, "derived")
    shared, hit = (
        a.value("traffic.shared_prefix_fraction"),
        a.value("observations.prefix_cache_hit_rate"),
    )
    if shared is not None and hit is not None and shared >= 0.2:
        a.put("derived.prefix_hit_gap", shared - hit, "derived")
    rps, rate = a.value("observations.requests_per_s"), a.value("traffic.arrival_rate_rps")
    if rps is not None and rate:
        a.put("derived.completed_over_offered", rps / rate, "derived")
    if rate is not None:
        a.put("derived.peak_rate_rps", rate * (a.value("traffic.peak_to_mean") or 1.0), "derived")
    modality = a.value("product.modality")
    if modality is not None:
        a.put("derived.media_input", modality in ("vision", "audio", "image", "video"), "stated")
    err = a.value("observations.error_rate")
    if err is not None:
        limit = a.value("slo.error_rate")
        a.put("derived.error_over_slo", err > (limit if limit is not None else 0.01), "derived")


# --------------------------------------------------------------------------- calculators


def _not_computed(notes: list[str]) -> list[str]:
    """A calculator that could not answer is an assumption of everything after it: say so."""
    return [
        f"Not computed: {n.rstrip('.')}; the reasoning continues without these numbers."
        for n in notes
    ]


def _typical(dist: Any) -> float | None:
    """A calculator's distribution (its Percentiles, or none) as one typical value: the
    median."""
    return float(dist.p50) if dist is not None else None


def _sizing_lengths(a: Analysis) -> tuple[float | None, float | None]:
    return a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")


def _calculator_facts(a: Analysis) -> None:
    missing = can_size(a.workload)
    if missing:
        if a.workload.deployment is not None:
            allowed = a.workload.constraints.gpus if a.workload.constraints else None
            hint = (
                f"; the workload allows {', '.join(allowed)}: `inferwise plan` sizes each candidate"
                if allowed and "deployment.gpu" in missing
                else ""
            )
            a.calculators_skipped = f"The calculators were not run: {missing} is missing{hint}."
            a.notes.append(a.calculators_skipped)
        return
    inp, out = _sizing_lengths(a)
    # Requests in flight hold typical, not worst-case, contexts: size the KV question with
    # p50 lengths (the p95 would call a healthy cache "full"). Observed concurrency and rates
    # are for the whole deployment; fit and predict describe one replica.
    context = int(inp + (out or 0)) if inp else None
    concurrency = a.value("observations.concurrency") or a.value("traffic.concurrency")
    replicas = max(1, int(a.value("derived.replicas") or 1))

    fit = run_fit(
        a.workload, context, max(1, round(concurrency / replicas)) if concurrency else None
    )
    a.calcs["fit"] = fit
    a.assumptions.extend(_not_computed(fit.notes))
    if fit.failure is not None and fit.failure.field in ("model", "gpu"):
        a.assumptions.append(
            "`inferwise predict` and `inferwise budget` were skipped for the same reason."
        )
        return
    if fit.result is not None:
        _fit_facts(a, fit.result, context, replicas)
    if inp is None or out is None:
        a.notes.append(
            "`inferwise predict` was not run: traffic.input_tokens and traffic.output_tokens are needed."
        )
        return
    _predict_facts(a, inp, out, concurrency, replicas)
    _single_request_facts(a, inp, out)
    if a.workload.slo is not None:
        _budget_facts(a, inp, out)
    _capacity_facts(a)


def _fit_facts(a: Analysis, r: FitResult, context: int | None, replicas: int) -> None:
    """What the memory fit says about the stated deployment at the workload's load."""
    answer = r.answer
    a.put("fit.fits", r.fits, "computed")
    if (
        not r.fits
        and answer is not None
        and answer.fits
        and a.value("deployment.max_model_len") is None
    ):
        # vLLM refuses to start when one request of max_model_len does not fit; with the
        # context left at the model's default that says nothing about the load asked
        # for, which fits. A deployment that runs must have set a shorter context.
        a.put("fit.fits", True, "computed", "at the workload's context and concurrency")
        a.put("fit.default_context_fails", True, "computed", r.verdict)
        a.assumptions.append(
            f"At the model's default max_model_len ({r.max_model_len:,} tokens) "
            f"the engine would not start: {r.verdict.rstrip('.')}. The workload's "
            "own load fits; a running deployment must pass a shorter --max-model-len "
            "(state deployment.max_model_len)."
        )
    a.put("fit.quantization", r.quantization, "computed", "as the engine would load it")
    if answer is not None:
        a.put(
            "fit.max_concurrency",
            answer.max_concurrency_at_context,
            "computed",
            f"whole requests of {answer.context_tokens} tokens",
        )
    else:
        a.put("fit.max_concurrency", r.max_concurrency, "computed", "at max_model_len")
    a.put("fit.kv_cache_tokens", r.kv_cache_tokens, "computed")
    if r.per_gpu.weights_gib and r.per_gpu.usable_gib:
        a.put("fit.weights_share", r.per_gpu.weights_gib / r.per_gpu.usable_gib, "computed")
    obs_c = a.value("observations.concurrency")
    obs_c = obs_c / replicas if obs_c else obs_c
    fit_c = a.value("fit.max_concurrency")
    if obs_c and fit_c:
        a.put("derived.concurrency_over_fit", obs_c / fit_c, "derived", "per replica")
    elif obs_c and fit_c == 0:
        a.put("derived.no_request_fits", True, "derived", f"context {context} tokens")


def _predict_facts(
    a: Analysis, inp: float, out: float, concurrency: float | None, replicas: int
) -> None:
    """Predicted latency at the workload's load, per replica."""
    rate = a.value("traffic.arrival_rate_rps")
    if concurrency or not rate:
        per = max(1.0, (concurrency or 1) / replicas)
        pred = run_predict(a.workload, inp, out, concurrency=per)
        at = f"at concurrency {per:.0f} per replica"
    else:
        pred = run_predict(a.workload, inp, out, request_rate=rate / replicas)
        at = f"at {rate / replicas:g} req/s per replica"
    a.calcs["predict"] = pred
    a.assumptions.extend(_not_computed(pred.notes))
    r = pred.result
    if r is None:
        return
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "queue_ms"):
        dist = getattr(r, metric)
        if dist is not None:
            for k in ("mean", *PCTS):
                a.put(f"predicted.{metric}.{k}", getattr(dist, k), "computed", at)
    a.put("predicted.itl_ms", _typical(r.itl_ms), "computed", at)
    a.put("predicted.ttft_ms", _typical(r.ttft_ms), "computed", at)
    a.put("predicted.bound", r.bound, "computed", at)
    a.put("predicted.decode_step_ms", r.step.decode_step_ms, "computed", at)
    a.put(
        "predicted.max_requests_per_s",
        r.saturation.max_requests_per_s,
        "computed",
        "saturation, ignoring SLOs",
    )
    obs_itl = _pct(a, "observations.itl_ms", "p50") or _pct(a, "observations.tpot_ms", "p50")
    pred_itl = a.value("predicted.itl_ms")
    if obs_itl and pred_itl:
        a.put("derived.itl_over_predicted", obs_itl / pred_itl, "derived")


def _single_request_facts(a: Analysis, inp: float, out: float) -> None:
    """A request alone: its TTFT is its prefill, the reference for "is the rest queueing?"."""
    single = run_predict(a.workload, inp, out, concurrency=1)
    a.calcs["predict_c1"] = single
    r = single.result
    ttft_c1 = _typical(r.ttft_ms) if r is not None else None
    obs_ttft = _pct(a, "observations.ttft_ms", "p50")
    if ttft_c1:
        a.put("predicted.prefill_ms", ttft_c1, "computed", "TTFT at concurrency 1")
        if obs_ttft:
            a.put("derived.ttft_over_prefill", obs_ttft / ttft_c1, "derived")
    itl_c1 = _typical(r.itl_ms) if r is not None else None
    if itl_c1:
        a.put("predicted.itl_ms_c1", itl_c1, "computed", "at concurrency 1")
        slo_itl = _tail(a, "slo.itl_ms") or _tail(a, "slo.tpot_ms")
        if slo_itl:
            a.put("derived.itl_floor_over_slo", itl_c1 / slo_itl, "derived")


def _budget_facts(a: Analysis, inp: float, out: float) -> None:
    budget = run_budget(a.workload, inp, out)
    a.calcs["budget"] = budget
    a.assumptions.extend(_not_computed(budget.notes))
    if budget.result is None:
        return
    max_rate = budget.result.max_rate_under_slo
    a.put("budget.max_rate_under_slo", max_rate, "computed")
    if max_rate == 0:
        _idle_misses(a, inp, out)
    a.put("budget.binding", _design_load_binding(budget.result), "computed")
    a.put("budget.feasible", budget.result.feasible, "computed")


def _design_load_binding(r: Any) -> str:
    """The stage most over its budget at the design load: the budget's binding stage, except
    where no load meets a target. There the budget names the fixed stage no replica count
    helps (that part is weighed by _idle_misses), while this fact stays the design load's
    overrun, which the rules weigh."""
    from inferwise.calculators.budget import overrun_stage

    if r.binding_target is None:
        return r.binding
    return overrun_stage(r.components, r.binding_target) or r.binding


def _idle_misses(a: Analysis, inp: float, out: float) -> None:
    """When no rate meets the SLO, which targets a lightly loaded replica already misses (the
    budget at a trickle of load): the part of the SLO that more replicas cannot buy."""
    idle = run_budget(a.workload, inp, out, idle=True)
    checks = idle.result.checks if idle.result is not None else []
    missed = [
        f"{c.metric.removesuffix('_ms').upper()} {c.percentile} "
        f"{c.predicted_ms:,.0f} ms > {c.target_ms:,.0f} ms"
        for c in checks
        if not c.met
    ]
    if missed:
        a.put(
            "derived.idle_misses", "; ".join(missed), "computed", "inferwise budget at 0.01 req/s"
        )
        a.put("derived.idle_misses_ttft", any(m.startswith("TTFT") for m in missed), "computed")
        a.put(
            "derived.idle_misses_decode",
            any(m.startswith(("ITL", "TPOT", "E2E")) for m in missed),
            "computed",
        )


def _capacity_facts(a: Analysis) -> None:
    """One capacity figure for the whole deployment, used by the diagnosis and the plan alike.

    Capacity is the budget's max rate under the SLO x replicas. When no rate meets the SLO
    (the budget answers 0), the honest figure is the saturation rate, labelled as such: the
    diagnosis then compares the peak with what the replicas can push through at all, and the
    plan's baseline says that no rate meets the SLO instead of printing 0 as a capacity."""
    replicas = max(1, int(a.value("derived.replicas") or 1))
    budget = a.calcs.get("budget")
    sat = budget.result.saturation_request_rate if budget and budget.result else None
    sat_src = "`inferwise budget` saturation_request_rate"
    if not sat:
        sat = a.value("predicted.max_requests_per_s")
        sat_src = "`inferwise predict` saturation max_requests_per_s"
    per = f"{replicas} replica{'s' if replicas > 1 else ''} x"
    if sat:
        a.put(
            "derived.saturation_rps",
            float(sat) * replicas,
            "computed",
            f"{per} {sat:.3g} req/s, {sat_src}",
        )
    slo_rate = a.value("budget.max_rate_under_slo")
    if slo_rate is not None and slo_rate <= 0:
        a.put("derived.no_rate_meets_slo", True, "computed", "inferwise budget")
    if slo_rate:
        a.put("derived.capacity_rps", float(slo_rate) * replicas, "computed")
        basis = f"max rate under the SLO: {per} {slo_rate:.3g} req/s, `inferwise budget` max_rate_under_slo"
    elif sat:
        a.put("derived.capacity_rps", float(sat) * replicas, "computed")
        basis = (
            f"saturation rate, since no rate meets the SLO: {per} {sat:.3g} req/s, {sat_src}"
            if slo_rate is not None
            else f"saturation rate, no SLO checked: {per} {sat:.3g} req/s, {sat_src}"
        )
    else:
        return
    a.put("derived.capacity_rps", a.value("derived.capacity_rps"), "computed", basis)
    a.put("derived.capacity_basis", basis, "computed")
    peak, cap = a.value("derived.peak_rate_rps"), a.value("derived.capacity_rps")
    if peak:
        a.put("derived.peak_over_capacity", peak / cap, "derived")
    rate, queue = a.value("traffic.arrival_rate_rps"), a.value("observations.queue_depth")
    sat_all = a.value("derived.saturation_rps")
    if rate and sat_all:
        a.put("derived.mean_over_saturation", rate / sat_all, "derived")
        served = a.value("derived.completed_over_offered")
        if rate > sat_all and (
            (queue is not None and queue <= 2) or (served is not None and served >= 0.95)
        ):
            # measured beats modelled: past its throughput ceiling a queue grows without
            # bound, so a deployment serving its mean rate with (almost) no queue has more
            # capacity than computed; say so rather than call it saturated
            a.put("derived.capacity_underestimated", True, "derived", f"mean rate {rate:g} req/s")
            a.assumptions.append(
                f"The computed throughput ceiling ({sat_all:.3g} req/s) is below the mean rate of "
                f"{rate:g} req/s that the measurements show being served "
                + (
                    f"with almost no queue (queue depth {queue:g})"
                    if queue is not None and queue <= 2
                    else f"in full ({served:.0%} completed)"
                )
                + ": the calculators underestimate this deployment, so "
                "computed capacities here are lower bounds and replica counts upper bounds."
            )


# --------------------------------------------------------------------------- symptoms


def _symptoms(a: Analysis) -> None:
    stated = list(a.workload.symptoms or [])
    derived: dict[str, str] = {}

    def judge(
        metric: str, label: str, high_id: str, ok_id: str, generic: tuple[float, float]
    ) -> None:
        ratio = a.value(f"derived.{metric}_over_slo")
        if ratio is not None:
            key = a.facts[f"derived.{metric}_over_slo"].note
            obs = a.value(f"observations.{metric}_ms.{key}")
            slo = a.value(f"slo.{metric}_ms.{key}")
            if ratio > 1:
                derived[high_id] = f"measured {label} {key} {obs:.0f} ms > target {slo:.0f} ms"
            else:
                derived[ok_id] = f"measured {label} {key} {obs:.0f} ms <= target {slo:.0f} ms"
            return
        obs_tail = _tail(a, f"observations.{metric}_ms")
        if obs_tail is None:
            return
        pred = a.value(f"predicted.{metric}_ms")
        obs50 = _pct(a, f"observations.{metric}_ms", "p50") or obs_tail
        if pred:
            if obs50 > 2 * pred:
                derived[high_id] = (
                    f"measured {label} p50 {obs50:.0f} ms > 2x predicted {pred:.0f} ms (no SLO given)"
                )
            elif obs50 <= 1.3 * pred:
                derived[ok_id] = (
                    f"measured {label} p50 {obs50:.0f} ms is close to predicted {pred:.0f} ms (no SLO given)"
                )
            return
        high, ok = generic
        if obs_tail > high:
            derived[high_id] = (
                f"measured {label} tail {obs_tail:.0f} ms > {high:.0f} ms (generic interactive threshold; no SLO given)"
            )
            a.assumptions.append(
                f"No {label} SLO: judged against a generic interactive threshold of {high:.0f} ms."
            )
        elif obs_tail < ok:
            derived[ok_id] = (
                f"measured {label} tail {obs_tail:.0f} ms < {ok:.0f} ms (generic threshold; no SLO given)"
            )

    judge("ttft", "TTFT", "ttft_high", "ttft_normal", (GENERIC_TTFT_HIGH_MS, GENERIC_TTFT_OK_MS))
    judge("itl", "ITL", "itl_high", "itl_normal", (GENERIC_ITL_HIGH_MS, GENERIC_ITL_OK_MS))
    if "itl_high" not in derived and "itl_normal" not in derived:
        judge("tpot", "TPOT", "itl_high", "itl_normal", (GENERIC_ITL_HIGH_MS, GENERIC_ITL_OK_MS))
    over = [
        m for m in ("ttft", "itl", "tpot", "e2e") if (a.value(f"derived.{m}_over_slo") or 0) > 1
    ]
    if over:
        derived["latency_high"] = "measured " + ", ".join(m.upper() for m in over) + " above target"
    gu = a.value("observations.gpu_util")
    if gu is not None and gu < GPU_UTIL_LOW:
        derived["gpu_util_low"] = f"measured GPU utilisation {gu:.0%} < {GPU_UTIL_LOW:.0%}"
    if a.value("derived.error_over_slo"):
        derived["errors_under_load"] = (
            f"measured error rate {a.value('observations.error_rate'):.1%} above target"
        )

    opposite = {
        "ttft_high": "ttft_normal",
        "ttft_normal": "ttft_high",
        "itl_high": "itl_normal",
        "itl_normal": "itl_high",
    }
    final: dict[str, SymptomBasis] = {}
    for sid, basis in derived.items():
        final[sid] = SymptomBasis(sid, "derived", basis)
    for sid in stated:
        if sid in final:
            final[sid] = SymptomBasis(sid, "derived", final[sid].basis + "; also stated")
            continue
        opp = opposite.get(sid)
        if opp in derived:
            a.assumptions.append(
                f"The workload states '{sid}' but the measurement says '{opp}' ({derived[opp]}); measured beats stated, so '{opp}' is used."
            )
            continue
        final[sid] = SymptomBasis(sid, "stated", "stated in the workload's symptoms")
    a.symptoms = [final[s] for s in SYMPTOMS if s in final]
    for s in a.symptoms:
        a.put(f"symptom.{s.id}", True, s.source, s.basis)


def analyse(workload: Workload, run_id: str | None = None, db: str | None = None) -> Analysis:
    """Everything the rules need, in dependency order: stated and measured values first,
    then the catalog, then the calculators (which need lengths), then ratios and symptoms."""
    run = load_run(run_id, db) if run_id else None
    if run is not None:
        workload = _with_run_slo(workload, run)
    a = Analysis(workload=workload, run=run)
    _workload_facts(a)
    if run is not None:
        _run_facts(a, run)
    _lengths(a)
    _deployment_derived(a)
    _observation_derived(a)
    _calculator_facts(a)
    _symptoms(a)
    return a
