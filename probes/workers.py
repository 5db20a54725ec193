"""Client worker processes: the load split over several event loops when one is not enough.

One asyncio loop stamps bytes well until its CPU share runs out; then every
stream's timestamps queue behind each other (the client-health sampler shows
it). With ``--workers N`` the measured load runs in N child processes, each
with its own loop, connection pool and share of the load: a closed loop gives
each worker part of the concurrency and a block of request indices; an open
loop deals the arrival schedule out round-robin, keeping every arrival's
absolute time. CLOCK_MONOTONIC is system-wide on Linux, so the children's
timestamps share the parent's origin.

The parent keeps everything that is not timing: the policy check, model
discovery, calibration, warm-up, the run store (a child's finished request is
committed by the parent as soon as its line arrives) and the summary.

Protocol over the child's stdin/stdout, one JSON object per line:
parent -> child: setup, then ``{"go": ...}`` with the load share, then
optionally ``{"stop": true}`` (or EOF); child -> parent: ``{"ready": true}``,
``{"r": record, "e": prompt-length error}`` per request, ``{"lag": [...]}``,
``{"done": true}``. The API key is never sent: a child reads it from the
same environment variable. Children ignore SIGINT (a terminal sends it to the
whole group), and SIGTERM; the parent stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from inferwise.probes.records import RequestRecord


def split(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal whole shares (largest first)."""
    base, rest = divmod(total, parts)
    return [base + (1 if i < rest else 0) for i in range(parts)]


async def drive_workers(
    *,
    n: int,
    setup: dict[str, Any],
    mode: str,
    concurrency: int,
    first_index: int,
    count: int,
    schedule: list[float] | None,
    origin: float,
    duration_s: float | None,
    max_in_flight: int,
    on_record: Callable[[RequestRecord, float | None], Awaitable[None]],
    notes: list[str],
) -> list[float]:
    """Run the measured load in `n` child processes; returns their loop-lag samples (ms)."""
    import tempfile
    import time

    procs = []
    # a child's stderr goes to a file: an unread pipe could fill up and block it
    logs = [tempfile.TemporaryFile() for _ in range(n)]  # noqa: SIM115 - closed in finally
    for w in range(n):
        p = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "inferwise.probes.workers",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=logs[w],
            limit=1 << 26,
        )
        procs.append(p)
        assert p.stdin is not None
        with contextlib.suppress(ConnectionError):  # a child that died at once is reported below
            p.stdin.write((json.dumps({**setup, "worker": w}) + "\n").encode())
            await p.stdin.drain()
    lag: list[float] = []
    try:
        for w, p in enumerate(procs):
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), 120)
            if not line or not line.startswith(b"{") or not json.loads(line).get("ready"):
                await asyncio.wait_for(p.wait(), 10)
                logs[w].seek(0)
                err = logs[w].read().decode(errors="replace").strip().splitlines()
                from inferwise.calculators.errors import OperationalError

                raise OperationalError(
                    f"client worker {w} did not start: {err[-1] if err else 'no output'}"
                )
        start = time.monotonic() + 0.02
        deadline = start + duration_s if duration_s is not None else None
        if mode == "closed":
            conc = split(concurrency, n)
            counts = [round(count * c / concurrency) for c in conc]
            counts[0] += count - sum(counts)
            first = first_index
            for p, c, k in zip(procs, conc, counts, strict=True):
                go = {
                    "mode": "closed",
                    "concurrency": c,
                    "first_index": first,
                    "count": k,
                    "deadline": deadline,
                    "start": start,
                }
                first += k
                _send(p, {"go": go})
        else:
            assert schedule is not None
            offset = start - origin
            shifted = [t + offset for t in schedule]
            for w, p in enumerate(procs):
                idx = list(range(first_index + w, first_index + len(shifted), n))
                go = {
                    "mode": "open",
                    "schedule": shifted[w::n],
                    "indices": idx,
                    "max_in_flight": max(1, max_in_flight // n),
                    "deadline": deadline,
                    "origin": origin,
                }
                _send(p, {"go": go})
        await asyncio.gather(*(_read(p, on_record, lag) for p in procs))
    except asyncio.CancelledError:
        for p in procs:
            _send(p, {"stop": True})
            with contextlib.suppress(Exception):
                p.stdin.close()  # type: ignore[union-attr]
        # keep what the children finished before they stopped
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(*(_read(p, on_record, lag) for p in procs)), 10)
        raise
    finally:
        for w, p in enumerate(procs):
            with contextlib.suppress(Exception):
                p.stdin.close()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(p.wait(), 10)
            except (TimeoutError, asyncio.CancelledError):
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            if p.returncode not in (0, None):
                notes.append(f"client worker {w} exited with code {p.returncode}")
        for log in logs:
            log.close()
    return lag


def _send(p: Any, msg: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        p.stdin.write((json.dumps(msg) + "\n").encode())


async def _read(
    p: Any, on_record: Callable[[RequestRecord, float | None], Awaitable[None]], lag: list[float]
) -> None:
    while True:
        line = await p.stdout.readline()
        if not line:
            return
        msg = json.loads(line)
        if "r" in msg:
            await on_record(RequestRecord.model_validate(msg["r"]), msg.get("e"))
        elif "lag" in msg:
            lag.extend(msg["lag"])
        elif msg.get("done"):
            return


# --------------------------------------------------------------------------- the child


def _emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _child_context(setup: dict[str, Any]) -> Any:
    """The parent's probe context, rebuilt in this process from its setup message."""
    import os

    from inferwise.probes.client import Pool, Target, Timeouts
    from inferwise.probes.prompts import Workload, load_dataset
    from inferwise.probes.runner import ProbeRequest
    from inferwise.probes.session import ProbeContext

    req = ProbeRequest.model_validate(setup["req"])
    api_key = os.environ.get(req.api_key_env) or None
    trace = None
    if req.trace is not None:
        from inferwise.probes.trace_replay import load_probe_trace

        trace = load_probe_trace(req)
        if trace.sha256 != setup.get("trace_sha256"):
            raise RuntimeError("the trace file changed after the run started")
    workload = Workload.of_probe(req, load_dataset(req.dataset) if req.dataset else None, trace)
    if setup.get("calibration"):
        workload.calibrate(*setup["calibration"])
    workload.set_salt(setup.get("salt", 0))
    pool = Pool(Target.from_url(req.url, connect_host=setup["connect_host"]))
    timeouts = Timeouts(
        req.connect_timeout_s, req.read_timeout_s, req.stall_timeout_s, req.total_timeout_s
    )
    ctx = ProbeContext(
        req, pool, api_key, [api_key] if api_key else [], timeouts, workload, setup["model"], None
    )
    ctx.ignore_eos, ctx.continuous_usage = setup["ignore_eos"], setup["continuous_usage"]
    return ctx


def _warm_hot_path() -> None:
    """Import and run once what the first finished request needs (the SSE parser, the
    record's validation and its JSON line) before saying ready: done lazily during the
    load, with 100+ streams receiving their first tokens at that moment, it would stall
    this loop and every one of their timestamps (more so where no .pyc is cached)."""
    import time

    from inferwise.probes.client import Outcome, to_record

    t = time.monotonic()
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    reads = [(t, chunk), (t, chunk), (t, usage), (t, b"data: [DONE]\n\n")]
    out = Outcome(t, t, t, 200, {"content-type": "text/event-stream"}, reads)
    rec = to_record(out, index=0, origin=t, stream=True, max_tokens=2)
    json.dumps(rec.model_dump(mode="json"), separators=(",", ":"))


async def _child(setup: dict[str, Any]) -> None:
    from inferwise.probes.health import LoopLagSampler
    from inferwise.probes.loadgen import closed_loop, open_loop
    from inferwise.probes.session import send_one

    ctx = _child_context(setup)
    _warm_hot_path()
    pool, timeouts = ctx.pool, ctx.timeouts
    origin = setup["origin"]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _emit({"ready": True})
    go_line = await reader.readline()
    if not go_line:
        return
    go = json.loads(go_line).get("go")
    if not go:
        return
    if setup.get("preconnect"):
        await pool.preconnect(go.get("concurrency") or min(8, go.get("max_in_flight", 8)), timeouts)

    async def send(i: int, scheduled: float | None, warmup: bool) -> RequestRecord:
        return await send_one(ctx, origin, i, scheduled, warmup)

    async def on_record(rec: RequestRecord) -> None:
        err = ctx.workload_errors.pop() if ctx.workload_errors else None
        _emit({"r": rec.model_dump(mode="json"), "e": err})

    lag = LoopLagSampler()
    lag.start()
    if go["mode"] == "closed":
        delay = go["start"] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        load = closed_loop(
            send,
            on_record,
            concurrency=go["concurrency"],
            first_index=go["first_index"],
            count=go["count"],
            deadline=go["deadline"],
        )
    else:
        load = open_loop(
            send,
            on_record,
            schedule=go["schedule"],
            origin=go["origin"],
            first_index=0,
            max_in_flight=go["max_in_flight"],
            deadline=go["deadline"],
            indices=go["indices"],
        )
    task = asyncio.ensure_future(load)
    stopper = asyncio.ensure_future(reader.readline())  # a stop line or EOF ends the load
    await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    stopper.cancel()
    pool.close()
    _emit({"lag": lag.stop()})
    _emit({"done": True})


def main() -> int:
    # the parent decides when to stop (a stop line, or EOF if it died): a Ctrl-C or
    # SIGTERM sent to the whole process group must not kill requests it wants to keep
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    line = sys.stdin.readline()
    if not line:
        return 1
    asyncio.run(_child(json.loads(line)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
