"""Stored runs as the report reads them: the recomputed detail `runs show` gives, the
per-request rows, and the scraped engine metrics as time series.

A probe sweep stores one run per load point, tied by the `sweep_id` label; naming any
point of a sweep brings in its siblings, ordered by the swept value, so the report can
draw the whole curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inferwise.calculators.errors import InputError
from inferwise.probes.records import RequestRecord
from inferwise.probes.runs import RunDetail

MAX_SWEEP_POINTS = 200
_HIDDEN_LABELS = {"model", "endpoint", "sweep", "sweep_id", "sweep_value"}


@dataclass(frozen=True)
class MetricSeries:
    """One engine concept (requests_running, requests_waiting, kv_cache_usage) over the run."""

    concept: str
    times_s: list[float]
    values: list[float]


@dataclass(frozen=True)
class RunView:
    detail: RunDetail
    records: list[RequestRecord]
    series: list[MetricSeries] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.detail.run_id

    @property
    def slo(self) -> dict[str, float]:
        return dict(self.detail.summary.slo or {})

    @property
    def offered(self) -> float | None:
        """The load asked for: concurrency (closed loop) or request rate (open loop)."""
        cfg = self.detail.config
        value = cfg.get("request_rate") if cfg.get("request_rate") is not None else None
        if value is None:
            value = cfg.get("concurrency")
        try:
            return None if value is None else float(value)
        except (TypeError, ValueError):
            return None

    @property
    def name(self) -> str:
        """A short legend label: the labels that tell runs apart, else the run id."""
        shown = {k: v for k, v in self.detail.labels.items() if k not in _HIDDEN_LABELS}
        labels = self.detail.labels
        if "sweep_value" in labels:
            shown = {labels.get("sweep", "load"): labels["sweep_value"], **shown}
        text = " ".join(f"{k}={v}" for k, v in shown.items())
        return text[:40] or self.run_id


@dataclass(frozen=True)
class Group:
    """A single run, or the load points of one sweep (runs sharing `sweep_id`)."""

    name: str
    runs: list[RunView]
    swept: str | None = None
    """`concurrency` or `request_rate` for a sweep; None for a single run."""

    @property
    def is_sweep(self) -> bool:
        return self.swept is not None and len(self.runs) > 1


@dataclass(frozen=True)
class Loaded:
    named: list[RunView]
    """The runs the caller named, in order (the first is the comparison's baseline)."""
    groups: list[Group]
    db_path: str


def load(run_ids: list[str], db: str | None) -> Loaded:
    """Resolve the ids (prefixes and `latest` work as in `runs show`) and read every run."""
    from inferwise.probes.store import RunStore

    if not run_ids:
        raise InputError("run_ids", "name at least one run", "ids from `inferwise runs list`")
    with RunStore(db, create=db is None) as store:
        try:
            ids = list(dict.fromkeys(store.resolve(r) for r in run_ids))
        except InputError as exc:
            raise InputError("run_ids", exc.message, exc.accepted) from None
        cache: dict[str, RunView] = {}
        named = [_view(store, i, db, cache) for i in ids]
        groups = _groups(store, named, db, cache)
        return Loaded(named=named, groups=groups, db_path=str(store.path))


def _view(store: Any, run_id: str, db: str | None, cache: dict[str, RunView]) -> RunView:
    from inferwise.probes.runs import ShowRunRequest, show_run

    if run_id not in cache:
        detail = show_run(ShowRunRequest(run_id=run_id, db=db))
        cache[run_id] = RunView(
            detail=detail,
            records=store.requests(run_id),
            series=metric_series(store.metric_samples(run_id)),
        )
    return cache[run_id]


def _groups(store: Any, named: list[RunView], db: str | None, cache: dict) -> list[Group]:
    groups: list[Group] = []
    seen_sweeps: set[str] = set()
    for run in named:
        sweep_id = run.detail.labels.get("sweep_id")
        if not sweep_id:
            groups.append(Group(name=run.name, runs=[run]))
            continue
        if sweep_id in seen_sweeps:
            continue
        seen_sweeps.add(sweep_id)
        siblings = store.list_runs(limit=MAX_SWEEP_POINTS, labels={"sweep_id": sweep_id})
        views = [_view(store, s.run_id, db, cache) for s in siblings]
        views.sort(key=lambda v: (_sweep_value(v), v.run_id))
        swept = run.detail.labels.get("sweep") or "load"
        groups.append(Group(name=f"sweep {sweep_id} ({swept})", runs=views, swept=swept))
    return groups


def _sweep_value(run: RunView) -> float:
    try:
        return float(run.detail.labels.get("sweep_value", "nan"))
    except ValueError:
        return math.nan


def metric_series(points: list[Any]) -> list[MetricSeries]:
    """Scrapes grouped by time, each normalised to the common concepts (the same mapping
    `runs show` summarises), then one series per concept."""
    from inferwise.probes.prom import Sample, detect_engine, normalize

    by_t: dict[float, list[Sample]] = {}
    for p in points:
        by_t.setdefault(p.t_s, []).append(Sample(name=p.name, labels=p.labels, value=p.value))
    if not by_t:
        return []
    engine = detect_engine(s for group in by_t.values() for s in group)
    out: dict[str, MetricSeries] = {}
    for t in sorted(by_t):
        for concept, value in normalize(by_t[t], engine).items():
            s = out.setdefault(concept, MetricSeries(concept, [], []))
            s.times_s.append(t)
            s.values.append(value)
    return list(out.values())
