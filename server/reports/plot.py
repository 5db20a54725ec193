"""matplotlib without pyplot: each figure is its own object rendered by Agg to PNG bytes.

No pyplot state means no display, no global figure registry and no backend switch, so
two reports rendered on two threads of the MCP server do not share anything.
"""

from __future__ import annotations

import io
from typing import Any

from inferwise.server.reports.model import Figure

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
DPI = 100
SLO_COLOR = "#d62728"


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def new_figure(
    width_in: float = 10.0, height_in: float = 4.0, *, left_in: float = 0.75, right_in: float = 0.2
) -> Any:
    """A matplotlib Figure with the report's style, not tied to pyplot. Margins are fixed
    in inches rather than solved by a layout engine, which took half the render time."""
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width_in, height_in), dpi=DPI)
    fig.set_facecolor("white")
    fig.subplots_adjust(
        left=left_in / width_in,
        right=1 - right_in / width_in,
        bottom=0.6 / height_in,
        top=1 - 0.4 / height_in,
        wspace=0.28,
        hspace=0.3,
    )
    return fig


def style(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)


def to_figure(fig: Any, name: str, title: str, caption: str = "") -> Figure:
    """Render to PNG (no timestamp or version in the metadata, so the bytes are stable)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return Figure(name=safe_name(name), title=title, png=buf.getvalue(), caption=caption)


def safe_name(name: str) -> str:
    """Letters, digits, '-' and '_' only: the figure name is also a PNG file name."""
    out = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)
    return out.strip("-") or "figure"


def empty_note(ax: Any, text: str) -> None:
    """Say on the chart why it is empty instead of drawing a blank frame."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
