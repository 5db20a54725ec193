"""Reports people look at: one self-contained HTML page with inline figures.

`build_report(run_ids, db)` for stored runs, and `fit_report`, `recommend_report`,
`predict_report` for the calculators' results; each returns a `Report` (html, figures as
PNG, a stable report_id). The names resolve on first use, so importing the package
loads neither matplotlib nor jinja2.
"""

from __future__ import annotations

from typing import Any

from inferwise.server.reports.model import Figure, Report, Section, Table

__all__ = [
    "Figure",
    "Report",
    "Section",
    "Table",
    "build_report",
    "fit_report",
    "predict_report",
    "recommend_report",
]

_LAZY = {
    "build_report": "inferwise.server.reports.runs_report",
    "fit_report": "inferwise.server.reports.calc_reports",
    "recommend_report": "inferwise.server.reports.calc_reports",
    "predict_report": "inferwise.server.reports.calc_reports",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
