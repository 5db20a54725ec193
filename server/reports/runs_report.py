"""`build_report`: the report of stored runs - one run, a sweep, or several overlaid.

What goes in, by what the ids name:

* one run: its latency distributions with the SLO, the per-request timeline, the engine
  metrics over time when it was scraped, client health and errors;
* a sweep (any point of one names them all): latency percentiles vs throughput and
  goodput vs offered load with the knee, the load points, the distributions per point;
* several runs or sweeps: the same figures overlaid, and the `runs compare` verdicts of
  the named runs (the first is the baseline), taken from `compare_runs` itself.
"""

from __future__ import annotations

from inferwise.server.reports import figures_run, figures_sweep, tables
from inferwise.server.reports.html import fit_page, render_page
from inferwise.server.reports.model import Report, Section, report_id
from inferwise.server.reports.runs_data import Group, Loaded, RunView, load
from inferwise.server.reports.sweep import knee, load_points

MAX_RUN_SECTIONS = 8
"""Detailed sections (timeline, engine metrics) for at most this many single runs."""


def build_report(run_ids: list[str], db: str | None = None) -> Report:
    """The report of the named runs (ids, unique prefixes or `latest`)."""
    data = load(run_ids, db)
    kind = _kind(data)
    rid = report_id("runs", {"runs": [r.run_id for r in data.named], "db": data.db_path})
    sections = _overview(data) + _group_sections(data)
    figures = [f for s in sections for f in s.figures]
    sections = fit_page(sections)
    title = _title(kind, data)
    subtitle = f"{len(data.named)} run(s) named from {data.db_path}"
    html = render_page(title, subtitle, sections, rid)
    return Report(rid, title, html, figures, kind, [r.run_id for r in data.named])


def _kind(data: Loaded) -> str:
    if len(data.groups) > 1:
        return "runs"
    return "sweep" if data.groups[0].is_sweep else "run"


def _title(kind: str, data: Loaded) -> str:
    if kind == "run":
        return f"inferwise report: run {data.named[0].run_id}"
    if kind == "sweep":
        return f"inferwise report: {data.groups[0].name}"
    return f"inferwise report: {len(data.groups)} runs compared"


def _overview(data: Loaded) -> list[Section]:
    """Overlaid figures and the comparison, when more than one run or sweep is named."""
    out: list[Section] = []
    if len(data.groups) > 1:
        singles = [g.runs[0] for g in data.groups if not g.is_sweep]
        figs = []
        if len(singles) > 1:
            figs.append(
                figures_run.distributions(
                    singles, "overlay-latency-cdf", "Latency distributions, overlaid"
                )
            )
        figs += figures_sweep.sweep_curves(data.groups, "overlay-sweep")
        out.append(Section("Runs overlaid", [_legend(data.groups)], [], figs))
    if len(data.named) > 1:
        out.append(_comparison(data))
    return out


def _legend(groups: list[Group]) -> str:
    parts = [f"{g.name}: {', '.join(r.run_id for r in g.runs)}" for g in groups]
    return "Series - " + "; ".join(parts)


def _comparison(data: Loaded) -> Section:
    from inferwise.probes.runs import CompareRunsRequest, compare_runs

    ids = [r.run_id for r in data.named][:20]
    # compare_runs' own defaults (seeded bootstrap): the verdicts are those `runs compare` prints
    result = compare_runs(CompareRunsRequest(run_ids=ids, db=data.db_path))
    notes = [result.method, *result.notes]
    return Section("Comparison (inferwise runs compare)", notes, tables.comparison_tables(result))


def _group_sections(data: Loaded) -> list[Section]:
    out: list[Section] = []
    singles = 0
    for group in data.groups:
        if group.is_sweep:
            out.append(_sweep_section(group))
        elif singles < MAX_RUN_SECTIONS:
            out.append(_run_section(group.runs[0]))
            singles += 1
    if singles == MAX_RUN_SECTIONS and len([g for g in data.groups if not g.is_sweep]) > singles:
        out.append(
            Section(
                "More runs", [f"Only the first {MAX_RUN_SECTIONS} runs have detailed sections."]
            )
        )
    return out


def _run_section(run: RunView) -> Section:
    d = run.detail
    notes = [
        f"{d.status} · {d.load} · created {d.created_at} · {d.requests_stored} requests stored",
        "Labels: " + (", ".join(f"{k}={v}" for k, v in d.labels.items()) or "none"),
        *d.notes,
        *d.summary.client_health.notes,
    ]
    tbl = [tables.latency_table(run), tables.throughput_table(run), tables.client_health_table(run)]
    tbl += [
        t for t in (tables.errors_table(run), tables.server_metrics_table(run)) if t is not None
    ]
    figs = [
        figures_run.distributions(
            [run], f"latency-cdf-{run.run_id}", f"Latency distributions of run {run.run_id}"
        ),
        figures_run.timeline(run, f"timeline-{run.run_id}"),
    ]
    engine = figures_run.engine_metrics(run, f"engine-metrics-{run.run_id}")
    if engine is not None:
        figs.append(engine)
    else:
        notes.append(
            "No engine metrics were scraped with this run (the server had no /metrics, or scraping was off)."
        )
    return Section(f"Run {run.run_id}", notes, tbl, figs)


def _sweep_section(group: Group) -> Section:
    points = load_points(group.runs)
    k = knee(points)
    notes = [f"{len(group.runs)} load points, swept over {group.swept}."]
    if k is not None:
        where = group.runs[k.index]
        verdict = "knee" if k.reached else "no knee within the sweep; the highest point"
        load = "?" if where.offered is None else f"{where.offered:g}"
        notes.append(f"Knee, by {k.rule}: {verdict} at offered load {load} (run {where.run_id}).")
    tbl = [tables.load_points_table(group.runs, k.index if k else None)]
    tbl += [
        tables.client_health_table(r)
        for r in group.runs
        if r.detail.summary.client_health.saturated
    ]
    sid = group.runs[0].detail.labels.get("sweep_id", "sweep")
    figs = figures_sweep.sweep_curves([group], f"sweep-{sid}")
    per_point = [RunView(r.detail, r.records, r.series) for r in group.runs]
    figs.append(
        figures_run.distributions(
            per_point, f"sweep-{sid}-latency-cdf", "Latency distributions per load point"
        )
    )
    return Section(f"Sweep {sid}", notes, tbl, figs)
