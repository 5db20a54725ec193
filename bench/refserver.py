"""A reference OpenAI-compatible streaming server with a known schedule that logs its own send times.

It is the ground truth for ``bench/probe_precision.py`` and the fault
injector for the probe tests. Written on asyncio's transport layer so that the
server itself adds as little as possible between "the schedule says send" and
the bytes reaching the socket, and so that every send time it logs is taken
right before ``transport.write``.

Schedule per request: TTFT drawn uniformly from [ttft_lo_ms, ttft_hi_ms] by a
hash of the prompt (so it is reproducible and independent of arrival order),
then one chunk every itl_ms, each carrying `tokens_per_chunk` tokens, on an
absolute timeline from the moment the request was read (a late wake-up does
not shift the following chunks). A role-only chunk goes out at once, before
the first token, as vLLM does.

Faults (``fault`` in the server config, or per request via the JSON field
``x_fault``): http_429, http_503, cut (close mid-stream), stall (stop
sending, keep the connection), slow_first_byte (headers after a delay),
malformed (non-JSON data), error_event (an error object mid-stream),
bad_utf8 (content with an invalid byte).

Log: ``GET /_log`` returns every request's receive time, send times and
schedule (monotonic clock seconds, comparable with the client's on Linux).

Run: ``python bench/refserver.py --port 8123 [--cpu 1] [--ttft-lo-ms 20 ...]``
or in-process with :class:`RefServer` (a background thread).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Config:
    ttft_lo_ms: float = 20.0
    ttft_hi_ms: float = 20.0
    itl_ms: float = 10.0
    tokens_per_chunk: int = 1
    default_max_tokens: int = 16
    fault: str | None = None
    fault_share: float = 1.0
    fault_after_tokens: int = 3
    slow_first_byte_ms: float = 300.0
    retry_after_s: float = 1.0
    usage: bool = True
    role_chunk: bool = True
    reject_fields: tuple[str, ...] = ()
    """Answer 400 to requests carrying these fields (top level or in stream_options), as strict APIs do."""


@dataclass
class Entry:
    key: str
    recv_t: float
    ttft_ms: float
    itl_ms: float
    tokens: int
    send_t: list[float] = field(default_factory=list)
    send_tokens: list[int] = field(default_factory=list)
    fault: str | None = None


class _Handler(asyncio.Protocol):
    def __init__(self, server: RefServerCore) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.last_head = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        for t in self.tasks:
            t.cancel()

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            self.last_head = head
            lines = head.split("\r\n")
            method, path = lines[0].split()[:2]
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.busy = True
            task = asyncio.get_running_loop().create_task(
                self.server.handle(self, method, path, body, t)
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def done(self) -> None:
        self.busy = False
        if self.buf:
            self.data_received(b"")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class RefServerCore:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.log: list[Entry] = []
        self.counter = 0

    def _response(
        self, status: int, body: bytes, ctype: str = "application/json", extra: str = ""
    ) -> bytes:
        reason = {
            200: "OK",
            404: "Not Found",
            429: "Too Many Requests",
            503: "Service Unavailable",
        }.get(status, "X")
        return (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        ).encode() + body

    async def handle(self, h: _Handler, method: str, path: str, body: bytes, recv_t: float) -> None:
        try:
            await self._handle(h, method, path, body, recv_t)
        finally:
            h.done()

    async def _handle(
        self, h: _Handler, method: str, path: str, body: bytes, recv_t: float
    ) -> None:
        cfg = self.config
        if method == "GET" and path.endswith("/models"):
            h.send(
                self._response(
                    200, json.dumps({"object": "list", "data": [{"id": "ref-model"}]}).encode()
                )
            )
            return
        if method == "GET" and path == "/_log":
            doc = [e.__dict__ for e in self.log]
            h.send(self._response(200, json.dumps(doc).encode()))
            return
        if method == "GET" and path == "/_echo_auth":
            h.send(self._response(200, b"{}"))
            return
        if method != "POST" or not path.endswith(("/chat/completions", "/completions")):
            h.send(self._response(404, b'{"error": {"message": "not found"}}'))
            return
        req = json.loads(body)
        unknown = [
            f for f in cfg.reject_fields if f in req or f in (req.get("stream_options") or {})
        ]
        if unknown:
            msg = json.dumps(
                {"error": {"message": f"Unrecognized request argument supplied: {unknown[0]}"}}
            )
            h.send(self._response(400, msg.encode()))
            return
        chat = path.endswith("/chat/completions")
        prompt = req["messages"][-1]["content"] if chat else req["prompt"]
        key = hashlib.sha1(prompt.encode()).hexdigest()[:16]
        rng = random.Random(key)
        ttft = rng.uniform(cfg.ttft_lo_ms, cfg.ttft_hi_ms)
        n = int(req.get("max_tokens") or cfg.default_max_tokens)
        fault = req.get("x_fault", cfg.fault)
        self.counter += 1
        if (
            fault
            and cfg.fault_share < 1.0
            and random.Random(self.counter).random() >= cfg.fault_share
        ):
            fault = None
        entry = Entry(key, recv_t, ttft, cfg.itl_ms, n, fault=fault)
        self.log.append(entry)
        if fault == "http_429":
            h.send(
                self._response(
                    429,
                    b'{"error": {"message": "rate limited"}}',
                    extra=f"Retry-After: {cfg.retry_after_s:g}\r\n",
                )
            )
            return
        if fault == "http_503":
            h.send(self._response(503, b'{"error": {"message": "overloaded"}}'))
            return
        if fault == "http_400_echo":
            # a careless server that echoes the request headers back in its error
            h.send(
                self._response(
                    400, json.dumps({"error": {"message": f"bad request: {h.last_head}"}}).encode()
                )
            )
            return
        loop = asyncio.get_running_loop()
        if fault == "slow_first_byte":
            await asyncio.sleep(cfg.slow_first_byte_ms / 1000)
        rid = f"cmpl-{self.counter}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        if not req.get("stream"):
            await asyncio.sleep(
                max(0.0, recv_t + (ttft + cfg.itl_ms * (n - 1)) / 1000 - loop.time())
            )
            text = " tok" * n
            choice = {"index": 0, "finish_reason": "length"}
            choice.update(
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            doc = {
                "id": rid,
                "object": obj,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt.split()) + 5,
                    "completion_tokens": n,
                    "total_tokens": 0,
                },
            }
            entry.send_t.append(time.monotonic())
            h.send(self._response(200, json.dumps(doc).encode()))
            return
        h.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n"
        )

        def event(choice: dict[str, Any] | None, usage: dict[str, int] | None = None) -> bytes:
            doc: dict[str, Any] = {"id": rid, "object": obj, "choices": [choice] if choice else []}
            if usage is not None:
                doc["usage"] = usage
            return _chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

        if cfg.role_chunk and chat:
            h.send(event({"index": 0, "delta": {"role": "assistant", "content": ""}}))
        sent = 0
        k = 0
        while sent < n:
            due = recv_t + (ttft + cfg.itl_ms * k) / 1000
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if (
                fault in ("cut", "stall", "error_event", "malformed")
                and sent >= cfg.fault_after_tokens
            ):
                if fault == "cut":
                    assert h.transport is not None
                    h.transport.close()
                elif fault == "stall":
                    await asyncio.sleep(3600)
                elif fault == "error_event":
                    h.send(_chunk(b'data: {"error": {"message": "engine died", "code": 500}}\n\n'))
                    h.send(b"0\r\n\r\n")
                else:
                    h.send(_chunk(b"data: this is not json\n\n"))
                    h.send(b"0\r\n\r\n")
                return
            m = min(cfg.tokens_per_chunk, n - sent)
            piece = " tok" * m
            if fault == "bad_utf8" and sent == 0:
                raw = event(
                    {"index": 0, "delta": {"content": "@@"}} if chat else {"index": 0, "text": "@@"}
                )
                raw = raw.replace(b"@@", b"\xff\xfe")
                h.send(raw)
            else:
                delta = (
                    {"index": 0, "delta": {"content": piece}}
                    if chat
                    else {"index": 0, "text": piece}
                )
                h.send(event(delta))
            entry.send_t.append(time.monotonic())
            entry.send_tokens.append(m)
            sent += m
            k += 1
        fin = (
            {"index": 0, "delta": {}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "length"}
        )
        h.send(event(fin))
        if cfg.usage:
            h.send(
                event(
                    None,
                    {
                        "prompt_tokens": len(prompt.split()) + 5,
                        "completion_tokens": n,
                        "total_tokens": 0,
                    },
                )
            )
        h.send(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


class RefServer:
    """In-process server on a free 127.0.0.1 port (background thread, its own event loop)."""

    def __init__(self, config: Config | None = None, **overrides: Any) -> None:
        self.config = config or Config(**overrides)
        self.core = RefServerCore(self.config)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RefServer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        server = loop.run_until_complete(
            loop.create_server(lambda: _Handler(self.core), "127.0.0.1", 0)
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    ap.add_argument("--ttft-lo-ms", type=float, default=20.0)
    ap.add_argument("--ttft-hi-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    core = RefServerCore(
        Config(
            ttft_lo_ms=args.ttft_lo_ms,
            ttft_hi_ms=args.ttft_hi_ms,
            itl_ms=args.itl_ms,
            tokens_per_chunk=args.tokens_per_chunk,
        )
    )

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Handler(core), "127.0.0.1", args.port, backlog=1024
        )
        print(f"ready {args.port}", flush=True)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
