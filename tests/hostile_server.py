"""An OpenAI-compatible server on 127.0.0.1 that misbehaves on purpose, for the probe's
hardening tests.

It answers discovery (/v1/models), the short negotiation and calibration
requests and /props like a real engine, so a probe reaches its measured load;
the measured streamed requests (max_tokens above 2) and /metrics then get the
behaviour the test asked for. It runs on its own thread and event loop, and
stops when the test leaves the ``with`` block.
"""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from typing import Any

BEHAVIOURS = (
    "normal",  # a correct stream of max_tokens tokens
    "flood",  # token events as fast as the socket takes them, never ending
    "long_line",  # one endless data line without a newline
    "slow_drip",  # one token event every 0.5 s, for ever (never stalls, never ends)
    "done_first",  # [DONE] first, then tokens
    "echo_auth",  # the Authorization header echoed back as the output text
    "huge_usage",  # usage counts of 10**30 and -5
)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _token(text: str = "tok") -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}}]})


def gzip_bomb(decompressed_mib: int) -> bytes:
    """`decompressed_mib` MiB of zeros, gzip-compressed (about 1 KB per MiB)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"0" * (1 << 20)
    return b"".join(comp.compress(block) for _ in range(decompressed_mib)) + comp.flush()


class HostileServer:
    def __init__(self, behaviour: str = "normal", metrics_bomb_mib: int = 0) -> None:
        assert behaviour in BEHAVIOURS
        self.behaviour = behaviour
        self.bomb = gzip_bomb(metrics_bomb_mib) if metrics_bomb_mib else None
        self.metrics_requests = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = json.loads(await reader.readexactly(length)) if length else {}
                await self._route(method, path, headers, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, headers: dict, body: dict, w: Any) -> None:
        if path.endswith("/models"):
            return await self._json(w, {"data": [{"id": "hostile"}]})
        if path == "/props":
            return await self._json(w, {}, status=404)
        if path == "/metrics":
            self.metrics_requests += 1
            if self.bomb is None:
                return await self._plain(w, b"vllm:num_requests_running 1\n")
            w.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Encoding: gzip\r\n"
                + f"Content-Length: {len(self.bomb)}\r\n\r\n".encode()
                + self.bomb
            )
            return await w.drain()
        max_tokens = int(body.get("max_tokens") or 16)
        if not body.get("stream"):
            words = len(str(body.get("messages", body.get("prompt", ""))).split())
            return await self._json(
                w,
                {
                    "choices": [
                        {"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": words + 5, "completion_tokens": 1},
                },
            )
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        behaviour = self.behaviour if max_tokens > 2 else "normal"
        await getattr(self, f"_{behaviour}")(w, max_tokens, headers)

    async def _json(self, w: Any, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        w.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await w.drain()

    async def _plain(self, w: Any, data: bytes) -> None:
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await w.drain()

    async def _end(self, w: Any, prompt: int, completion: Any) -> None:
        usage = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
        w.write(_chunk(_event(usage)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()

    async def _normal(self, w: Any, n: int, headers: dict) -> None:
        w.write(_chunk(b"".join(_token() for _ in range(n))))
        await self._end(w, 10, n)

    async def _flood(self, w: Any, n: int, headers: dict) -> None:
        block = _chunk(_token() * 256)
        while True:
            w.write(block)
            await w.drain()

    async def _long_line(self, w: Any, n: int, headers: dict) -> None:
        w.write(_chunk(b'data: {"choices": [{"delta": {"content": "'))
        block = _chunk(b"x" * 65536)
        while True:
            w.write(block)
            await w.drain()

    async def _slow_drip(self, w: Any, n: int, headers: dict) -> None:
        while True:
            w.write(_chunk(_token()))
            await w.drain()
            await asyncio.sleep(0.5)

    async def _done_first(self, w: Any, n: int, headers: dict) -> None:
        w.write(_chunk(b"data: [DONE]\n\n" + b"".join(_token() for _ in range(n))))
        await self._end(w, 10, n)

    async def _echo_auth(self, w: Any, n: int, headers: dict) -> None:
        w.write(_chunk(_token("echo: " + headers.get("authorization", ""))))
        w.write(_chunk(b"".join(_token() for _ in range(n - 1))))
        await self._end(w, 10, n)

    async def _huge_usage(self, w: Any, n: int, headers: dict) -> None:
        w.write(_chunk(b"".join(_token() for _ in range(n))))
        await self._end(w, -5, 10**30)
