"""Load shapes: a closed loop at fixed concurrency, or an open loop on an absolute arrival schedule.

Open loop: inter-arrival times are gamma distributed with shape
``burstiness`` and mean ``1/rate`` (burstiness 1 is a Poisson process; below 1
burstier, above 1 more regular), as vLLM's benchmark defines it. The schedule
is computed up front as absolute offsets from the run's origin and each
request is sent at its slot. A request the client could not send on time
(busy loop, stream cap reached) keeps its scheduled time in the record and is
sent late: the lateness is measured (``schedule_delay_ms``), never hidden by
re-timing the rest of the schedule.

Closed loop: ``concurrency`` senders, each sending its next request as soon as
its previous one ended.

Both stop sending at the request count or the duration, whichever comes
first; requests in flight then finish (bounded by their own timeouts).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferwise.probes.records import RequestRecord

Send = Callable[[int, float | None, bool], Awaitable[RequestRecord]]
"""send(index, scheduled_s or None, warmup) -> record (never raises for request trouble)."""
OnRecord = Callable[[RequestRecord], Awaitable[None]]


def load_words(concurrency: int | None, rate: float | None, burstiness: float | None) -> str:
    """The load shape in words, as every report says it: the probe's result, `runs list`,
    `runs show` and `runs compare`."""
    if rate is not None:
        if math.isinf(rate):
            return "open loop, all requests at once"
        shape = "Poisson" if burstiness in (None, 1) else f"gamma (burstiness {burstiness:g})"
        return f"open loop, {rate:g} req/s, {shape} arrivals"
    if concurrency is not None:
        return f"closed loop, concurrency {concurrency}"
    return "unknown load"


def trace_words(info: dict[str, Any]) -> str:
    """A trace replay's load in words, from its description (probe result, stored run)."""
    scale = info.get("time_scale") or 1.0
    speed = "" if scale == 1 else f" at {scale:g}x speed"
    window = ""
    if info.get("start_s") is not None or info.get("duration_s") is not None:
        dur = info.get("duration_s")
        window = (
            f", window {info.get('start_s') or 0:g} s + {'all' if dur is None else f'{dur:g} s'}"
        )
    return (
        f"trace replay {info.get('name')} ({info.get('format')}, {info.get('requests')} requests"
        f"{window}){speed}, mean {info.get('mean_rate_per_s', 0):.3g} req/s"
    )


def arrival_schedule(
    rate_per_s: float,
    burstiness: float = 1.0,
    *,
    count: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    start_s: float = 0.0,
) -> list[float]:
    """Absolute send times (s from the origin). `count` and/or `duration_s` bound it;
    an infinite rate sends everything at `start_s`."""
    if count is None and duration_s is None:
        raise ValueError("a schedule needs a count or a duration")
    if rate_per_s == float("inf"):
        return [start_s] * (count if count is not None else 0)
    rng = random.Random(seed)
    theta = 1.0 / (rate_per_s * burstiness)
    out: list[float] = []
    t = start_s
    while count is None or len(out) < count:
        t += rng.gammavariate(burstiness, theta)
        if duration_s is not None and t - start_s > duration_s:
            break
        out.append(t)
    return out


async def closed_loop(
    send: Send,
    on_record: OnRecord,
    *,
    concurrency: int,
    first_index: int,
    count: int | None,
    deadline: float | None,
    warmup: bool = False,
) -> None:
    """`concurrency` senders share one counter; each sends until the count or the
    monotonic `deadline` is reached."""
    counter = itertools.count(first_index)
    last = None if count is None else first_index + count

    async def sender() -> None:
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                return
            i = next(counter)
            if last is not None and i >= last:
                return
            rec = await send(i, None, warmup)
            await on_record(rec)

    n = concurrency if count is None else min(concurrency, count)
    async with asyncio.TaskGroup() as tg:
        for _ in range(n):
            tg.create_task(sender())


async def open_loop(
    send: Send,
    on_record: OnRecord,
    *,
    schedule: list[float],
    origin: float,
    first_index: int,
    max_in_flight: int,
    deadline: float | None,
    indices: list[int] | None = None,
) -> None:
    """Send request k at origin + schedule[k]; never more than `max_in_flight` at once
    (a full pipe makes the next sends late, which the records show). `indices` names
    the requests when this loop sends only a share of a schedule (worker processes)."""
    slots = asyncio.Semaphore(max_in_flight)
    loop = asyncio.get_running_loop()

    async def one(i: int, scheduled: float) -> None:
        try:
            rec = await send(i, scheduled, False)
            await on_record(rec)
        finally:
            slots.release()

    async with asyncio.TaskGroup() as tg:
        for k, at in enumerate(schedule):
            due = origin + at
            if deadline is not None and due >= deadline:
                break
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            tg.create_task(one(indices[k] if indices is not None else first_index + k, at))
