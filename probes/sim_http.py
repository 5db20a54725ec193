"""The simulated engine's HTTP side: an OpenAI-compatible ASGI app over `SimEngine`.

A bare ASGI app rather than a framework: the hot path is one chunk per token
at concurrency 64 on two cores, and the server's own overhead must not blur
the timing the probe is measured against. Every token-bearing chunk's send
time (time.monotonic, system-wide on Linux) goes into the send log, keyed by
the request's X-Request-Id, so a client in another process can compare its
own timestamps with the truth.

Faults are drawn per request from a seeded RNG: 429 and 503 answers,
streams cut mid-way (the connection closes without the end of the chunked
body), stalls (no bytes for `stall_s`), and a slow first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from inferwise.probes.sim_engine import SimEngine, chat_prompt_tokens, output_token, tokenize

SEND_LOG_LIMIT = 100_000


@dataclass(frozen=True)
class FaultPlan:
    """The mid-stream fault one response gets, if any: the connection cut, a stall, or an
    error event, striking after `after_tokens` output tokens. One value instead of three
    mutually exclusive positions."""

    kind: Literal["cut", "stall", "error"] | None = None
    after_tokens: int = 0

    def strikes(self, kind: str, tokens_sent: int) -> bool:
        """Whether fault `kind` strikes before `tokens_sent` tokens are out."""
        return self.kind == kind and tokens_sent > self.after_tokens


@dataclass(frozen=True)
class _Delivery:
    """Everything one response's delivery needs (streamed or whole)."""

    send: Any
    req: dict[str, Any]
    seq: Any
    entry: SendLogEntry
    chat: bool
    fault: FaultPlan
    disconnected: asyncio.Event


@dataclass
class SendLogEntry:
    """What the server did for one request, on the system-wide monotonic clock (seconds)."""

    request_id: str
    arrival_s: float
    endpoint: str
    stream: bool
    status: int = 200
    fault: str | None = None
    headers_s: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """(send time, tokens in the chunk) for every token-bearing chunk."""
    end_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    finish_reason: str | None = None
    admitted_s: float | None = None
    """When the scheduler admitted the request into the running batch (queueing ends)."""
    engine_first_token_s: float | None = None
    """When the engine step that produced the first token ended (before the HTTP write)."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "chunks": [list(c) for c in self.chunks]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SendLogEntry:
        """The inverse of :meth:`to_json` (JSON turned the chunk tuples into lists)."""
        return cls(**{**data, "chunks": [tuple(c) for c in data["chunks"]]})

    @property
    def first_token_s(self) -> float | None:
        return self.chunks[0][0] if self.chunks else None


class _BadRequest(Exception):
    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type_: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type_


class _CutLogFilter(logging.Filter):
    """Deliberate mid-stream cuts make uvicorn log an error; they are the point, not a bug."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "returned without completing response" not in record.getMessage()


@dataclass
class SimSettings:
    """The subset of SimConfig the HTTP side needs (kept apart so this module has no pydantic model)."""

    served_model_name: str
    max_model_len: int
    default_max_tokens: int
    tokens_per_chunk: int
    seed: int
    strict_model_name: bool = False
    fault_429_rate: float = 0.0
    fault_503_rate: float = 0.0
    fault_cut_rate: float = 0.0
    fault_stall_rate: float = 0.0
    fault_error_rate: float = 0.0
    reasoning_tokens: int = 0
    stall_s: float = 2.0
    slow_first_byte_ms: float = 0.0
    echo_answers: bool = False


class SimApp:
    """ASGI callable. The engine is created lazily inside the server's event loop."""

    def __init__(self, settings: SimSettings, engine_factory: Any):
        self.s = settings
        self._engine_factory = engine_factory
        self.engine: SimEngine | None = None
        self.rng = random.Random(settings.seed)
        self.send_log: OrderedDict[str, SendLogEntry] = OrderedDict()
        self._counter = 0
        self._answers: dict[int, list[str]] = {}
        """Sequence seed -> the answer tokens it replies with (echo_answers)."""
        self.created = int(time.time())
        logging.getLogger("uvicorn.error").addFilter(_CutLogFilter())

    # ---------------------------------------------------------------- ASGI

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    if self.engine is not None:
                        await self.engine.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if self.engine is None:
            self.engine = self._engine_factory()
        path = scope.get("path", "")
        method = scope.get("method", "GET")
        try:
            if path in ("/v1/chat/completions", "/v1/completions"):
                if method != "POST":
                    raise _BadRequest(f"method {method} not allowed; use POST", status=405)
                await self._completion(scope, receive, send, chat=path.endswith("chat/completions"))
            elif path in ("/health", "/healthz") and method == "GET":
                await _send_json(send, 200, {})
            elif path == "/v1/models" and method == "GET":
                await _send_json(send, 200, self._models())
            elif path == "/metrics" and method == "GET":
                body = self.engine.metrics_text(self.s.served_model_name).encode()
                await _send_bytes(send, 200, body, b"text/plain; version=0.0.4; charset=utf-8")
            elif path == "/sim/send_log" and method == "GET":
                await _send_json(send, 200, {k: v.to_json() for k, v in self.send_log.items()})
            else:
                raise _BadRequest(f"no route {method} {path}", status=404, type_="not_found_error")
        except _BadRequest as exc:
            await _send_error(send, exc.status, exc.message, exc.type, exc.param)
        except Exception as exc:  # never crash the server on one request
            logging.getLogger("inferwise.sim").warning("request failed: %r", exc)
            # if the response had already started this fails too and the connection closes
            with contextlib.suppress(Exception):
                await _send_error(
                    send, 500, f"internal error: {type(exc).__name__}", "server_error", None
                )

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.s.served_model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "inferwise-sim",
                    "root": self.s.served_model_name,
                    "max_model_len": self.s.max_model_len,
                }
            ],
        }

    # ---------------------------------------------------------------- completions

    async def _completion(self, scope: dict[str, Any], receive: Any, send: Any, chat: bool) -> None:
        arrival = time.monotonic()
        body = await _read_body(receive)
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        self._counter += 1
        request_id = headers.get("x-request-id") or f"sim-{self._counter}-{uuid.uuid4().hex[:8]}"
        req = self._parse(body, chat)
        assert self.engine is not None
        entry = SendLogEntry(request_id, arrival, "chat" if chat else "completions", req["stream"])
        entry.prompt_tokens = len(req["prompt"])
        self._log(entry)

        fault = self._draw_fault()
        entry.fault = fault
        if fault in ("429", "503"):
            entry.status = int(fault)
            entry.end_s = time.monotonic()
            extra = [(b"retry-after", b"1")] if fault == "429" else []
            message = (
                "rate limit exceeded (simulated)"
                if fault == "429"
                else "service unavailable (simulated)"
            )
            await _send_error(
                send,
                entry.status,
                message,
                "rate_limit_exceeded" if fault == "429" else "server_error",
                None,
                extra,
                request_id,
            )
            return
        if self.s.slow_first_byte_ms > 0:
            await asyncio.sleep(self.s.slow_first_byte_ms / 1000.0)
        answer = req.get("answer")
        seq = self.engine.submit(
            request_id,
            req["prompt"],
            req["max_tokens"],
            req["min_tokens"],
            req["ignore_eos"],
            natural_tokens=len(answer) if answer else None,
        )
        if answer:
            self._answers[seq.seed] = answer
        # a mid-stream fault strikes after a random number of output tokens
        plan = FaultPlan()
        if fault in ("cut", "stall", "error"):
            plan = FaultPlan(fault, self.rng.randint(1, max(req["max_tokens"] - 1, 1)))
        disconnected = asyncio.Event()

        async def watch_disconnect() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    disconnected.set()
                    self.engine.cancel(seq)  # type: ignore[union-attr]
                    seq.ready.set()
                    return

        watcher = asyncio.get_running_loop().create_task(watch_disconnect())
        try:
            deliver = self._stream if req["stream"] else self._whole
            await deliver(_Delivery(send, req, seq, entry, chat, plan, disconnected))
        finally:
            watcher.cancel()
            entry.admitted_s = seq.admitted_s
            entry.engine_first_token_s = seq.first_token_s
            self._answers.pop(seq.seed, None)
            if not seq.finished:
                self.engine.cancel(seq)

    def _token(self, seed: int, i: int) -> str:
        """The i-th output token: the echoed answer's while it lasts, else the sim's words."""
        answer = self._answers.get(seed)
        if answer and i < len(answer):
            return answer[i]
        return output_token(seed, i)

    def _delta(self, seed: int, start: int, k: int) -> dict[str, str]:
        """Chat delta for output tokens start..start+k: the first `reasoning_tokens` are reasoning."""
        r = self.s.reasoning_tokens
        delta: dict[str, str] = {}
        if start < r:
            delta["reasoning_content"] = "".join(
                self._token(seed, j) for j in range(start, min(start + k, r))
            )
        if start + k > r:
            delta["content"] = "".join(
                self._token(seed, j) for j in range(max(start, r), start + k)
            )
        return delta

    def _draw_fault(self) -> str | None:
        r = self.rng.random()
        for name, rate in (
            ("429", self.s.fault_429_rate),
            ("503", self.s.fault_503_rate),
            ("cut", self.s.fault_cut_rate),
            ("stall", self.s.fault_stall_rate),
            ("error", self.s.fault_error_rate),
        ):
            if r < rate:
                return name
            r -= rate
        return None

    def _log(self, entry: SendLogEntry) -> None:
        self.send_log[entry.request_id] = entry
        while len(self.send_log) > SEND_LOG_LIMIT:
            self.send_log.popitem(last=False)

    def _parse(self, body: bytes, chat: bool) -> dict[str, Any]:
        """Validate a request body the way an OpenAI-compatible server does; 400 with the field on error."""
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise _BadRequest("request body must be a JSON object")
        model = data.get("model")
        if model is not None and not isinstance(model, str):
            raise _BadRequest("'model' must be a string", "model")
        if self.s.strict_model_name and model is not None and model != self.s.served_model_name:
            raise _BadRequest(
                f"The model `{model}` does not exist.", "model", 404, "not_found_error"
            )
        prompt = _chat_prompt(data) if chat else _completion_prompt(data)
        if not prompt:
            raise _BadRequest("the prompt is empty", "messages" if chat else "prompt")
        max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
        if max_tokens is None:
            max_tokens = self.s.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest("max_tokens must be an integer >= 1", "max_tokens")
        min_tokens = data.get("min_tokens", 0) or 0
        if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
            raise _BadRequest("min_tokens must be an integer >= 0", "min_tokens")
        if min_tokens > max_tokens:
            raise _BadRequest("min_tokens must be <= max_tokens", "min_tokens")
        if len(prompt) + max_tokens > self.s.max_model_len:
            raise _BadRequest(
                f"This model's maximum context length is {self.s.max_model_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the completion).",
                "max_tokens",
            )
        n = data.get("n", 1)
        if n != 1:
            raise _BadRequest("only n=1 is supported", "n")
        stream = data.get("stream", False)
        if not isinstance(stream, bool):
            raise _BadRequest("'stream' must be a boolean", "stream")
        opts = data.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise _BadRequest("'stream_options' must be an object", "stream_options")
        ignore_eos = data.get("ignore_eos", False)
        return {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "min_tokens": min_tokens,
            "ignore_eos": bool(ignore_eos),
            "stream": stream,
            "include_usage": bool(opts.get("include_usage", False)),
            "continuous_usage": bool(opts.get("continuous_usage_stats", False)),
            "answer": _echo_answer(data) if self.s.echo_answers else None,
        }

    async def _stream(self, d: _Delivery) -> None:
        send, req, seq, entry, chat = d.send, d.req, d.seq, d.entry, d.chat
        sse = _Chunks(entry.request_id, chat, self.s.served_model_name, len(req["prompt"]))
        await self._start_stream(d, sse)
        per_chunk = self.s.tokens_per_chunk
        sent = pending = 0
        stalled = False
        while True:
            if not seq.finished and seq.generated == seq.delivered:
                await seq.ready.wait()
            if d.disconnected.is_set():
                _ended(entry, "client_disconnected")
                return
            pending += seq.take()
            finished = seq.finished
            while pending >= per_chunk or (finished and pending > 0):
                k = min(per_chunk, pending)
                if await self._fault_ends_stream(d, sent, k):
                    return
                if d.fault.kind == "stall" and not stalled and sent >= d.fault.after_tokens:
                    stalled = True
                    await asyncio.sleep(self.s.stall_s)
                    if d.disconnected.is_set():
                        _ended(entry, "client_disconnected")
                        return
                data = sse.chunk(
                    self._choice(d, sent, k),
                    sse.usage(sent + k) if req["continuous_usage"] else None,
                )
                entry.chunks.append((time.monotonic(), k))
                await send({"type": "http.response.body", "body": data, "more_body": True})
                sent += k
                pending -= k
            if finished:
                break
        await self._end_stream(d, sse, sent)

    async def _start_stream(self, d: _Delivery, sse: _Chunks) -> None:
        """The event-stream head, and for chat the role-only first chunk."""
        await d.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", d.entry.request_id.encode("latin-1", "replace")),
                ],
            }
        )
        d.entry.headers_s = time.monotonic()
        if d.chat:
            role = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            await d.send({"type": "http.response.body", "body": sse.chunk(role), "more_body": True})

    async def _fault_ends_stream(self, d: _Delivery, sent: int, k: int) -> bool:
        """A cut (the chunked body left unterminated: the client sees the connection drop) or
        an error event then [DONE], as vLLM sends when generation fails, before token `sent+k`."""
        if d.fault.strikes("cut", sent + k):
            _ended(d.entry, "cut")
            return True
        if not d.fault.strikes("error", sent + k):
            return False
        err = {
            "error": {
                "message": "internal error during generation (simulated)",
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
        }
        body = b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n"
        await d.send({"type": "http.response.body", "body": body, "more_body": False})
        _ended(d.entry, "error", completion_tokens=sent)
        return True

    def _choice(self, d: _Delivery, sent: int, k: int) -> dict[str, Any]:
        if d.chat:
            return {
                "index": 0,
                "delta": self._delta(d.seq.seed, sent, k),
                "logprobs": None,
                "finish_reason": None,
            }
        text = "".join(self._token(d.seq.seed, sent + j) for j in range(k))
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    async def _end_stream(self, d: _Delivery, sse: _Chunks, sent: int) -> None:
        """The finish reason, the usage chunk when asked for, and [DONE]."""
        req = d.req
        reason = "length" if d.seq.finish_reason == "length" else "stop"
        if d.chat:
            last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            last = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        tail = sse.chunk(last, sse.usage(sent) if req["continuous_usage"] else None)
        if req["include_usage"]:
            tail += sse.chunk(None, sse.usage(sent))
        tail += b"data: [DONE]\n\n"
        await d.send({"type": "http.response.body", "body": tail, "more_body": False})
        _ended(d.entry, reason, completion_tokens=sent)

    def _whole_doc(self, d: _Delivery, n: int, reason: str) -> dict[str, Any]:
        """The non-streamed reply object (chat or completions) of `n` output tokens."""
        seq, rid = d.seq, d.entry.request_id
        prompt_tokens = len(d.req["prompt"])
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        }
        if d.chat:
            message = {"role": "assistant", "content": None, **self._delta(seq.seed, 0, n)}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
            kind = ("chatcmpl-", "chat.completion")
        else:
            text = "".join(self._token(seq.seed, j) for j in range(n))
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            kind = ("cmpl-", "text_completion")
        return {
            "id": kind[0] + rid,
            "object": kind[1],
            "created": int(time.time()),
            "model": self.s.served_model_name,
            "choices": [choice],
            "usage": usage,
        }

    async def _whole(self, d: _Delivery) -> None:
        send, seq, entry = d.send, d.seq, d.entry
        while not seq.finished:
            await seq.ready.wait()
            seq.take()
            if d.disconnected.is_set():
                _ended(entry, "client_disconnected")
                return
        if d.fault.kind == "stall":
            await asyncio.sleep(self.s.stall_s)
        if d.fault.kind == "error":
            entry.status = 500
            _ended(entry, "error")
            await _send_error(
                send,
                500,
                "internal error during generation (simulated)",
                "InternalServerError",
                None,
                None,
                entry.request_id,
            )
            return
        n = seq.generated
        reason = "length" if seq.finish_reason == "length" else "stop"
        doc = self._whole_doc(d, n, reason)
        body = json.dumps(doc).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", entry.request_id.encode("latin-1", "replace")),
                ],
            }
        )
        entry.headers_s = time.monotonic()
        if d.fault.kind == "cut":
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            _ended(entry, "cut")
            return
        entry.chunks.append((time.monotonic(), n))
        await send({"type": "http.response.body", "body": body, "more_body": False})
        _ended(entry, reason, completion_tokens=n)


@dataclass(frozen=True)
class _Chunks:
    """Builds one stream's SSE chunks (OpenAI chunk objects) and its usage blocks."""

    request_id: str
    chat: bool
    model: str
    prompt_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, choice: dict[str, Any] | None, usage: dict[str, int] | None = None) -> bytes:
        doc: dict[str, Any] = {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice] if choice is not None else [],
        }
        if usage is not None:
            doc["usage"] = usage
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def usage(self, done: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
        }


def _ended(entry: SendLogEntry, reason: str, completion_tokens: int | None = None) -> None:
    """Log how and when a response ended."""
    entry.end_s = time.monotonic()
    entry.finish_reason = reason
    if completion_tokens is not None:
        entry.completion_tokens = completion_tokens


_ANSWER_MARK_RE = re.compile(r"\[\[answer:\s?(.*?)\]\]", re.S)


def _echo_answer(data: dict[str, Any]) -> list[str] | None:
    """echo_answers: the text of the request's last ``[[answer: ...]]`` marker, as output
    tokens (each a word with its leading space), or None when the prompt has none. The
    test hook that lets a grader be checked end to end against known answers."""
    texts: list[str] = []
    if isinstance(data.get("prompt"), str):
        texts.append(data["prompt"])
    for m in data.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            texts.append(m["content"])
    found = _ANSWER_MARK_RE.findall("\n".join(texts))
    if not found:
        return None
    return re.findall(r"\s*\S+", found[-1]) or None


def _chat_prompt(data: dict[str, Any]) -> list[str]:
    """The prompt tokens of a chat request's messages (text parts only)."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list", "messages")
    parsed: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a 'role'", "messages")
        parsed.append((m["role"], _message_text(m.get("content", ""), i)))
    return chat_prompt_tokens(parsed)


def _message_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise _BadRequest(
                    f"messages[{i}].content: only text parts are supported", "messages"
                )
        return "\n".join(parts)
    if not isinstance(content, str):
        raise _BadRequest(
            f"messages[{i}].content must be a string or a list of text parts", "messages"
        )
    return content


def _completion_prompt(data: dict[str, Any]) -> list[str]:
    """The prompt tokens of a completions request: a string, one string in a list, or ids."""
    p = data.get("prompt")
    if isinstance(p, list) and len(p) == 1:
        p = p[0]
    if isinstance(p, str):
        return tokenize(p)
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return [str(t) for t in p]
    raise _BadRequest(
        "'prompt' must be a string, a list with one string, or a list of token ids", "prompt"
    )


async def _read_body(receive: Any) -> bytes:
    parts = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > 16 * 1024 * 1024:
            raise _BadRequest("request body larger than 16 MiB", status=413)
        parts.append(chunk)
        if not msg.get("more_body", False):
            break
    return b"".join(parts)


async def _send_bytes(
    send: Any,
    status: int,
    body: bytes,
    content_type: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(
    send: Any, status: int, doc: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send_bytes(send, status, json.dumps(doc).encode(), b"application/json", extra)


async def _send_error(
    send: Any,
    status: int,
    message: str,
    type_: str,
    param: str | None,
    extra: list[tuple[bytes, bytes]] | None = None,
    request_id: str | None = None,
) -> None:
    headers = list(extra or [])
    if request_id:
        headers.append((b"x-request-id", request_id.encode("latin-1", "replace")))
    doc = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    await _send_json(send, status, doc, headers)
