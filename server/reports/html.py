"""The report page: one jinja2 template (server/templates/report.html.j2), HTML-escaped,
with every figure inlined as a base64 PNG and the CSS in the page, so the file opens
anywhere without a network or JavaScript."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from inferwise.server.reports.model import Section

MAX_HTML_BYTES = 5 * 1024 * 1024
FIGURE_BUDGET_BYTES = 4 * 1024 * 1024
"""Inline figures (base64, 4/3 of the PNG) stay under this; tables and CSS fit in the rest."""


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("inferwise.server", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["b64"] = lambda data: base64.b64encode(data).decode("ascii")
    return env


def fit_page(sections: list[Section]) -> list[Section]:
    """Keep the page under 5 MB: past the figure budget, the last sections' figures are
    left out of the page (each says so; `--png` and the MCP tool still carry them all)."""
    import dataclasses

    total = sum(_inline_bytes(f.png) for s in sections for f in s.figures)
    out = list(sections)
    for i in range(len(out) - 1, -1, -1):
        if total <= FIGURE_BUDGET_BYTES:
            break
        s = out[i]
        if s.figures:
            total -= sum(_inline_bytes(f.png) for f in s.figures)
            note = f"{len(s.figures)} figure(s) left out of this page to keep it under 5 MB; --png DIR writes them."
            out[i] = dataclasses.replace(s, figures=[], notes=[*s.notes, note])
    return out


def _inline_bytes(png: bytes) -> int:
    return (len(png) + 2) // 3 * 4


def render_page(title: str, subtitle: str, sections: list[Section], report_id: str) -> str:
    html = (
        _environment()
        .get_template("report.html.j2")
        .render(
            title=title,
            subtitle=subtitle,
            sections=sections,
            report_id=report_id,
            generated=datetime.now(UTC).isoformat(timespec="seconds"),
            version=_version(),
        )
    )
    return html


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("inferwise")
    except Exception:
        return "unknown"
