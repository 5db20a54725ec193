"""Server metrics: parse a Prometheus /metrics page and say what it means.

Engines name the same facts differently (vLLM's `vllm:num_requests_waiting`,
SGLang's `sglang:num_queue_reqs`, llama.cpp's `llamacpp:requests_deferred`),
so diagnosis reads the *concepts* from `normalize()` and never a raw name.
`scrape_loop` samples a page at an interval during a probe run; it stops by
itself, with a note, when the server has no usable /metrics, so a probe
against an endpoint without one loses nothing but the server view.

Only the stdlib at module level: the run store and the registry import this.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class PrometheusFormatError(ValueError):
    """A line that is not Prometheus text exposition format (the body is probably HTML or JSON)."""


@dataclass(frozen=True)
class Sample:
    """One sample line. `family` and `type` come from the `# TYPE` line that covers it."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None
    family: str = ""
    type: str = "untyped"


# --------------------------------------------------------------------------- parsing

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count", "_created")
_SUMMARY_SUFFIXES = ("_sum", "_count", "_created")
_COUNTER_SUFFIXES = ("_total", "_created")


def _is_name_start(ch: str) -> bool:
    return ch.isascii() and (ch.isalpha() or ch in "_:")


def _is_name_char(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch in "_:")


def _parse_value(text: str, line_no: int) -> float:
    t = text.strip()
    low = t.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    try:
        return float(t)
    except ValueError:
        raise PrometheusFormatError(f"line {line_no}: value {text!r} is not a number") from None


def _unescape(text: str, help_only: bool = False) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "n":
                out.append("\n")
            elif nxt == "\\":
                out.append("\\")
            elif nxt == '"' and not help_only:
                out.append('"')
            else:
                out.append(ch + nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _parse_labels(line: str, pos: int, line_no: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y\\"z"}` starting at the `{`; return labels and the index after `}`."""
    labels: dict[str, str] = {}
    i = pos + 1
    n = len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        start = i
        while i < n and _is_name_char(line[i]):
            i += 1
        name = line[start:i]
        if not name:
            raise PrometheusFormatError(f"line {line_no}: bad label name at column {i + 1}")
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != "=":
            raise PrometheusFormatError(f"line {line_no}: expected '=' after label {name!r}")
        i += 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise PrometheusFormatError(f"line {line_no}: label {name!r} value must be quoted")
        i += 1
        buf: list[str] = []
        while i < n and line[i] != '"':
            if line[i] == "\\" and i + 1 < n:
                buf.append(line[i : i + 2])
                i += 2
            else:
                buf.append(line[i])
                i += 1
        if i >= n:
            raise PrometheusFormatError(f"line {line_no}: unterminated label value for {name!r}")
        labels[name] = _unescape("".join(buf))
        i += 1
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == ",":
            i += 1
            continue
        if i < n and line[i] == "}":
            return labels, i + 1
        raise PrometheusFormatError(f"line {line_no}: expected ',' or '}}' in labels")


def _family_of(name: str, types: dict[str, str]) -> tuple[str, str]:
    if name in types:
        return name, types[name]
    for suffix in _HISTOGRAM_SUFFIXES + _COUNTER_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            kind = types.get(base)
            if kind is None:
                continue
            if (
                (kind == "histogram" and suffix in _HISTOGRAM_SUFFIXES)
                or (kind == "summary" and suffix in _SUMMARY_SUFFIXES)
                or (kind == "counter" and suffix in _COUNTER_SUFFIXES)
                or kind in ("gaugehistogram", "unknown", "untyped")
            ):
                return base, kind
    return name, "untyped"


def parse_prometheus(text: str) -> list[Sample]:
    """Parse the Prometheus text exposition format (0.0.4, and OpenMetrics' superset of it we meet).

    Raises PrometheusFormatError on the first line that is not the format, so a
    caller can tell an HTML error page from an empty metrics page.
    """
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for line_no, raw in enumerate(text.split("\n"), start=1):  # only \n ends a line
        line = raw.strip(" \t\r")
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].strip().split(None, 2)
            if len(parts) >= 3 and parts[0] == "TYPE":
                types[parts[1]] = parts[2].strip().lower()
            elif len(parts) == 2 and parts[0] == "TYPE":
                raise PrometheusFormatError(f"line {line_no}: TYPE line without a type")
            continue  # HELP, EOF and free comments carry nothing we store
        if not _is_name_start(line[0]):
            raise PrometheusFormatError(
                f"line {line_no}: {line[:40]!r} does not start with a metric name"
            )
        i = 1
        while i < len(line) and _is_name_char(line[i]):
            i += 1
        name = line[:i]
        labels: dict[str, str] = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, line_no)
        rest = line[i:].split()
        if not rest:
            raise PrometheusFormatError(f"line {line_no}: metric {name!r} has no value")
        if len(rest) > 2 and rest[2] != "#":  # OpenMetrics exemplars follow a '#'
            raise PrometheusFormatError(f"line {line_no}: unexpected text after value of {name!r}")
        value = _parse_value(rest[0], line_no)
        ts: int | None = None
        if len(rest) >= 2 and rest[1] != "#":
            try:
                ts = int(float(rest[1]))
            except ValueError:
                raise PrometheusFormatError(f"line {line_no}: bad timestamp {rest[1]!r}") from None
        family, kind = _family_of(name, types)
        samples.append(
            Sample(name=name, labels=labels, value=value, timestamp_ms=ts, family=family, type=kind)
        )
    return samples


# --------------------------------------------------------------------------- normalising

CONCEPTS: dict[str, str] = {
    "requests_running": "requests being generated now (in the running batch / busy slots)",
    "requests_waiting": "requests queued, not yet admitted",
    "kv_cache_usage": "fraction of the KV cache in use, 0-1",
    "kv_cache_tokens": "tokens held in the KV cache",
    "prefix_cache_hits": "prefix-cache hits, in tokens (counter)",
    "prefix_cache_queries": "prefix-cache look-ups, in tokens (counter)",
    "prefix_cache_hit_rate": "prefix-cache hit rate as the engine reports it, 0-1",
    "preemptions": "preempted (evicted and recomputed) requests (counter)",
    "prompt_tokens": "prompt (prefill) tokens processed (counter)",
    "generation_tokens": "generated (decode) tokens (counter)",
}

# concept -> candidate metric names in preference order, and how to fold label sets
# ("sum" across data-parallel engines for counts, "mean" for ratios).
_NAMES: dict[str, dict[str, tuple[list[str], str]]] = {
    "vllm": {
        "requests_running": (["vllm:num_requests_running"], "sum"),
        "requests_waiting": (["vllm:num_requests_waiting"], "sum"),
        "kv_cache_usage": (["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"], "mean"),
        "prefix_cache_hits": (
            [
                "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_hits",
                "vllm:gpu_prefix_cache_hits_total",
            ],
            "sum",
        ),
        "prefix_cache_queries": (
            [
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_queries",
                "vllm:gpu_prefix_cache_queries_total",
            ],
            "sum",
        ),
        "prefix_cache_hit_rate": (["vllm:gpu_prefix_cache_hit_rate"], "mean"),
        "preemptions": (["vllm:num_preemptions_total", "vllm:num_preemptions"], "sum"),
        "prompt_tokens": (["vllm:prompt_tokens_total", "vllm:prompt_tokens"], "sum"),
        "generation_tokens": (["vllm:generation_tokens_total", "vllm:generation_tokens"], "sum"),
    },
    "sglang": {
        "requests_running": (["sglang:num_running_reqs"], "sum"),
        "requests_waiting": (["sglang:num_queue_reqs"], "sum"),
        "kv_cache_usage": (["sglang:token_usage"], "mean"),
        "kv_cache_tokens": (["sglang:num_used_tokens"], "sum"),
        "prefix_cache_hits": (["sglang:cached_tokens_total"], "sum"),
        "prefix_cache_hit_rate": (["sglang:cache_hit_rate"], "mean"),
        # SGLang "retracts" a request when the KV cache runs out: its preemption
        "preemptions": (
            ["sglang:num_retracted_requests_total", "sglang:total_retracted_reqs"],
            "sum",
        ),
        "prompt_tokens": (["sglang:prompt_tokens_total"], "sum"),
        "generation_tokens": (["sglang:generation_tokens_total"], "sum"),
    },
    "llamacpp": {
        "requests_running": (["llamacpp:requests_processing"], "sum"),
        "requests_waiting": (["llamacpp:requests_deferred"], "sum"),
        "kv_cache_usage": (["llamacpp:kv_cache_usage_ratio"], "mean"),
        "kv_cache_tokens": (["llamacpp:kv_cache_tokens"], "sum"),
        "prefix_cache_hits": (["llamacpp:prompt_tokens_cached_total"], "sum"),
        "prompt_tokens": (["llamacpp:prompt_tokens_total"], "sum"),
        "generation_tokens": (["llamacpp:tokens_predicted_total"], "sum"),
    },
}


def detect_engine(samples: Iterable[Sample]) -> str | None:
    """The engine whose prefix most samples carry (vllm, sglang, llamacpp), else None."""
    counts: dict[str, int] = {}
    for s in samples:
        prefix = s.name.split(":", 1)[0] if ":" in s.name else ""
        if prefix in _NAMES:
            counts[prefix] = counts.get(prefix, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda k: counts[k])


def concept_names(engine: str | None = None) -> set[str]:
    """Every raw metric name the normaliser understands (for one engine, or all)."""
    engines = [engine] if engine else list(_NAMES)
    return {n for e in engines for names, _ in _NAMES.get(e, {}).values() for n in names}


def normalize(samples: Iterable[Sample], engine: str | None = None) -> dict[str, float]:
    """Map an engine's metric names to the common concepts in `CONCEPTS`.

    Missing concepts are absent (not zero): an engine that does not report
    KV usage must not look like an empty cache.
    """
    samples = list(samples)
    engine = engine or detect_engine(samples)
    if engine is None:
        return {}
    by_name: dict[str, list[float]] = {}
    for s in samples:
        if not math.isnan(s.value):
            by_name.setdefault(s.name, []).append(s.value)
    out: dict[str, float] = {}
    for concept, (names, fold) in _NAMES[engine].items():
        for n in names:
            values = by_name.get(n)
            if values:
                out[concept] = sum(values) if fold == "sum" else sum(values) / len(values)
                break
    if engine == "llamacpp" and "prefix_cache_hits" in out and "prompt_tokens" in out:
        # llama.cpp counts computed prompt tokens apart from cached ones; a look-up covers both
        out["prefix_cache_queries"] = out["prompt_tokens"] + out["prefix_cache_hits"]
    return out


def storable(samples: Iterable[Sample]) -> list[Sample]:
    """The samples worth keeping with a run: the engine's own series, without histogram buckets.

    Buckets multiply the rows by ~20 and the probe measures the distributions
    itself; `_sum`/`_count` stay so server-side means can still be derived.
    """
    keep: list[Sample] = []
    for s in samples:
        prefix = s.name.split(":", 1)[0] if ":" in s.name else ""
        if prefix not in _NAMES:
            continue
        if s.name.endswith("_bucket") or s.name.endswith("_created"):
            continue
        keep.append(s)
    return keep


# --------------------------------------------------------------------------- scraping


@dataclass
class ScrapeReport:
    """What a scrape loop did; `note` says why it stopped early, if it did."""

    scrapes: int = 0
    failures: int = 0
    samples: int = 0
    engine: str | None = None
    stopped_early: bool = False
    note: str | None = None
    last: dict[str, float] = field(default_factory=dict)


Sink = Callable[[float, list[Sample]], Any]

MAX_PAGE_BYTES = 16 << 20
"""A vLLM page is ~0.1-1 MB; past 16 MB of decoded text it is a gzip bomb or a broken server."""


class PageTooLarge(Exception):
    """The page, decompressed, passed MAX_PAGE_BYTES; reading stopped there."""


async def fetch_page(
    client: Any,
    url: str,
    timeout_s: float,
    *,
    max_bytes: int = MAX_PAGE_BYTES,
    extensions: dict[str, Any] | None = None,
) -> tuple[int, str]:
    """GET `url` as (status, text), decompressing as it streams and stopping at
    `max_bytes` of decoded body: a 1 MB gzip bomb must not become 1 GB in memory.

    The raw bytes are inflated here, never more than the bytes still allowed at a time
    (a client library's decoder inflates a whole network chunk at once: 64 KB of a bomb
    is 64 MB). Only gzip and zlib are asked for."""
    import zlib

    parts: list[bytes] = []
    size = 0
    headers = {"Accept-Encoding": "gzip, identity"}
    async with client.stream(
        "GET", url, timeout=timeout_s, headers=headers, extensions=extensions or {}
    ) as resp:
        encoding = resp.headers.get("content-encoding", "").strip().lower()
        inflater = (
            zlib.decompressobj(zlib.MAX_WBITS | 32)
            if encoding in ("gzip", "x-gzip", "deflate")
            else None
        )
        async for raw in resp.aiter_raw():
            data = raw
            while data:
                if inflater is None:
                    out, data = data, b""
                else:
                    out = inflater.decompress(data, max_bytes - size + 1)
                    data = inflater.unconsumed_tail
                size += len(out)
                if size > max_bytes:
                    raise PageTooLarge(f"the /metrics page is larger than {max_bytes >> 20} MiB")
                parts.append(out)
        return resp.status_code, b"".join(parts).decode(resp.encoding or "utf-8", "replace")


async def scrape_loop(
    client: Any,
    url: str,
    interval_s: float,
    sink: Sink,
    stop_event: asyncio.Event,
    *,
    max_scrapes: int = 100_000,
    max_consecutive_failures: int = 5,
    timeout_s: float = 5.0,
    t0: float | None = None,
    extensions: dict[str, Any] | None = None,
) -> ScrapeReport:
    """Scrape `url` every `interval_s` until `stop_event` is set; hand each page to `sink(t_s, samples)`.

    `t_s` is seconds since `t0` on the monotonic clock (the run's start, so
    server series line up with request records). Only `storable()` samples are
    passed on. A 404, a body that is not Prometheus text, or
    `max_consecutive_failures` network errors in a row end the loop with a note
    rather than an exception: server metrics are a bonus, never a reason to fail
    the probe. A page larger than MAX_PAGE_BYTES once decompressed ends it too.
    `extensions` go to every request (the probe pins TLS's server name with them).
    """
    interval_s = max(float(interval_s), 0.05)
    t0 = time.monotonic() if t0 is None else t0
    report = ScrapeReport()
    consecutive = 0
    while not stop_event.is_set() and report.scrapes < max_scrapes:
        t_s = time.monotonic() - t0
        stop_note: str | None = None
        try:
            status, body = await fetch_page(client, url, timeout_s, extensions=extensions)
            failure = f"HTTP {status}" if status >= 400 else None
        except PageTooLarge as exc:  # a bomb repeats: stop at the first
            report.stopped_early, report.note = True, f"{exc}; no more server metrics recorded"
            break
        except Exception as exc:  # network errors of any client library
            status, body, failure = None, "", type(exc).__name__
        if status == 404:
            stop_note = "the server has no /metrics endpoint (HTTP 404); no server metrics recorded"
        elif failure is not None:
            report.failures += 1
            consecutive += 1
            if consecutive >= max_consecutive_failures:
                stop_note = f"stopped after {consecutive} failed scrapes in a row ({failure})"
        else:
            try:
                samples = parse_prometheus(body)
                if not samples:
                    stop_note = "the /metrics page is empty; no server metrics recorded"
            except PrometheusFormatError as exc:
                samples = []
                stop_note = (
                    f"the /metrics body is not Prometheus text ({exc}); no server metrics recorded"
                )
            if samples:
                consecutive = 0
                report.scrapes += 1
                report.engine = report.engine or detect_engine(samples)
                report.last = normalize(samples, report.engine)
                keep = storable(samples)
                report.samples += len(keep)
                result = sink(t_s, keep)
                if inspect.isawaitable(result):
                    await result
        if stop_note is not None:
            report.stopped_early = True
            report.note = stop_note
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), timeout=interval_s)
    return report
