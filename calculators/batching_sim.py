"""Discrete-event simulation of a continuous-batching engine (vLLM v1 style).

Why a simulation and not a formula: TTFT and ITL under load depend on how the
scheduler mixes prefill chunks with decodes, how many sequences the KV cache
admits and when requests queue or get preempted. Those effects are discrete
and non-linear, and closed forms exist only at the extremes. The engine is
stepped the way vLLM's scheduler steps it:

1. every running sequence that has finished its prompt decodes one token;
2. sequences part-way through their prompt get the next chunk, then waiting
   requests are admitted (FIFO) while ``max_num_seqs``, the step's token
   budget (``max_num_batched_tokens``) and the KV capacity allow;
3. when the KV cache cannot take the next token of every running sequence,
   the most recently admitted one is preempted (recompute: its KV is freed
   and it returns to the head of the queue);
4. the step lasts ``StepModel`` time; tokens are emitted at its end.

Long runs of pure decode steps (nothing to admit, no prompt in flight) are
advanced in one vectorised block until the next completion or arrival, which
keeps a simulation of hundreds of requests within milliseconds.

numpy is imported inside the functions (the MCP server imports this module's
callers at start-up).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import deadline

if TYPE_CHECKING:  # pragma: no cover
    from .roofline import StepModel


@dataclass
class SimResult:
    """Per-request outcomes (ms, numpy arrays indexed by request) and run totals."""

    arrival_ms: Any
    queue_ms: Any
    """From arrival to the first step that schedules the request."""
    ttft_ms: Any
    e2e_ms: Any
    tpot_ms: Any
    """(e2e - ttft) / (output - 1); NaN for single-token outputs."""
    itl_values: Any
    """Durations (ms) of the steps that emitted decode tokens ..."""
    itl_weights: Any
    """... and how many sequences emitted a token in each: every such token's
    gap to the previous one is that step's duration."""
    input_tokens: Any
    output_tokens: Any
    completed: int
    rejected: int
    """Requests whose prompt alone exceeds the KV capacity."""
    duration_ms: float
    """First arrival to last completion (how benchmark_serving measures)."""
    steps: int
    preemptions: int
    mean_decode_batch: float
    max_running: int
    peak_kv_tokens: int

    @property
    def itl_ms(self) -> Any:
        """Every inter-token gap of every request, expanded (large; prefer the weighted form)."""
        import numpy as np

        return np.repeat(self.itl_values, self.itl_weights.astype(int))

    @property
    def output_tokens_per_s(self) -> float:
        done = ~_isnan(self.e2e_ms)
        return (
            float(self.output_tokens[done].sum()) / (self.duration_ms / 1e3)
            if self.duration_ms > 0
            else 0.0
        )

    @property
    def requests_per_s(self) -> float:
        return self.completed / (self.duration_ms / 1e3) if self.duration_ms > 0 else 0.0


def _isnan(a: Any) -> Any:
    import numpy as np

    return np.isnan(a)


def simulate(  # noqa: C901, PLR0915 - one cohesive step loop, kept whole for speed (see docstring)
    model: StepModel,
    input_tokens: Any,
    output_tokens: Any,
    arrival_ms: Any | None = None,
    concurrency: int | None = None,
    max_steps: int = 2_000_000,
    stagger_ms: float = 0.0,
) -> SimResult:
    """Run requests through the engine model.

    Open loop: ``arrival_ms`` gives each request's arrival (sorted). Closed
    loop: ``concurrency`` clients each send their next request the moment the
    previous one completes (benchmark_serving ``--max-concurrency`` with
    ``--request-rate inf``); ``stagger_ms`` spreads the clients' first requests. Neither: every request arrives at t=0 (offline).

    One function on purpose: the step loop is the hot path of every prediction (and of
    the recommender's search), and its state lives in locals; split into methods or
    closures it ran measurably slower. The loop checks the compute budget
    (:mod:`.deadline`) every 512 iterations.
    """
    import numpy as np

    inp = np.asarray(input_tokens, dtype=np.int64)
    out = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    n = len(inp)
    prompt = inp.tolist()
    outl = out.tolist()
    arrivals = _initial_arrivals(arrival_ms, concurrency, n, stagger_ms)
    closed = arrival_ms is None and concurrency is not None
    next_req = len(arrivals)  # closed loop: next request id to release

    cap = int(model.kv_capacity_tokens)
    max_seqs = int(model.max_num_seqs)
    budget_cap = int(model.max_num_batched_tokens)

    arr_t = [float("nan")] * n
    sched_t = [float("nan")] * n
    first_t = [float("nan")] * n
    done_t = [float("nan")] * n
    for i, a in enumerate(arrivals):
        arr_t[i] = a

    # Per-request progress.
    computed = [0] * n  # tokens in KV for prefilling requests
    to_prefill = [0] * n  # prompt tokens still to compute (grows after preemption)
    generated = [0] * n
    # Decode-phase requests: finish at a decode tick (kept in decode_heap); context = base + tick.
    ctx_base = [0] * n
    version = [0] * n
    tick = 0
    decode_heap: list[tuple[int, int, int]] = []  # (finish_tick, version, id)
    decoding: set[int] = set()
    sum_ctx_base = 0
    prefilling: list[int] = []  # admission order
    order: list[int] = []  # admission order of all running requests
    waiting: deque[int] = deque()
    reserved = 0  # prompt tokens admitted but not yet computed
    kv_used = 0  # tokens in cache (prefilling computed + decoding contexts)

    lines: dict[int, tuple[float, float, float, float, float]] = {}
    itl_chunks: list[Any] = []
    itl_counts: list[Any] = []
    t = 0.0
    arr_i = 0  # next arrival index (open loop / offline / closed initial)
    steps = preempt = rejected = 0
    decode_batch_sum = 0.0
    max_running = peak_kv = 0
    released = len(arrivals)
    finished = 0

    def release_next(now: float) -> None:
        nonlocal next_req, released
        if closed and next_req < n:
            arr_t[next_req] = now
            arrivals.append(now)
            next_req += 1
            released += 1

    def finish(i: int, now: float) -> None:
        nonlocal finished
        done_t[i] = now
        finished += 1
        order.remove(i)
        release_next(now)

    def retire_decodes(now: float) -> None:
        """Finish the decodes whose last token came at this tick (stale heap entries of
        preempted requests carry an old version and are dropped)."""
        nonlocal sum_ctx_base, kv_used
        while decode_heap and decode_heap[0][0] <= tick:
            _, ver, i = heapq.heappop(decode_heap)
            if i in decoding and version[i] == ver:
                decoding.discard(i)
                sum_ctx_base -= ctx_base[i]
                kv_used -= ctx_base[i] + tick
                generated[i] = outl[i]
                finish(i, now)

    loops = 0
    while finished + rejected < n and steps < max_steps:
        loops += 1
        if not loops & 511:
            deadline.check()
            time.sleep(0)  # hand the GIL over: a server's event loop shares this process
        # Arrivals up to now join the queue.
        while arr_i < len(arrivals) and arrivals[arr_i] <= t:
            waiting.append(arr_i)
            arr_i += 1
        if not order and not waiting:
            if arr_i < len(arrivals):
                t = arrivals[arr_i]
                continue
            break

        d = len(decoding)
        # Preempt (recompute) the newest requests until every decode fits its next token.
        while d and kv_used + reserved + d > cap and order:
            victim = order.pop()
            preempt += 1
            if victim in decoding:
                ctx = ctx_base[victim] + tick
                decoding.discard(victim)
                version[victim] += 1
                sum_ctx_base -= ctx_base[victim]
                kv_used -= ctx
                to_prefill[victim] = ctx  # prompt + generated so far, recomputed
                computed[victim] = 0
            else:
                prefilling.remove(victim)
                kv_used -= computed[victim]
                reserved -= to_prefill[victim]
                to_prefill[victim] += computed[victim]
                computed[victim] = 0
            waiting.appendleft(victim)
            d = len(decoding)

        budget = budget_cap - d
        chunks: list[tuple[int, int]] = []
        for i in prefilling:
            if budget <= 0:
                break
            c = min(to_prefill[i], budget)
            chunks.append((i, c))
            budget -= c
        while waiting and len(order) < max_seqs and budget > 0:
            i = waiting[0]
            need = to_prefill[i] if to_prefill[i] else prompt[i]
            if need > cap:  # can never fit: fail it rather than block the queue forever
                waiting.popleft()
                rejected += 1
                release_next(t)
                continue
            if kv_used + reserved + d + need > cap:  # this step's decode tokens too
                break
            waiting.popleft()
            to_prefill[i] = need
            reserved += need
            order.append(i)
            prefilling.append(i)
            if sched_t[i] != sched_t[i]:  # first time scheduled (NaN check)
                sched_t[i] = t
            c = min(need, budget)
            chunks.append((i, c))
            budget -= c

        if not chunks and d == 0:
            # Nothing can run: only possible when waiting requests are blocked
            # forever (cannot happen with the rejection above) or arrivals pending.
            if arr_i < len(arrivals):
                t = max(t, arrivals[arr_i])
                continue
            break

        if not chunks:
            # Pure decode: advance a block of steps at once.
            k = decode_heap[0][0] - tick if decode_heap else 1
            while decode_heap and (
                decode_heap[0][2] not in decoding or version[decode_heap[0][2]] != decode_heap[0][1]
            ):
                heapq.heappop(decode_heap)
                k = decode_heap[0][0] - tick if decode_heap else 1
            room = cap - kv_used - reserved
            k = max(1, min(k, room // d if d else k))
            kv0 = sum_ctx_base + d * tick
            line = lines.get(d)
            if line is None:
                line = lines[d] = model.decode_line(d)
            limit = arrivals[arr_i] if arr_i < len(arrivals) and len(order) < max_seqs else None
            times, end_t = _decode_block(line, t, kv0, d, k, limit)
            k = len(times)
            itl_chunks.append(times)
            itl_counts.append(d)
            decode_batch_sum += d * k
            steps += k
            tick += k
            kv_used += d * k
            peak_kv = max(peak_kv, kv_used + reserved)
            t = end_t
            retire_decodes(t)
            continue

        # A mixed step: decodes plus prefill chunks.
        p_tokens = 0
        pairs = 0.0
        ctx_prefill = 0
        completing = []
        for i, c in chunks:
            done = computed[i]
            pairs += c * (done + c / 2.0)
            ctx_prefill += done
            p_tokens += c
            if c == to_prefill[i]:
                completing.append(i)
        kv_ctx = sum_ctx_base + d * tick + ctx_prefill
        dt = model.step_ms(p_tokens, d, kv_ctx, prefill_pairs=pairs, sampled=d + len(completing))
        t += dt
        steps += 1
        if d:
            itl_chunks.append(np.array([dt]))
            itl_counts.append(d)
            decode_batch_sum += d
        tick += 1
        kv_used += d
        for i, c in chunks:
            computed[i] += c
            to_prefill[i] -= c
            reserved -= c
            kv_used += c
        peak_kv = max(peak_kv, kv_used + reserved)
        retire_decodes(t)
        for i in completing:
            prefilling.remove(i)
            if first_t[i] != first_t[i]:
                first_t[i] = t
            generated[i] += 1
            if generated[i] >= outl[i]:
                kv_used -= computed[i]
                computed[i] = 0
                finish(i, t)
                continue
            ctx = computed[i]
            computed[i] = 0
            ctx_base[i] = ctx - tick
            sum_ctx_base += ctx_base[i]
            version[i] += 1
            heapq.heappush(decode_heap, (tick + (outl[i] - generated[i]), version[i], i))
            decoding.add(i)
        max_running = max(max_running, len(order))

    return _result(
        inp,
        out,
        _Timeline(arr_t, sched_t, first_t, done_t),
        itl_chunks,
        itl_counts,
        _Counters(rejected, steps, preempt, decode_batch_sum, max_running, peak_kv),
    )


def _initial_arrivals(
    arrival_ms: Any | None, concurrency: int | None, n: int, stagger_ms: float
) -> list[float]:
    """Arrival times known before the run: the open loop's, all at 0 (offline), or a closed
    loop's first request per client."""
    if arrival_ms is not None:
        return [float(a) for a in arrival_ms]
    if concurrency is None:
        return [0.0] * n
    # Closed loop: clients start together (a benchmark) or spread evenly over
    # `stagger_ms` (independent users, whose phases then stay spread).
    c = min(concurrency, n)
    return [stagger_ms * i / c for i in range(c)]


def _decode_block(
    line: tuple[float, float, float, float, float],
    t: float,
    kv0: float,
    d: int,
    k: int,
    limit: float | None,
) -> tuple[Any, float]:
    """Step times of up to ``k`` pure-decode steps of ``d`` sequences from time ``t`` (KV
    tokens ``kv0``, growing by ``d`` a step), stopping at the step that reaches ``limit``
    (the next arrival); returns the times and the end time."""
    import numpy as np

    c0, c1, m0, m1, fixed = line
    if k <= 48:
        # Few steps: plain arithmetic beats numpy's per-call cost.
        times_l: list[float] = []
        now = t
        kv = kv0
        for _ in range(k):
            dt_s = max(c0 + c1 * kv, m0 + m1 * kv) + fixed
            now += dt_s
            times_l.append(dt_s)
            kv += d
            if limit is not None and now >= limit:
                break
        return np.array(times_l), now
    kvs = kv0 + d * np.arange(k, dtype=float)
    times = np.maximum(c0 + c1 * kvs, m0 + m1 * kvs) + fixed
    ends = t + np.cumsum(times)
    if limit is not None:
        cut = int(np.searchsorted(ends, limit, side="left")) + 1
        if cut < k:
            times, ends = times[:cut], ends[:cut]
    return times, float(ends[-1])


@dataclass(frozen=True)
class _Timeline:
    """Per-request event times (ms) the step loop filled in (NaN where never reached)."""

    arrival: list[float]
    scheduled: list[float]
    first_token: list[float]
    done: list[float]


@dataclass(frozen=True)
class _Counters:
    rejected: int
    steps: int
    preemptions: int
    decode_batch_sum: float
    max_running: int
    peak_kv: int


def _result(
    inp: Any, out: Any, tl: _Timeline, itl_chunks: list[Any], itl_counts: list[Any], k: _Counters
) -> SimResult:
    """The run's per-request latencies and totals."""
    import numpy as np

    arr = np.array(tl.arrival)
    first = np.array(tl.first_token)
    done = np.array(tl.done)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (done - first) / (out - 1), np.nan)
    if itl_chunks:
        itl_values = np.concatenate(itl_chunks)
        itl_weights = np.repeat(np.asarray(itl_counts, dtype=float), [len(c) for c in itl_chunks])
    else:
        itl_values = itl_weights = np.array([])
    finite = done[~np.isnan(done)]
    start = float(np.nanmin(arr)) if len(arr) else 0.0
    duration = float(finite.max() - start) if len(finite) else 0.0
    return SimResult(
        arrival_ms=arr,
        queue_ms=np.array(tl.scheduled) - arr,
        ttft_ms=first - arr,
        e2e_ms=done - arr,
        tpot_ms=tpot,
        itl_values=itl_values,
        itl_weights=itl_weights,
        input_tokens=inp,
        output_tokens=out,
        completed=int(len(finite)),
        rejected=k.rejected,
        duration_ms=duration,
        steps=k.steps,
        preemptions=k.preemptions,
        mean_decode_batch=k.decode_batch_sum / k.steps if k.steps else 0.0,
        max_running=k.max_running,
        peak_kv_tokens=int(k.peak_kv),
    )


def poisson_arrivals_ms(n: int, rate_per_s: float, burstiness: float = 1.0, seed: int = 0) -> Any:
    """Arrival times (ms) with gamma inter-arrival gaps, as vLLM's benchmark draws them.

    burstiness 1 is a Poisson process; below 1 is burstier, above 1 smoother
    (shape = burstiness, mean gap = 1 / rate).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate_per_s * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps) * 1e3


def lognormal_lengths(
    p50: int, p95: int | None, n: int, seed: int = 0, max_tokens: int | None = None
) -> Any:
    """Token lengths from a median and a 95th percentile (lognormal fit).

    A lognormal is the usual shape of prompt and completion lengths (long
    right tail); two quantiles pin it: sigma = ln(p95/p50) / 1.645.
    """
    import numpy as np

    if p95 is None or p95 <= p50:
        return np.full(n, int(p50), dtype=np.int64)
    rng = np.random.default_rng(seed)
    sigma = np.log(p95 / p50) / 1.6448536269514722
    x = np.exp(np.log(p50) + sigma * rng.standard_normal(n))
    x = np.maximum(1, np.round(x)).astype(np.int64)
    if max_tokens is not None:
        x = np.minimum(x, max_tokens)
    return x


@dataclass
class LoadStats:
    """What a benchmark client would report for a simulated run.

    For a closed loop (fixed concurrency) the first and last ``concurrency``
    requests are the ramp-up and ramp-down, not the load being asked about,
    so they are left out, and throughput follows Little's law
    (``concurrency / mean end-to-end latency``). Open-loop and offline runs
    use every request and the wall-clock duration, as benchmark_serving does.
    """

    ttft_ms: Any
    itl_values: Any
    itl_weights: Any
    tpot_ms: Any
    e2e_ms: Any
    queue_ms: Any
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    completed: int
    kept: Any = None
    """Boolean mask over the simulated requests: those the per-request figures above cover."""


def load_stats(res: SimResult, concurrency: int | None = None) -> LoadStats:
    import numpy as np

    n = len(res.e2e_ms)
    done = ~np.isnan(res.e2e_ms)
    mask = done.copy()
    closed = bool(concurrency) and n >= 3 * int(concurrency or 0)
    if closed:
        idx = np.arange(n)
        mask &= (idx >= concurrency) & (idx < n - concurrency)
    e2e = res.e2e_ms[mask]
    if closed and len(e2e) and e2e.mean() > 0:
        rps = float(concurrency) / (float(e2e.mean()) / 1e3)
        out_per_req = float(res.output_tokens[mask].mean())
        in_per_req = float(res.input_tokens[mask].mean())
        out_tps = rps * out_per_req
        total_tps = rps * (out_per_req + in_per_req)
    else:
        seconds = res.duration_ms / 1e3
        rps = res.completed / seconds if seconds > 0 else 0.0
        out_tps = float(res.output_tokens[done].sum()) / seconds if seconds > 0 else 0.0
        total_tps = (
            float(res.output_tokens[done].sum() + res.input_tokens[done].sum()) / seconds
            if seconds > 0
            else 0.0
        )
    return LoadStats(
        ttft_ms=res.ttft_ms[mask],
        itl_values=res.itl_values,
        itl_weights=res.itl_weights,
        tpot_ms=res.tpot_ms[mask & ~np.isnan(res.tpot_ms)],
        e2e_ms=e2e,
        queue_ms=res.queue_ms[mask],
        requests_per_s=rps,
        output_tokens_per_s=out_tps,
        total_tokens_per_s=total_tps,
        completed=int(done.sum()),
        kept=mask,
    )


def simulate_load(
    model: StepModel,
    input_tokens: Any,
    output_tokens: Any,
    *,
    concurrency: int | None = None,
    rate_per_s: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
    stagger_ms: float = 0.0,
) -> tuple[SimResult, LoadStats]:
    """The requests under one load shape, and its statistics: a closed loop of
    `concurrency` clients (first requests spread over `stagger_ms`), an open loop
    at `rate_per_s` with gamma(`burstiness`) arrivals drawn from `seed`, or, with
    neither (or an infinite rate), every request at once (offline)."""
    if concurrency is not None:
        res = simulate(
            model, input_tokens, output_tokens, concurrency=concurrency, stagger_ms=stagger_ms
        )
        return res, load_stats(res, concurrency)
    if rate_per_s is None or math.isinf(rate_per_s):
        res = simulate(model, input_tokens, output_tokens)
    else:
        arrivals = poisson_arrivals_ms(len(input_tokens), float(rate_per_s), burstiness, seed=seed)
        res = simulate(model, input_tokens, output_tokens, arrival_ms=arrivals)
    return res, load_stats(res)


def weighted_summary(
    values: Any, weights: Any, qs: tuple[float, ...] = (50, 90, 95, 99)
) -> tuple[float, list[float]]:
    """Mean and percentiles of a sample given as distinct values with counts
    (the ITL of a run: step durations weighted by the tokens they emitted),
    with numpy's default (linear) percentile definition on the expanded sample."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = (w > 0) & ~np.isnan(v)
    v, w = v[keep], w[keep]
    if not len(v):
        return float("nan"), [float("nan")] * len(qs)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    n = cum[-1]
    out = []
    for q in qs:
        pos = q / 100.0 * (n - 1)  # 0-based rank in the expanded sample
        lo = int(np.searchsorted(cum, np.floor(pos) + 1, side="left"))
        hi = int(np.searchsorted(cum, np.ceil(pos) + 1, side="left"))
        frac = pos - np.floor(pos)
        out.append(float(v[lo] + (v[min(hi, len(v) - 1)] - v[lo]) * frac))
    return float((v * w).sum() / n), out
