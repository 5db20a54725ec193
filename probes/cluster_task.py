"""The long-running task a Dask worker runs for a cluster probe: its slice of the load.

The measuring itself is the same lean client as a local run: the task starts the
`--workers` child process (:mod:`inferwise.probes.workers`, one asyncio loop of its own,
so the Dask worker's threads and heartbeats share no interpreter lock with the
timestamps), hands it the setup and its share of the schedule, and relays the child's
finished-request lines to the driver through a Dask queue in small batches (every
~50 ms), so the driver stores each request as it completes.

Clocks: the driver measured this worker's offset before the task started and sends the
run's origin, start and deadline already shifted into this machine's monotonic clock;
the child's timestamps, relative to that origin, are then on the driver's timeline.

The task stops its child early when the driver sets the run's stop event (Ctrl-C); when
the driver's future for it is released (the driver died) Dask cancels the task, and the
child, its stdin closed, cancels what it had in flight. Either way the slice is bounded by
the call's time cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

RELAY_EVERY_S = 0.05
RELAY_MAX_LINES = 500
CHECK_STOP_EVERY_S = 0.25


@dataclass
class SliceSpec:
    """One worker's share of a cluster run, in the driver's clock (seconds, monotonic)."""

    run_key: str
    slice_no: int
    setup: dict[str, Any]
    go: dict[str, Any]
    offset_s: float
    """Worker clock minus driver clock: added to every driver time sent to the child."""
    names: dict[str, str] = field(default_factory=dict)


def names_for(run_key: str, slice_no: int) -> dict[str, str]:
    """The Dask queue/variable/event names a run's slices share."""
    return {
        "queue": f"inferwise-{run_key}-records",
        "go": f"inferwise-{run_key}-go",
        "stop": f"inferwise-{run_key}-stop",
        "claimed": f"inferwise-{run_key}-claimed-{slice_no}",
        "key": f"inferwise-probe-{run_key}-{slice_no}",
    }


def worker_clock() -> float:
    """This worker's monotonic clock (the driver samples it for the offset)."""
    return time.monotonic()


async def run_slice(spec: SliceSpec) -> dict[str, Any]:
    """Run one slice to its end and relay its records; returns what the child reported.

    A coroutine, so Dask runs it on the worker's event loop: no pool thread is held, and
    the worker's profiler (which samples task threads every 10 ms) leaves it alone."""
    from distributed import Event, Queue, Variable

    claimed = Event(spec.names["claimed"])
    if await _aw(claimed.is_set()):
        # the scheduler re-ran this slice after its worker died: its requests were already
        # accounted for (worker_lost), so sending them again would double the load
        return {"slice": spec.slice_no, "skipped": True}
    await _aw(claimed.set())
    out = await _aw(Queue(spec.names["queue"]))
    child = await _start_child(spec)
    try:
        ready = await child.stdout.readline()
        if not ready.startswith(b"{") or not json.loads(ready).get("ready"):
            raise RuntimeError(f"client worker did not start: {await _child_error(child)}")
        await _aw(out.put(("ready", spec.slice_no, None)))
        go = await _aw(Variable(spec.names["go"]).get(timeout=300))
        _send(child, {"go": _shifted_go(spec, go)})
        return await _relay(spec, child, out, Event(spec.names["stop"]))
    finally:
        with contextlib.suppress(Exception):
            child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 10)
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        child.log.close()


async def _aw(x: Any) -> Any:
    """Dask's coordination objects answer with a coroutine on an asynchronous client (the
    worker's, inside a coroutine task) and with the value on a synchronous one."""
    return await x if inspect.isawaitable(x) else x


async def _start_child(spec: SliceSpec) -> Any:
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed when the slice ends
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "inferwise.probes.workers",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        limit=1 << 26,
    )
    child.log = log  # type: ignore[attr-defined]
    _widen_pipe(child)
    setup = {**spec.setup, "worker": spec.slice_no, "origin": spec.setup["origin"] + spec.offset_s}
    _send(child, setup)
    return child


def _widen_pipe(child: Any) -> None:
    """Give the child's stdout pipe 1 MiB (Linux; the default is 64 KiB, ~40 records): a
    full pipe would block the child's loop, and every stream's timestamps with it, whenever
    this worker's loop is slow to read."""
    import fcntl

    with contextlib.suppress(Exception):
        fd = child.stdout._transport.get_extra_info("pipe").fileno()
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)


async def _child_error(child: Any) -> str:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(child.wait(), 5)
    child.log.seek(0)
    lines = child.log.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit code {child.returncode}"


def _send(child: Any, msg: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        child.stdin.write((json.dumps(msg) + "\n").encode())


def _shifted_go(spec: SliceSpec, go: dict[str, Any]) -> dict[str, Any]:
    """The slice's load message, with the driver's start and deadline on this clock."""
    msg = dict(spec.go)
    shift = spec.offset_s
    msg["deadline"] = None if go.get("deadline") is None else go["deadline"] + shift
    if msg["mode"] == "closed":
        msg["start"] = go["start"] + shift
    else:
        # the schedule counts from the run's origin; it starts when the driver says go
        lead = go["start"] - spec.setup["origin"]
        msg["schedule"] = [t + lead for t in msg["schedule"]]
        msg["origin"] = spec.setup["origin"] + shift
    return msg


async def _relay(spec: SliceSpec, child: Any, out: Any, stop: Any) -> dict[str, Any]:
    """Forward the child's record lines in batches until it says done; tell it to stop
    when the driver sets the run's stop event."""
    lines: asyncio.Queue[bytes] = asyncio.Queue()

    async def read() -> None:
        while line := await child.stdout.readline():
            lines.put_nowait(line)
        lines.put_nowait(b"")

    reader = asyncio.ensure_future(read())
    batch: list[str] = []
    lag: list[float] = []
    next_check = time.monotonic() + CHECK_STOP_EVERY_S
    stopping = ended = False
    flush_at = time.monotonic() + RELAY_EVERY_S
    try:
        while not ended:
            try:
                line = await asyncio.wait_for(lines.get(), max(0.001, flush_at - time.monotonic()))
            except TimeoutError:
                line = None
            if line == b"" or (line and line.startswith(b'{"done"')):
                ended = True
            elif line and line.startswith(b'{"r"'):
                batch.append(line.decode())
            elif line and line.startswith(b'{"lag"'):
                lag = json.loads(line)["lag"]
            now = time.monotonic()
            if batch and (ended or now >= flush_at or len(batch) >= RELAY_MAX_LINES):
                await _aw(out.put(("records", spec.slice_no, batch)))
                batch = []
            if now >= flush_at:
                flush_at = now + RELAY_EVERY_S
            if not stopping and now >= next_check:
                next_check = now + CHECK_STOP_EVERY_S
                if not _still_wanted(spec.names["key"]) or await _aw(stop.is_set()):
                    _send(child, {"stop": True})
                    stopping = True
    finally:
        reader.cancel()
    await _aw(out.put(("done", spec.slice_no, lag)))
    return {"slice": spec.slice_no, "lag_samples": len(lag)}


def _still_wanted(key: str) -> bool:
    """False once the scheduler released this task: the driver's client is gone (it died
    or was killed), so nobody would store what the slice still sends."""
    try:
        from distributed import get_worker

        ts = get_worker().state.tasks.get(key)
    except Exception:
        return True
    return ts is not None and ts.state not in ("cancelled", "released", "forgotten")
