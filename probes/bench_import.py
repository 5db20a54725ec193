"""``inferwise runs import FILE``: benchmark result files become stored runs.

A vLLM ``bench serve``, guidellm or AIPerf result becomes one stored run per load
level, with labels (the tool, the file) and the load shape in its config, so
``runs list``, ``runs compare``, ``diagnose --run``, ``explain`` and reports work
on it as on a probe run. Where the file keeps per-request data (vLLM's
``input_lens``, ``output_lens``, ``ttfts``, ``itls``) each request becomes a
stored request row; its send time is reconstructed from the closed loop (each
client sends its next request when its last one ends), which the run's meta
says. A summary-only file stores the summary alone: its means and medians are
the tool's, nothing is invented.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferwise.calculators.bench_files import FORMATS, MeasuredPoint
from inferwise.probes.records import RequestRecord
from inferwise.probes.summary import Distribution, ProbeSummary, summarize


class ImportRunsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str = Field(
        description=f"Benchmark result file: {FORMATS}.",
        json_schema_extra={"cli_positional": True},
        min_length=1,
    )
    label: dict[str, str] = Field(
        default_factory=dict, description="Labels to add to every imported run (k=v)."
    )
    db: str | None = Field(default=None, description="Run database file.")

    @field_validator("label")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 32 or any(len(k) > 64 or len(x) > 256 for k, x in v.items()):
            raise ValueError("at most 32 labels, keys up to 64 and values up to 256 characters")
        return v


class ImportedRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    source: str
    load: str
    requests: int = Field(description="Requests in the file's result.")
    request_rows: int = Field(description="Per-request rows stored (0: summary only).")


class ImportRunsResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    runs: list[ImportedRun]
    db: str


def records_of(point: MeasuredPoint) -> list[RequestRecord]:
    """Per-request rows from the file's lists (empty when it kept none)."""
    if not (point.input_lens and point.output_lens and point.ttfts_ms and point.itls_ms):
        return []
    n = min(len(point.input_lens), len(point.output_lens), len(point.ttfts_ms), len(point.itls_ms))
    clients = [(0.0, c) for c in range(max(1, point.concurrency or n))]
    heapq.heapify(clients)
    out: list[RequestRecord] = []
    for i in range(n):
        free_at, client = heapq.heappop(clients)
        first = free_at + point.ttfts_ms[i] / 1e3
        times = [first]
        for gap_ms in point.itls_ms[i]:
            times.append(times[-1] + gap_ms / 1e3)
        out.append(
            RequestRecord(
                index=i,
                ok=True,
                start_s=free_at,
                first_byte_s=None,
                first_token_s=first,
                end_s=times[-1],
                input_tokens=point.input_lens[i],
                output_tokens=point.output_lens[i],
                chunk_times_s=times,
                chunk_tokens=[1] * len(times),
            )
        )
        heapq.heappush(clients, (times[-1], client))
    return out


def summary_of(point: MeasuredPoint) -> ProbeSummary:
    """The tool's own summary figures in the probe's summary shape."""

    def dist(mean: float | None, p50: float | None = None) -> Distribution:
        if mean is None:
            return Distribution()
        return Distribution(count=point.num_requests, mean=mean, p50=p50)

    return ProbeSummary(
        completed=point.num_requests,
        failed=point.failed,
        window_s=point.duration_s,
        ttft_ms=dist(point.ttft_ms, point.ttft_ms_p50),
        itl_ms=dist(point.itl_ms),
        tpot_ms=dist(point.tpot_ms),
        e2e_ms=dist(point.e2e_ms),
        request_throughput=point.requests_per_s,
        output_token_throughput=point.output_tokens_per_s,
        total_input_tokens=round(point.input_tokens_mean * point.num_requests),
        total_output_tokens=round(point.output_tokens_mean * point.num_requests),
    )


def _config(point: MeasuredPoint) -> dict[str, Any]:
    return {
        "model": point.model,
        "concurrency": point.concurrency,
        "request_rate": point.request_rate,
        "requests": point.num_requests,
        "input_tokens": round(point.input_tokens_mean),
        "output_tokens": round(point.output_tokens_mean),
        "tool": point.tool,
        "source_file": point.source,
    }


def import_runs(req: ImportRunsRequest) -> ImportRunsResult:
    """Read the whole file first (a bad file stores nothing), then store one run per load level."""
    from inferwise.calculators.bench_files import read_bench_file
    from inferwise.probes.store import RunStore

    points = read_bench_file(req.file)
    out: list[ImportedRun] = []
    with RunStore(req.db) as store:
        for point in points:
            labels = {"source": point.tool, "file": Path(req.file).name, **req.label}
            if point.model:
                labels.setdefault("model", point.model)
            records = records_of(point)
            meta = {"imported": True, "start_times_reconstructed": bool(records)}
            run_id = store.create_run(labels=labels, config=_config(point), meta=meta)
            store.add_requests(run_id, records)
            store.finish_run(
                run_id, "complete", summarize(records) if records else summary_of(point)
            )
            out.append(
                ImportedRun(
                    run_id=run_id,
                    source=point.source,
                    load=point.load_label,
                    requests=point.num_requests,
                    request_rows=len(records),
                )
            )
        db = str(store.path)
    return ImportRunsResult(tool=points[0].tool, runs=out, db=db)
