"""Every error class of one request, against a local reference server with faults, a closed port
and sockets that never answer; plus timing rules and API-key redaction on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from inferwise.probes.client import Pool, Target, Timeouts, exchange, request_body, to_record

ROOT = Path(__file__).resolve().parents[1]


from bench.refserver import RefServer  # noqa: E402

FAST = Timeouts(connect_s=0.3, read_s=0.3, stall_s=0.3, total_s=5.0)


def one(
    url: str,
    *,
    fault: str | None = None,
    timeouts: Timeouts = FAST,
    stream: bool = True,
    max_tokens: int = 8,
    api_key: str | None = None,
    endpoint: str = "chat",
    connect_host: str | None = None,
):
    async def go():
        pool = Pool(Target.from_url(url, connect_host=connect_host))
        path, body = request_body(
            endpoint,
            "m",
            "hello there",
            max_tokens,
            stream=stream,
            ignore_eos=True,
            extra={"x_fault": fault} if fault else None,
        )
        out = await exchange(pool, path, body, api_key=api_key, timeouts=timeouts)
        pool.close()
        return to_record(
            out, index=0, origin=out.start_t, stream=stream, secrets=[api_key] if api_key else []
        )

    return asyncio.run(go())


@pytest.fixture(scope="module")
def server():
    with RefServer(
        ttft_lo_ms=30, ttft_hi_ms=30, itl_ms=5, slow_first_byte_ms=1000, retry_after_s=2
    ) as s:
        yield s


def test_good_stream_timings(server) -> None:
    r = one(server.base_url, max_tokens=8)
    assert r.ok, r.error_message
    assert r.output_tokens == 8 and not r.tokens_approximate
    assert r.input_tokens == 7  # the reference server counts words + 5
    # TTFT is the first token, not the role-only chunk that was sent at once
    assert r.first_byte_s is not None and r.ttft_ms >= 29
    assert r.first_token_s >= r.first_byte_s
    assert 4 < (r.tpot_ms or 0) < 20
    assert len(r.chunk_times_s) == 8


def test_completions_endpoint_and_non_streaming(server) -> None:
    r = one(server.base_url, endpoint="completions", max_tokens=4)
    assert r.ok and r.output_tokens == 4
    n = one(server.base_url, stream=False, max_tokens=4)
    assert n.ok and n.ttft_ms == pytest.approx(n.e2e_ms)
    assert n.output_tokens == 4


@pytest.mark.parametrize(
    ("fault", "error_class"),
    [
        ("http_429", "http_429"),
        ("http_503", "http_5xx"),
        ("cut", "stream_cut"),
        ("stall", "stalled"),
        ("malformed", "malformed_sse"),
        ("error_event", "server_error_event"),
        ("slow_first_byte", "read_timeout"),
    ],
)
def test_fault_classes(server, fault: str, error_class: str) -> None:
    r = one(server.base_url, fault=fault)
    assert not r.ok
    assert r.error_class == error_class, r.error_message
    if fault == "http_429":
        assert r.http_status == 429 and "Retry-After 2" in (r.error_message or "")
    if fault in ("cut", "stall", "error_event"):
        # tokens before the fault are kept for partial timing
        assert r.first_token_s is not None


def test_http_404_is_4xx(server) -> None:
    async def go():
        pool = Pool(Target.from_url(server.base_url))
        out = await exchange(pool, "/nowhere", b"{}", api_key=None, timeouts=FAST)
        return to_record(out, index=0, origin=0.0, stream=True)

    r = asyncio.run(go())
    assert r.error_class == "http_4xx" and r.http_status == 404


def test_bad_utf8_in_content_still_counts(server) -> None:
    r = one(server.base_url, fault="bad_utf8", max_tokens=4)
    assert r.ok and len(r.chunk_times_s) == 4


def test_total_timeout(server) -> None:
    r = one(server.base_url, max_tokens=200, timeouts=Timeouts(0.3, 0.5, 0.5, 0.3))
    assert r.error_class == "total_timeout"


def test_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = one(f"http://127.0.0.1:{port}")
    assert r.error_class == "connect_refused" and r.first_byte_s is None


def test_dns_failure_is_classified() -> None:
    r = one("http://nonexistent.invalid:8000", connect_host="nonexistent.invalid")
    assert r.error_class == "dns"


def test_tls_failure_is_classified() -> None:
    """A plain-HTTP server answering a TLS hello: the handshake fails, class `tls`."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        r = one(f"https://127.0.0.1:{port}", timeouts=Timeouts(2.0, 2.0, 2.0, 3.0))
        assert r.error_class == "tls", r.error_message
    finally:
        listener.close()


def test_connect_timeout_when_the_backlog_is_full() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    try:
        r = one(f"http://127.0.0.1:{port}", timeouts=Timeouts(0.2, 0.2, 0.2, 1.0))
        assert r.error_class == "connect_timeout"
    finally:
        filler.close()
        listener.close()


def test_read_timeout_when_the_server_never_answers() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        r = one(f"http://127.0.0.1:{port}", timeouts=Timeouts(0.5, 0.2, 0.2, 1.0))
        assert r.error_class == "read_timeout"
    finally:
        listener.close()


def test_api_key_sent_but_redacted_from_errors(server) -> None:
    key = "sk-test-SECRET-1234567890"
    r = one(server.base_url, fault="http_400_echo", api_key=key)
    assert r.error_class == "http_4xx"
    assert key not in (r.error_message or "") and "***" in (r.error_message or "")
    assert key not in r.model_dump_json()


def test_keep_alive_reuses_one_connection(server) -> None:
    async def go():
        pool = Pool(Target.from_url(server.base_url))
        recs = []
        for _ in range(3):
            path, body = request_body("chat", "m", "hi", 2, stream=True, ignore_eos=True)
            out = await exchange(pool, path, body, api_key=None, timeouts=FAST)
            recs.append(to_record(out, index=0, origin=0.0, stream=True))
        pool.close()
        return pool.opened, recs

    opened, recs = asyncio.run(go())
    assert all(r.ok for r in recs)
    assert opened == 1


def test_cancelling_a_request_closes_its_connection(server) -> None:
    async def go():
        pool = Pool(Target.from_url(server.base_url))
        path, body = request_body("chat", "m", "hi", 100, stream=True, ignore_eos=True)
        task = asyncio.create_task(exchange(pool, path, body, api_key=None, timeouts=FAST))
        await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return pool.idle

    assert asyncio.run(go()) == []
