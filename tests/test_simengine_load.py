"""Timing follows the schedule; load produces queueing, batch growth, preemption and faults as configured."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from inferwise.probes.prom import normalize, parse_prometheus
from inferwise.probes.sim import SimServer
from inferwise.probes.sim_engine import FixedTiming, SimEngine


def test_ttft_and_itl_follow_the_schedule_at_concurrency_1():
    with SimServer(ttft_ms=40, itl_ms=8) as sim:
        with httpx.Client(base_url=sim.base_url, timeout=10) as client:
            for i in range(9):
                with client.stream(
                    "POST",
                    "/v1/completions",
                    json={"prompt": "hello there", "max_tokens": 10, "stream": True},
                    headers={"X-Request-Id": f"c1-{i}"},
                ) as r:
                    for _ in r.iter_bytes():
                        pass
        log = sim.send_log
    ttfts = [(log[f"c1-{i}"].chunks[0][0] - log[f"c1-{i}"].arrival_s) * 1000 for i in range(9)]
    itls = [
        (b[0] - a[0]) * 1000
        for i in range(9)
        for a, b in zip(log[f"c1-{i}"].chunks, log[f"c1-{i}"].chunks[1:], strict=False)
    ]
    assert 40 <= statistics.median(ttfts) <= 44, ttfts
    assert 7.5 <= statistics.median(itls) <= 9.5, itls
    assert 7.0 <= statistics.mean(itls) <= 9.5


async def _stream(client, rid, max_tokens=20):
    async with client.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "same prompt", "max_tokens": max_tokens, "stream": True},
        headers={"X-Request-Id": rid},
    ) as r:
        async for _ in r.aiter_bytes():
            pass


def test_requests_beyond_max_num_seqs_queue_and_metrics_show_it():
    async def main(sim):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=20) as client:
            tasks = [asyncio.create_task(_stream(client, f"q-{i}", 40)) for i in range(4)]
            deadline = time.monotonic() + 0.3
            while True:  # wait until all four arrived (a loaded machine may take a moment)
                await asyncio.sleep(0.02)
                concepts = normalize(parse_prometheus((await client.get("/metrics")).text))
                if concepts["requests_waiting"] == 2 or time.monotonic() > deadline:
                    break
            await asyncio.gather(*tasks)
            return concepts

    with SimServer(ttft_ms=20, itl_ms=10, itl_per_seq_ms=0, max_num_seqs=2) as sim:
        concepts = asyncio.run(main(sim))
        log = sim.send_log
    assert concepts["requests_running"] == 2 and concepts["requests_waiting"] == 2
    assert 0 < concepts["kv_cache_usage"] < 1
    ttft = sorted((log[f"q-{i}"].chunks[0][0] - log[f"q-{i}"].arrival_s) * 1000 for i in range(4))
    # the first two start at once; the others wait for a slot (about one whole request: 20 + 39*10 ms)
    assert ttft[1] < 100
    assert ttft[2] > 350 and ttft[3] > 350


def test_itl_grows_with_the_batch():
    async def main(sim, n):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=20) as client:
            await asyncio.gather(*[_stream(client, f"b{n}-{i}", 15) for i in range(n)])

    with SimServer(ttft_ms=5, itl_ms=5, itl_per_seq_ms=1.0, max_num_seqs=16) as sim:
        asyncio.run(main(sim, 1))
        asyncio.run(main(sim, 8))
        log = sim.send_log

    def median_itl(prefix):
        gaps = [
            (b[0] - a[0]) * 1000
            for rid, e in log.items()
            if rid.startswith(prefix)
            for a, b in zip(e.chunks[1:], e.chunks[2:], strict=False)
        ]
        return statistics.median(gaps)

    assert median_itl("b1-") < 7
    assert median_itl("b8-") > 10  # 5 + 7 * 1 ms per extra running sequence


def test_kv_pressure_preempts_and_recomputes():
    async def main():
        engine = SimEngine(
            FixedTiming(1, 1), max_num_seqs=8, kv_capacity_tokens=64, enable_prefix_caching=False
        )
        seqs = [engine.submit(f"p{i}", ["t"] * 20, 20, 0, True) for i in range(3)]
        while not all(s.finished for s in seqs):
            await asyncio.sleep(0.01)
        await engine.stop()
        return engine, seqs

    engine, seqs = asyncio.run(main())
    assert engine.stats.preemptions >= 1
    assert all(s.generated == 20 and s.finish_reason == "length" for s in seqs)
    assert engine.kv_used == 0


def test_prefix_cache_counts_shared_prefixes():
    async def main():
        engine = SimEngine(FixedTiming(1, 1), max_num_seqs=4, kv_capacity_tokens=10_000)
        shared = [f"w{i}" for i in range(64)]
        a = engine.submit("a", shared + ["x"] * 10, 2, 0, True)
        while not a.finished:
            await asyncio.sleep(0.005)
        b = engine.submit("b", shared + ["y"] * 10, 2, 0, True)
        while not b.finished:
            await asyncio.sleep(0.005)
        await engine.stop()
        return engine

    engine = asyncio.run(main())
    assert engine.stats.prefix_cache_hits == 64
    assert engine.stats.prefix_cache_queries == 148


def test_client_disconnect_frees_the_slot():
    async def main(sim):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=20) as client:
            async with client.stream(
                "POST", "/v1/completions", json={"prompt": "x", "max_tokens": 1000, "stream": True}
            ) as r:
                async for _ in r.aiter_bytes():
                    break
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            await _stream(client, "after", 3)
            return (time.monotonic() - t0) * 1000

    with SimServer(ttft_ms=5, itl_ms=5, max_num_seqs=1) as sim:
        elapsed = asyncio.run(main(sim))
        assert sim.app.engine.stats.finished["abort"] == 1
    assert elapsed < 500


def test_each_fault_appears_at_its_share():
    n = 240

    async def one(client, i):
        try:
            async with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 6,
                    "stream": True,
                },
                headers={"X-Request-Id": f"f-{i}"},
            ) as r:
                if r.status_code != 200:
                    return str(r.status_code)
                last = time.monotonic()
                gap = 0.0
                async for _ in r.aiter_bytes():
                    now = time.monotonic()
                    gap = max(gap, now - last)
                    last = now
                return "stall" if gap >= 0.6 else "ok"
        except httpx.TransportError:  # the connection dropped mid-body
            return "cut"

    async def main(sim):
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=20, limits=limits) as client:
            sem = asyncio.Semaphore(32)

            async def guarded(i):
                async with sem:
                    return await one(client, i)

            return await asyncio.gather(*[guarded(i) for i in range(n)])

    with SimServer(
        ttft_ms=1,
        itl_ms=1,
        itl_per_seq_ms=0,
        max_num_seqs=64,
        fault_429_rate=0.1,
        fault_503_rate=0.1,
        fault_cut_rate=0.1,
        fault_stall_rate=0.1,
        stall_s=1.0,
        seed=7,
    ) as sim:
        outcomes = asyncio.run(main(sim))
        truth = {rid: e.fault or "ok" for rid, e in sim.send_log.items()}
    for name in ("429", "503", "cut", "stall"):
        share = outcomes.count(name) / n
        assert 0.04 <= share <= 0.18, (name, share, outcomes)
    # the client saw what the server did, request by request (a loaded machine may blur one or two stalls)
    agree = sum(truth[f"f-{i}"] == outcome for i, outcome in enumerate(outcomes))
    assert agree >= n - 2, [
        (i, truth[f"f-{i}"], o) for i, o in enumerate(outcomes) if truth[f"f-{i}"] != o
    ]


def test_process_mode_serves_and_shares_its_send_log():
    with SimServer(ttft_ms=10, itl_ms=2, process=True) as sim:
        r = httpx.post(
            sim.base_url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 3},
            headers={"X-Request-Id": "proc-1"},
            timeout=10,
        )
        assert r.status_code == 200
        entry = sim.send_log["proc-1"]
        assert entry.completion_tokens == 3 and entry.chunks


def test_metrics_page_carries_cache_config_and_queue_time():
    from inferwise.probes.prom import parse_prometheus

    async def main(sim):
        async with httpx.AsyncClient(base_url=sim.base_url, timeout=20) as client:
            await asyncio.gather(*[_stream(client, f"m-{i}", 5) for i in range(3)])
            return (await client.get("/metrics")).text

    with SimServer(ttft_ms=5, itl_ms=5, max_num_seqs=1, kv_capacity_tokens=4096) as sim:
        samples = parse_prometheus(asyncio.run(main(sim)))
    by_name = {s.name: s for s in samples}
    assert by_name["vllm:cache_config_info"].labels["num_gpu_blocks"] == "256"
    assert by_name["vllm:request_queue_time_seconds_count"].value == 3
    # one slot: the later requests waited for the earlier ones (about 5 + 4 * 5 ms each)
    assert by_name["vllm:request_queue_time_seconds_sum"].value > 0.03
