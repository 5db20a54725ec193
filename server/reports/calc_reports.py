"""Reports of the calculators' answers: `fit_report`, `recommend_report`, `predict_report`.

Each takes the operation's typed result (what `--json` prints) and returns the same
`Report` as a run's report, so a door handles every report one way.
"""

from __future__ import annotations

from typing import Any

from inferwise.server.render import fmt, rate
from inferwise.server.reports import figures_calc
from inferwise.server.reports.html import fit_page, render_page
from inferwise.server.reports.model import Report, Section, Table, report_id


def _report(kind: str, title: str, subtitle: str, sections: list[Section], inputs: Any) -> Report:
    rid = report_id(kind, inputs)
    figures = [f for s in sections for f in s.figures]
    html = render_page(title, subtitle, fit_page(sections), rid)
    return Report(rid, title, html, figures, kind)


def fit_report(fit: Any) -> Report:
    """The memory breakdown per GPU as a stacked bar, with the verdict and suggestions."""
    g = fit.per_gpu
    rows = [[label, fmt(getattr(g, attr), 2)] for attr, label in figures_calc._MEMORY_PARTS]
    rows += [["usable (total x utilisation)", fmt(g.usable_gib, 2)], ["total", fmt(g.total_gib, 2)]]
    notes = [
        fit.verdict,
        f"{fit.engine} {fit.engine_version}; TP {fit.tensor_parallel_size}, PP {fit.pipeline_parallel_size}; "
        f"max_model_len {fit.max_model_len:,}; KV cache {fit.kv_cache_tokens:,} tokens, "
        f"max concurrency {fit.max_concurrency:.1f}",
        *fit.warnings,
    ]
    tbls = [Table(["per GPU", "GiB"], rows, "Memory of the most constrained GPU")]
    if fit.suggestions:
        tbls.append(
            Table(
                ["change", "flags", "fits", "KV tokens", "max concurrency"],
                [
                    [s.change, s.flags, fmt(s.fits), fmt(s.kv_cache_tokens), fmt(s.max_concurrency)]
                    for s in fit.suggestions
                ],
                "What would change the fit",
            )
        )
    sections = [
        Section("Memory fit", notes, tbls, [figures_calc.memory_breakdown(fit)]),
        Section("Assumptions", list(fit.assumptions)),
    ]
    title = f"inferwise fit: {fit.model} on {fit.num_gpus} x {fit.gpu}"
    return _report(
        "fit", title, "fits" if fit.fits else "does not fit", sections, fit.model_dump(mode="json")
    )


def recommend_report(result: Any) -> Report:
    """The Pareto frontier and the cost of each candidate, with the recommended fleet."""
    rec = result.recommended
    notes = [result.verdict]
    if rec is not None:
        notes.append(
            f"Recommended: {figures_calc.candidate_label(rec)}; serve with: {rec.serve_command}"
        )
    rows = [
        [
            figures_calc.candidate_label(c),
            fmt(c.meets_slo),
            fmt(c.total_gpus),
            fmt(c.usd_per_hour, 2),
            fmt(c.usd_per_million_output_tokens, 3),
            f"{c.usd_per_successful_request:.5f}",
            rate(c.max_rate_under_slo_per_replica),
        ]
        for c in result.candidates
    ]
    cand_table = Table(
        [
            "candidate",
            "meets SLO",
            "GPUs",
            "$/h",
            "$/M output tokens",
            "$/request",
            "max req/s per replica",
        ],
        rows,
        "Candidates",
    )
    prices = Table(
        ["GPU", "$/GPU-hour", "source"],
        [[p.gpu, fmt(p.usd_per_gpu_hour, 2), p.source] for p in result.prices],
        "Prices used",
    )
    figs = [figures_calc.pareto(result), figures_calc.candidate_costs(result)]
    sections = [
        Section("Recommendation", notes + list(result.warnings), [cand_table, prices], figs),
        Section("Assumptions", list(result.assumptions)),
    ]
    return _report(
        "recommend",
        "inferwise recommend",
        result.objective,
        sections,
        result.model_dump(mode="json"),
    )


def predict_report(pred: Any, run: str | None = None, db: str | None = None) -> Report:
    """The prediction's latency percentiles; beside the run's measured ones when a run id is given."""
    measured = None
    notes = [
        f"{pred.model} on {pred.gpu} (TP {pred.tensor_parallel_size}), {pred.engine}; bound: {pred.bound}",
        f"Predicted {fmt(pred.output_tokens_per_s)} output tokens/s, {rate(pred.requests_per_s)} requests/s",
    ]
    if run is not None:
        from inferwise.probes.runs import ShowRunRequest, show_run

        detail = show_run(ShowRunRequest(run_id=run, db=db))
        measured = detail.summary
        notes.append(
            f"Measured (run {detail.run_id}, {detail.load}): {fmt(measured.output_token_throughput)} output tokens/s, "
            f"{rate(measured.request_throughput)} requests/s"
        )
    rows = []
    for metric, label in figures_calc._PREDICTED:
        p = getattr(pred, metric)
        m = getattr(measured, metric) if measured is not None else None
        for q in ("p50", "p95", "p99"):
            pv = getattr(p, q) if p is not None else None
            mv = getattr(m, q) if m is not None else None
            err = (pv - mv) / mv * 100 if pv is not None and mv else None
            rows.append([f"{label} {q.upper()}", fmt(pv), fmt(mv), fmt(err)])
    tbl = Table(["ms", "predicted", "measured", "error (%)"], rows, "Latency")
    sections = [
        Section(
            "Prediction",
            notes + list(pred.warnings),
            [tbl],
            [figures_calc.predicted_vs_measured(pred, measured)],
        ),
        Section("Assumptions", list(pred.assumptions)),
    ]
    inputs = {
        "predict": pred.model_dump(mode="json"),
        "run": measured.model_dump(mode="json") if measured else None,
    }
    title = "inferwise predict" + (" vs measured" if measured is not None else "")
    return _report("predict", title, pred.model, sections, inputs)
