"""Server-sent events, read the way the probe needs them: timestamps first, parsing later.

The transport records every read as ``(arrival_time, bytes)`` the moment it
arrives and does nothing else on the hot path. This module turns those reads
into what a request record needs, after the fact:

* :class:`SSESplitter` cuts a byte stream into events (LF, CRLF or CR line
  ends; events split across reads; several ``data:`` lines joined with ``\\n``;
  comment lines ignored), per the WHATWG event-stream rules.
* :func:`interpret` reads one event's JSON: which deltas carry tokens
  (content, reasoning content, tool calls; a role-only or empty delta does
  not), the usage block, an error object, finish reasons, llama.cpp timings.
* :func:`analyze_stream` combines both into timestamps per token-bearing
  chunk and token counts, preferring the server's own usage numbers.

Everything here is pure and synchronous so the metric definitions can be
tested on hand-built streams.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SSEEvent:
    data: bytes
    event: str | None = None


class SSESplitter:
    """Incremental event-stream splitter. Feed bytes; get the complete events so far.

    Linear in the bytes fed: line ends are normalised per read, only the new read is
    searched for the blank line that ends an event, and an unfinished event is kept
    as a list of pieces that is joined once, when it ends. (Re-scanning a growing
    buffer on every read made one long line without a newline quadratic.)
    """

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._last = b""  # last byte of the pending event, after normalising
        self._cr = False  # the previous read ended in CR: a leading LF here is its pair

    def feed(self, data: bytes) -> list[SSEEvent]:
        data = self._normalise(data)
        if not data:
            return []
        events: list[SSEEvent] = []
        pos = 0
        if self._last == b"\n" and data[:1] == b"\n":  # the blank line spans two reads
            events += self._dispatch(b"")
            pos = 1
        while True:
            i = data.find(b"\n\n", pos)
            if i < 0:
                break
            events += self._dispatch(data[pos:i])
            pos = i + 2
        rest = data[pos:]
        if rest:
            self._pending.append(rest)
            self._pending_bytes += len(rest)
            self._last = rest[-1:]
        return events

    def _normalise(self, data: bytes) -> bytes:
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        self._cr = data[-1:] == b"\r"
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return data

    def _dispatch(self, tail: bytes) -> list[SSEEvent]:
        """End the pending event with `tail` (the bytes before the blank line)."""
        if self._pending:
            block = b"".join([*self._pending, tail])
            self._pending.clear()
            self._pending_bytes = 0
        else:
            block = tail
        self._last = b""
        ev = _parse_block(block)
        return [ev] if ev is not None else []

    def close(self) -> tuple[list[SSEEvent], bytes]:
        """End of stream: a final event without its blank line is still dispatched;
        returns (events, leftover bytes that were not an event)."""
        buf = b"".join(self._pending).strip(b"\n")
        self._pending.clear()
        self._pending_bytes = 0
        self._last = b""
        if not buf:
            return [], b""
        ev = _parse_block(buf)
        if ev is not None:
            return [ev], b""
        return [], buf


def _parse_block(block: bytes) -> SSEEvent | None:
    if block.startswith(b"data: ") and b"\n" not in block:  # the common case, one data line
        return SSEEvent(data=block[6:])
    data_lines: list[bytes] = []
    event: str | None = None
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data_lines.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace")
        # id and retry do not matter to a probe
    if not data_lines:
        return None
    return SSEEvent(data=b"\n".join(data_lines), event=event)


@dataclass(slots=True)
class ChunkInfo:
    """What one event says."""

    done: bool = False
    tokens_bearing: bool = False
    text: str = ""
    usage: dict[str, Any] | None = None
    error: str | None = None
    finish_reason: str | None = None
    timings: dict[str, float] | None = None
    malformed: bool = False


def _error_text(obj: Any) -> str:
    if isinstance(obj, dict):
        msg = obj.get("message") or obj.get("error") or obj.get("type") or json.dumps(obj)
        return str(msg)[:4000]
    return str(obj)[:4000]


def interpret(data: bytes) -> ChunkInfo:
    """Read one event's payload. Bytes that are not UTF-8 are replaced, not fatal."""
    stripped = data.strip()
    if stripped == b"[DONE]":
        return ChunkInfo(done=True)
    try:
        obj = json.loads(stripped.decode("utf-8", "replace"))
    except ValueError:
        return ChunkInfo(malformed=True)
    if not isinstance(obj, dict):
        return ChunkInfo(malformed=True)
    info = ChunkInfo()
    if "error" in obj and obj["error"]:
        info.error = _error_text(obj["error"])
    elif obj.get("object") == "error":
        info.error = _error_text(obj)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        info.usage = usage
    timings = obj.get("timings")
    if isinstance(timings, dict):
        info.timings = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}
    pieces: list[str] = []
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            info.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for key in ("content", "reasoning_content", "reasoning"):
                value = delta.get(key)
                if isinstance(value, str) and value:
                    info.tokens_bearing = True
                    if key == "content":
                        pieces.append(value)
            if delta.get("tool_calls"):
                info.tokens_bearing = True
        text = choice.get("text")
        if isinstance(text, str) and text:
            info.tokens_bearing = True
            pieces.append(text)
        message = choice.get("message")  # non-streaming chat reply
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            if message["content"]:
                info.tokens_bearing = True
            pieces.append(message["content"])
    info.text = "".join(pieces)
    return info


@dataclass
class StreamAnalysis:
    """Timestamps and counts derived from a stream's reads."""

    first_token_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    tokens_approximate: bool = False
    saw_done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    malformed: bool = False
    events: int = 0
    after_done: int = 0
    """Events the server sent after ``[DONE]``: ignored, counted so a test can see them."""
    text: str = ""
    timings: dict[str, float] | None = None


def analyze_stream(reads: list[tuple[float, bytes]]) -> StreamAnalysis:
    """Token-bearing chunk times and token counts from timestamped reads of an SSE body.

    Token counts per chunk come from per-chunk cumulative usage when the server
    sends it (vLLM's continuous usage stats); otherwise each token-bearing
    event counts one token and, when a final usage gives the total, the counts
    are scaled so that they add up to it (the gap rule then spreads it).
    """
    out = StreamAnalysis()
    splitter = SSESplitter()
    texts: list[str] = []
    per_chunk_usage = True
    last_completion = 0
    final_usage: dict[str, Any] | None = None
    events_with_times: list[tuple[float, SSEEvent]] = []
    for t, data in reads:
        for ev in splitter.feed(data):
            events_with_times.append((t, ev))
    tail_events, leftover = splitter.close()
    end_t = reads[-1][0] if reads else 0.0
    events_with_times.extend((end_t, ev) for ev in tail_events)
    if leftover.strip():
        out.malformed = True
    for t, ev in events_with_times:
        if out.saw_done:  # nothing after [DONE] belongs to the response
            out.after_done += 1
            continue
        out.events += 1
        if ev.event == "error":
            out.error = _error_text(ev.data.decode("utf-8", "replace"))
            continue
        info = interpret(ev.data)
        if info.done:
            out.saw_done = True
            continue
        if info.malformed:
            out.malformed = True
            continue
        if info.error:
            out.error = info.error
        if info.finish_reason:
            out.finish_reason = info.finish_reason
        if info.timings:
            out.timings = info.timings
        usage_completion = None
        if info.usage is not None:
            final_usage = info.usage
            usage_completion = token_count(info.usage.get("completion_tokens"))
        if info.tokens_bearing:
            if out.first_token_s is None:
                out.first_token_s = t
            out.chunk_times_s.append(t)
            if usage_completion is not None:
                out.chunk_tokens.append(max(usage_completion - last_completion, 1))
                last_completion = usage_completion
            else:
                per_chunk_usage = False
                out.chunk_tokens.append(1)
            if info.text:
                texts.append(info.text)
    out.text = "".join(texts)
    total = None
    if final_usage is not None:
        out.input_tokens = token_count(final_usage.get("prompt_tokens"))
        total = token_count(final_usage.get("completion_tokens"))
    if total is not None:
        out.output_tokens = total
        if out.chunk_tokens and not per_chunk_usage:
            _spread(out.chunk_tokens, total)
    else:
        out.output_tokens = sum(out.chunk_tokens) if out.chunk_tokens else 0
        out.tokens_approximate = True
    return out


MAX_TOKEN_COUNT = 1 << 31
"""A usage count above this (or below zero, or not an integer) is not a count: ignored."""


def token_count(value: Any) -> int | None:
    """A server's token count if it is a plausible one: an int in [0, 2^31)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TOKEN_COUNT:
        return value
    return None


def _spread(chunk_tokens: list[int], total: int) -> None:
    """Make chunk token counts add up to the reported total, keeping one per chunk
    minimum; surplus goes evenly to chunks after the first (the first chunk's gap is TTFT)."""
    n = len(chunk_tokens)
    surplus = total - n
    if surplus <= 0:
        return
    if n == 1:
        chunk_tokens[0] = total
        return
    base, rest = divmod(surplus, n - 1)
    for i in range(1, n):
        chunk_tokens[i] = 1 + base + (1 if i <= rest else 0)
