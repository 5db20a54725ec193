"""Bounds that hold per call, not per run: the probe's caps across a sweep, the MCP
server under a burst of slow calls, linear-time parsing, the run store opened by many
creators at once, and the /metrics scrape pinned to the approved address."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.runner import ProbeRequest, _check_bounds
from inferwise.probes.sse import SSESplitter, analyze_stream


def test_the_request_cap_counts_every_sweep_point_and_warm_up() -> None:
    req = ProbeRequest(url="http://127.0.0.1:1", requests=1000, sweep=[8, 8, 8])
    with pytest.raises(InputError, match="3 sweep points = 3000 requests exceeds the cap of 1000"):
        _check_bounds(req)
    ok = ProbeRequest(url="http://127.0.0.1:1", requests=300, warmup_requests=10, sweep=[1, 2, 4])
    assert _check_bounds(ok) == (300, None)
    # the default request count shrinks to fit a sweep under the cap
    default = ProbeRequest(url="http://127.0.0.1:1", sweep=list(range(1, 21)), max_requests=1000)
    assert _check_bounds(default) == (50, None)


def test_duration_cap_covers_the_whole_sweep() -> None:
    req = ProbeRequest(url="http://127.0.0.1:1", duration_s=300, sweep=[1, 2, 4])
    with pytest.raises(InputError, match="x 3 sweep points exceeds the cap of 600 s"):
        _check_bounds(req)


def test_prompt_memory_is_bounded_per_call() -> None:
    with pytest.raises(Exception, match="input_tokens"):
        ProbeRequest(url="http://127.0.0.1:1", input_tokens=400_000_000)
    req = ProbeRequest(url="http://127.0.0.1:1", input_tokens=1_000_000, concurrency=64)
    with pytest.raises(InputError, match="prompt tokens in flight"):
        _check_bounds(req)


def test_an_open_loop_with_long_prompts_holds_fewer_streams() -> None:
    from inferwise.probes.runner import _in_flight_for_memory

    req = ProbeRequest(url="http://127.0.0.1:1", input_tokens=131072, request_rate=5)
    capped, note = _in_flight_for_memory(req)
    assert capped.max_concurrency == (1 << 24) // 131072 == 128
    assert "capped at 128" in note


@pytest.mark.parametrize(
    "field,value",
    [
        ("request_rate", 1e-320),
        ("request_rate", 1e9),
        ("burstiness", 1e-310),
        ("slo", {"ttft_ms": 1e308}),
        ("seed", -1),
        ("sweep", list(range(1, 100))),
    ],
)
def test_meaningless_probe_numbers_are_refused(field, value) -> None:
    with pytest.raises(Exception, match=field):
        ProbeRequest(url="http://127.0.0.1:1", **{field: value})


def test_the_mcp_door_applies_the_operators_caps(monkeypatch) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    from inferwise.server.mcp_server import make_tool_function
    from inferwise.server.registry import BY_TOOL

    monkeypatch.setenv("INFERWISE_MCP_MAX_REQUESTS", "50")
    tool = make_tool_function(BY_TOOL["probe_endpoint"])
    with pytest.raises(ToolError, match="exceeds the cap of 50 per call"):
        asyncio.run(tool(url="http://127.0.0.1:1", requests=20, sweep=[1, 2, 4]))


def test_splitting_one_endless_line_is_linear() -> None:
    """100 MB without a newline froze the loop for ~45 s when every read re-scanned the
    buffer; 16 MB in 4 KB reads must take well under a second."""
    piece = b"x" * 4096
    sp = SSESplitter()
    t0 = time.perf_counter()
    for _ in range(4096):
        assert sp.feed(piece) == []
    events = sp.feed(b"\n\ndata: [DONE]\n\n")
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    assert [e.data for e in events] == [b"[DONE]"]  # the long block was not an event


def test_events_after_done_are_ignored() -> None:
    token = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    a = analyze_stream([(0.0, token + b"data: [DONE]\n\n" + token * 5)])
    assert a.saw_done and a.output_tokens == 1 and a.after_done == 5


def test_many_processes_creating_one_new_run_store_all_succeed(tmp_path) -> None:
    db = tmp_path / "new.db"
    code = (
        "from inferwise.probes.store import RunStore\n"
        f"s = RunStore({str(db)!r}); s.create_run(labels={{}}, config={{}}, meta={{}}); s.close()\n"
    )

    def one(_: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    failed = [r.stderr[-200:] for r in results if r.returncode]
    assert not failed
    from inferwise.probes.store import RunStore

    with RunStore(db, create=False) as store:
        assert len(store.list_runs(limit=100)) == 16


def test_the_metrics_scrape_connects_to_the_approved_address_and_names_the_host(
    monkeypatch,
) -> None:
    """Over https the scraper must not resolve the name again (the policy promised one
    checked lookup): it connects to the address and sends the name as SNI and Host."""
    from inferwise.probes import prom, session
    from inferwise.probes.client import Pool, Target

    seen = {}

    async def fake_loop(client, url, interval, sink, stop, **kw):
        seen.update(url=url, extensions=kw.get("extensions"), host=client.headers["host"])
        return prom.ScrapeReport(stopped_early=True)

    monkeypatch.setattr(prom, "scrape_loop", fake_loop)
    target = Target.from_url("https://models.example.com:8443/v1", connect_host="203.0.113.7")
    ctx = session.ProbeContext(
        req=ProbeRequest(url="https://models.example.com:8443"),
        pool=Pool(target),
        api_key=None,
        secrets=[],
        timeouts=None,
        workload=None,
        model="m",
        store=None,
    )
    asyncio.run(session.scrape_metrics(ctx, "run", 0.0, asyncio.Event(), {}, []))
    assert seen["url"] == "https://203.0.113.7:8443/metrics"
    assert seen["extensions"] == {"sni_hostname": "models.example.com"}
    assert seen["host"] == "models.example.com:8443"


@pytest.mark.slow
def test_the_mcp_server_answers_while_forty_slow_calls_are_in_flight(tmp_path) -> None:
    """40 predictions that run to the compute budget must not starve a memory fit."""
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    slow = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "gpu": "h100",
        "max_model_len": 131072,
        "input_tokens": 120000,
        "output_tokens": 10000,
        "num_requests": 4000,
        "concurrency": 4000,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 16,  # vLLM needs max_num_batched_tokens >= max_num_seqs
    }
    fit = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100"}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "inferwise.server", "mcp"],
        env={"INFERWISE_DB": str(tmp_path / "r.db"), "INFERWISE_COMPUTE_BUDGET_S": "1"},
    )

    async def go() -> tuple[float, list]:
        async with Client(params) as client:
            await client.call_tool("estimate_memory_fit", fit)  # the tool is built
            bad = [
                asyncio.create_task(client.call_tool("predict_performance", slow))
                for _ in range(40)
            ]
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            result = await client.call_tool("estimate_memory_fit", fit)
            took = time.monotonic() - t0
            assert not result.is_error
            done = await asyncio.gather(*bad)
            return took, done

    took, done = asyncio.run(asyncio.wait_for(go(), 120))
    print(f"memory fit answered in {took * 1000:.0f} ms with 40 slow calls in flight")
    assert took < 1.0, took
    assert all(r.is_error and "time budget" in r.content[0].text for r in done)
