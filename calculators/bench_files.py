"""Benchmark result files from other tools, read into typed measured load points.

A user who ran ``vllm bench serve --save-result``, guidellm or AIPerf last week
already holds measurements of their deployment; calibration and ``runs import``
read those files instead of asking for a new probe. Each reader turns one file
into one :class:`MeasuredPoint` per load level, in the units this project uses
(milliseconds, tokens, per second), whatever the tool wrote.

Formats (field names as the tools write them):

* vLLM ``bench serve --save-result`` (``benchmarks/serve.py``): one JSON object
  with ``max_concurrency``, ``request_rate`` (a number or ``"inf"``),
  ``num_prompts``, ``completed``, ``total_input_tokens``,
  ``total_output_tokens``, ``duration`` (s), ``request_throughput``,
  ``output_throughput``, ``mean/median/p99_ttft_ms``, ``mean/median_tpot_ms``,
  ``mean/median_itl_ms``, ``mean_e2el_ms`` and, unless removed, the
  per-request lists ``input_lens``, ``output_lens``, ``ttfts`` (s) and
  ``itls`` (s, one list per request).
* guidellm benchmarks report (``guidellm benchmark --output-path x.json``):
  ``{"benchmarks": [...]}``, each with a strategy (``synchronous``,
  ``concurrent`` with ``streams``, ``constant``/``poisson`` with ``rate``,
  ``throughput``) under ``args.strategy`` or ``config.strategy``, and
  ``metrics.<name>.successful.{mean, median, ...}`` for
  ``time_to_first_token_ms``, ``inter_token_latency_ms``,
  ``time_per_output_token_ms``, ``request_latency`` (s),
  ``output_tokens_per_second``, ``requests_per_second``,
  ``prompt_token_count``, ``output_token_count``.
* AIPerf ``profile_export_aiperf.json``: metric objects ``{"unit", "avg",
  "p50", ...}`` named ``time_to_first_token``, ``inter_token_latency``,
  ``request_latency``, ``output_token_throughput``, ``request_throughput``,
  ``input_sequence_length``, ``output_sequence_length``, ``request_count``
  (at the top or under ``records``), and the load under
  ``input_config.loadgen.{concurrency, request_rate}``.

Stdlib and pydantic only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .bounds import MAX_SLO_MS
from .errors import InputError
from .files import read_text

MAX_BENCH_FILE_BYTES = 64 * 1024 * 1024
"""A detailed vLLM result of 10,000 requests with per-token ITLs is a few MiB."""
Tool = Literal["vllm-bench", "guidellm", "aiperf", "inferwise-probe"]
FORMATS = "a vLLM `bench serve --save-result` JSON, a guidellm benchmarks JSON report, an AIPerf profile_export_aiperf.json"


class MeasuredPoint(BaseModel):
    """One measured load level: its load shape, its lengths and its mean latencies."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="Where it was measured: file[#index] or run:RUN_ID.")
    tool: Tool
    model: str | None = None
    concurrency: int | None = Field(default=None, description="Closed-loop clients.")
    request_rate: float | None = Field(
        default=None, description="Open-loop arrivals per second; inf = all at once."
    )
    num_requests: int = Field(ge=1)
    input_tokens_mean: float = Field(gt=0)
    output_tokens_mean: float = Field(gt=0)
    ttft_ms: float | None = Field(default=None, description="Mean time to first token.")
    ttft_ms_p50: float | None = None
    itl_ms: float | None = Field(default=None, description="Mean inter-token latency.")
    tpot_ms: float | None = Field(default=None, description="Mean time per output token.")
    e2e_ms: float | None = Field(default=None, description="Mean request latency.")
    output_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    duration_s: float | None = None
    failed: int = 0
    input_lens: list[int] | None = None
    output_lens: list[int] | None = None
    ttfts_ms: list[float] | None = None
    itls_ms: list[list[float]] | None = None
    length_spread: Literal["fixed", "uniform"] = Field(
        default="fixed",
        description=(
            "How per-request lengths spread around the means when the lists are absent: "
            "fixed, or uniform from 1 to twice the mean (sglang.bench_serving's random "
            "dataset at its default --random-range-ratio 0)."
        ),
    )

    @property
    def load_label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        if self.request_rate is None or math.isinf(self.request_rate):
            return "offline"
        return f"{self.request_rate:g} req/s"


# --------------------------------------------------------------------------- helpers


def _num(value: Any) -> float | None:
    """A finite number, or None (tools write NaN, null or strings for missing values)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(float(value)):
        return float(value)
    return None


def _positive(value: Any) -> float | None:
    v = _num(value)
    return v if v is not None and v > 0 else None


def _rate(value: Any) -> float | None:
    if value in ("inf", "Infinity") or (isinstance(value, float) and math.isinf(value)):
        return math.inf
    return _positive(value)


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not value:
        return None
    out = [int(v) for v in value if _num(v) is not None]
    return out if len(out) == len(value) else None


def read_bench_json(path: str | Path) -> Any:
    """The parsed JSON of a benchmark file; NaN and Infinity (as Python's json writes
    them) read as numbers, every other problem is an InputError naming from_file."""
    text = read_text(path, "from_file", MAX_BENCH_FILE_BYTES, "benchmark file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            "from_file",
            f"{path} is not JSON ({exc.msg} at line {exc.lineno}); expected {FORMATS}",
        ) from None
    except RecursionError:
        raise InputError("from_file", f"{path} is nested too deeply") from None


def detect_format(data: Any) -> Tool | None:
    """Which tool wrote the parsed file, by the fields only that tool writes."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("benchmarks"), list):
        return "guidellm"
    if "request_throughput" in data and ("mean_ttft_ms" in data or "completed" in data):
        return "vllm-bench"
    body = data.get("records") if isinstance(data.get("records"), dict) else data
    if isinstance(body.get("time_to_first_token"), dict) or isinstance(
        body.get("request_latency"), dict
    ):
        return "aiperf"
    return None


def read_bench_file(path: str | Path) -> list[MeasuredPoint]:
    """Every load level in a benchmark file; an InputError names the file when its
    format is unknown or it holds no usable measurement."""
    data = read_bench_json(path)
    tool = detect_format(data)
    if tool is None:
        raise InputError("from_file", f"{path}: unknown benchmark file format", FORMATS)
    reader = {"vllm-bench": vllm_points, "guidellm": guidellm_points, "aiperf": aiperf_points}
    points = reader[tool](data, str(path))
    if not points:
        raise InputError("from_file", f"{path}: the {tool} file holds no completed load level")
    for p in points:
        _check_ranges(p)
    return points


LATENCY_FIELDS = ("ttft_ms", "ttft_ms_p50", "itl_ms", "tpot_ms", "e2e_ms")
RATE_FIELDS = ("output_tokens_per_s", "requests_per_s")
MAX_MEASURED_RATE_PER_S = 1e9
"""A billion tokens (or requests) a second: far past any one deployment."""


def _check_ranges(p: MeasuredPoint) -> None:
    """Refuse a measurement no benchmark can produce (a negative or day-long mean latency, a
    negative or absurd rate), naming the file and field: a calibration fitted through it
    would carry it into every later prediction. Missing values (NaN, null) stay missing."""
    for name in LATENCY_FIELDS:
        v = getattr(p, name)
        if v is not None and not 0 <= v <= MAX_SLO_MS:
            raise InputError(
                "from_file", f"{p.source}: {name} = {v:g}", f"0 to {MAX_SLO_MS:,.0f} ms"
            )
    for name in RATE_FIELDS:
        v = getattr(p, name)
        if v is not None and not 0 <= v <= MAX_MEASURED_RATE_PER_S:
            raise InputError(
                "from_file", f"{p.source}: {name} = {v:g}", f"0 to {MAX_MEASURED_RATE_PER_S:g}"
            )
    for name, values in (("ttfts", p.ttfts_ms), ("itls", [g for r in p.itls_ms or [] for g in r])):
        if values and not 0 <= min(values) <= max(values) <= MAX_SLO_MS:
            raise InputError(
                "from_file",
                f"{p.source}: {name} holds {min(values):g} .. {max(values):g} ms",
                f"0 to {MAX_SLO_MS:,.0f} ms",
            )


# --------------------------------------------------------------------------- vLLM


def vllm_points(data: dict[str, Any], source: str) -> list[MeasuredPoint]:
    """One point: a vLLM ``bench serve`` result (summary fields, per-request lists when kept)."""
    completed = int(_num(data.get("completed")) or 0)
    if completed < 1:
        return []
    inp = _int_list(data.get("input_lens"))
    out = _int_list(data.get("output_lens"))
    ttfts = data.get("ttfts") if isinstance(data.get("ttfts"), list) else None
    itls = data.get("itls") if isinstance(data.get("itls"), list) else None
    in_total = _positive(data.get("total_input_tokens")) or (sum(inp) if inp else None)
    out_total = _positive(data.get("total_output_tokens")) or (sum(out) if out else None)
    if not in_total or not out_total:
        raise InputError("from_file", f"{source}: no total_input_tokens / total_output_tokens")
    return [
        MeasuredPoint(
            source=source,
            tool="vllm-bench",
            model=data.get("model_id") or None,
            concurrency=int(c) if (c := _positive(data.get("max_concurrency"))) else None,
            request_rate=None if data.get("max_concurrency") else _rate(data.get("request_rate")),
            num_requests=completed,
            input_tokens_mean=in_total / completed,
            output_tokens_mean=out_total / completed,
            ttft_ms=_num(data.get("mean_ttft_ms")),
            ttft_ms_p50=_num(data.get("median_ttft_ms")),
            itl_ms=_num(data.get("mean_itl_ms")),
            tpot_ms=_num(data.get("mean_tpot_ms")),
            e2e_ms=_num(data.get("mean_e2el_ms")),
            output_tokens_per_s=_num(data.get("output_throughput")),
            requests_per_s=_num(data.get("request_throughput")),
            duration_s=_num(data.get("duration")),
            failed=max(0, int(_num(data.get("num_prompts")) or completed) - completed),
            input_lens=inp,
            output_lens=out,
            ttfts_ms=[1e3 * float(t) for t in ttfts if _num(t) is not None] if ttfts else None,
            itls_ms=[[1e3 * float(g) for g in r if _num(g) is not None] for r in itls]
            if itls and all(isinstance(r, list) for r in itls)
            else None,
        )
    ]


# --------------------------------------------------------------------------- guidellm


def _successful(metrics: dict[str, Any], name: str, stat: str = "mean") -> float | None:
    block = metrics.get(name)
    if not isinstance(block, dict):
        return None
    inner = block.get("successful", block)
    return _num(inner.get(stat)) if isinstance(inner, dict) else None


def _guidellm_load(bench: dict[str, Any]) -> tuple[int | None, float | None]:
    """(concurrency, rate) of a guidellm benchmark's scheduling strategy."""
    strategy: Any = None
    for holder in (bench.get("args"), bench.get("config"), bench):
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            strategy = holder["strategy"]
            break
    if not isinstance(strategy, dict):
        return None, None
    kind = strategy.get("type_") or strategy.get("type")
    if kind == "synchronous":
        return 1, None
    if kind == "concurrent":
        return int(_positive(strategy.get("streams")) or 1), None
    if kind in ("constant", "poisson", "async"):
        return None, _rate(strategy.get("rate"))
    if kind == "throughput":
        return None, math.inf
    return None, None


def guidellm_points(data: dict[str, Any], source: str) -> list[MeasuredPoint]:
    """One point per benchmark of a guidellm report (request_latency is in seconds)."""
    points: list[MeasuredPoint] = []
    for i, bench in enumerate(data["benchmarks"]):
        metrics = bench.get("metrics") if isinstance(bench, dict) else None
        if not isinstance(metrics, dict):
            continue
        totals = metrics.get("request_totals") or (bench.get("run_stats") or {}).get(
            "requests_made", {}
        )
        ok = int(_num((totals or {}).get("successful")) or 0)
        inp = _successful(metrics, "prompt_token_count")
        out = _successful(metrics, "output_token_count")
        if ok < 1 or not inp or not out:
            continue
        conc, rate = _guidellm_load(bench)
        latency_s = _successful(metrics, "request_latency")
        points.append(
            MeasuredPoint(
                source=f"{source}#{i}",
                tool="guidellm",
                model=_guidellm_model(data, bench),
                concurrency=conc,
                request_rate=rate,
                num_requests=ok,
                input_tokens_mean=inp,
                output_tokens_mean=out,
                ttft_ms=_successful(metrics, "time_to_first_token_ms"),
                ttft_ms_p50=_successful(metrics, "time_to_first_token_ms", "median"),
                itl_ms=_successful(metrics, "inter_token_latency_ms"),
                tpot_ms=_successful(metrics, "time_per_output_token_ms"),
                e2e_ms=latency_s * 1e3 if latency_s is not None else None,
                output_tokens_per_s=_successful(metrics, "output_tokens_per_second"),
                requests_per_s=_successful(metrics, "requests_per_second"),
                duration_s=_num((bench.get("run_stats") or {}).get("total_time")),
                failed=int(_num((totals or {}).get("errored")) or 0),
            )
        )
    return points


def _guidellm_model(data: dict[str, Any], bench: dict[str, Any]) -> str | None:
    for holder in (bench.get("worker"), bench.get("backend"), data.get("args"), bench.get("args")):
        if isinstance(holder, dict):
            for key in ("backend_model", "model"):
                if isinstance(holder.get(key), str) and holder[key]:
                    return str(holder[key])
    return None


# --------------------------------------------------------------------------- AIPerf


def _stat(body: dict[str, Any], name: str, stat: str = "avg") -> float | None:
    block = body.get(name)
    if isinstance(block, dict):
        value = _num(block.get(stat))
        if value is None or str(block.get("unit", "ms")).lower() not in ("s", "sec", "seconds"):
            return value
        return value * 1e3
    return _num(block) if stat == "avg" else None


def aiperf_points(data: dict[str, Any], source: str) -> list[MeasuredPoint]:
    """One point: an AIPerf profile export's aggregate statistics."""
    body = data.get("records") if isinstance(data.get("records"), dict) else data
    count = _stat(body, "request_count") or _num(data.get("request_count"))
    inp = _stat(body, "input_sequence_length")
    out = _stat(body, "output_sequence_length")
    if not count or not inp or not out:
        raise InputError(
            "from_file",
            f"{source}: the AIPerf export has no request_count / input_sequence_length / "
            "output_sequence_length",
        )
    cfg = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    loadgen = cfg.get("loadgen") if isinstance(cfg.get("loadgen"), dict) else {}
    endpoint = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}
    names = endpoint.get("model_names") or []
    rate = _rate(loadgen.get("request_rate"))
    conc = _positive(loadgen.get("concurrency"))
    return [
        MeasuredPoint(
            source=source,
            tool="aiperf",
            model=str(names[0]) if isinstance(names, list) and names else None,
            concurrency=int(conc) if conc and rate is None else None,
            request_rate=rate,
            num_requests=int(count),
            input_tokens_mean=inp,
            output_tokens_mean=out,
            ttft_ms=_stat(body, "time_to_first_token"),
            ttft_ms_p50=_stat(body, "time_to_first_token", "p50"),
            itl_ms=_stat(body, "inter_token_latency"),
            e2e_ms=_stat(body, "request_latency"),
            output_tokens_per_s=_stat(body, "output_token_throughput"),
            requests_per_s=_stat(body, "request_throughput"),
            duration_s=_stat(body, "benchmark_duration"),
            failed=int(_stat(body, "error_request_count") or 0),
        )
    ]
