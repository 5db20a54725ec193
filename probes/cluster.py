"""`inferwise probe --cluster`: one measured run spread over the workers of a Dask cluster.

The driver (this process) keeps everything that is not timing, as with `--workers`: the
policy check, discovery, calibration, warm-up, the run store and the summary. It builds
the whole schedule on its own clock (closed loop: the concurrency and a block of request
indices per worker; open loop: every arrival keeps its absolute time, dealt to the
workers in time order, round-robin), measures each worker's clock offset (the round-trip
midpoint of a `client.run` call, best of a few), and submits one long-running task per
worker (:func:`inferwise.probes.cluster_task.run_slice`, pinned to that worker). Finished
request lines come back through a Dask queue as they complete and are stored at once, so
a driver that dies keeps what it received and a worker that dies loses only what it had
not finished; those requests are stored as failed, class `worker_lost`, naming it.

Dask is an optional extra (``inferwise[distributed]``); it is imported here only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from secrets import token_hex
from typing import Any

from inferwise.calculators.errors import InputError, OperationalError
from inferwise.probes.cluster_models import (
    INSTALL_HINT,
    ClusterInfo,
    ClusterTarget,
    ClusterWorker,
)
from inferwise.probes.records import RequestRecord

OnRecord = Callable[[RequestRecord, float | None], Awaitable[None]]
OFFSET_SAMPLES = 5
POLL_S = 0.05
LIVENESS_EVERY_S = 0.5
READY_TIMEOUT_S = 120.0
START_LEAD_S = 0.1
"""The driver's go reaches every worker through the scheduler in milliseconds."""
STOP_GRACE_S = 10.0


def import_distributed() -> Any:
    """The Dask engine, or a usage error saying what to install (exit 2)."""
    try:
        import distributed
    except ImportError:
        raise InputError(
            "cluster", f"--cluster needs the Dask engine, which is not installed: {INSTALL_HINT}"
        ) from None
    return distributed


@dataclasses.dataclass
class ClusterConnection:
    """A client connected to the scheduler (and the local cluster it started, if any)."""

    target: ClusterTarget
    client: Any
    scheduler: str
    local: Any = None

    @classmethod
    async def open(cls, target: ClusterTarget, policy: Any) -> ClusterConnection:
        distributed = import_distributed()
        if target.kind == "local":
            return await cls._start_local(distributed, target)
        addr = await _approved_address(target, policy)
        security = None
        if target.tls:
            security = distributed.Security(
                tls_ca_file=target.tls_ca,
                tls_client_cert=target.tls_cert,
                tls_client_key=target.tls_key,
                require_encryption=True,
            )
        client = distributed.Client(addr, asynchronous=True, security=security, timeout=10)
        try:
            await asyncio.wait_for(client, 20)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5)
            raise OperationalError(
                f"could not connect to the Dask scheduler at {target.address}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return cls(target, client, target.address)

    @classmethod
    async def _start_local(cls, distributed: Any, target: ClusterTarget) -> ClusterConnection:
        n = target.local_workers
        with _sigint_ignored_by_children():
            cluster = await _local_cluster(distributed, n)
        client = await distributed.Client(cluster, asynchronous=True)
        await asyncio.wait_for(client.wait_for_workers(n), READY_TIMEOUT_S)
        return cls(target, client, cluster.scheduler_address, cluster)

    async def workers(self) -> dict[str, str]:
        """address -> name of the workers the scheduler knows now."""
        info = await self.client.scheduler.identity(n_workers=-1)
        return {a: str(w.get("name", a)) for a, w in (info.get("workers") or {}).items()}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 10)
        if self.local is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.local.close(), 20)


async def _local_cluster(distributed: Any, n: int) -> Any:
    return await distributed.LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        asynchronous=True,
        silence_logs=logging.ERROR,
    )


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Iterator[None]:
    """local:N worker processes share the terminal's process group, so a Ctrl-C would kill
    them with the driver's requests in flight; started while SIGINT is ignored, they keep
    ignoring it (Python leaves an inherited SIG_IGN alone) and the driver stops them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


async def _approved_address(target: ClusterTarget, policy: Any) -> str:
    """The scheduler passes the same target policy as a probe URL; the client then
    connects to the address the policy approved (no second lookup)."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    try:
        addrs = await asyncio.to_thread(policy.check, f"http://{host}:{target.port}")
    except InputError as exc:
        raise InputError("cluster", f"scheduler: {exc.message}", exc.accepted) from None
    ip = addrs[0]
    ip = f"[{ip}]" if ":" in ip else ip
    return f"{'tls' if target.tls else 'tcp'}://{ip}:{target.port}"


async def check_workers(conn: ClusterConnection, workers: dict[str, str]) -> None:
    """Every worker must be able to run the probe's client (inferwise installed there)."""
    from inferwise.probes import cluster_task

    if not workers:
        raise OperationalError(
            f"the Dask scheduler at {conn.scheduler} has no workers; start "
            f"`dask worker {conn.scheduler}` on each load machine"
        )
    got = await conn.client.run(cluster_task.worker_clock, on_error="return")
    for addr, value in got.items():
        if isinstance(value, BaseException):
            raise OperationalError(
                f"Dask worker {workers.get(addr, addr)} ({addr}) cannot run the probe's client "
                f"({type(value).__name__}: {value}); install inferwise there"
            )


async def measure_offset(client: Any, addr: str) -> tuple[float, float]:
    """(worker clock - driver clock, round trip) in seconds: the midpoint of the call with
    the shortest round trip, so the offset is within half that round trip."""
    from inferwise.probes.cluster_task import worker_clock

    best: tuple[float, float] | None = None
    for _ in range(OFFSET_SAMPLES):
        t0 = time.monotonic()
        got = await client.run(worker_clock, workers=[addr])
        t1 = time.monotonic()
        if addr not in got:
            raise OperationalError(f"Dask worker {addr} did not answer the clock check")
        sample = (got[addr] - (t0 + t1) / 2, t1 - t0)
        if best is None or sample[1] < best[1]:
            best = sample
    assert best is not None
    return best


@dataclasses.dataclass
class ClusterLoad:
    """The measured load of one run point, on the driver's clock."""

    setup: dict[str, Any]
    mode: str  # "closed" | "open"
    concurrency: int
    first_index: int
    count: int
    schedule: list[float] | None
    origin: float
    duration_s: float | None
    hard_deadline: float | None
    max_in_flight: int


@dataclasses.dataclass
class _Slice:
    """One worker's share and what has come back of it."""

    no: int
    address: str
    name: str
    go: dict[str, Any]
    offset_s: float
    rtt_s: float
    entries: list[tuple[int, float | None]]
    """(request index, scheduled s) it was given; closed loop: in send order."""
    received: set[int] = dataclasses.field(default_factory=set)
    ready: bool = False
    done: bool = False
    lost: bool = False
    lost_requests: int = 0
    lag_ms: list[float] = dataclasses.field(default_factory=list)
    offset_after_s: float | None = None
    rtt_after_s: float = 0.0
    future: Any = None


def plan_slices(load: ClusterLoad, workers: dict[str, str]) -> list[_Slice]:
    """Split the load over the workers: a closed loop by concurrency (and a block of
    indices each), an open loop by arrival time (round-robin, absolute times kept)."""
    from inferwise.probes.workers import split

    addrs = sorted(workers)
    if load.mode == "closed":
        addrs = addrs[: max(1, min(len(addrs), load.concurrency))]
    n = len(addrs)
    out: list[_Slice] = []
    if load.mode == "closed":
        conc = split(load.concurrency, n)
        counts = [round(load.count * c / load.concurrency) for c in conc]
        counts[0] += load.count - sum(counts)
        first = load.first_index
        for no, (a, c, k) in enumerate(zip(addrs, conc, counts, strict=True)):
            go = {"mode": "closed", "concurrency": c, "first_index": first, "count": k}
            entries = [(i, None) for i in range(first, first + k)]
            out.append(_Slice(no, a, workers[a], go, 0.0, 0.0, entries))
            first += k
        return out
    assert load.schedule is not None
    for no, a in enumerate(addrs):
        times = load.schedule[no::n]
        idx = list(range(load.first_index + no, load.first_index + len(load.schedule), n))
        go = {
            "mode": "open",
            "schedule": times,
            "indices": idx,
            "max_in_flight": max(1, load.max_in_flight // n),
        }
        out.append(_Slice(no, a, workers[a], go, 0.0, 0.0, list(zip(idx, times, strict=True))))
    return out


def lost_records(s: _Slice, dead_at_s: float, count_bounded: bool) -> list[RequestRecord]:
    """The requests a lost worker never returned, as failed `worker_lost` records: those it
    had in flight, and (when the run was bounded by a count, so they were due) those it
    never sent. `dead_at_s` is when the driver saw it gone, from the run's origin."""
    who = f"worker {s.name} ({s.address})"
    missing = [(i, t) for i, t in s.entries if i not in s.received]
    if s.go["mode"] == "closed":
        sent = min(len(s.entries), len(s.received) + s.go["concurrency"])
        sent_ids = {i for i, _ in s.entries[:sent]}
        in_flight = [e for e in missing if e[0] in sent_ids]
        unsent = [e for e in missing if e[0] not in sent_ids] if count_bounded else []
    else:
        in_flight = [e for e in missing if e[1] is not None and e[1] <= dead_at_s]
        unsent = [e for e in missing if e[1] is None or e[1] > dead_at_s]
    out = [
        RequestRecord(
            index=i,
            ok=False,
            error_class="worker_lost",
            error_message=f"in flight on {who} when it was lost",
            start_s=t if t is not None else dead_at_s,
        )
        for i, t in in_flight
    ]
    out += [
        RequestRecord(
            index=i,
            ok=False,
            error_class="worker_lost",
            error_message=f"not sent: {who} was lost before its turn",
            start_s=dead_at_s,
        )
        for i, _ in unsent
    ]
    return out


class ClusterRun:
    """Drives one run point over the cluster: submit the slices, say go, store what
    streams back, account for workers that die, stop them on Ctrl-C."""

    def __init__(
        self, conn: ClusterConnection, load: ClusterLoad, on_record: OnRecord, notes: list[str]
    ) -> None:
        self.conn, self.load, self.on_record, self.notes = conn, load, on_record, notes
        self.run_key = token_hex(6)
        self.slices: list[_Slice] = []
        self.stored: set[int] = set()
        self.started_at: float | None = None
        self.stopping = False

    async def run(self) -> ClusterInfo:
        distributed = import_distributed()
        from inferwise.probes.cluster_task import names_for

        workers = await self.conn.workers()
        await check_workers(self.conn, workers)
        self.slices = plan_slices(self.load, workers)
        for s in self.slices:
            s.offset_s, s.rtt_s = await measure_offset(self.conn.client, s.address)
        names = names_for(self.run_key, 0)
        self.queue = await distributed.Queue(names["queue"], client=self.conn.client)
        self.go = distributed.Variable(names["go"], client=self.conn.client)
        self.stop = distributed.Event(names["stop"], client=self.conn.client)
        try:
            self._submit(distributed)
            await self._until_ready()
            await self._say_go()
            await self._collect()
        except asyncio.CancelledError:
            await self._stop_and_drain()
            raise
        finally:
            await self._after()
        return self.info()

    def _submit(self, distributed: Any) -> None:
        from inferwise.probes.cluster_task import SliceSpec, names_for, run_slice

        for s in self.slices:
            spec = SliceSpec(
                run_key=self.run_key,
                slice_no=s.no,
                setup=self.load.setup,
                go=s.go,
                offset_s=s.offset_s,
                names=names_for(self.run_key, s.no),
            )
            s.future = self.conn.client.submit(
                run_slice,
                spec,
                key=spec.names["key"],
                workers=[s.address],
                allow_other_workers=False,
                pure=False,
            )

    async def _until_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        next_check = time.monotonic() + LIVENESS_EVERY_S
        while not all(s.ready or s.lost for s in self.slices):
            if time.monotonic() > deadline:
                raise OperationalError(
                    f"the Dask workers did not start their clients within {READY_TIMEOUT_S:g} s"
                )
            await self._poll()
            if time.monotonic() >= next_check:  # a worker that dies now is lost, not awaited
                next_check = time.monotonic() + LIVENESS_EVERY_S
                alive = await self.conn.workers()
                for s in self.slices:
                    if not s.ready and not s.lost and s.address not in alive:
                        await self._account_lost(s, "it left the cluster before the load started")
            for s in self.slices:
                if s.future.status == "error" and not s.ready:
                    exc = await s.future.exception()
                    raise OperationalError(
                        f"Dask worker {s.name} ({s.address}) could not start the probe's client: {exc}"
                    )
        if all(s.lost for s in self.slices):
            raise OperationalError("every Dask worker was lost before the load started")

    async def _say_go(self) -> None:
        start = time.monotonic() + START_LEAD_S
        deadline = None
        if self.load.duration_s is not None:
            deadline = start + self.load.duration_s
        if self.load.hard_deadline is not None:
            hard = self.load.hard_deadline
            deadline = hard if deadline is None else min(deadline, hard)
        self.started_at = start
        await self.go.set({"start": start, "deadline": deadline})

    async def _collect(self) -> None:
        next_check = 0.0
        while not all(s.done or s.lost for s in self.slices):
            await self._poll()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + LIVENESS_EVERY_S
                await self._check_liveness()

    async def _poll(self) -> None:
        """Take what the queue holds, or wait POLL_S when it is empty (a blocking get with
        a timeout would log an error on the scheduler each time it expires)."""
        msgs = await self.queue.get(batch=True)
        for msg in msgs:
            await self._handle(msg)
        if not msgs:
            await asyncio.sleep(POLL_S)

    async def _handle(self, msg: Any) -> None:
        kind, no, body = msg
        s = self.slices[no]
        if kind == "ready":
            s.ready = True
        elif kind == "done":
            s.lag_ms = list(body or [])
            s.done = True
        elif kind == "records" and not s.lost:
            for line in body:
                data = json.loads(line)
                rec = RequestRecord.model_validate(data["r"])
                if rec.index in self.stored:
                    continue
                self.stored.add(rec.index)
                s.received.add(rec.index)
                await self.on_record(rec, data.get("e"))

    async def _check_liveness(self) -> None:
        alive = await self.conn.workers()
        for s in self.slices:
            if s.done or s.lost:
                continue
            failed = s.future.status == "error"
            if s.address in alive and not failed:
                continue
            await self._poll_empty()  # what it put before it died is still queued
            why = "its task failed" if failed else "it left the cluster"
            await self._account_lost(s, why)

    async def _poll_empty(self) -> None:
        with contextlib.suppress(Exception):
            await self._poll()

    async def _account_lost(self, s: _Slice, why: str) -> None:
        s.lost = True
        if self.stopping:  # as in a local run, what was in flight at Ctrl-C is not kept
            self.notes.append(f"worker {s.name} ({s.address}) left while the run was stopping")
            return
        dead_at = time.monotonic() - self.load.origin
        count_bounded = self.load.duration_s is None
        records = [r for r in lost_records(s, dead_at, count_bounded) if r.index not in self.stored]
        for rec in records:
            self.stored.add(rec.index)
            await self.on_record(rec, None)
        s.lost_requests = len(records)
        into = dead_at - ((self.started_at or self.load.origin) - self.load.origin)
        others = sum(1 for x in self.slices if not x.lost)
        self.notes.append(
            f"worker {s.name} ({s.address}) was lost {max(0.0, into):.1f} s into the load ({why}): "
            f"{len(records)} of its {len(s.entries)} requests are stored as failed (worker_lost); "
            f"the run finished with the other {others} worker(s)"
        )
        with contextlib.suppress(Exception):
            await s.future.cancel()

    async def _stop_and_drain(self) -> None:
        """Ctrl-C: tell every worker to stop, and keep what they finished before they did."""
        self.stopping = True
        with contextlib.suppress(Exception):
            await self.stop.set()
        end = time.monotonic() + STOP_GRACE_S
        with contextlib.suppress(Exception):
            while time.monotonic() < end and not all(s.done or s.lost for s in self.slices):
                await self._poll()
                await self._check_liveness()

    async def _after(self) -> None:
        """Offsets after the load (drift), and the run's Dask objects released."""
        for s in self.slices:
            if not s.lost and s.ready:
                with contextlib.suppress(Exception):
                    s.offset_after_s, s.rtt_after_s = await asyncio.wait_for(
                        measure_offset(self.conn.client, s.address), 10
                    )
        with contextlib.suppress(Exception):
            await self.conn.client.cancel([s.future for s in self.slices if s.future])
        with contextlib.suppress(Exception):
            await self.go.delete()
        for s in self.slices:
            note = drift_note(s)
            if note:
                self.notes.append(note)

    def info(self) -> ClusterInfo:
        return cluster_info(self.conn.scheduler, self.slices)

    def lag_samples(self) -> list[float]:
        return [x for s in self.slices for x in s.lag_ms]


def drift_note(s: _Slice) -> str | None:
    """Say so when the offset after the load differs from the one before by more than the
    two measurements' own uncertainty (half of each round trip) and 1 ms."""
    if s.offset_after_s is None:
        return None
    drift_ms = (s.offset_after_s - s.offset_s) * 1000
    noise_ms = (s.rtt_s + s.rtt_after_s) / 2 * 1000
    if abs(drift_ms) <= max(1.0, noise_ms):
        return None
    return (
        f"worker {s.name}'s clock moved {drift_ms:+.1f} ms against the driver's during the run "
        f"(measurement uncertainty {noise_ms:.1f} ms); its records were shifted by the offset "
        "measured before the load"
    )


def cluster_info(scheduler: str, slices: list[_Slice]) -> ClusterInfo:
    from inferwise.probes.summary import LOOP_LAG_P99_LIMIT_MS, distribution

    out = []
    for s in slices:
        p99 = distribution(s.lag_ms).p99
        out.append(
            ClusterWorker(
                address=s.address,
                name=s.name,
                requests=len(s.received) + s.lost_requests,
                clock_offset_ms=round(s.offset_s * 1000, 3),
                clock_offset_after_ms=(
                    None if s.offset_after_s is None else round(s.offset_after_s * 1000, 3)
                ),
                rtt_ms=round(s.rtt_s * 1000, 3),
                lag_p99_ms=None if p99 is None else round(p99, 3),
                saturated=p99 is not None and p99 > LOOP_LAG_P99_LIMIT_MS,
                lost=s.lost,
                lost_requests=s.lost_requests,
            )
        )
    return ClusterInfo(scheduler=scheduler, workers=out)


def apply_cluster_health(summary: Any, info: ClusterInfo) -> None:
    """The aggregate saturation verdict: the client was saturated when any worker's loop
    was (one slow worker skews its share of the requests), each named in a note."""
    from inferwise.probes.summary import LOOP_LAG_P99_LIMIT_MS

    health = summary.client_health
    health.workers = len(info.workers)
    # the pooled samples' note would advise --workers; each worker is named below instead
    health.notes = [n for n in health.notes if not n.startswith("client event loop lagged")]
    health.saturated = bool(health.notes)
    for w in info.workers:
        if w.saturated:
            health.saturated = True
            health.notes.append(
                f"Dask worker {w.name} ({w.address}): event loop lagged {w.lag_p99_ms:.1f} ms at "
                f"P99 (limit {LOOP_LAG_P99_LIMIT_MS:g} ms); its requests' latencies include client "
                "delay: add workers or lower the load"
            )
