"""The report as an MCP reply: the figures as PNG image content, the page as a resource.

Clients that show images show the figures inline; the whole page (tables, notes, every
figure) is one resource read away at ``inferwise://reports/{report_id}``. Pages are kept
in this process only, the most recent :data:`KEPT_REPORTS` of them: a report is cheap to
make again from the run store, and nothing measured lives in it.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from typing import Any

from inferwise.calculators.errors import InputError
from inferwise.server.reports.command import ReportRequest, ReportResult, WrittenFigure

KEPT_REPORTS = 16
MAX_IMAGES = 12
"""Figures sent as image content in one reply (a sweep of several runs has more; the
page holds them all)."""
URI = "inferwise://reports/{report_id}"

_pages: OrderedDict[str, str] = OrderedDict()
_lock = threading.Lock()


def render_for_mcp(req: ReportRequest) -> tuple[ReportResult, list[Any]]:
    """The report of ``req.run_ids`` (from the server's run store) and the content blocks
    beyond the Markdown summary: one image per figure and a link to the page."""
    from mcp_types import ImageContent, ResourceLink

    from inferwise.server.reports.runs_report import build_report

    report = build_report(req.run_ids, req.db)
    keep_page(report.report_id, report.html)
    uri = URI.format(report_id=report.report_id)
    result = ReportResult(
        report_id=report.report_id,
        kind=report.kind,
        title=report.title,
        run_ids=report.run_ids,
        path=None,
        resource_uri=uri,
        html_bytes=len(report.html.encode("utf-8")),
        figures=[
            WrittenFigure(name=f.name, title=f.title, png_bytes=len(f.png)) for f in report.figures
        ],
    )
    content: list[Any] = [
        ImageContent(
            type="image", data=base64.b64encode(f.png).decode("ascii"), mime_type="image/png"
        )
        for f in report.figures[:MAX_IMAGES]
    ]
    content.append(
        ResourceLink(
            type="resource_link",
            uri=uri,
            name=f"report-{report.report_id}",
            title=report.title,
            description="The whole report as one self-contained HTML page.",
            mime_type="text/html",
            size=result.html_bytes,
        )
    )
    return result, content


def keep_page(report_id: str, html: str) -> None:
    with _lock:
        _pages[report_id] = html
        _pages.move_to_end(report_id)
        while len(_pages) > KEPT_REPORTS:
            _pages.popitem(last=False)


def page(report_id: str) -> str:
    """A kept page; an id this process has not rendered (or no longer keeps) is refused."""
    with _lock:
        html = _pages.get(report_id)
    if html is None:
        raise InputError(
            "report_id",
            f"no report '{report_id[:40]}' in this server; render it again with render_report",
        )
    return html
