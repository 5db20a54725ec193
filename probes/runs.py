"""`inferwise runs list|show|compare|export`: the stored probe runs, read back.

`show` recomputes the summary from the stored requests with the probe's own
`summarize()`, so a run interrupted before it wrote its summary, or stored by
an older version, reads the same as a fresh one. `compare` puts a baseline
next to candidates metric by metric and says whether each change is beyond
noise (runs_stats.py says how). `export` writes one row per request with the
derived metrics, for notebooks and spreadsheets.

Only the stdlib, pydantic and light project modules at module level: the
registry imports these models when the MCP server lists its tools.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferwise.calculators.errors import InputError
from inferwise.probes.cluster_models import ClusterInfo
from inferwise.probes.quality import QualityComparison
from inferwise.probes.records import ErrorClassCount, error_counts
from inferwise.probes.summary import SLO_KEYS, ProbeSummary, check_slo


def _run_id_field() -> Any:
    return Field(
        description="Run id from `runs list` (a unique prefix or `latest` works too).",
        min_length=1,
        json_schema_extra={"cli_positional": True},
    )


_DB_DESC = "Run database file (default: $INFERWISE_DB or the user's data dir, ~/.local/share/inferwise/runs.db)."


# --------------------------------------------------------------------------- list


class ListRunsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=20, ge=1, le=1000, description="Most recent runs to list.")
    label: dict[str, str] = Field(
        default_factory=dict,
        description="Only runs carrying every one of these labels, e.g. model=meta-llama/Llama-3.1-8B-Instruct engine=vllm.",
    )
    db: str | None = Field(default=None, description=_DB_DESC)


class RunRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    created_at: str = Field(description="ISO 8601, UTC.")
    status: str = Field(description="running, complete, interrupted or failed.")
    stale: bool = Field(
        default=False, description="Still `running` on disk but its process is gone (killed)."
    )
    labels: dict[str, str] = Field(default_factory=dict)
    load: str = Field(description="Load shape in words, e.g. 'closed loop, concurrency 8'.")
    requests: int = Field(description="Stored requests (warm-up included).")
    completed: int | None = None
    failed: int | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    output_token_throughput: float | None = Field(
        default=None, description="Generated tokens per second."
    )
    request_throughput: float | None = Field(
        default=None, description="Completed requests per second."
    )


class ListRunsResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db_path: str
    runs: list[RunRow]
    filtered_by: dict[str, str] = Field(default_factory=dict)


def describe_load(config: dict[str, Any]) -> str:
    """The load shape in words, from a stored run config."""
    from inferwise.probes.loadgen import load_words

    rate, conc, burst = (config.get(k) for k in ("request_rate", "concurrency", "burstiness"))
    try:
        rate = None if rate is None else float(rate)
        burst = None if burst is None else float(burst)
    except (TypeError, ValueError):
        rate = math.nan
    parts = [load_words(conc, rate, burst)]
    if isinstance(config.get("trace_replay"), dict):
        from inferwise.probes.loadgen import trace_words

        parts = [trace_words(config["trace_replay"])]
    if config.get("requests"):
        parts.append(f"{config['requests']} requests")
    if config.get("duration_s"):
        parts.append(f"{config['duration_s']:g} s")
    lengths = []
    if config.get("input_tokens"):
        lengths.append(f"in {config['input_tokens']}")
    if config.get("output_tokens"):
        lengths.append(f"out {config['output_tokens']}")
    if lengths:
        parts.append("/".join(lengths) + " tokens")
    return ", ".join(parts)


def _run_row(r: Any) -> RunRow:
    """One line of `runs list`: the stored run's headline numbers (none without a summary)."""
    s = r.summary
    return RunRow(
        run_id=r.run_id,
        created_at=r.created_at,
        status=r.status,
        stale=r.stale,
        labels=r.labels,
        load=describe_load(r.config),
        requests=r.request_count,
        completed=s.completed if s else None,
        failed=s.failed if s else None,
        ttft_p50_ms=s.ttft_ms.p50 if s else None,
        ttft_p95_ms=s.ttft_ms.p95 if s else None,
        itl_p50_ms=s.itl_ms.p50 if s else None,
        itl_p95_ms=s.itl_ms.p95 if s else None,
        output_token_throughput=s.output_token_throughput if s else None,
        request_throughput=s.request_throughput if s else None,
    )


def list_runs(req: ListRunsRequest) -> ListRunsResult:
    """Newest first, with the headline numbers of each run's stored summary."""
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store:
        runs = store.list_runs(limit=req.limit, labels=req.label)
        for r in runs:
            if r.summary is None and r.request_count:
                # killed or still running: no summary was written, so compute one from what is stored
                from inferwise.probes.summary import summarize

                r.summary = summarize(store.requests(r.run_id), slo=r.config.get("slo") or None)
        rows = [_run_row(r) for r in runs]
        return ListRunsResult(db_path=str(store.path), runs=rows, filtered_by=req.label)


# --------------------------------------------------------------------------- show


class ShowRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = _run_id_field()
    slo: dict[str, float] | None = Field(
        default=None,
        description="SLO targets in ms to judge goodput by (keys ttft_ms, itl_ms, tpot_ms, e2e_ms); default: the run's own.",
    )
    db: str | None = Field(default=None, description=_DB_DESC)

    _slo = field_validator("slo")(classmethod(lambda cls, v: check_slo(v)))


class ServerMetricSummary(BaseModel):
    """One engine metric (by common concept) over the run, from the scraped /metrics samples."""

    model_config = ConfigDict(extra="forbid")

    concept: str = Field(description="Common name, e.g. requests_waiting, kv_cache_usage (0-1).")
    kind: Literal["gauge", "counter", "derived"]
    samples: int
    min: float | None = None
    mean: float | None = None
    max: float | None = None
    last: float | None = None
    increase: float | None = Field(default=None, description="Counters: growth during the run.")


class RunDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    created_at: str
    finished_at: str | None = None
    status: str
    stale: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    load: str
    config: dict[str, Any] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)
    requests_stored: int
    summary: ProbeSummary = Field(description="Recomputed from the stored requests.")
    errors: list[ErrorClassCount] = Field(default_factory=list)
    server_engine: str | None = Field(
        default=None, description="Engine whose /metrics were scraped (vllm, sglang, llamacpp)."
    )
    server_metrics: list[ServerMetricSummary] = Field(default_factory=list)
    cluster: ClusterInfo | None = Field(
        default=None, description="The Dask scheduler and workers that carried a --cluster run."
    )
    notes: list[str] = Field(default_factory=list)


_GAUGES = (
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "kv_cache_tokens",
    "prefix_cache_hit_rate",
)
_COUNTERS = (
    "prefix_cache_hits",
    "prefix_cache_queries",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
)


def summarize_server_metrics(points: list[Any]) -> tuple[str | None, list[ServerMetricSummary]]:
    """Group stored samples by scrape time, normalise each scrape, then summarise each concept over time."""
    from inferwise.probes.prom import Sample, detect_engine, normalize

    by_t: dict[float, list[Sample]] = {}
    for p in points:
        by_t.setdefault(p.t_s, []).append(Sample(name=p.name, labels=p.labels, value=p.value))
    if not by_t:
        return None, []
    engine = detect_engine(s for group in by_t.values() for s in group)
    series: dict[str, list[float]] = {}
    for t in sorted(by_t):
        for concept, value in normalize(by_t[t], engine).items():
            series.setdefault(concept, []).append(value)
    out: list[ServerMetricSummary] = []
    for concept in (*_GAUGES, *_COUNTERS):
        values = series.get(concept)
        if not values:
            continue
        kind: Literal["gauge", "counter"] = "counter" if concept in _COUNTERS else "gauge"
        out.append(
            ServerMetricSummary(
                concept=concept,
                kind=kind,
                samples=len(values),
                min=min(values),
                mean=sum(values) / len(values),
                max=max(values),
                last=values[-1],
                increase=(values[-1] - values[0]) if kind == "counter" else None,
            )
        )
    hits, queries = series.get("prefix_cache_hits"), series.get("prefix_cache_queries")
    if hits and queries and queries[-1] - queries[0] > 0:
        rate = (hits[-1] - hits[0]) / (queries[-1] - queries[0])
        out.append(
            ServerMetricSummary(
                concept="prefix_cache_hit_rate_during_run",
                kind="derived",
                samples=len(hits),
                last=rate,
            )
        )
    return engine, out


def _error_counts(records: list[Any]) -> list[ErrorClassCount]:
    """The measured requests' failures (warm-up left out, as in the summary)."""
    return error_counts(r for r in records if not r.warmup)


def _recompute(
    records: list[Any], stored: ProbeSummary | None, slo: dict[str, float] | None
) -> ProbeSummary:
    from inferwise.probes.summary import summarize

    if not records and stored is not None:  # an imported summary-only result: the tool's figures
        return stored
    summary = summarize(records, slo=slo or None)
    # loop-lag samples are not stored per request; keep the client-health verdict the run wrote
    if stored is not None:
        summary.client_health = stored.client_health
    return summary


def show_run(req: ShowRunRequest) -> RunDetail:
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store:
        run_id = store.resolve(req.run_id)
        run = store.get_run(run_id)
        records = store.requests(run_id)
        points = store.metric_samples(run_id)
    slo = req.slo if req.slo is not None else run.config.get("slo")
    summary = _recompute(records, run.summary, slo)
    engine, server = summarize_server_metrics(points)
    notes: list[str] = []
    if run.stale:
        notes.append(
            "the process writing this run is gone (killed?); the requests it finished are all here"
        )
    elif run.status == "running":
        notes.append("the run is still in progress; figures cover the requests finished so far")
    if run.status == "interrupted":
        notes.append("the run was interrupted; figures cover the requests that finished")
    if not points:
        notes.append("no server metrics were recorded with this run")
    return RunDetail(
        run_id=run.run_id,
        created_at=run.created_at,
        finished_at=run.finished_at,
        status=run.status,
        stale=run.stale,
        labels=run.labels,
        load=describe_load(run.config),
        config=run.config,
        meta=run.meta,
        requests_stored=len(records),
        summary=summary,
        errors=_error_counts(records),
        server_engine=engine,
        server_metrics=server,
        cluster=_stored_cluster(run.meta),
        notes=notes,
    )


def _stored_cluster(meta: dict[str, Any]) -> ClusterInfo | None:
    """The cluster block a --cluster run stored in its meta (none for a local run, or one
    written by another version that this one cannot read)."""
    try:
        return ClusterInfo.model_validate(meta["cluster"]) if meta.get("cluster") else None
    except ValueError:
        return None


# --------------------------------------------------------------------------- compare


class CompareRunsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[str] = Field(
        min_length=2,
        max_length=20,
        description="Run ids: the baseline first, then one or more candidates to compare with it.",
        json_schema_extra={"cli_positional": True},
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="Confidence level of the intervals."
    )
    min_change_pct: float = Field(
        default=5.0,
        ge=0,
        le=100,
        description="Changes smaller than this (percent of the baseline) are called within noise even when "
        "statistically detectable.",
    )
    resamples: int = Field(
        default=2000,
        ge=100,
        le=20000,
        description="Bootstrap resamples (bounded further for very large runs).",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**63 - 1,
        description="Seed of the bootstrap (same seed, same intervals).",
    )
    slo: dict[str, float] | None = Field(
        default=None,
        description="SLO targets in ms for goodput (keys ttft_ms, itl_ms, tpot_ms, e2e_ms); default: the baseline run's.",
    )
    quality_floor: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Minimum graded accuracy (0-1 or %): a candidate below it is a regression.",
    )
    workload: str | None = Field(
        default=None,
        description="Workload file; its product.quality_floor_score is the floor.",
    )
    db: str | None = Field(default=None, description=_DB_DESC)

    _slo = field_validator("slo")(classmethod(lambda cls, v: check_slo(v)))


Verdict = Literal["better", "worse", "within noise", "not comparable"]


class MetricComparison(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str = Field(description="e.g. ttft_ms, itl_ms, output_token_throughput, goodput.")
    statistic: str = Field(description="p50, p95, p99, or rate (per-second metrics).")
    unit: str
    higher_is_better: bool
    baseline: float | None = None
    candidate: float | None = None
    change_pct: float | None = Field(
        default=None, description="(candidate - baseline) / baseline x 100."
    )
    diff_ci_low: float | None = Field(
        default=None, description="Lower end of the interval of candidate - baseline."
    )
    diff_ci_high: float | None = None
    p_value: float | None = Field(
        default=None,
        description="Mann-Whitney U, two-sided, on per-request values (or per-slice rates).",
    )
    verdict: Verdict


class CandidateComparison(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    labels: dict[str, str] = Field(default_factory=dict)
    label_changes: dict[str, str] = Field(
        default_factory=dict, description="Labels that differ from the baseline's: 'old -> new'."
    )
    load_changes: dict[str, str] = Field(
        default_factory=dict, description="Load/workload settings that differ."
    )
    completed: int
    failed: int
    metrics: list[MetricComparison]
    better: list[str] = Field(
        default_factory=list, description="metric.statistic beyond noise and better."
    )
    worse: list[str] = Field(default_factory=list)
    quality: QualityComparison | None = Field(
        default=None, description="Graded accuracy against the baseline's (None: neither graded)."
    )
    regression: bool = Field(
        default=False,
        description="The candidate's graded accuracy is below the product's quality floor, "
        "whatever its latency verdicts.",
    )
    regression_reason: str | None = None


class CompareRunsResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline_id: str
    baseline_labels: dict[str, str] = Field(default_factory=dict)
    baseline_load: str
    baseline_completed: int
    candidates: list[CandidateComparison]
    method: str = Field(description="How 'beyond noise' was decided.")
    notes: list[str] = Field(default_factory=list)


_PERCENTILES = (50.0, 95.0, 99.0)
_LATENCIES = SLO_KEYS  # the per-request latency metrics, each of which an SLO may target
_LOAD_KEYS = (
    "concurrency",
    "request_rate",
    "burstiness",
    "requests",
    "duration_s",
    "input_tokens",
    "output_tokens",
    "input_distribution",
    "output_distribution",
    "shared_prefix_fraction",
    "endpoint",
    "stream",
    "url",
)


class _RunData:
    """A run's measured requests, split the way summarize() splits them."""

    def __init__(self, run: Any, records: list[Any], slo: dict[str, float] | None):
        from inferwise.probes.summary import measured_window, split_records, summarize

        self.run = run
        split = split_records(records)
        self.ok = split.ok
        self.ok_warm = split.ok_warm
        self.measured = split.measured
        self.summary = summarize(records, slo=slo or None)
        if not records and run.summary is not None:  # imported summary-only result
            self.summary = run.summary
        self.window = measured_window(self.measured)

    def latency(self, metric: str) -> tuple[Any, list[float]]:
        """(Samples for the percentile bootstrap, per-request values for the rank test)."""
        from inferwise.probes.runs_stats import per_request, pooled

        if metric == "itl_ms":
            groups = [r.itl_ms() for r in self.ok_warm]
            groups = [g for g in groups if g]
            medians = [statistics.median(g) for g in groups]
            return pooled(groups), medians
        values = [getattr(r, metric) for r in self.ok_warm]
        values = [v for v in values if v is not None]
        return per_request(values), values


def _change_pct(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base == 0:
        return None
    return (cand - base) / abs(base) * 100.0


def _verdict(
    ci: Any, change: float | None, higher_is_better: bool, min_change_pct: float
) -> Verdict:
    if ci is None or change is None:
        return "not comparable"
    if ci.low <= 0.0 <= ci.high or abs(change) < min_change_pct:
        return "within noise"
    increased = ci.low > 0.0
    return "better" if increased == higher_is_better else "worse"


def _compare_pair(
    base: _RunData, cand: _RunData, req: CompareRunsRequest, slo: dict[str, float] | None
) -> list[MetricComparison]:
    from inferwise.probes.runs_stats import (
        bootstrap_mean_diff,
        bootstrap_percentile_diffs,
        mann_whitney_p,
        slice_rates,
    )
    from inferwise.probes.summary import meets_goal

    out: list[MetricComparison] = []
    for k, metric in enumerate(_LATENCIES):
        b_samples, b_values = base.latency(metric)
        c_samples, c_values = cand.latency(metric)
        cis = (
            bootstrap_percentile_diffs(
                b_samples,
                c_samples,
                _PERCENTILES,
                resamples=req.resamples,
                confidence=req.confidence,
                seed=req.seed + k,
            )
            or {}
        )
        p = mann_whitney_p(b_values, c_values)
        b_dist = getattr(base.summary, metric)
        c_dist = getattr(cand.summary, metric)
        for q in _PERCENTILES:
            stat = f"p{int(q)}"
            out.append(
                _comparison(
                    metric,
                    stat,
                    "ms",
                    (getattr(b_dist, stat), getattr(c_dist, stat)),
                    ci=cis.get(q),
                    p_value=p,
                    higher_is_better=False,
                    min_change_pct=req.min_change_pct,
                )
            )

    def rates(run: _RunData, kind: str) -> list[float]:
        if run.window is None:
            return []
        ok = [r for r in run.measured if r.ok and r.end_s is not None]
        if kind == "output_token_throughput":
            weights = [float(r.output_tokens or 0) for r in ok]
        elif kind == "request_throughput":
            weights = [1.0] * len(ok)
        else:
            ok = [r for r in run.measured if r.end_s is not None]
            weights = [1.0 if slo and meets_goal(r, slo) else 0.0 for r in ok]
        slices = max(3, min(10, len(run.measured) // 10))
        return slice_rates([r.end_s for r in ok], weights, run.window[0], run.window[1], slices)

    per_second = [("output_token_throughput", "tokens/s"), ("request_throughput", "requests/s")]
    if slo:
        per_second.append(("goodput", "requests/s"))
    for k, (metric, unit) in enumerate(per_second):
        b_rates, c_rates = rates(base, metric), rates(cand, metric)
        ci = bootstrap_mean_diff(
            b_rates,
            c_rates,
            resamples=req.resamples,
            confidence=req.confidence,
            seed=req.seed + 100 + k,
        )
        out.append(
            _comparison(
                metric,
                "rate",
                unit,
                # both summaries were taken with this slo, so goodput is among them
                (getattr(base.summary, metric), getattr(cand.summary, metric)),
                ci=ci,
                p_value=mann_whitney_p(b_rates, c_rates),
                higher_is_better=True,
                min_change_pct=req.min_change_pct,
            )
        )
    return out


def _comparison(
    metric: str,
    statistic: str,
    unit: str,
    values: tuple[float | None, float | None],
    *,
    ci: Any,
    p_value: float | None,
    higher_is_better: bool,
    min_change_pct: float,
) -> MetricComparison:
    """One row of a comparison: baseline and candidate `values`, the interval `ci` of
    candidate - baseline (None when it could not be computed), and the verdict they give."""
    bv, cv = values
    change = _change_pct(bv, cv)
    return MetricComparison(
        metric=metric,
        statistic=statistic,
        unit=unit,
        higher_is_better=higher_is_better,
        baseline=bv,
        candidate=cv,
        change_pct=change,
        diff_ci_low=ci.low if ci else None,
        diff_ci_high=ci.high if ci else None,
        p_value=p_value,
        verdict=_verdict(ci, change, higher_is_better, min_change_pct),
    )


def _diff(
    a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...] | None = None
) -> dict[str, str]:
    names = keys or tuple(sorted(set(a) | set(b)))
    return {k: f"{a.get(k)} -> {b.get(k)}" for k in names if a.get(k) != b.get(k)}


def _quality(
    base: list[Any], cand: list[Any], floor: float | None, alpha: float
) -> QualityComparison | None:
    from inferwise.probes.quality import compare_quality

    if floor is not None and floor > 1:
        floor = floor / 100.0  # given in percent
    return compare_quality(base, cand, alpha=alpha, floor=floor)


def _named(
    metrics: list[MetricComparison], verdict: str, quality: QualityComparison | None
) -> list[str]:
    """metric.statistic of every row with `verdict`; graded accuracy as quality.accuracy."""
    out = [f"{m.metric}.{m.statistic}" for m in metrics if m.verdict == verdict]
    if quality is not None and quality.verdict == verdict:
        out.append("quality.accuracy")
    return out


def _regression_reason(
    quality: QualityComparison | None, metrics: list[MetricComparison]
) -> str | None:
    """Why a candidate is a regression however fast it is: its accuracy is under the floor."""
    if quality is None or not quality.below_floor or quality.candidate_accuracy is None:
        return None
    faster = [f"{m.metric}.{m.statistic}" for m in metrics if m.verdict == "better"]
    speed = f"a speed-up ({', '.join(faster[:3])} better) that " if faster else ""
    low, high = quality.diff_ci95_low, quality.diff_ci95_high
    diff = (
        f", {100 * quality.accuracy_diff:+.1f} points vs the baseline "
        f"(95% CI [{100 * low:+.1f}, {100 * high:+.1f}])"
        if quality.accuracy_diff is not None and low is not None and high is not None
        else ""
    )
    return (
        f"{speed}loses quality below the floor: accuracy {quality.candidate_accuracy:.1%} < "
        f"{quality.quality_floor:.1%}{diff}"
    )


def compare_runs(req: CompareRunsRequest) -> CompareRunsResult:
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store:
        try:
            ids = [store.resolve(r) for r in req.run_ids]
        except InputError as exc:  # name the argument the caller gave (run_ids), not the store's
            raise InputError("run_ids", exc.message, exc.accepted) from None
        if len(set(ids)) != len(ids):
            raise InputError(
                "run_ids", "the same run is listed twice", "distinct run ids, baseline first"
            )
        runs = [(store.get_run(i), store.requests(i)) for i in ids]
    base_run, base_records = runs[0]
    slo = req.slo if req.slo is not None else base_run.config.get("slo")
    base = _RunData(base_run, base_records, slo)
    notes: list[str] = []
    if not base.ok_warm:
        notes.append(
            f"baseline {base_run.run_id} has no completed requests: nothing to compare against"
        )
    candidates: list[CandidateComparison] = []
    for run, records in runs[1:]:
        cand = _RunData(run, records, slo)
        metrics = _compare_pair(base, cand, req, slo)
        quality = _quality(base_records, records, req.quality_floor, 1 - req.confidence)
        if run.status != "complete" or base_run.status != "complete":
            notes.append(
                f"{run.run_id}: compares a {base_run.status} baseline with a {run.status} run"
            )
        candidates.append(
            CandidateComparison(
                run_id=run.run_id,
                labels=run.labels,
                label_changes=_diff(base_run.labels, run.labels),
                load_changes=_diff(base_run.config, run.config, _LOAD_KEYS),
                completed=len(cand.ok),
                failed=len(cand.measured) - len(cand.ok),
                metrics=metrics,
                better=_named(metrics, "better", quality),
                worse=_named(metrics, "worse", quality),
                quality=quality,
                regression=bool(quality and quality.below_floor),
                regression_reason=_regression_reason(quality, metrics),
            )
        )
        if cand.ok_warm and len(cand.ok_warm) < 30:
            notes.append(
                f"{run.run_id}: only {len(cand.ok_warm)} completed requests; tail percentiles are rough"
            )
    method = (
        f"Latency percentiles: {int(req.confidence * 100)}% bootstrap interval of candidate - baseline, "
        "resampling requests (ITL gaps stay with their request); throughput and goodput: bootstrap over "
        "equal time slices of each run. A change is beyond noise when the interval excludes 0 and the change "
        f"is at least {req.min_change_pct:g}% of the baseline. p-values: Mann-Whitney U on per-request values "
        "(per-request median ITL; per-slice rates). Graded accuracy: McNemar exact test when both runs "
        "graded the same prompt ids, else a two-proportion z-test; Newcombe interval of the difference; "
        "beyond noise at p < 1 - confidence."
    )
    return CompareRunsResult(
        baseline_id=base_run.run_id,
        baseline_labels=base_run.labels,
        baseline_load=describe_load(base_run.config),
        baseline_completed=len(base.ok),
        candidates=candidates,
        method=method,
        notes=notes,
    )


# --------------------------------------------------------------------------- export


class ExportRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = _run_id_field()
    format: Literal["jsonl", "csv"] = Field(
        default="jsonl", description="One JSON object per line, or CSV with a header."
    )
    output: str | None = Field(default=None, description="File to write; default: print to stdout.")
    include_chunks: bool = Field(
        default=False, description="Add every chunk's arrival time and token count."
    )
    include_text: bool = Field(
        default=False,
        description="Add prompt and output text (only present when the probe ran with --store-text).",
    )
    db: str | None = Field(default=None, description=_DB_DESC)


class ExportRunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    format: str
    rows: int
    columns: list[str]
    path: str | None = Field(default=None, description="File written, when --output was given.")
    content: str | None = Field(
        default=None, description="The exported text, when no --output was given."
    )


_EXPORT_COLUMNS = [
    "run_id",
    "index",
    "ok",
    "error_class",
    "error_message",
    "http_status",
    "warmup",
    "scheduled_s",
    "start_s",
    "first_byte_s",
    "first_token_s",
    "end_s",
    "input_tokens",
    "output_tokens",
    "tokens_approximate",
    "ttft_ms",
    "e2e_ms",
    "tpot_ms",
    "itl_mean_ms",
    "itl_p50_ms",
    "itl_max_ms",
    "chunks",
    "tokens_per_chunk_mean",
    "schedule_delay_ms",
    "prompt_id",
    "grader",
    "correct",
    "output_sha256",
]


def export_rows(
    run_id: str, records: list[Any], include_chunks: bool, include_text: bool
) -> tuple[list[str], list[dict[str, Any]]]:
    columns = list(_EXPORT_COLUMNS)
    if include_chunks:
        columns += ["chunk_times_s", "chunk_tokens"]
    if include_text:
        columns += ["prompt_text", "output_text"]
    rows = []
    for r in records:
        itl = r.itl_ms()
        row: dict[str, Any] = {
            "run_id": run_id,
            "index": r.index,
            "ok": r.ok,
            "error_class": r.error_class,
            "error_message": r.error_message,
            "http_status": r.http_status,
            "warmup": r.warmup,
            "scheduled_s": r.scheduled_s,
            "start_s": r.start_s,
            "first_byte_s": r.first_byte_s,
            "first_token_s": r.first_token_s,
            "end_s": r.end_s,
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "tokens_approximate": r.tokens_approximate,
            "ttft_ms": r.ttft_ms,
            "e2e_ms": r.e2e_ms,
            "tpot_ms": r.tpot_ms,
            "itl_mean_ms": sum(itl) / len(itl) if itl else None,
            "itl_p50_ms": statistics.median(itl) if itl else None,
            "itl_max_ms": max(itl) if itl else None,
            "chunks": len(r.chunk_times_s),
            "tokens_per_chunk_mean": (sum(r.chunk_tokens) / len(r.chunk_tokens))
            if r.chunk_tokens
            else None,
            "schedule_delay_ms": r.schedule_delay_ms,
            "prompt_id": r.prompt_id,
            "grader": r.grader,
            "correct": r.correct,
            "output_sha256": r.output_sha256,
        }
        if include_chunks:
            row["chunk_times_s"] = r.chunk_times_s
            row["chunk_tokens"] = r.chunk_tokens
        if include_text:
            row["prompt_text"] = r.prompt_text
            row["output_text"] = r.output_text
        rows.append(row)
    return columns, rows


def _render_export(fmt: str, columns: list[str], rows: list[dict[str, Any]]) -> str:
    import csv
    import io
    import json

    buf = io.StringIO()
    if fmt == "jsonl":
        for row in rows:
            buf.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()}
            )
    return buf.getvalue()


def export_run(req: ExportRunRequest) -> ExportRunResult:
    from pathlib import Path

    from inferwise.calculators.errors import OperationalError
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store:
        run_id = store.resolve(req.run_id)
        records = store.requests(run_id)
    columns, rows = export_rows(run_id, records, req.include_chunks, req.include_text)
    text = _render_export(req.format, columns, rows)
    if req.output in (None, "-"):
        return ExportRunResult(
            run_id=run_id, format=req.format, rows=len(rows), columns=columns, content=text
        )
    path = Path(req.output).expanduser()
    if path.is_dir():
        raise InputError("output", f"{path} is a directory", "a file path")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
    return ExportRunResult(
        run_id=run_id, format=req.format, rows=len(rows), columns=columns, path=str(path)
    )
