"""The typed values a report is made of: figures, tables, sections, and the report itself.

Every door takes the same `Report`: the CLI writes `html` to a file and `figures` as PNG
files, the MCP tool returns the figures as image content and the HTML as a resource
(`inferwise://reports/{report_id}`). Nothing here imports matplotlib or jinja2.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One chart as a PNG: what an MCP client shows as an image and the HTML embeds inline."""

    name: str
    """File-name-safe id, unique within the report (``latency-cdf-20261202-021500-ab12``)."""
    title: str
    png: bytes
    caption: str = ""


@dataclass(frozen=True)
class Table:
    """Rows of already formatted cells; `classes` (same shape, optional) styles cells (verdicts)."""

    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    classes: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    """A titled part of the report: a few sentences, tables and figures, in that order."""

    title: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    """A rendered report: one self-contained HTML page and the figures it holds."""

    report_id: str
    title: str
    html: str
    figures: list[Figure]
    kind: str
    """run, sweep, runs, fit, recommend or predict."""
    run_ids: list[str] = field(default_factory=list)


def report_id(kind: str, inputs: Any) -> str:
    """A stable id of what the report was made from (same inputs, same id): 16 hex digits
    of SHA-256 over the kind and the inputs as canonical JSON."""
    text = json.dumps([kind, inputs], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
