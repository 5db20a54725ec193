"""`inferwise workload --from-trace FILE`: a workload file fitted to a production trace.

A team that has a trace has the best description of its traffic there is; the
workload file is what ``plan``, ``diagnose``, ``recommend`` and ``budget`` read.
This turns one into the other: the traffic's mean and peak rate, burstiness,
length percentiles, prefix reuse and day profile measured from the rows
(:mod:`inferwise.calculators.trace_stats`), and the trace itself named
(path, format, sha256) so that ``plan``'s baseline replays it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError, OperationalError
from inferwise.calculators.trace_stats import TraceStats


class WorkloadFromTraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_trace: str = Field(
        min_length=1,
        max_length=4096,
        description="Trace file: Mooncake JSONL, BurstGPT CSV, Azure LLM inference CSV, or JSONL with timestamp and lengths.",
    )
    trace_format: Literal["mooncake", "burstgpt", "azure", "jsonl"] | None = Field(
        None, description="Format of the trace file; default: guessed from its first line."
    )
    name: str | None = Field(
        None, max_length=200, description="Workload name; default: the trace's file name."
    )
    output: str | None = Field(
        None,
        max_length=4096,
        description="Write the workload file here (JSON); without it the result carries it.",
        json_schema_extra={"cli_aliases": ["-o"]},
    )


class WorkloadFromTraceResult(BaseModel):
    workload: dict[str, Any] = Field(description="The workload file (schema of `plan --workload`).")
    stats: TraceStats = Field(description="What was measured from the trace.")
    trace: dict[str, Any] = Field(description="Name, sha256, format and rows of the trace.")
    path: str | None = Field(None, description="Where the workload file was written.")
    notes: list[str] = Field(default_factory=list)


def workload_from_trace(req: WorkloadFromTraceRequest) -> WorkloadFromTraceResult:
    from pathlib import Path

    from inferwise.calculators.trace_stats import trace_stats
    from inferwise.calculators.traces import load_trace
    from inferwise.knowledge.workload import parse_workload

    trace = load_trace(req.from_trace, req.trace_format, field_name="from_trace")
    stats = trace_stats(trace)
    traffic: dict[str, Any] = {
        "mode": "online",
        "arrival_rate_rps": round(stats.mean_rate_rps, 6),
        "peak_to_mean": round(stats.peak_to_mean, 4),
        "burstiness": stats.burstiness,
        "input_tokens": _pct(stats.input_tokens),
        "output_tokens": _pct(stats.output_tokens),
        "shared_prefix_fraction": (
            None if stats.shared_prefix_fraction is None else round(stats.shared_prefix_fraction, 4)
        ),
        "hourly_rate_rps": stats.hourly_rate_rps,
        "trace": {
            "path": str(Path(trace.path).resolve()),
            "format": trace.format,
            "sha256": trace.sha256,
        },
    }
    data = {
        "name": req.name or trace.name,
        "traffic": {k: v for k, v in traffic.items() if v is not None},
    }
    workload = parse_workload(data)  # the file it writes is one `plan` accepts
    doc = workload.model_dump(mode="json", exclude_none=True)
    path = _write(req.output, doc) if req.output else None
    return WorkloadFromTraceResult(
        workload=doc,
        stats=stats,
        trace=trace.describe(),
        path=path,
        notes=[*trace.notes, *stats.notes],
    )


def _pct(p: Any) -> dict[str, float]:
    return {k: getattr(p, k) for k in ("p50", "p90", "p95", "p99", "mean", "max")}


def _write(output: str, doc: dict[str, Any]) -> str:
    import json
    from pathlib import Path

    path = Path(output).expanduser()
    if path.is_dir():
        raise InputError("output", f"{path} is a directory", "a file path")
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
    return str(path)
