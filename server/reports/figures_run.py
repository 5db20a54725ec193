"""Figures of stored runs: latency distributions with the SLO, the per-request timeline,
the engine's queue and KV cache over time."""

from __future__ import annotations

from typing import Any

from inferwise.probes.summary import split_records
from inferwise.server.reports.model import Figure
from inferwise.server.reports.plot import (
    SLO_COLOR,
    colour,
    empty_note,
    new_figure,
    style,
    to_figure,
)
from inferwise.server.reports.runs_data import RunView

LATENCIES = (("ttft_ms", "TTFT"), ("itl_ms", "ITL (per token)"), ("e2e_ms", "E2E"))
TIMELINE_MAX_REQUESTS = 2000
"""More rows than this are thinned evenly: a timeline's pixels cannot show more."""


def latency_values(run: RunView, metric: str) -> list[float]:
    """The values the run's distribution is computed over (warm, successful requests;
    per token for ITL), as summarize() takes them."""
    ok_warm = split_records(run.records).ok_warm
    if metric == "itl_ms":
        return [v for r in ok_warm for v in r.itl_ms()]
    values = (getattr(r, metric) for r in ok_warm)
    return [float(v) for v in values if v is not None]


def _cdf(ax: Any, values: list[float], label: str, color: str) -> None:
    import numpy as np

    xs = np.sort(np.asarray(values, dtype=float))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.step(xs, ys, where="post", label=label, color=color, linewidth=1.4)


def distributions(runs: list[RunView], name: str, title: str) -> Figure:
    """One empirical CDF per latency metric, one line per run, the SLO target as a red
    dashed line and the run's P95 and P99 ticked on a single run."""
    fig = new_figure(12, 3.8)
    axes = fig.subplots(1, 3)
    for ax, (metric, label) in zip(axes, LATENCIES, strict=True):
        style(ax, label, "ms", "share of requests" if metric != "itl_ms" else "share of tokens")
        drawn = False
        for i, run in enumerate(runs):
            values = latency_values(run, metric)
            if values:
                _cdf(ax, values, run.name, colour(i))
                drawn = True
        if not drawn:
            empty_note(ax, "no completed requests")
            continue
        _slo_line(ax, runs, metric)
        if len(runs) == 1:
            _percentile_ticks(ax, runs[0], metric)
        ax.set_ylim(0, 1.02)
    if len(runs) > 1 or any(r.slo for r in runs):
        axes[0].legend(fontsize=7, loc="lower right")
    return to_figure(
        fig, name, title, "Empirical CDF: the share of requests at or below a latency."
    )


def _slo_line(ax: Any, runs: list[RunView], metric: str) -> None:
    targets = sorted({r.slo[metric] for r in runs if metric in r.slo})
    for k, target in enumerate(targets):
        ax.axvline(
            target,
            color=SLO_COLOR,
            linestyle="--",
            linewidth=1.2,
            label=f"SLO {target:g} ms" if k == 0 else None,
        )


def _percentile_ticks(ax: Any, run: RunView, metric: str) -> None:
    dist = getattr(run.detail.summary, metric)
    for q, y in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        v = getattr(dist, q)
        if v is not None:
            ax.plot([v], [y], marker="o", color="black", markersize=3)
            ax.annotate(
                f"{q.upper()} {v:.0f}",
                (v, y),
                fontsize=7,
                xytext=(4, -8),
                textcoords="offset points",
            )


def timeline(run: RunView, name: str) -> Figure:
    """Each request as a row: waiting for its first token (start to first token), then
    streaming (first token to end); failures as red crosses. Above it, how many requests
    were in flight and how many still waited for a first token: queueing shows as long
    first segments and a rising waiting count, bursts as clustered starts."""
    fig = new_figure(12, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1, 2.6])
    records = sorted(run.records, key=lambda r: (r.start_s, r.index))
    if not records:
        empty_note(bottom, "no requests stored")
        return to_figure(fig, name, f"Timeline of run {run.run_id}")
    step = max(1, len(records) // TIMELINE_MAX_REQUESTS)
    shown = records[::step]
    _in_flight(top, records)
    _request_rows(bottom, shown)
    style(bottom, "", "seconds since the run started", "request (in start order)")
    caption = "Blue: waiting for the first token; green: streaming; red x: failed."
    if step > 1:
        caption += f" Every {step}th of {len(records)} requests drawn."
    return to_figure(fig, name, f"Per-request timeline of run {run.run_id}", caption)


def _request_rows(ax: Any, records: list[Any]) -> None:
    ok = [(i, r) for i, r in enumerate(records) if r.ok and r.end_s is not None]
    waiting = [(i, r.start_s, r.first_token_s or r.end_s) for i, r in ok]
    streaming = [(i, r.first_token_s, r.end_s) for i, r in ok if r.first_token_s is not None]
    width = max(0.5, min(3.0, 600 / max(len(records), 1)))
    if waiting:
        ys, xs0, xs1 = zip(*waiting, strict=True)
        ax.hlines(ys, xs0, xs1, color=colour(0), linewidth=width, label="waiting for first token")
    if streaming:
        ys, xs0, xs1 = zip(*streaming, strict=True)
        ax.hlines(ys, xs0, xs1, color=colour(2), linewidth=width, label="streaming")
    failed = [
        (i, r.end_s if r.end_s is not None else r.start_s)
        for i, r in enumerate(records)
        if not r.ok
    ]
    if failed:
        ys, xs = zip(*failed, strict=True)
        ax.plot(xs, ys, "x", color=SLO_COLOR, markersize=4, label="failed")
    late = [(i, r.scheduled_s) for i, r in enumerate(records) if r.scheduled_s is not None]
    if late:
        ys, xs = zip(*late, strict=True)
        ax.plot(xs, ys, ".", color="#7f7f7f", markersize=1.5, label="scheduled send")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper right")


def _in_flight(ax: Any, records: list[Any]) -> None:
    """Step counts of requests in flight and of those without a first token yet."""
    events_all: list[tuple[float, int]] = []
    events_wait: list[tuple[float, int]] = []
    for r in records:
        end = r.end_s if r.end_s is not None else r.start_s
        events_all += [(r.start_s, 1), (end, -1)]
        first = r.first_token_s if r.first_token_s is not None else end
        events_wait += [(r.start_s, 1), (first, -1)]
    for events, label, c in (
        (events_all, "in flight", colour(1)),
        (events_wait, "waiting for first token", colour(0)),
    ):
        xs, ys = _running_count(events)
        ax.step(xs, ys, where="post", label=label, color=c, linewidth=1.2)
    style(ax, "Requests in flight (client side)", "", "requests")
    ax.legend(fontsize=7, loc="upper right")


def _running_count(events: list[tuple[float, int]]) -> tuple[list[float], list[int]]:
    xs, ys, n = [], [], 0
    for t, d in sorted(events, key=lambda e: (e[0], e[1])):
        n += d
        xs.append(t)
        ys.append(n)
    return xs, ys


_ENGINE_COUNTS = (("requests_running", "running"), ("requests_waiting", "waiting"))


def engine_metrics(run: RunView, name: str) -> Figure | None:
    """The engine's own view from its /metrics scrapes: running and waiting requests
    (left axis) and KV-cache usage in percent (right axis). None without scrapes."""
    series = {s.concept: s for s in run.series}
    if not any(c in series for c, _ in _ENGINE_COUNTS) and "kv_cache_usage" not in series:
        return None
    fig = new_figure(12, 3.4, right_in=0.8)
    ax = fig.subplots(1, 1)
    style(
        ax,
        f"Engine metrics ({run.detail.server_engine or 'engine'} /metrics)",
        "seconds since the run started",
        "requests",
    )
    for k, (concept, label) in enumerate(_ENGINE_COUNTS):
        s = series.get(concept)
        if s:
            marker = "o" if len(s.times_s) <= 60 else None
            ax.step(
                s.times_s,
                s.values,
                where="post",
                label=label,
                color=colour(k + 1),
                marker=marker,
                markersize=3,
                linestyle=("-", "--")[k],
                linewidth=1.4,
            )
    ends = [r.end_s for r in run.records if r.end_s is not None]
    if ends:
        ax.set_xlim(0, max(ends) * 1.02)
    handles, labels = ax.get_legend_handles_labels()
    kv = series.get("kv_cache_usage")
    if kv:
        right = ax.twinx()
        right.plot(
            kv.times_s, [100 * v for v in kv.values], color=colour(4), label="KV cache usage"
        )
        right.set_ylabel("KV cache usage (%)", fontsize=9)
        right.set_ylim(0, 105)
        right.tick_params(labelsize=8)
        h2, l2 = right.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=7, loc="upper right")
    return to_figure(fig, name, f"Engine metrics over run {run.run_id}")
