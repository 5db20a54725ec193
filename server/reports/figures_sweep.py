"""Figures of sweeps: latency percentiles against achieved throughput, and goodput
against offered load, one line per sweep, each knee marked with a star."""

from __future__ import annotations

from typing import Any

from inferwise.server.reports.model import Figure
from inferwise.server.reports.plot import (
    SLO_COLOR,
    colour,
    empty_note,
    new_figure,
    style,
    to_figure,
)
from inferwise.server.reports.runs_data import Group
from inferwise.server.reports.sweep import Knee, LoadPoint, knee, load_points

_METRICS = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
_QUANTILES = (("p50", "-", "o"), ("p95", "--", "s"), ("p99", ":", "^"))


def sweep_curves(groups: list[Group], name: str) -> list[Figure]:
    """The two sweep figures for these groups (sweeps and single runs alike: a single run
    is one point)."""
    series = [(g, load_points(g.runs), knee(load_points(g.runs))) for g in groups]
    return [_latency_vs_throughput(series, f"{name}-latency"), _goodput(series, f"{name}-goodput")]


def _latency_vs_throughput(
    series: list[tuple[Group, list[LoadPoint], Knee | None]], name: str
) -> Figure:
    fig = new_figure(12, 4.0)
    axes = fig.subplots(1, 3)
    slo = _slo_of(series)
    for ax, (metric, label) in zip(axes, _METRICS, strict=True):
        style(ax, f"{label} percentiles vs throughput", "completed requests/s", "ms")
        for i, (group, points, k) in enumerate(series):
            xs = [p.request_throughput for p in points]
            for q, line, marker in _QUANTILES:
                ys = [p.latency_ms[metric][q] for p in points]
                pairs = [
                    (x, y) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None
                ]
                if not pairs:
                    continue
                px, py = zip(*pairs, strict=True)
                tag = f"{group.name} {q.upper()}" if len(series) > 1 else q.upper()
                ax.plot(px, py, line, marker=marker, markersize=3, color=colour(i), label=tag)
            _mark_knee(ax, points, k, lambda p, m=metric: p.latency_ms[m]["p95"], colour(i))
        if metric in slo:
            ax.axhline(
                slo[metric],
                color=SLO_COLOR,
                linestyle="--",
                linewidth=1,
                label=f"SLO {slo[metric]:g} ms",
            )
    axes[0].legend(fontsize=6, loc="upper left")
    return to_figure(
        fig,
        name,
        "Latency percentiles vs throughput, per load point",
        "Each marker is one load point; the star is the knee (P95).",
    )


def _goodput(series: list[tuple[Group, list[LoadPoint], Knee | None]], name: str) -> Figure:
    fig = new_figure(12, 3.8)
    ax = fig.subplots(1, 1)
    swept = {g.swept for g, _, _ in series if g.swept}
    xlabel = "offered load (" + (" / ".join(sorted(swept)) or "concurrency or request rate") + ")"
    style(ax, "Goodput and throughput vs offered load", xlabel, "requests/s")
    drawn = False
    for i, (group, points, k) in enumerate(series):
        xs = [p.offered for p in points]
        for attr, line, word in (
            ("request_throughput", ":", "throughput"),
            ("goodput", "-", "goodput"),
        ):
            pairs = [
                (x, getattr(p, attr))
                for x, p in zip(xs, points, strict=True)
                if x is not None and getattr(p, attr) is not None
            ]
            if pairs:
                px, py = zip(*pairs, strict=True)
                ax.plot(
                    px,
                    py,
                    line,
                    marker="o",
                    markersize=3,
                    color=colour(i),
                    label=f"{group.name} {word}",
                )
                drawn = True
        _mark_knee(
            ax,
            points,
            k,
            lambda p: p.goodput if p.goodput is not None else p.request_throughput,
            colour(i),
            x=lambda p: p.offered,
        )
    if not drawn:
        empty_note(ax, "no completed requests")
    else:
        ax.legend(fontsize=7, loc="upper left")
    caption = "Goodput: requests meeting every SLO target per second (needs an SLO on the run)."
    return to_figure(fig, name, "Goodput vs offered load", caption)


def _mark_knee(
    ax: Any, points: list[LoadPoint], k: Knee | None, y: Any, color: str, x: Any = None
) -> None:
    if k is None:
        return
    p = points[k.index]
    px = x(p) if x else p.request_throughput
    py = y(p)
    if px is None or py is None:
        return
    word = "knee" if k.reached else "no knee yet"
    ax.plot([px], [py], marker="*", markersize=14, color=color, markeredgecolor="black", zorder=5)
    ax.annotate(word, (px, py), xytext=(6, 6), textcoords="offset points", fontsize=8)


def _slo_of(series: list[tuple[Group, list[LoadPoint], Knee | None]]) -> dict[str, float]:
    for group, _, _ in series:
        for run in group.runs:
            if run.slo:
                return run.slo
    return {}
