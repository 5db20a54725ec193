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
