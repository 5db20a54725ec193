"""Figures of the calculators' answers: the memory fit per GPU, the recommender's Pareto
frontier and prices, and a prediction beside a measured run."""

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

_MEMORY_PARTS = (
    ("weights_gib", "weights"),
    ("activation_gib", "activation peak"),
    ("non_torch_gib", "non-torch"),
    ("cuda_graph_gib", "CUDA graphs"),
    ("kv_cache_gib", "KV cache"),
    ("headroom_gib", "headroom (left free)"),
)


def memory_breakdown(fit: Any, name: str = "fit-memory") -> Figure:
    """One stacked bar of the most constrained GPU's memory, total and usable marked."""
    g = fit.per_gpu
    fig = new_figure(8, 4.5)
    ax = fig.subplots(1, 1)
    style(ax, f"Memory per GPU: {fit.model} on {fit.num_gpus} x {fit.gpu}", "", "GiB")
    bottom = 0.0
    for i, (attr, label) in enumerate(_MEMORY_PARTS):
        value = max(float(getattr(g, attr)), 0.0)
        ax.bar(
            [0],
            [value],
            bottom=[bottom],
            width=0.5,
            color=colour(i),
            label=f"{label} {value:.2f} GiB",
        )
        bottom += value
    ax.axhline(g.total_gib, color="black", linewidth=1, label=f"total {g.total_gib:.1f} GiB")
    ax.axhline(
        g.usable_gib,
        color=SLO_COLOR,
        linestyle="--",
        linewidth=1,
        label=f"usable {g.usable_gib:.1f} GiB",
    )
    ax.set_xticks([0], ["each GPU" if fit.num_gpus > 1 else "GPU"])
    ax.set_xlim(-0.6, 1.8)
    ax.legend(fontsize=8, loc="center right")
    verdict = "fits" if fit.fits else "does not fit"
    return to_figure(fig, name, "Memory breakdown per GPU", f"{verdict}: {fit.verdict}")


def pareto(result: Any, name: str = "recommend-pareto") -> Figure:
    """Throughput per GPU against speed per user: every priced candidate (meeting the SLO
    or not), the frontier the search kept joined by a line, the recommended one starred."""
    fig = new_figure(9, 4.5)
    ax = fig.subplots(1, 1)
    style(ax, "Pareto frontier", "output tokens/s per user", "output tokens/s per GPU")
    frontier = sorted(result.pareto, key=lambda p: p.output_tokens_per_s_per_user)
    if not frontier and not result.candidates:
        empty_note(ax, "no configuration met the targets")
        return to_figure(fig, name, "Pareto frontier")
    for ok, label, c in (
        (True, "candidate, meets the SLO", colour(2)),
        (False, "candidate, misses it", colour(3)),
    ):
        sel = [p for p in result.candidates if p.meets_slo == ok]
        if sel:
            ax.scatter(
                [p.output_tokens_per_s_per_user for p in sel],
                [p.output_tokens_per_s_per_gpu for p in sel],
                color=c,
                label=label,
                s=22,
                alpha=0.7,
            )
    if frontier:
        ax.plot(
            [p.output_tokens_per_s_per_user for p in frontier],
            [p.output_tokens_per_s_per_gpu for p in frontier],
            "-o",
            color=colour(0),
            markersize=4,
            label="Pareto frontier",
        )
    for p in frontier[:12]:
        ax.annotate(
            f"{p.gpu} TP{p.tensor_parallel_size} {p.quantization}",
            (p.output_tokens_per_s_per_user, p.output_tokens_per_s_per_gpu),
            fontsize=6,
            xytext=(3, 3),
            textcoords="offset points",
        )
    rec = result.recommended
    if rec is not None:
        ax.plot(
            [rec.output_tokens_per_s_per_user],
            [rec.output_tokens_per_s_per_gpu],
            "*",
            markersize=14,
            color=colour(1),
            markeredgecolor="black",
            label="recommended",
        )
    ax.legend(fontsize=8)
    return to_figure(fig, name, "Pareto frontier: throughput per GPU vs speed per user")


def candidate_label(c: Any) -> str:
    return f"{c.gpu} TP{c.tensor_parallel_size} {c.quantization}/{c.kv_cache_dtype} x{c.replicas + c.spare_replicas}"


def candidate_costs(result: Any, name: str = "recommend-cost") -> Figure:
    """$ per million output tokens and $ per hour per candidate; the recommended one darker."""
    cands = list(result.candidates)[:15]
    fig = new_figure(12, max(2.5, 0.35 * len(cands) + 1.2), left_in=2.2)
    left, right = fig.subplots(1, 2, sharey=True)
    if not cands:
        empty_note(left, "no candidates")
        return to_figure(fig, name, "Cost per candidate")
    labels = [candidate_label(c) for c in cands]
    rec = result.recommended
    colors = [
        colour(0) if rec is not None and c == rec else ("#9ecae1" if c.meets_slo else "#fcbba1")
        for c in cands
    ]
    ys = list(range(len(cands)))
    left.barh(ys, [c.usd_per_million_output_tokens for c in cands], color=colors)
    right.barh(ys, [c.usd_per_hour for c in cands], color=colors)
    left.set_yticks(ys, labels, fontsize=7)
    left.invert_yaxis()
    style(left, "$ per million output tokens", "USD", "")
    style(right, "$ per hour (fleet incl. spares)", "USD/h", "")
    return to_figure(
        fig,
        name,
        "Cost per candidate",
        "Dark: recommended; light blue: meets the SLO; pink: misses it.",
    )


_PREDICTED = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))


def predicted_vs_measured(pred: Any, measured: Any | None, name: str = "predict-latency") -> Figure:
    """Grouped bars per percentile: predicted, and measured when a run summary is given."""
    import numpy as np

    fig = new_figure(12, 3.8)
    axes = fig.subplots(1, 3)
    qs = ("p50", "p90", "p95", "p99")
    for ax, (metric, label) in zip(axes, _PREDICTED, strict=True):
        style(ax, label, "", "ms")
        p = getattr(pred, metric)
        if p is None:
            empty_note(ax, "not predicted (one-token outputs)")
            continue
        x = np.arange(len(qs))
        width = 0.38 if measured is not None else 0.6
        ax.bar(
            x - (width / 2 if measured is not None else 0),
            [getattr(p, q) for q in qs],
            width,
            color=colour(0),
            label="predicted",
        )
        if measured is not None:
            m = getattr(measured, metric)
            ax.bar(
                x + width / 2,
                [getattr(m, q) or 0.0 for q in qs],
                width,
                color=colour(1),
                label="measured",
            )
        ax.set_xticks(x, [q.upper() for q in qs])
    axes[0].legend(fontsize=8)
    title = "Predicted vs measured latency" if measured is not None else "Predicted latency"
    return to_figure(fig, name, title)
