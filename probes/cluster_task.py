"""The long-running task a Dask worker runs for a cluster probe: its slice of the load.

The measuring itself is the same lean client as a local run: the task starts the
`--workers` child process (:mod:`inferwise.probes.workers`, one asyncio loop of its own,
so the Dask worker's threads and heartbeats share no interpreter lock with the
timestamps), hands it the setup and its share of the schedule, and relays the child's
finished-request lines to the driver through a Dask queue in small batches (every
~20 ms), so the driver stores each request as it completes.

Clocks: the driver measured this worker's offset before the task started and sends the
run's origin, start and deadline already shifted into this machine's monotonic clock;
the child's timestamps, relative to that origin, are then on the driver's timeline.

The task stops its child early when the driver sets the run's stop event (Ctrl-C) or
when the driver's future for it is released (the driver died): then the child finishes
nothing more and the slice ends, bounded by the call's time cap in any case.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

RELAY_EVERY_S = 0.02
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
    }


def worker_clock() -> float:
    """This worker's monotonic clock (the driver samples it for the offset)."""
    return time.monotonic()


def run_slice(spec: SliceSpec) -> dict[str, Any]:
    """Run one slice to its end and relay its records; returns what the child reported."""
    from distributed import Event, Queue, Variable

    claimed = Event(spec.names["claimed"])
    if claimed.is_set():
        # the scheduler re-ran this slice after its worker died: its requests were already
        # accounted for (worker_lost), so sending them again would double the load
        return {"slice": spec.slice_no, "skipped": True}
    claimed.set()
    out = Queue(spec.names["queue"])
    child = _start_child(spec)
    try:
        ready = child.stdout.readline()
        if not ready.startswith("{") or not json.loads(ready).get("ready"):
            raise RuntimeError(f"client worker did not start: {_child_error(child)}")
        out.put(("ready", spec.slice_no, None))
        go = Variable(spec.names["go"]).get(timeout=300)
        _send(child, {"go": _shifted_go(spec, go)})
        return _relay(spec, child, out, Event(spec.names["stop"]))
    finally:
        with contextlib.suppress(Exception):
            child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()


def _start_child(spec: SliceSpec) -> Any:
    log = tempfile.TemporaryFile()  # noqa: SIM115 - read on failure, closed with the process
    child = subprocess.Popen(
        [sys.executable, "-m", "inferwise.probes.workers"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        bufsize=1,
    )
    child.log = log  # type: ignore[attr-defined]
    setup = {**spec.setup, "worker": spec.slice_no, "origin": spec.setup["origin"] + spec.offset_s}
    _send(child, setup)
    return child


def _child_error(child: Any) -> str:
    with contextlib.suppress(Exception):
        child.wait(5)
    child.log.seek(0)
    lines = child.log.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit code {child.returncode}"


def _send(child: Any, msg: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        child.stdin.write(json.dumps(msg) + "\n")
        child.stdin.flush()


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


def _relay(spec: SliceSpec, child: Any, out: Any, stop: Any) -> dict[str, Any]:
    """Forward the child's record lines in batches until it says done."""
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read() -> None:
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="inferwise-relay", daemon=True).start()
    batch: list[str] = []
    lag: list[float] = []
    next_check = time.monotonic() + CHECK_STOP_EVERY_S
    stopping = ended = False
    while not ended:
        try:
            line = lines.get(timeout=RELAY_EVERY_S)
        except queue.Empty:
            line = ""
        if line is None:
            ended = True
        elif line.startswith('{"r"'):
            batch.append(line)
        elif line.startswith('{"lag"'):
            lag = json.loads(line)["lag"]
        elif line.startswith('{"done"'):
            ended = True
        if batch and (ended or line == "" or len(batch) >= RELAY_MAX_LINES):
            out.put(("records", spec.slice_no, batch))
            batch = []
        if not stopping and time.monotonic() >= next_check:
            next_check = time.monotonic() + CHECK_STOP_EVERY_S
            if stop.is_set() or not _still_wanted():
                _send(child, {"stop": True})
                stopping = True
    out.put(("done", spec.slice_no, lag))
    return {"slice": spec.slice_no, "lag_samples": len(lag)}


def _still_wanted() -> bool:
    """False once the scheduler cancelled this task (its driver released the future or
    died); best effort, as the worker's task table is read from this thread."""
    try:
        from distributed import get_worker
        from distributed.worker import thread_state

        ts = get_worker().state.tasks.get(thread_state.key)
        return ts is None or ts.state not in ("cancelled", "released", "forgotten")
    except Exception:
        return True
