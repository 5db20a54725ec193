"""The report's tables, built from the typed results (summaries, client health, the
`runs compare` verdicts) and formatted once, with the CLI's number format."""

from __future__ import annotations

from typing import Any

from inferwise.server.render import fmt, rate
from inferwise.server.reports.model import Table
from inferwise.server.reports.runs_data import RunView

_LATENCY_ROWS = (
    ("ttft_ms", "TTFT"),
    ("itl_ms", "ITL (per token)"),
    ("tpot_ms", "TPOT"),
    ("e2e_ms", "E2E"),
)


def latency_table(run: RunView) -> Table:
    s = run.detail.summary
    rows, classes = [], []
    for metric, label in _LATENCY_ROWS:
        d = getattr(s, metric)
        target = (s.slo or {}).get(metric)
        rows.append(
            [
                label,
                *(fmt(getattr(d, q)) for q in ("mean", "p50", "p90", "p95", "p99", "max")),
                fmt(target) if target else "-",
                fmt(d.count),
            ]
        )
        over = target is not None and d.p95 is not None and d.p95 > target
        classes.append(["", "", "", "", "bad" if over else "", "", "", "", ""])
    return Table(
        ["metric (ms)", "mean", "P50", "P90", "P95", "P99", "max", "SLO", "n"],
        rows,
        "Latency (recomputed from the stored requests)",
        classes,
    )


def throughput_table(run: RunView) -> Table:
    s = run.detail.summary
    row = [
        fmt(s.completed),
        fmt(s.failed),
        fmt(s.window_s, 2),
        rate(s.request_throughput),
        fmt(s.output_token_throughput),
        rate(s.goodput) if s.goodput is not None else "-",
        fmt(s.slo_attainment_pct) if s.slo_attainment_pct is not None else "-",
    ]
    return Table(
        [
            "completed",
            "failed",
            "window (s)",
            "requests/s",
            "output tokens/s",
            "goodput (req/s)",
            "SLO attainment (%)",
        ],
        [row],
        "Throughput",
    )


def client_health_table(run: RunView) -> Table:
    h = run.detail.summary.client_health
    row = [
        "saturated" if h.saturated else "kept up",
        fmt(h.loop_lag_ms.p99, 2),
        fmt(h.schedule_delay_ms.p99, 2) if h.schedule_delay_ms.count else "-",
        fmt(h.workers),
    ]
    return Table(
        ["client", "event-loop lag P99 (ms)", "send delay vs schedule P99 (ms)", "workers"],
        [row],
        "Client health: did the measuring client keep up?",
        [["bad" if h.saturated else "", "", "", ""]],
    )


def errors_table(run: RunView) -> Table | None:
    if not run.detail.errors:
        return None
    rows = [
        [e.error_class, fmt(e.count), (e.examples[0] if e.examples else "")[:120]]
        for e in run.detail.errors
    ]
    return Table(["error class", "requests", "example"], rows, "Failed requests")


def server_metrics_table(run: RunView) -> Table | None:
    if not run.detail.server_metrics:
        return None
    rows = [
        [
            m.concept,
            fmt(m.samples),
            fmt(m.min, 3),
            fmt(m.mean, 3),
            fmt(m.max, 3),
            fmt(m.increase, 0) if m.increase is not None else "-",
        ]
        for m in run.detail.server_metrics
    ]
    return Table(
        ["engine metric", "scrapes", "min", "mean", "max", "increase"],
        rows,
        "Scraped engine metrics over the run",
    )


def load_points_table(runs: list[RunView], knee_index: int | None) -> Table:
    rows, classes = [], []
    for i, run in enumerate(runs):
        s = run.detail.summary
        rows.append(
            [
                run.run_id,
                fmt(run.offered, 2),
                rate(s.request_throughput),
                fmt(s.output_token_throughput),
                rate(s.goodput) if s.goodput is not None else "-",
                fmt(s.ttft_ms.p95),
                fmt(s.itl_ms.p95),
                fmt(s.e2e_ms.p95),
                fmt(s.failed),
                "knee" if i == knee_index else "",
            ]
        )
        classes.append([""] * 9 + ["better" if i == knee_index else ""])
    return Table(
        [
            "run",
            "offered",
            "requests/s",
            "output tokens/s",
            "goodput",
            "TTFT P95",
            "ITL P95",
            "E2E P95",
            "failed",
            "",
        ],
        rows,
        "Load points",
        classes,
    )


_VERDICT_CLASS = {
    "better": "better",
    "worse": "worse",
    "within noise": "noise",
    "not comparable": "noise",
}


def comparison_tables(result: Any) -> list[Table]:
    """One table per candidate of a `runs compare` result, its verdicts as computed there."""
    out = []
    for cand in result.candidates:
        rows, classes = [], []
        for m in cand.metrics:
            rows.append(
                [
                    f"{m.metric}.{m.statistic}",
                    m.unit,
                    fmt(m.baseline),
                    fmt(m.candidate),
                    fmt(m.change_pct) if m.change_pct is not None else "-",
                    f"{m.p_value:.3g}" if m.p_value is not None else "-",
                    m.verdict,
                ]
            )
            classes.append([""] * 6 + [_VERDICT_CLASS.get(m.verdict, "")])
        changes = ", ".join(
            f"{k}: {v}" for k, v in {**cand.label_changes, **cand.load_changes}.items()
        )
        caption = f"{cand.run_id} vs baseline {result.baseline_id}" + (
            f" ({changes})" if changes else ""
        )
        out.append(
            Table(
                ["metric", "unit", "baseline", "candidate", "change (%)", "p-value", "verdict"],
                rows,
                caption,
                classes,
            )
        )
    return out
