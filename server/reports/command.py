"""`inferwise report RUN_ID... -o FILE.html [--png DIR]`: the registry operation that
writes a run report to disk. The input and output models are declared here so the
command is built like every other (flags from the model, Markdown from a template, JSON
with --json); the MCP tool for reports is another door onto `build_report`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError, OperationalError

_DB_DESC = "Run database file (default: $INFERWISE_DB or the user's data dir, ~/.local/share/inferwise/runs.db)."


class ReportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[str] = Field(
        min_length=1,
        max_length=20,
        description="Runs to report (ids, unique prefixes or `latest`); several are overlaid and "
        "compared, the first as the baseline. Any point of a sweep brings in the whole sweep.",
        json_schema_extra={"cli_positional": True},
    )
    output: str | None = Field(
        default=None,
        description="HTML file to write (one self-contained page, figures inline).",
        json_schema_extra={"cli_aliases": ["-o"]},
    )
    png: str | None = Field(
        default=None, description="Folder to write each figure to as a PNG file."
    )
    db: str | None = Field(default=None, description=_DB_DESC)


class WrittenFigure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    title: str
    png_bytes: int
    path: str | None = Field(default=None, description="The PNG file, when --png was given.")


class ReportResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    report_id: str = Field(description="Stable hash of the inputs (same runs, same id).")
    kind: str = Field(description="run, sweep or runs.")
    title: str
    run_ids: list[str]
    path: str | None = Field(default=None, description="The HTML file written.")
    resource_uri: str | None = Field(
        default=None, description="MCP: the page as a resource (inferwise://reports/{id})."
    )
    html_bytes: int
    figures: list[WrittenFigure]


def _target(path_text: str, field: str, folder: bool) -> Path:
    path = Path(path_text).expanduser()
    if not folder and path.is_dir():
        raise InputError(field, f"{path} is a directory", "a file path such as report.html")
    if folder and path.exists() and not path.is_dir():
        raise InputError(field, f"{path} is not a folder", "a folder for the PNG files")
    if not folder and not path.parent.is_dir():
        raise InputError(
            field, f"no folder {path.parent} to write {path.name} into", "an existing folder"
        )
    return path


def run_report(req: ReportRequest) -> ReportResult:
    from inferwise.server.reports.runs_report import build_report

    if req.output is None and req.png is None:
        raise InputError("output", "say where to write the report", "-o FILE.html and/or --png DIR")
    for name in ("output", "png"):  # "" would write nothing and still succeed
        if getattr(req, name) is not None and not getattr(req, name).strip():
            raise InputError(name, "an empty path", "-o FILE.html and/or --png DIR")
    html_path = _target(req.output, "output", False) if req.output else None
    png_dir = _target(req.png, "png", True) if req.png else None
    report = build_report(req.run_ids, req.db)
    written = [
        WrittenFigure(name=f.name, title=f.title, png_bytes=len(f.png)) for f in report.figures
    ]
    try:
        if html_path is not None:
            html_path.write_text(report.html, encoding="utf-8")
        if png_dir is not None:
            png_dir.mkdir(parents=True, exist_ok=True)
            for w, f in zip(written, report.figures, strict=True):
                target = png_dir / f"{f.name}.png"
                target.write_bytes(f.png)
                w.path = str(target)
    except OSError as exc:
        raise OperationalError(f"cannot write the report: {exc.strerror or exc}") from None
    return ReportResult(
        report_id=report.report_id,
        kind=report.kind,
        title=report.title,
        run_ids=report.run_ids,
        path=str(html_path) if html_path else None,
        html_bytes=len(report.html.encode("utf-8")),
        figures=written,
    )
