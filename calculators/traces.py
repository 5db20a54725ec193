"""Production request traces read into one typed form: arrivals, lengths and shared prefixes.

Four formats, as their publishers ship them (checked against the published
files, 2026-12-02):

* ``mooncake`` - JSON lines ``{"timestamp": ms, "input_length", "output_length",
  "hash_ids": [...]}`` (https://github.com/kvcache-ai/Mooncake, FAST25-release/traces).
  ``timestamp`` is milliseconds since the trace began; each hash id names one
  512-token block of the prompt, so two requests whose ``hash_ids`` start with
  the same ids share exactly that prompt prefix.
* ``burstgpt`` - CSV with the columns ``Timestamp`` (seconds), ``Model``,
  ``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``
  (https://github.com/HPMLL/BurstGPT). Rows with 0 response tokens are the
  failed requests of the ``BurstGPT_*.csv`` files: they are skipped and counted.
* ``azure`` - CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``, the timestamp a
  date-time string such as ``2023-11-16 18:15:46.6805900`` (2023) or
  ``2024-05-10 00:00:00.009930+00:00`` (2024)
  (https://github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace).
* ``jsonl`` - the plain form: JSON lines with ``timestamp`` (seconds) or
  ``timestamp_ms``, and ``input_tokens`` / ``output_tokens`` (or Mooncake's
  ``input_length`` / ``output_length``), optional ``hash_ids``.

Why a calculator: the probe replays a trace and ``predict``/``budget`` simulate
it; both read it here, a local file in and a typed :class:`Trace` out.

The window and the replay speed are applied here, the same for every caller:
``start_s``/``duration_s`` cut a window in trace time (seconds after the
trace's first request), then the arrivals are re-based to the window's start
and divided by ``time_scale`` (2 = twice as fast: every gap halved, the rate
doubled; 0.5 = half speed). Every problem is an :class:`InputError` naming the
row (line number in the file, header = line 1 for CSV) and the field.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from .errors import InputError
from .files import MiB, expand_path, stat_path

TraceFormat = Literal["mooncake", "burstgpt", "azure", "jsonl"]
FORMATS: tuple[str, ...] = ("mooncake", "burstgpt", "azure", "jsonl")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id in the Mooncake traces (their README: block size 512)."""
MAX_TRACE_BYTES = 1024 * MiB
"""The largest published trace (Azure 2024 conversation week) is about 1 GB of CSV."""
MAX_TRACE_ROWS = 1_000_000
"""Rows kept after the window: arrays of a million requests stay ~50 MB in memory."""
MAX_LINE_BYTES = 1 * MiB
MAX_HASH_IDS = 4096
"""2M tokens of 512-token blocks: longer than any context window."""
MAX_TOKENS = 10_000_000
MAX_TIME_VALUE = 1e13
"""Largest timestamp number read (seconds or ms): epoch milliseconds reach it in the year
2286, and up to it a double still resolves 2 ms (of ms values: 2 us). Far beyond it, arrival
gaps vanish in the float and latencies come out as 0."""


@dataclass(frozen=True)
class TraceWindow:
    """Which part of the trace, at what speed. Seconds of trace time."""

    start_s: float | None = None
    duration_s: float | None = None
    time_scale: float = 1.0
    max_requests: int | None = None


@dataclass
class Trace:
    """A trace's requests in arrival order, after the window and the time scale."""

    name: str
    path: str
    sha256: str
    format: str
    arrival_s: list[float]
    """Seconds from the window's start, divided by the time scale."""
    input_tokens: list[int]
    output_tokens: list[int]
    hash_ids: list[list[int]] | None
    """Per request, its 512-token prefix blocks (Mooncake); None when the format has none."""
    rows: list[int]
    """Line of each request in the file (for messages)."""
    window: TraceWindow
    total_rows: int = 0
    """Requests in the whole file (before the window)."""
    trace_span_s: float = 0.0
    """First to last timestamp of the whole file, seconds (unscaled)."""
    skipped_rows: int = 0
    first_epoch_s: float | None = None
    """Wall-clock time of the window's first request (Azure's date-times), for a day profile."""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """First to last arrival of the kept requests (scaled)."""
        return self.arrival_s[-1] - self.arrival_s[0] if self.arrival_s else 0.0

    @property
    def mean_rate_per_s(self) -> float:
        """Requests per second over the kept span (all at one instant: the count)."""
        span = self.duration_s
        return len(self) / span if span > 0 else float(len(self))

    def describe(self) -> dict[str, Any]:
        """What a stored run or result says about the trace it replayed."""
        w = self.window
        return {
            "name": self.name,
            "sha256": self.sha256,
            "format": self.format,
            "requests": len(self),
            "total_rows": self.total_rows,
            "skipped_rows": self.skipped_rows,
            "start_s": w.start_s,
            "duration_s": w.duration_s,
            "time_scale": w.time_scale,
            "max_requests": w.max_requests,
            "span_s": round(self.duration_s, 6),
            "mean_rate_per_s": round(self.mean_rate_per_s, 6),
        }

    def check_context(self, max_model_len: int, field_name: str = "trace") -> None:
        """Every request must fit the model's context window (prompt + output)."""
        for i, (a, b) in enumerate(zip(self.input_tokens, self.output_tokens, strict=True)):
            if a + b > max_model_len:
                raise InputError(
                    field_name,
                    f"row {self.rows[i]}: input {a} + output {b} tokens = {a + b} exceeds the "
                    f"model's context window of {max_model_len} tokens",
                    "a trace whose requests fit the context, or a window without this row "
                    "(trace_start / trace_duration)",
                )


def check_window(window: TraceWindow) -> None:
    """A window the reader can apply: finite, non-negative, a positive speed."""
    if not (math.isfinite(window.time_scale) and 1e-3 <= window.time_scale <= 1e3):
        raise InputError(
            "trace_time_scale", f"{window.time_scale:g} is out of range", "0.001 to 1000"
        )
    for name, v in (("trace_start", window.start_s), ("trace_duration", window.duration_s)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise InputError(name, f"{v:g} must be a finite number of seconds >= 0")
    if window.duration_s is not None and window.duration_s <= 0:
        raise InputError("trace_duration", "must be > 0 seconds")


def load_trace(
    path: str, fmt: str | None = None, window: TraceWindow | None = None, field_name: str = "trace"
) -> Trace:
    """Read, check and window a trace file. `fmt` None: guessed from the first line."""
    window = window or TraceWindow()
    check_window(window)
    p = _checked_path(path, field_name)
    data, digest = _read_bytes(p, field_name)
    text = data.decode("utf-8", errors="replace")
    first = text.lstrip()[:200]
    fmt = fmt or _guess_format(first)
    if fmt not in FORMATS:
        raise InputError("trace_format", f"unknown format {fmt!r}", ", ".join(FORMATS))
    reader = _CsvRows(text, fmt, field_name) if fmt in ("burstgpt", "azure") else None
    rows = reader.rows() if reader else _json_rows(text, fmt, field_name)
    trace = _collect(rows, p, digest, fmt, window, field_name)
    trace.skipped_rows = reader.skipped if reader else 0
    if trace.skipped_rows:
        trace.notes.append(f"{trace.skipped_rows} rows with 0 response tokens (failed) skipped")
    return trace


# --------------------------------------------------------------------------- reading


def _checked_path(path: str, field_name: str) -> Path:
    p = expand_path(path)
    st = stat_path(p)
    if st is None or not stat.S_ISREG(st.st_mode):
        raise InputError(field_name, f"no regular file at {path}", "a trace file (a regular file)")
    if st.st_size > MAX_TRACE_BYTES:
        raise InputError(
            field_name,
            f"{path} is {st.st_size / MiB:.0f} MiB; the limit is {MAX_TRACE_BYTES // MiB} MiB",
            "a shorter cut of the trace (e.g. head -n 100000)",
        )
    return p


def _read_bytes(p: Path, field_name: str) -> tuple[bytes, str]:
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise InputError(field_name, f"cannot read {p}: {exc.strerror or exc}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise InputError(field_name, f"{p} is larger than {MAX_TRACE_BYTES // MiB} MiB")
    if not data.strip():
        raise InputError(field_name, f"{p} is empty")
    return data, hashlib.sha256(data).hexdigest()


def _guess_format(first: str) -> str:
    if first.startswith("{"):
        return "mooncake" if '"input_length"' in first else "jsonl"
    head = first.splitlines()[0] if first else ""
    if "ContextTokens" in head:
        return "azure"
    if "Request tokens" in head:
        return "burstgpt"
    raise InputError(  # the line itself is not echoed: over MCP it could be any local file
        "trace_format",
        "cannot tell the format of the trace file from its first line "
        "(a JSON object, or a CSV header with ContextTokens or Request tokens)",
        ", ".join(FORMATS),
    )


# A parsed row: (line, timestamp seconds, input tokens, output tokens, hash ids, epoch s or None)
_Row = tuple[int, float, int, int, list[int] | None, float | None]


def _int_field(v: Any, line: int, name: str, field_name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or v is None:
        raise InputError(field_name, f"row {line}: {name} is missing", f"an integer >= {minimum}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(
            field_name, f"row {line}: {name} = {str(v)[:40]!r} is not a number"
        ) from None
    if not math.isfinite(x) or x != int(x) or not (minimum <= x <= MAX_TOKENS):
        raise InputError(
            field_name,
            f"row {line}: {name} = {str(v)[:40]} is not a whole number in range",
            f"{minimum} to {MAX_TOKENS:,}",
        )
    return int(x)


def _time_field(v: Any, line: int, name: str, field_name: str) -> float:
    if isinstance(v, bool) or v is None:
        raise InputError(field_name, f"row {line}: {name} is missing", "a number of seconds >= 0")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(
            field_name, f"row {line}: {name} = {str(v)[:40]!r} is not a number"
        ) from None
    if not math.isfinite(x) or not 0 <= x <= MAX_TIME_VALUE:
        what = "is negative" if x < 0 else "is out of range"
        raise InputError(field_name, f"row {line}: {name} = {v} {what}", f"0 to {MAX_TIME_VALUE:g}")
    return x


def _json_rows(text: str, fmt: str, field_name: str) -> Any:
    for line_no, line in enumerate(io.StringIO(text), 1):
        line = line.strip()
        if not line:
            continue
        if len(line) > MAX_LINE_BYTES:
            raise InputError(field_name, f"row {line_no}: longer than {MAX_LINE_BYTES // MiB} MiB")
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(field_name, f"row {line_no} is not valid JSON") from None
        if not isinstance(obj, dict):
            raise InputError(field_name, f"row {line_no} is not a JSON object")
        yield _json_row(obj, line_no, fmt, field_name)


def _json_row(obj: dict[str, Any], n: int, fmt: str, field_name: str) -> _Row:
    if fmt == "mooncake" or "timestamp_ms" in obj:
        key = "timestamp" if fmt == "mooncake" else "timestamp_ms"
        t = _time_field(obj.get(key), n, key, field_name) / 1000.0
    else:
        t = _time_field(obj.get("timestamp"), n, "timestamp", field_name)
    in_key = "input_length" if fmt == "mooncake" or "input_length" in obj else "input_tokens"
    out_key = "output_length" if fmt == "mooncake" or "output_length" in obj else "output_tokens"
    inp = _int_field(obj.get(in_key), n, in_key, field_name)
    out = _int_field(obj.get(out_key), n, out_key, field_name)
    hashes = obj.get("hash_ids")
    if hashes is not None:
        ok = isinstance(hashes, list) and all(
            isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63 for h in hashes
        )
        if not ok or len(hashes) > MAX_HASH_IDS:
            raise InputError(
                field_name,
                f"row {n}: hash_ids must be a list of at most {MAX_HASH_IDS} integers >= 0",
            )
        if len(hashes) > math.ceil(inp / MOONCAKE_BLOCK_TOKENS):
            raise InputError(
                field_name,
                f"row {n}: {len(hashes)} hash_ids of {MOONCAKE_BLOCK_TOKENS} tokens are more "
                f"than {in_key} {inp} holds",
            )
    elif fmt == "mooncake":
        raise InputError(field_name, f"row {n}: hash_ids is missing", "a list of block ids")
    return (n, t, inp, out, hashes, None)


class _CsvRows:
    """BurstGPT and Azure CSV rows: the header checked for the format's columns."""

    COLUMNS = {
        "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
        "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    }

    def __init__(self, text: str, fmt: str, field_name: str) -> None:
        self.fmt, self.field_name = fmt, field_name
        self.reader = csv.reader(io.StringIO(text))
        try:
            header = [h.strip() for h in next(self.reader)]
        except (StopIteration, csv.Error):
            raise InputError(field_name, "row 1: no CSV header") from None
        want = self.COLUMNS[fmt]
        missing = [c for c in want if c not in header]
        if missing:
            raise InputError(
                field_name,
                f"row 1: the {fmt} header lacks the column(s) {', '.join(missing)}",
                ", ".join(want),
            )
        self.idx = [header.index(c) for c in want]
        self.skipped = 0

    def rows(self) -> Any:
        t_key, in_key, out_key = self.COLUMNS[self.fmt]
        fn = self.field_name
        try:
            for cells in self.reader:
                line = self.reader.line_num
                if not cells or not any(c.strip() for c in cells):
                    continue
                if len(cells) <= max(self.idx):
                    raise InputError(fn, f"row {line}: {len(cells)} columns, the header has more")
                ts, inp, out = (cells[i].strip() for i in self.idx)
                if self.fmt == "burstgpt" and out in ("0", "0.0"):
                    self.skipped += 1  # a failed request in BurstGPT_*.csv
                    continue
                epoch = _azure_time(ts, line, fn) if self.fmt == "azure" else None
                t = epoch if epoch is not None else _time_field(ts, line, t_key, fn)
                yield (
                    line,
                    t,
                    _int_field(inp, line, in_key, fn),
                    _int_field(out, line, out_key, fn),
                    None,
                    epoch,
                )
        except csv.Error as exc:
            raise InputError(fn, f"row {self.reader.line_num}: not valid CSV ({exc})") from None


def _azure_time(ts: str, line: int, field_name: str) -> float:
    """Seconds since the epoch from Azure's date-time (7 fraction digits in 2023: cut to 6)."""
    s = ts.strip().replace("T", " ")
    head, dot, rest = s.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        s = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise InputError(
            field_name,
            f"row {line}: TIMESTAMP = {ts[:40]!r} is not a date-time",
            "e.g. 2023-11-16 18:15:46.6805900",
        ) from None
    if dt.tzinfo is None:
        from datetime import UTC

        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# --------------------------------------------------------------------------- the window


def _collect(
    rows: Any, p: Path, digest: str, fmt: str, window: TraceWindow, field_name: str
) -> Trace:
    """Check the order of every row, keep those in the window, re-base and scale them."""
    arrivals: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    hashes: list[list[int]] = []
    lines: list[int] = []
    first_t = last_t = None
    total = 0
    origin = first_epoch = None
    any_hash = False
    for line, t, a, b, h, epoch in rows:
        if last_t is not None and t < last_t:
            raise InputError(
                field_name,
                f"row {line}: timestamp goes back in time ({_t(t, fmt)} after {_t(last_t, fmt)})",
                "rows in arrival order (sort the file by its timestamp)",
            )
        first_t = t if first_t is None else first_t
        last_t = t
        total += 1
        rel = t - first_t
        if window.start_s is not None and rel < window.start_s:
            continue
        if window.duration_s is not None and rel - (window.start_s or 0.0) > window.duration_s:
            continue  # still read on: the rest must be checked too
        if window.max_requests is not None and len(arrivals) >= window.max_requests:
            continue
        if origin is None:
            origin = first_t + (window.start_s if window.start_s is not None else 0.0)
            first_epoch = epoch
        if len(arrivals) >= MAX_TRACE_ROWS:
            raise InputError(
                field_name,
                f"more than {MAX_TRACE_ROWS:,} requests in the window",
                "a shorter window (trace_duration) or a request cap (requests)",
            )
        arrivals.append((t - origin) / window.time_scale)
        inp.append(a)
        out.append(b)
        hashes.append(h or [])
        any_hash = any_hash or h is not None
        lines.append(line)
    if total == 0:
        raise InputError(field_name, f"{p} holds no requests")
    if not arrivals:
        raise InputError(
            "trace_start",
            f"the window (start {window.start_s or 0:g} s, duration "
            f"{'all' if window.duration_s is None else f'{window.duration_s:g} s'}) holds no "
            f"request; the trace spans {(last_t or 0) - (first_t or 0):.6g} s",
            "a window inside the trace's span",
        )
    return Trace(
        name=p.name,
        path=str(p),
        sha256=digest,
        format=fmt,
        arrival_s=arrivals,
        input_tokens=inp,
        output_tokens=out,
        hash_ids=hashes if any_hash else None,
        rows=lines,
        window=window,
        total_rows=total,
        trace_span_s=(last_t or 0.0) - (first_t or 0.0),
        first_epoch_s=first_epoch,
    )


def _t(t: float, fmt: str) -> str:
    if fmt == "azure":
        from datetime import UTC

        return datetime.fromtimestamp(t, UTC).isoformat(sep=" ")
    return f"{t:g} s"


def shared_prefix_fraction(trace: Trace) -> float | None:
    """Share of prompt tokens that a prefix cache of unbounded size could serve: per
    request, its leading 512-token blocks whose hash ids an earlier request already sent
    (Mooncake's ids name a block together with everything before it, so a shared id is a
    shared prefix). None when the trace has no hash ids."""
    if trace.hash_ids is None:
        return None
    seen: set[int] = set()
    hit = total = 0
    for ids, n in zip(trace.hash_ids, trace.input_tokens, strict=True):
        total += n
        j = 0
        while j < len(ids) and ids[j] in seen:
            hit += min(MOONCAKE_BLOCK_TOKENS, n - j * MOONCAKE_BLOCK_TOKENS)
            j += 1
        seen.update(ids)
    return hit / total if total else None
