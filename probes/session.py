"""One measured run against an endpoint: the work `inferwise probe` repeats per sweep point.

What happens between "the target is approved" and "the run is closed":
find the model and which optional request fields the server accepts,
calibrate synthetic prompt lengths, send warm-up requests, drive the measured
load (in this event loop or in worker processes), commit every finished
request to the store as it completes, scrape the server's /metrics beside it
on a thread of its own, and close the run as complete, failed or interrupted
(Ctrl-C / SIGTERM keep every finished request).

The input and output models live in :mod:`inferwise.probes.runner`; this
module is imported only when a probe actually runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import queue
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from inferwise.probes.records import RequestRecord
from inferwise.probes.runner import Calibration, ProbeRequest, Progress, display_url
from inferwise.probes.summary import ProbeSummary

PARSE_ON_THREAD_BYTES = 256 << 10


async def report_progress(
    progress: Progress | None, done: float, total: float | None, msg: str
) -> None:
    """Tell the caller (an MCP client's progress channel) how far the run is.

    A failing progress callback (the client went away, its channel closed) must not end a run
    whose requests are already measured and stored, so its error is logged and dropped."""
    if progress is None:
        return
    try:
        await progress(done, total, msg)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logging.getLogger(__name__).debug("progress report dropped: %r", exc)


@dataclasses.dataclass
class ProbeContext:
    """What every request of a run shares: inputs, connection pool, key, workload, store,
    and what the server turned out to accept."""

    req: ProbeRequest
    pool: Any
    api_key: str | None
    secrets: list[str]
    timeouts: Any
    workload: Any
    model: str
    store: Any
    ignore_eos: bool = True
    continuous_usage: bool = True
    workload_errors: list[float] = dataclasses.field(default_factory=list)
    """Relative prompt-length errors (server prompt_tokens vs target), for the calibration report."""
    trace: Any = None
    """The replayed trace (calculators.traces.Trace), when the load is one."""
    cluster: Any = None
    """The Dask connection (:class:`inferwise.probes.cluster.ClusterConnection`) of a --cluster run."""


async def discover_model(ctx: ProbeContext) -> tuple[str | None, str | None]:
    """The first model the server lists at /v1/models, or (None, why not)."""
    import json

    from inferwise.probes.client import exchange

    out = await exchange(
        ctx.pool, "/models", b"", api_key=ctx.api_key, timeouts=ctx.timeouts, method="GET"
    )
    if out.error_class or not out.status or out.status >= 400:
        return (
            None,
            f"could not list models ({out.error_class or f'HTTP {out.status}'}); pass --model",
        )
    try:
        data = json.loads(b"".join(d for _, d in out.reads))
        return str(data["data"][0]["id"]), None
    except (ValueError, KeyError, IndexError, TypeError):
        return None, "the server's /v1/models reply lists no model; pass --model"


async def server_properties(ctx: ProbeContext) -> dict[str, Any]:
    """Engine facts the server states about itself, stored with the run so the
    diagnosis knows the slot limit instead of guessing it from the load.

    llama.cpp answers GET /props with `total_slots` (its -np); vLLM and SGLang
    have no such endpoint (a 404 leaves this empty). Best effort, one request.
    """
    import json

    from inferwise.probes.client import Pool, exchange

    target = ctx.pool.target
    root = dataclasses.replace(target, base_path=target.base_path.removesuffix("/v1"))
    pool = Pool(root)
    try:
        out = await exchange(
            pool, "/props", b"", api_key=ctx.api_key, timeouts=ctx.timeouts, method="GET"
        )
    finally:
        pool.close()
    if out.error_class or out.status != 200:
        return {}
    try:
        data = json.loads(b"".join(d for _, d in out.reads))
        slots = int(data["total_slots"])
    except (ValueError, KeyError, TypeError):
        return {}
    return {"engine": "llama.cpp", "max_num_seqs": slots} if slots > 0 else {}


async def negotiate(ctx: ProbeContext) -> list[str]:
    """Find which optional request fields the server accepts. Engines (vLLM, SGLang,
    llama.cpp) take ignore_eos and per-chunk usage; strict hosted APIs answer 400 to
    unknown fields. One short request per combination, until one is accepted."""
    from inferwise.probes.client import exchange, request_body

    want_eos = ctx.req.ignore_eos
    combos = [(want_eos, True), (want_eos, False)]
    if want_eos:
        combos += [(False, True), (False, False)]
    for eos, cont in combos:
        path, body = request_body(
            ctx.req.endpoint,
            ctx.model,
            "Say hi.",
            2,
            stream=ctx.req.stream,
            ignore_eos=eos,
            continuous_usage=cont,
        )
        out = await exchange(ctx.pool, path, body, api_key=ctx.api_key, timeouts=ctx.timeouts)
        if out.status not in (400, 422):
            ctx.ignore_eos, ctx.continuous_usage = eos, cont
            notes = []
            if want_eos and not eos:
                notes.append(
                    "the server rejects ignore_eos/min_tokens: output lengths are capped by max_tokens, not fixed"
                )
            if not cont and ctx.req.stream:
                notes.append(
                    "the server rejects per-chunk usage: tokens per chunk are estimated from the final usage"
                )
            return notes
    return []


async def calibrate(ctx: ProbeContext) -> Calibration:
    """Two one-token requests of 64 and 512 words; the server's prompt_tokens give the
    line tokens = a + b * words that synthetic prompts are then sized by."""
    import random

    from inferwise.probes.client import exchange, request_body, to_record
    from inferwise.probes.prompts import fit_calibration

    points: list[tuple[int, int]] = []
    for words in (64, 512):
        text = ctx.workload.synthetic_text(random.Random(words), words)
        path, body = request_body(
            ctx.req.endpoint, ctx.model, text, 1, stream=False, ignore_eos=False
        )
        out = await exchange(ctx.pool, path, body, api_key=ctx.api_key, timeouts=ctx.timeouts)
        rec = to_record(out, index=0, origin=0.0, stream=False, secrets=ctx.secrets)
        if not rec.ok or rec.input_tokens is None:
            why = rec.error_class or "no prompt_tokens in usage"
            return Calibration(note=f"not calibrated ({why}); assumed one token per word")
        points.append((words, rec.input_tokens))
    a, b = fit_calibration(points)
    if not (0.1 <= b <= 10 and abs(a) <= 10_000):
        # a broken or hostile count would size every prompt wrongly (0.001 tokens a word
        # means a million words for a 1,000-token prompt)
        return Calibration(
            note=f"not calibrated (the server's prompt_tokens imply {b:.3g} tokens per word "
            f"and {a:.3g} extra tokens); assumed one token per word"
        )
    ctx.workload.calibrate(a, b)
    return Calibration(calibrated=True, overhead_tokens=round(a, 2), tokens_per_word=round(b, 4))


async def send_one(
    ctx: ProbeContext, origin: float, index: int, scheduled: float | None, warmup: bool
) -> RequestRecord:
    """Send request `index` and return its record (never raises for request trouble).
    With honor_retry_after, a 429 is retried and the user-felt start is kept."""
    from inferwise.probes.client import (
        ResponseLimits,
        exchange,
        request_body,
        retry_after_s,
        to_record,
    )

    item = ctx.workload.item(index)
    limits = ResponseLimits.for_max_tokens(item.max_tokens)
    path, body = request_body(
        ctx.req.endpoint,
        ctx.model,
        item.text,
        item.max_tokens,
        stream=ctx.req.stream,
        # a graded answer ends where the model ends it: forcing max_tokens would pad it
        ignore_eos=ctx.ignore_eos and item.grader is None,
        continuous_usage=ctx.continuous_usage,
        messages=item.messages,
    )
    out = await exchange(
        ctx.pool, path, body, api_key=ctx.api_key, timeouts=ctx.timeouts, limits=limits
    )
    first_start = out.start_t
    tries = 0
    while ctx.req.honor_retry_after and out.status == 429 and tries < 3:
        wait = retry_after_s(out.headers)
        if wait is None or wait > 60:
            break
        tries += 1
        await asyncio.sleep(wait)
        out = await exchange(
            ctx.pool, path, body, api_key=ctx.api_key, timeouts=ctx.timeouts, limits=limits
        )
    if out.start_t != first_start:
        out = dataclasses.replace(out, start_t=first_start)  # the user waited through the retries
    record = functools.partial(
        to_record,
        out,
        index=index,
        origin=origin,
        stream=ctx.req.stream,
        warmup=warmup,
        scheduled_s=scheduled,
        secrets=ctx.secrets,
        store_text=ctx.req.store_text,
        prompt=item.text,
        max_tokens=item.max_tokens,
        prompt_id=item.prompt_id,
        grader=item.grader,
    )
    # parsing is linear, but a few MB of events would still hold the loop (and every other
    # stream's timestamps) for milliseconds: large responses are parsed on a thread
    large = sum(len(d) for _, d in out.reads) > PARSE_ON_THREAD_BYTES
    rec = await asyncio.to_thread(record) if large else record()
    if item.target_input_tokens and rec.input_tokens:
        ctx.workload_errors.append(
            (rec.input_tokens - item.target_input_tokens) / item.target_input_tokens
        )
    return rec


@dataclasses.dataclass(frozen=True)
class LoadPoint:
    """One point of a run: closed loop (concurrency) or open loop (rate), and its bounds."""

    concurrency: int | None
    rate: float | None
    requests: int | None
    duration_s: float | None


@dataclasses.dataclass
class PointResult:
    """What one stored run at one load point left behind."""

    run_id: str
    status: str
    summary: ProbeSummary
    records: list[RequestRecord]
    server_metrics: dict[str, float]
    notes: list[str]
    cluster: Any = None


async def run_point(
    ctx: ProbeContext,
    point: LoadPoint,
    *,
    labels: dict[str, str],
    meta: dict[str, Any],
    progress: Progress | None,
    stop: asyncio.Event,
    hard_deadline: float | None = None,
    progress_prefix: str = "",
) -> PointResult:
    """One stored run at one load point. At `hard_deadline` (monotonic; the call's cap)
    the requests in flight are cancelled and the run closes as interrupted."""
    run = _PointRun(ctx, point, labels, meta, progress, progress_prefix)
    return await run.execute(stop, hard_deadline)


class _PointRun:
    """The state of one run at one load point, and the steps that drive it: send the
    warm-up and the measured load (here or in worker processes), store each finished
    request as it comes, and close the run with its status."""

    def __init__(
        self,
        ctx: ProbeContext,
        point: LoadPoint,
        labels: dict[str, str],
        meta: dict[str, Any],
        progress: Progress | None,
        progress_prefix: str,
    ) -> None:
        from inferwise.probes.health import LoopLagSampler

        req = ctx.req
        self.ctx, self.point, self.req = ctx, point, req
        self.progress, self.progress_prefix = progress, progress_prefix
        self.run_id = ctx.store.create_run(labels=labels, config=self._config(), meta=meta)
        self.records: list[RequestRecord] = []
        self.counts: Counter[str] = Counter()
        self.notes: list[str] = []
        self.server_last: dict[str, float] = {}
        self.worker_lag: list[float] = []
        self.cluster_info: Any = None
        self.lag = LoopLagSampler()
        self.origin = time.monotonic()
        self.total = (point.requests or 0) + req.warmup_requests or None
        # measured requests at most: a duration-bounded run still stops at the request cap
        self.cap = (
            point.requests if point.requests is not None else req.max_requests - req.warmup_requests
        )
        self.writer = StoreWriter(ctx.store, self.run_id)

    def _config(self) -> dict[str, Any]:
        req, point = self.req, self.point
        config = req.model_dump(mode="json", exclude={"db", "api_key_env", "allow_hosts"})
        config.update(
            {
                "url": display_url(req.url),
                "concurrency": point.concurrency,
                "request_rate": point.rate,
                "requests": point.requests,
                # fresh prompt text per run: a rerun must not find its prompts in the prefix cache
                "prompt_salt": self.ctx.workload.new_salt(),
            }
        )
        if self.ctx.trace is not None:
            config["trace_replay"] = self.ctx.trace.describe()
        return config

    # ------------------------------------------------------------------ requests

    async def on_record(self, rec: RequestRecord) -> None:
        self.writer.put(rec)
        self.records.append(rec)
        self.counts["ok" if rec.ok else "failed"] += 1
        done = self.counts["ok"] + self.counts["failed"]
        elapsed = time.monotonic() - self.origin
        await report_progress(
            self.progress,
            done,
            self.total,
            f"{self.progress_prefix}completed {self.counts['ok']}, failed {self.counts['failed']}, "
            f"{done / elapsed if elapsed > 0 else 0:.1f} req/s",
        )

    def send(self, i: int, scheduled: float | None, warmup: bool) -> Awaitable[RequestRecord]:
        return send_one(self.ctx, self.origin, i, scheduled, warmup)

    # ------------------------------------------------------------------ the load

    async def drive(self, hard_deadline: float | None) -> None:
        from inferwise.probes.loadgen import closed_loop

        req, point = self.req, self.point
        if req.warmup_requests:
            await closed_loop(
                self.send,
                self.on_record,
                concurrency=point.concurrency or min(req.warmup_requests, 8),
                first_index=0,
                count=req.warmup_requests,
                deadline=None,
                warmup=True,
            )
        if self.ctx.cluster is not None:
            await self._drive_cluster(hard_deadline)
        elif req.workers > 1:
            await self._drive_workers()
        else:
            await self._drive_here(hard_deadline)

    async def _drive_here(self, hard_deadline: float | None) -> None:
        from inferwise.probes.loadgen import closed_loop, open_loop

        req, point, ctx = self.req, self.point, self.ctx
        if req.preconnect:
            await ctx.pool.preconnect(
                min(point.concurrency or 8, req.max_concurrency), ctx.timeouts
            )
        self.lag.start()
        start = time.monotonic()
        deadline = start + point.duration_s if point.duration_s is not None else None
        if hard_deadline is not None:
            deadline = hard_deadline if deadline is None else min(deadline, hard_deadline)
        if point.rate is None:
            await closed_loop(
                self.send,
                self.on_record,
                concurrency=point.concurrency or 1,
                first_index=req.warmup_requests,
                count=self.cap,
                deadline=deadline,
            )
            return
        await open_loop(
            self.send,
            self.on_record,
            schedule=self._schedule(start - self.origin),
            origin=self.origin,
            first_index=req.warmup_requests,
            max_in_flight=req.max_concurrency,
            deadline=deadline,
        )

    def _schedule(self, start_s: float) -> list[float]:
        """The open loop's absolute send times (s from the origin), from `start_s`."""
        from inferwise.probes.loadgen import arrival_schedule

        point = self.point
        assert point.rate is not None
        if self.ctx.trace is not None:
            from inferwise.probes.trace_replay import trace_schedule

            return trace_schedule(self.ctx.trace, start_s, self.cap, point.duration_s)
        return arrival_schedule(
            point.rate,
            self.req.burstiness,
            count=self.cap,
            duration_s=point.duration_s,
            seed=self.req.seed,
            start_s=start_s,
        )

    async def on_worker_record(self, rec: RequestRecord, err: float | None) -> None:
        """A record from a worker process (or Dask worker), with its prompt-length error."""
        if err is not None:
            self.ctx.workload_errors.append(err)
        await self.on_record(rec)

    def _worker_setup(self) -> dict[str, Any]:
        """What a worker process needs to rebuild this run's context (never the API key)."""
        req, ctx = self.req, self.ctx
        w = ctx.workload
        return {
            # a trace replay's rate is the trace's own: the child re-reads the trace
            "req": req.model_dump(mode="json", exclude={"request_rate"} if ctx.trace else None),
            "trace_sha256": ctx.trace.sha256 if ctx.trace else None,
            "model": ctx.model,
            "ignore_eos": ctx.ignore_eos,
            "continuous_usage": ctx.continuous_usage,
            "calibration": [w.overhead_tokens, w.tokens_per_word] if w.calibrated else None,
            "salt": w.salt,
            "connect_host": ctx.pool.target.connect_host,
            "origin": self.origin,
            "preconnect": req.preconnect,
        }

    async def _drive_workers(self) -> None:
        from inferwise.probes.workers import drive_workers

        req, point = self.req, self.point
        setup = self._worker_setup()
        schedule = self._schedule(0.0) if point.rate is not None else None
        self.worker_lag.extend(
            await drive_workers(
                n=req.workers,
                setup=setup,
                mode="closed" if point.rate is None else "open",
                concurrency=point.concurrency or 1,
                first_index=req.warmup_requests,
                count=self.cap,
                schedule=schedule,
                origin=self.origin,
                duration_s=point.duration_s,
                max_in_flight=req.max_concurrency,
                on_record=self.on_worker_record,
                notes=self.notes,
            )
        )

    async def _drive_cluster(self, hard_deadline: float | None) -> None:
        """The measured load over the Dask workers (:mod:`inferwise.probes.cluster`)."""
        from inferwise.probes.cluster import ClusterLoad, ClusterRun

        req, point = self.req, self.point
        load = ClusterLoad(
            setup=self._worker_setup(),
            mode="closed" if point.rate is None else "open",
            concurrency=point.concurrency or 1,
            first_index=req.warmup_requests,
            count=self.cap,
            schedule=self._schedule(0.0) if point.rate is not None else None,
            origin=self.origin,
            duration_s=point.duration_s,
            hard_deadline=hard_deadline,
            max_in_flight=req.max_concurrency,
        )
        run = ClusterRun(self.ctx.cluster, load, self.on_worker_record, self.notes)
        try:
            self.cluster_info = await run.run()
        finally:
            self.cluster_info = self.cluster_info or run.info()
            self.worker_lag.extend(run.lag_samples())
            self.ctx.store.update_meta(
                self.run_id, {"cluster": self.cluster_info.model_dump(mode="json")}
            )

    # ------------------------------------------------------------------ the run's life

    def summary(self) -> ProbeSummary:
        from inferwise.probes.summary import summarize

        # loop lag: the workers' samples, or this loop's own
        summary = summarize(
            self.records,
            slo=self.req.slo,
            loop_lag_ms=self.worker_lag or self.lag.stop(),
            workers=self.req.workers,
        )
        if self.cluster_info is not None:
            from inferwise.probes.cluster import apply_cluster_health

            apply_cluster_health(summary, self.cluster_info)
        return summary

    async def execute(self, stop: asyncio.Event, hard_deadline: float | None) -> PointResult:
        old_switch = sys.getswitchinterval()
        # threads beside the probe's loop (store writer, scraper) hand the GIL back
        # within half a millisecond, so a byte never waits longer to be stamped
        sys.setswitchinterval(min(old_switch, 0.0005))
        self.writer.start()
        scraper = None
        if self.req.metrics_interval_s > 0:
            scraper = ScrapeThread(self.ctx, self.run_id, self.origin, self.server_last, self.notes)
            scraper.start()
        status = "failed"  # what the run is, should waiting for it raise
        try:
            status = await self._wait(stop, hard_deadline)
        except asyncio.CancelledError:
            status = "interrupted"
            self.writer.close()
            self.ctx.store.finish_run(self.run_id, "interrupted", self.summary())
            raise
        finally:
            if scraper is not None:
                await scraper.stop()
            await asyncio.to_thread(self.writer.close)
            sys.setswitchinterval(old_switch)
            if status == "failed":  # the load itself broke (e.g. a worker did not start)
                self.ctx.store.finish_run(self.run_id, "failed", None)
        return self._close(status)

    async def _wait(self, stop: asyncio.Event, hard_deadline: float | None) -> str:
        """Drive the load until it ends, `stop` is set or the hard deadline passes; the
        status that leaves. Cancellation cancels the load and passes on."""
        task = asyncio.create_task(self.drive(hard_deadline))
        waiter = asyncio.create_task(stop.wait())
        limit_s = None if hard_deadline is None else max(0.0, hard_deadline - time.monotonic())
        try:
            await asyncio.wait({task, waiter}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise
        finally:
            waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if not stop.is_set():
                self.notes.append(
                    f"stopped at the call's time cap (max_duration_s {self.req.max_duration_s:g} s); "
                    "requests still in flight were cancelled"
                )
            return "interrupted"
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return "interrupted" if stop.is_set() else "complete"

    def _close(self, status: str) -> PointResult:
        if self.writer.failed:
            self.notes.append(
                f"{self.writer.failed} finished requests could not be stored ({self.writer.error}); "
                "the summary still counts them"
            )
        if status == "interrupted":
            self.notes.append(
                f"interrupted: {len(self.records)} finished requests kept, requests in flight were cancelled"
            )
        summary = self.summary()
        measured = [r for r in self.records if not r.warmup]
        if measured and summary.completed == 0 and status == "complete":
            status = "failed"
        self.ctx.store.finish_run(self.run_id, status, summary)  # type: ignore[arg-type]
        return PointResult(
            self.run_id,
            status,
            summary,
            self.records,
            self.server_last,
            self.notes,
            self.cluster_info,
        )


class StoreWriter:
    """Commits finished requests to the run store on a thread of its own.

    A commit is cheap (~0.1 ms) until SQLite checkpoints its WAL and fsyncs:
    measured here 8 ms at P99 and 20 ms at worst, which on the probe's loop
    would freeze every stream's timestamps. On this thread the fsync runs
    without the GIL. Requests queued together are committed in one
    transaction, within milliseconds of finishing; `close` drains the queue, so
    an interrupted run still keeps every finished request."""

    def __init__(self, store: Any, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.queue: queue.SimpleQueue[RequestRecord | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="inferwise-store", daemon=True)
        self.failed = 0
        self.error: str | None = None
        self.closed = False

    def start(self) -> None:
        self.thread.start()

    def put(self, rec: RequestRecord) -> None:
        self.queue.put(rec)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            batch: list[RequestRecord] = []
            stop = item is None
            if item is not None:
                batch.append(item)
            while not stop:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batch.append(more)
            if batch:
                try:
                    self.store.add_requests(self.run_id, batch)
                except Exception as exc:  # a full disk must not kill the run
                    self.failed += len(batch)
                    self.error = type(exc).__name__
            if stop:
                return

    def close(self) -> None:
        """Write what is queued and stop (blocking; call from a thread when in a loop)."""
        if self.closed:
            return
        self.closed = True
        self.queue.put(None)
        self.thread.join()


class ScrapeThread:
    """Runs the /metrics scraper on its own thread and event loop.

    Parsing a real vLLM metrics page (1,000+ lines) takes tens of milliseconds of
    pure Python; on the probe's loop that would freeze every stream's
    timestamps once per scrape. On a thread, the probe's loop only waits for
    the GIL (the run lowers the switch interval so that wait stays under a
    millisecond)."""

    def __init__(
        self,
        ctx: ProbeContext,
        run_id: str,
        origin: float,
        last: dict[str, float],
        notes: list[str],
    ):
        self.args = (ctx, run_id, origin)
        self.last = last
        self.notes = notes
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="inferwise-scrape", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.stop_event = asyncio.Event()
            self.ready.set()
            await scrape_metrics(*self.args, self.stop_event, self.last, self.notes)

        try:
            asyncio.run(main())
        finally:
            self.ready.set()

    async def stop(self) -> None:
        await asyncio.to_thread(self.ready.wait, 5)
        if self.loop is not None and self.stop_event is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self.loop.call_soon_threadsafe(self.stop_event.set)
        await asyncio.to_thread(self.thread.join, 10)


async def scrape_metrics(
    ctx: ProbeContext,
    run_id: str,
    origin: float,
    stop: asyncio.Event,
    last: dict[str, float],
    notes: list[str],
) -> None:
    """Best effort: the server's Prometheus metrics beside the run (a 404 ends it quietly)."""
    try:
        import httpx

        from inferwise.probes.prom import scrape_loop

        t = ctx.pool.target
        host = f"[{t.connect_host}]" if ":" in t.connect_host else t.connect_host
        url = f"{t.scheme}://{host}:{t.port}/metrics"
        headers = {"Host": t.host_header}
        if ctx.api_key:
            headers["Authorization"] = f"Bearer {ctx.api_key}"

        def sink(t_s: float, samples: list[Any]) -> None:
            ctx.store.add_metric_samples(
                run_id, [(t_s, s.name, s.labels, s.value) for s in samples]
            )

        # Always the address the policy approved (a second lookup could be answered
        # differently); over TLS the certificate is checked against the name (SNI).
        extensions = {"sni_hostname": t.host} if t.scheme == "https" else None
        async with httpx.AsyncClient(headers=headers, trust_env=False) as client:
            report = await scrape_loop(
                client,
                url,
                ctx.req.metrics_interval_s,
                sink,
                stop,
                t0=origin,
                extensions=extensions,
            )
            if not report.stopped_early:
                # one more page after the load, so the counters cover the whole run
                final = await scrape_loop(
                    client,
                    url,
                    ctx.req.metrics_interval_s,
                    sink,
                    asyncio.Event(),
                    max_scrapes=1,
                    t0=origin,
                    extensions=extensions,
                )
                report.last = final.last or report.last
        last.update(report.last)
        if report.note and report.scrapes == 0 and "404" not in report.note:
            notes.append(f"server metrics: {report.note}")
    except Exception as exc:  # never fail a probe over metrics
        notes.append(f"server metrics not recorded ({type(exc).__name__})")


@contextlib.contextmanager
def handle_signals(stop: asyncio.Event):
    """SIGINT/SIGTERM end the run cleanly; a second SIGINT falls back to the previous handler.

    Only in the main thread, and only for signals the event loop does not already
    handle (a server hosting the probe, e.g. MCP over HTTP, keeps its own);
    the previous handlers are put back afterwards."""
    loop = asyncio.get_running_loop()
    saved: dict[int, Any] = {}
    owned = getattr(loop, "_signal_handlers", {})
    if threading.current_thread() is threading.main_thread():

        def first(sig: int) -> None:
            stop.set()
            if sig == signal.SIGINT:
                _restore(signal.SIGINT)

        for sig in (signal.SIGINT, signal.SIGTERM):
            if sig in owned:
                continue
            try:
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, first, sig)
                saved[sig] = previous
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    def _restore(sig: int) -> None:
        if sig not in saved:
            return
        previous = saved.pop(sig)
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    try:
        yield
    finally:
        for sig in list(saved):
            _restore(sig)
