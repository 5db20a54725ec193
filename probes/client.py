"""One measured request: a lean HTTP/1.1 client on asyncio's transport layer.

Why not httpx here: the probe's numbers are only as good as the moment a byte
is stamped. A general-purpose client runs several coroutine hops, a parser
state machine and line splitting per chunk before user code sees the bytes;
under 64 concurrent streams on two cores that work queues up and adds tens to
hundreds of milliseconds to TTFT (measured: ``bench/probe_precision.py``).
Here ``data_received`` stamps the monotonic clock first, decodes HTTP chunked
framing with a few slices, stores ``(time, bytes)`` and returns; the SSE and
JSON are parsed after the request ends (:mod:`inferwise.probes.sse`).
Timeouts are checked by one coarse timer per request, not re-armed per chunk.

What it supports is what OpenAI-compatible endpoints need: HTTP/1.1 with
keep-alive, chunked / content-length / close-delimited bodies, TLS with
certificate verification, connecting to the address the target policy
resolved (so a name cannot be re-resolved to a forbidden address).
No proxies, no HTTP/2, no redirects (a redirect is reported as an error).

The API key is sent in a header and scrubbed from every message that leaves
this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from inferwise.probes.records import RequestRecord

USER_AGENT = "inferwise-probe/0.1"


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 10.0
    read_s: float = 120.0
    """Longest wait for the first response byte (prefill of a long prompt can be slow)."""
    stall_s: float = 30.0
    """Longest silence once the response has started: beyond it the stream is `stalled`."""
    total_s: float = 600.0


@dataclass(frozen=True)
class ResponseLimits:
    """How much one response may hold before it is cut and classified ``over_limit``.

    A hostile or broken server can stream token events as fast as the socket
    takes them; without a cap the probe would keep every byte (gigabytes in
    seconds) and lose the request to a MemoryError. The caps follow from what
    was asked: an OpenAI-compatible stream sends about one event per token
    plus a few for the role, the finish reason, usage and ``[DONE]``.
    """

    max_body_bytes: int = 1 << 20
    max_events: int = 4096

    @classmethod
    def for_max_tokens(cls, max_tokens: int | None) -> ResponseLimits:
        """Twice the asked tokens plus 64 events; 4 KiB per event plus 1 MiB, at most 256 MiB."""
        if max_tokens is None:
            return cls()
        events = 2 * max(int(max_tokens), 1) + 64
        return cls(max_body_bytes=min(256 << 20, (1 << 20) + 4096 * events), max_events=events)


@dataclass(frozen=True)
class Target:
    """Where requests go. `connect_host` is the address the policy approved."""

    scheme: str
    host: str
    port: int
    base_path: str
    connect_host: str

    @classmethod
    def from_url(cls, url: str, connect_host: str | None = None) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        path = parts.path.rstrip("/")
        if not path.endswith("/v1"):
            path += "/v1"
        return cls(scheme, host, port, path, connect_host or host)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        h = f"[{self.host}]" if ":" in self.host else self.host
        return h if self.port == default else f"{h}:{self.port}"


def redact(text: str | None, secrets: list[str], limit: int | None = 300) -> str | None:
    """Remove secrets, then clip: clipping first could leave a prefix of a key behind.
    `limit` None keeps the whole text (stored prompts and outputs)."""
    if text is None:
        return None
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


class _Failure(Exception):
    def __init__(self, error_class: str, message: str, status: int | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.status = status


class _Conn(asyncio.Protocol):
    """One keep-alive connection; holds the state of the response being read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = 0
        self._reset()

    def _reset(self, limits: ResponseLimits | None = None) -> None:
        self.limits = limits or ResponseLimits()
        self.body_bytes = 0
        self.events = 0
        self.fut: asyncio.Future[None] | None = None
        self.head = b""
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.first_byte_t: float | None = None
        self.last_t: float | None = None
        self.reads: list[tuple[float, bytes]] = []
        self.mode = "head"  # head, chunked, length, close, done
        self.cbuf = b""
        self.remaining = 0
        self.skip = 0
        self.length_left = 0
        self.reusable = False
        self.cut = False

    # asyncio.Protocol -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()
        self.last_t = t
        mode = self.mode
        if mode == "head":
            if self.first_byte_t is None:
                self.first_byte_t = t
            self._head(t, data)
        elif mode != "done":  # "done": stray bytes after a response; the connection is not reused
            self.data_received_body(t, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is None or self.fut.done():
            return
        if self.mode != "close":  # only a close-delimited body may end with the connection
            self.cut = True
        self._finish(reusable=False)

    # parsing --------------------------------------------------------------
    def _head(self, t: float, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > 65536:
                self._fail(_Failure("malformed_sse", "response head too large"))
            return
        head, body = self.head[:end], self.head[end + 4 :]
        self.head = b""
        lines = head.decode("latin-1").split("\r\n")
        try:
            self.status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            self._fail(_Failure("malformed_sse", f"not an HTTP response: {lines[0][:80]!r}"))
            return
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            self.mode = "chunked"
        elif "content-length" in self.headers:
            self.mode = "length"
            try:
                self.length_left = int(self.headers["content-length"])
            except ValueError:
                self._fail(_Failure("malformed_sse", "bad Content-Length"))
                return
            if self.length_left == 0:
                self._finish(reusable=not body)
                return
        else:
            self.mode = "close"
        if body:
            self.data_received_body(t, body)

    def data_received_body(self, t: float, body: bytes) -> None:
        """Body bytes read at `t`, framed as the response head said (chunked, by length, or
        until the connection closes)."""
        self.body_bytes += len(body)
        self.events += body.count(b"data:")
        limits = self.limits
        if self.body_bytes > limits.max_body_bytes or self.events > limits.max_events:
            self._over_limit()
            return
        mode = self.mode
        if mode == "chunked":
            self._chunked(t, body)
        elif mode == "length":
            take = body[: self.length_left]
            self.length_left -= len(take)
            self.reads.append((t, take))
            if self.length_left <= 0:
                self._finish(reusable=len(take) == len(body))
        else:
            self.reads.append((t, body))

    def _chunked(self, t: float, data: bytes) -> None:
        buf = self.cbuf + data if self.cbuf else data
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        while pos < n:
            if self.remaining:
                take = min(self.remaining, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.skip = 2
                continue
            if self.skip:
                take = min(self.skip, n - pos)
                pos += take
                self.skip -= take
                continue
            i = buf.find(b"\r\n", pos)
            if i < 0:
                break
            try:
                size = int(buf[pos:i].split(b";")[0], 16)
            except ValueError:
                self.cbuf = b""
                if out:
                    self.reads.append((t, b"".join(out)))
                self._fail(_Failure("malformed_sse", "bad chunked framing"))
                return
            pos = i + 2
            if size == 0:
                if out:
                    self.reads.append((t, b"".join(out)))
                self.cbuf = b""
                # reusable only if the empty trailer line came with it
                self._finish(reusable=buf[pos:] == b"\r\n")
                return
            self.remaining = size
        self.cbuf = buf[pos:]
        if out:
            self.reads.append((t, out[0] if len(out) == 1 else b"".join(out)))

    def _over_limit(self) -> None:
        """Cut the response: what arrived so far is kept, the connection is closed."""
        limits = self.limits
        what = (
            f"{self.body_bytes} body bytes (cap {limits.max_body_bytes})"
            if self.body_bytes > limits.max_body_bytes
            else f"{self.events} events (cap {limits.max_events})"
        )
        self._fail(_Failure("over_limit", f"response exceeded {what}; cut"))
        if self.transport is not None:
            self.transport.close()

    def _finish(self, reusable: bool) -> None:
        self.mode = "done"
        conn_hdr = self.headers.get("connection", "").lower()
        self.reusable = reusable and not self.closed and conn_hdr != "close"
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)

    def _fail(self, failure: _Failure) -> None:
        self.mode = "done"
        self.reusable = False
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(failure)


@dataclass
class Pool:
    """Idle keep-alive connections, per target. One pool per event loop."""

    target: Target
    tls: ssl.SSLContext | None = None
    idle: list[_Conn] = field(default_factory=list)
    opened: int = 0

    async def acquire(self, timeouts: Timeouts) -> tuple[_Conn, bool]:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = {}
        if self.target.scheme == "https":
            if self.tls is None:
                self.tls = ssl.create_default_context()
            kwargs = {"ssl": self.tls, "server_hostname": self.target.host}
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Conn, self.target.connect_host, self.target.port, **kwargs),
                timeouts.connect_s,
            )
        except TimeoutError:
            raise _Failure(
                "connect_timeout", f"no connection within {timeouts.connect_s:g} s"
            ) from None
        except ConnectionRefusedError:
            raise _Failure(
                "connect_refused", f"connection refused by {self.target.host}:{self.target.port}"
            ) from None
        except socket.gaierror as exc:
            raise _Failure("dns", f"cannot resolve {self.target.host}: {exc.strerror}") from None
        except ssl.SSLError as exc:
            raise _Failure("tls", f"TLS failed: {exc.reason or exc}") from None
        except OSError as exc:
            raise _Failure("connect_refused", f"cannot connect: {exc.strerror or exc}") from None
        self.opened += 1
        return conn, False

    async def preconnect(self, n: int, timeouts: Timeouts) -> int:
        """Open up to `n` idle connections ahead of the load, so that TCP and TLS set-up is
        not counted in the first requests' TTFT. Failures are left for the requests to report."""
        missing = max(0, n - len(self.idle))
        results = await asyncio.gather(
            *(self.acquire(timeouts) for _ in range(missing)), return_exceptions=True
        )
        opened = 0
        for res in results:
            if isinstance(res, tuple):
                conn, _ = res
                conn.reusable = True
                self.idle.append(conn)
                opened += 1
        return opened

    def release(self, conn: _Conn) -> None:
        if conn.reusable and not conn.closed:
            conn._reset()
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()


@dataclass(frozen=True)
class Outcome:
    """Raw result of one HTTP exchange, before SSE analysis."""

    start_t: float
    first_byte_t: float | None
    end_t: float
    status: int | None
    headers: dict[str, str]
    reads: list[tuple[float, bytes]]
    error_class: str | None = None
    error_message: str | None = None


def build_head(
    target: Target, path: str, body_len: int, api_key: str | None, method: str = "POST"
) -> bytes:
    lines = [
        f"{method} {target.base_path}{path} HTTP/1.1",
        f"Host: {target.host_header}",
        f"User-Agent: {USER_AGENT}",
        "Content-Type: application/json",
        "Accept: text/event-stream, application/json",
        f"Content-Length: {body_len}",
    ]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def exchange(
    pool: Pool,
    path: str,
    body: bytes,
    *,
    api_key: str | None,
    timeouts: Timeouts,
    method: str = "POST",
    limits: ResponseLimits | None = None,
) -> Outcome:
    """Send one request and read the response with arrival times, up to `limits`
    (default: 1 MiB, for the short replies of discovery and calibration). Never raises
    for network or HTTP trouble; the outcome carries the error class instead."""
    head = build_head(pool.target, path, len(body), api_key, method)
    start = time.monotonic()
    conn: _Conn | None = None
    for attempt in range(2):
        try:
            conn, reused = await pool.acquire(timeouts)
        except _Failure as f:
            return Outcome(start, None, time.monotonic(), None, {}, [], f.error_class, f.message)
        loop = asyncio.get_running_loop()
        conn._reset(limits)
        conn.fut = loop.create_future()
        assert conn.transport is not None
        conn.transport.write(head + body)
        conn.used += 1
        try:
            await _wait(conn, start, timeouts)
        except _Failure as f:
            if (
                reused
                and attempt == 0
                and conn.first_byte_t is None
                and f.error_class == "stream_cut"
            ):
                continue  # the server closed an idle keep-alive connection; retry once on a fresh one
            pool.release(conn)
            return Outcome(
                start,
                conn.first_byte_t,
                time.monotonic(),
                conn.status,
                conn.headers,
                conn.reads,
                f.error_class,
                f.message,
            )
        except asyncio.CancelledError:
            conn.reusable = False
            pool.release(conn)
            raise
        break
    assert conn is not None
    end = conn.last_t or time.monotonic()
    outcome = Outcome(start, conn.first_byte_t, end, conn.status, conn.headers, conn.reads)
    pool.release(conn)
    return outcome


async def _wait(conn: _Conn, start: float, timeouts: Timeouts) -> None:
    """Wait for the response to end, checking timeouts with a coarse periodic timer."""
    assert conn.fut is not None
    fut = conn.fut
    loop = asyncio.get_running_loop()
    tick = max(0.01, min(timeouts.stall_s, timeouts.read_s, timeouts.total_s) / 20)

    def check() -> None:
        if fut.done():
            return
        now = time.monotonic()
        if now - start > timeouts.total_s:
            conn._fail(_Failure("total_timeout", f"request exceeded {timeouts.total_s:g} s"))
        elif conn.first_byte_t is None and now - start > timeouts.read_s:
            conn._fail(_Failure("read_timeout", f"no response within {timeouts.read_s:g} s"))
        elif conn.last_t is not None and now - conn.last_t > timeouts.stall_s:
            conn._fail(_Failure("stalled", f"stream silent for more than {timeouts.stall_s:g} s"))
        else:
            handle[0] = loop.call_later(tick, check)
            return
        if conn.transport is not None:
            conn.transport.close()

    handle = [loop.call_later(tick, check)]
    try:
        await fut
    finally:
        handle[0].cancel()
    if conn.cut:
        where = "before the response" if conn.first_byte_t is None else "mid-stream"
        raise _Failure("stream_cut", f"connection closed {where}")


# ---------------------------------------------------------------------------
# OpenAI-compatible request bodies and the record of one request


def request_body(
    endpoint: str,
    model: str,
    prompt: str,
    max_tokens: int | None,
    *,
    stream: bool,
    ignore_eos: bool,
    continuous_usage: bool = True,
    extra: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> tuple[str, bytes]:
    """(path, JSON body). Usage is requested per stream (`include_usage`) and, for
    vLLM, per chunk (`continuous_usage_stats`). Most engines ignore fields they do
    not know; strict APIs reject them, which the runner detects and then drops them."""
    payload: dict[str, Any] = {"model": model, "stream": stream}
    if endpoint == "chat":
        path = "/chat/completions"
        payload["messages"] = messages or [{"role": "user", "content": prompt}]
    else:
        path = "/completions"
        payload["prompt"] = prompt
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
        if ignore_eos:
            payload["ignore_eos"] = True
            payload["min_tokens"] = max_tokens
    if stream:
        payload["stream_options"] = {"include_usage": True}
        if continuous_usage:
            payload["stream_options"]["continuous_usage_stats"] = True
    payload["temperature"] = 0.0
    if extra:
        payload.update(extra)
    return path, json.dumps(payload).encode()


def over_token_limit(max_tokens: int) -> int:
    """More output tokens than this for `max_tokens` is a broken or hostile server, not a
    measurement: the margin allows a tokenizer that counts a few special tokens."""
    return int(max_tokens * 1.5) + 16


def _status_error(status: int) -> str:
    if status == 429:
        return "http_429"
    if status >= 500:
        return "http_5xx"
    return "http_4xx"


def retry_after_s(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def to_record(
    outcome: Outcome,
    *,
    index: int,
    origin: float,
    stream: bool,
    warmup: bool = False,
    scheduled_s: float | None = None,
    secrets: list[str] | None = None,
    store_text: bool = False,
    prompt: str | None = None,
    max_tokens: int | None = None,
    prompt_id: str | None = None,
    grader: Any = None,
) -> RequestRecord:
    """Turn a raw exchange into a request record with times relative to `origin`.

    Stored prompt and output text have the secrets removed too: an endpoint that
    echoes the Authorization header must not put the key into the run store.
    A stream that carries far more tokens than `max_tokens` asked for is failed as
    `over_limit`, with its timings kept. A completed reply's text is hashed always
    and checked by `grader` (a probes.graders.Grader) when the prompt has one; both
    happen here, after the response ended, off the byte-stamping path."""
    secrets = secrets or []
    base: dict[str, Any] = {
        "index": index,
        "warmup": warmup,
        "scheduled_s": scheduled_s,
        "start_s": outcome.start_t - origin,
        "first_byte_s": None if outcome.first_byte_t is None else outcome.first_byte_t - origin,
        "end_s": outcome.end_t - origin,
        "http_status": outcome.status,
        "prompt_text": redact(prompt, secrets, None) if store_text else None,
        "prompt_id": prompt_id,
        "grader": grader.name if grader is not None else None,
    }
    text = _TextPolicy(secrets, store_text, grader)
    if outcome.error_class is not None and (outcome.status is None or outcome.status < 400):
        return _transport_failure(outcome, origin, base, secrets)
    status = outcome.status or 0
    if status >= 400 or status < 200 or 300 <= status < 400:
        return _http_failure(outcome, status, base, secrets)
    ctype = outcome.headers.get("content-type", "")
    if not stream or "text/event-stream" not in ctype:
        body = b"".join(d for _, d in outcome.reads)
        if "text/event-stream" not in ctype and body.lstrip().startswith(b"{"):
            return _whole_reply(body, base, text)
    return _stream_record(outcome, origin, base, text, max_tokens)


@dataclass(frozen=True)
class _TextPolicy:
    """Whether response text is kept, and the secrets to take out of whatever is."""

    secrets: list[str]
    store: bool
    grader: Any = None

    def keep(self, text: str) -> str | None:
        return redact(text, self.secrets, None) if self.store else None

    def judged(self, text: str) -> dict[str, Any]:
        """What a completed reply's text leaves even when it is not stored: its hash, and
        whether it passed the prompt's grader."""
        from inferwise.probes.graders import output_hash

        out: dict[str, Any] = {"output_sha256": output_hash(text)}
        if self.grader is not None:
            out["correct"] = self.grader.grade(text)
        return out


def _transport_failure(
    outcome: Outcome, origin: float, base: dict[str, Any], secrets: list[str]
) -> RequestRecord:
    """Network trouble (or a cut past the caps): keep what arrived for the partial timings."""
    from inferwise.probes.sse import analyze_stream

    analysis = analyze_stream(outcome.reads) if outcome.reads else None
    if analysis is not None and analysis.first_token_s is not None:
        base["first_token_s"] = analysis.first_token_s - origin
        base["chunk_times_s"] = [t - origin for t in analysis.chunk_times_s]
        base["chunk_tokens"] = analysis.chunk_tokens
    return RequestRecord(
        ok=False,
        error_class=outcome.error_class,  # type: ignore[arg-type]
        error_message=redact(outcome.error_message, secrets),
        **base,
    )


def _http_failure(
    outcome: Outcome, status: int, base: dict[str, Any], secrets: list[str]
) -> RequestRecord:
    """A non-2xx answer: its class and the server's own message."""
    body = b"".join(d for _, d in outcome.reads)[:8000].decode("utf-8", "replace")
    try:
        obj = json.loads(body)
        detail = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
        body = str(detail)
    except ValueError:
        pass
    cls = _status_error(status) if status >= 400 else "other"
    ra = retry_after_s(outcome.headers)
    wait = f" (Retry-After {ra:g} s)" if status == 429 and ra is not None else ""
    msg = f"HTTP {status}{wait}: {body.strip()}"
    return RequestRecord(ok=False, error_class=cls, error_message=redact(msg, secrets), **base)  # type: ignore[arg-type]


def _whole_reply(body: bytes, base: dict[str, Any], text: _TextPolicy) -> RequestRecord:
    """A non-streamed JSON reply: the first token is only seen with the last, TTFT = E2E."""
    from inferwise.probes.sse import interpret, token_count

    info = interpret(body)
    if info.malformed or info.error:
        return RequestRecord(
            ok=False,
            error_class="server_error_event" if info.error else "malformed_sse",
            error_message=redact(info.error or "reply is not JSON", text.secrets),
            **base,
        )
    usage = info.usage or {}
    out_tokens = token_count(usage.get("completion_tokens"))
    return RequestRecord(
        ok=True,
        first_token_s=base["end_s"],
        input_tokens=token_count(usage.get("prompt_tokens")),
        output_tokens=out_tokens if out_tokens is not None else (1 if info.text else 0),
        tokens_approximate=out_tokens is None,
        chunk_times_s=[base["end_s"]],
        chunk_tokens=[out_tokens if out_tokens else 1],
        output_text=text.keep(info.text),
        **text.judged(info.text),
        **base,
    )


def _stream_record(
    outcome: Outcome,
    origin: float,
    base: dict[str, Any],
    text: _TextPolicy,
    max_tokens: int | None,
) -> RequestRecord:
    """A streamed reply: token times and counts, and what made it fail if it did."""
    from inferwise.probes.sse import analyze_stream

    a = analyze_stream(outcome.reads)
    fields: dict[str, Any] = {
        "first_token_s": None if a.first_token_s is None else a.first_token_s - origin,
        "chunk_times_s": [t - origin for t in a.chunk_times_s],
        "chunk_tokens": a.chunk_tokens,
        "input_tokens": a.input_tokens,
        "output_tokens": a.output_tokens,
        "tokens_approximate": a.tokens_approximate,
        "server_timings": a.timings,
        "output_text": text.keep(a.text),
    }
    failure = _stream_failure(a, max_tokens)
    if failure is None:
        return RequestRecord(ok=True, **fields, **text.judged(a.text), **base)
    error_class, error_message = failure
    return RequestRecord(
        ok=False,
        error_class=error_class,  # type: ignore[arg-type]
        error_message=redact(error_message, text.secrets),
        **fields,
        **base,
    )


def _stream_failure(a: Any, max_tokens: int | None) -> tuple[str, str] | None:
    """(error class, message) of a stream that is not a complete response, else None."""
    if max_tokens is not None and (a.output_tokens or 0) > over_token_limit(max_tokens):
        return "over_limit", f"stream carried {a.output_tokens} tokens for max_tokens {max_tokens}"
    if a.error:
        return "server_error_event", f"error event in stream: {a.error}"
    if a.malformed:
        return "malformed_sse", "stream held data that is not server-sent events JSON"
    if not a.saw_done and a.finish_reason is None:
        return "stream_cut", "stream ended without [DONE] or a finish reason"
    if a.first_token_s is None and a.saw_done:
        return "malformed_sse", "stream said [DONE] before any token"
    if a.first_token_s is None:
        return "other", "stream finished without any token"
    return None
