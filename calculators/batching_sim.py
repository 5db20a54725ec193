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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from . import deadline

if TYPE_CHECKING:  # pragma: no cover
    from .roofline import DecodeLine, StepModel


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
    kv_capacity_tokens: int = 0
    """The KV capacity the run was simulated with, in tokens of whole contexts (the reported
    one, or more where the engine frees the blocks that leave a sliding window)."""

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


SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
"""SGLang's scheduler defaults (environ.py: SGLANG_INIT_NEW_TOKEN_RATIO 0.7,
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600,
SGLANG_RETRACT_DECODE_STEPS 20): it admits a prompt only while the KV cache also holds this
share of every running request's remaining output, decays the share to its floor over 600
steps, and raises it again when a decode runs out of memory and requests are retracted."""
SGLANG_MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
SGLANG_RATIO_DECAY = (SGLANG_INIT_NEW_TOKEN_RATIO - SGLANG_MIN_NEW_TOKEN_RATIO) / 600
SGLANG_RETRACT_DECODE_STEPS = 20


def simulate(
    model: StepModel,
    input_tokens: Any,
    output_tokens: Any,
    arrival_ms: Any | None = None,
    concurrency: int | None = None,
    max_steps: int = 2_000_000,
    stagger_ms: float = 0.0,
    *,
    cached: KvCached | None = None,
) -> SimResult:
    """Run requests through the engine model.

    Open loop: ``arrival_ms`` gives each request's arrival (sorted). Closed
    loop: ``concurrency`` clients each send their next request the moment the
    previous one completes (benchmark_serving ``--max-concurrency`` with
    ``--request-rate inf``); ``stagger_ms`` spreads the clients' first requests.
    Neither: every request arrives at t=0 (offline). ``cached``: prompt tokens
    whose KV is there before the request is scheduled (prefix-cache hits, or the
    KV a disaggregated decode worker receives).
    """
    lanes = min(model.pipeline_parallel_size, len(input_tokens), concurrency or len(input_tokens))
    if lanes <= 1:
        return _simulate_engine(
            model,
            input_tokens,
            output_tokens,
            arrival_ms,
            concurrency,
            max_steps,
            stagger_ms,
            cached,
        )
    # Pipeline parallelism as the engines run it: one micro-batch in flight per stage (vLLM's
    # virtual engines, TensorRT-LLM's micro-batches). Each lane is an engine of its own over a
    # share of the requests (clients, arrivals) whose steps take the whole pipeline's latency;
    # together the lanes keep every stage busy.
    import numpy as np

    inp, out, n = np.asarray(input_tokens), np.asarray(output_tokens), len(input_tokens)
    lane = pipeline_lane(model, lanes)
    parts = []
    for k in range(lanes):
        idx = np.arange(k, n, lanes)
        res = _simulate_engine(
            lane,
            inp[idx],
            out[idx],
            None if arrival_ms is None else np.asarray(arrival_ms)[idx],
            None if concurrency is None else concurrency // lanes + (k < concurrency % lanes),
            max_steps,
            stagger_ms,
            None if cached is None else replace(cached, tokens=np.asarray(cached.tokens)[idx]),
        )
        parts.append((idx, res))
    return _merged(parts, n)


def pipeline_lane(model: StepModel, lanes: int) -> StepModel:
    """One of a pipeline-parallel engine's `lanes` micro-batch lanes: its share of the
    sequences and the KV cache (vLLM gives each virtual engine its own scheduler and 1/pp of
    the KV blocks), with the whole pipeline's step time."""
    return replace(
        model,
        max_num_seqs=max(1, -(-model.max_num_seqs // lanes)),
        kv_capacity_tokens=model.kv_capacity_tokens // lanes,
        admission_watermark_tokens=model.admission_watermark_tokens // lanes,
    )


def _simulate_engine(
    model: StepModel,
    input_tokens: Any,
    output_tokens: Any,
    arrival_ms: Any | None,
    concurrency: int | None,
    max_steps: int,
    stagger_ms: float,
    cached: KvCached | None,
) -> SimResult:
    """One engine's scheduler loop over the requests (see :func:`simulate`)."""
    import numpy as np

    inp = np.asarray(input_tokens, dtype=np.int64)
    out = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    if model.kv_window_share and len(inp):  # capacity in whole contexts, at the mean one
        context = float(inp.mean() + out.mean() / 2.0)
        model = replace(model, kv_capacity_tokens=model.context_capacity_tokens(context))
    if model.reserves_whole_request and len(inp):
        model = no_evict_admission(model, int(round(float((inp + out).mean()))))
    frontend_ms = model.efficiency.request_overhead_ms
    arrivals = _initial_arrivals(arrival_ms, concurrency, len(inp), stagger_ms)
    closed = arrival_ms is None and concurrency is not None
    loop = _StepLoop(model, inp.tolist(), out.tolist(), arrivals, closed, frontend_ms)
    if cached is not None:
        loop.preload(cached)
    loop.run(max_steps)
    return _result(inp, out, loop.timeline(), loop.itl_chunks, loop.itl_counts, loop.counters())


def _merged(parts: list[tuple[Any, SimResult]], n: int) -> SimResult:
    """One SimResult from the lanes' (request indices, result) pairs."""
    import numpy as np

    def placed(field: str, dtype: Any = float) -> Any:
        a = np.full(n, np.nan) if dtype is float else np.zeros(n, dtype=dtype)
        for idx, res in parts:
            a[idx] = getattr(res, field)
        return a

    results = [res for _, res in parts]
    starts = [float(np.nanmin(r.arrival_ms)) for r in results]
    ends = [s + r.duration_ms for s, r in zip(starts, results, strict=True) if r.completed]
    steps = sum(r.steps for r in results)
    return SimResult(
        arrival_ms=placed("arrival_ms"),
        queue_ms=placed("queue_ms"),
        ttft_ms=placed("ttft_ms"),
        e2e_ms=placed("e2e_ms"),
        tpot_ms=placed("tpot_ms"),
        itl_values=np.concatenate([r.itl_values for r in results]),
        itl_weights=np.concatenate([r.itl_weights for r in results]),
        input_tokens=placed("input_tokens", np.int64),
        output_tokens=placed("output_tokens", np.int64),
        completed=sum(r.completed for r in results),
        rejected=sum(r.rejected for r in results),
        duration_ms=max(ends) - min(starts) if ends else 0.0,
        steps=steps,
        preemptions=sum(r.preemptions for r in results),
        mean_decode_batch=(
            sum(r.mean_decode_batch * r.steps for r in results) / steps if steps else 0.0
        ),
        max_running=sum(r.max_running for r in results),
        peak_kv_tokens=sum(r.peak_kv_tokens for r in results),
        kv_capacity_tokens=sum(r.kv_capacity_tokens for r in results),
    )


def no_evict_admission(model: StepModel, tokens_per_request: int) -> StepModel:
    """TensorRT-LLM's default capacity scheduler (GUARANTEED_NO_EVICT) as a batch cap:
    with every request reserving its whole input + output, at most KV capacity / (input +
    output) run at once, at the mean length of the requests simulated (exact for the
    fixed lengths of benchmarks; per-request reservation is not modelled)."""
    cap = max(1, int(model.kv_capacity_tokens // max(1, tokens_per_request)))
    return replace(model, max_num_seqs=min(model.max_num_seqs, cap))


@dataclass(frozen=True)
class KvCached:
    """Prompt tokens each request finds in the KV cache when it is scheduled.

    ``tokens[i]`` of request i's prompt are not computed (at most the prompt minus one:
    the last prompt token is always run to sample the first output token), but its
    attention reads them. ``own`` says whose blocks they are: ``False`` for prefix-cache
    hits (blocks shared with other requests, held once in ``shared_kv_tokens`` taken off
    the capacity), ``True`` for KV transferred to a disaggregated decode worker (the
    request holds it from admission, like a computed prompt).
    """

    tokens: Any
    own: bool = False
    shared_kv_tokens: int = 0


class _StepLoop:
    """The engine's state between steps, and the steps of the scheduler.

    One engine step is: queue the arrivals, preempt until every decode fits its next
    token, choose the prefill chunks (running prompts first, then admissions under the
    engine's rule: vLLM V1 none in a step that preempted, V0 above its watermark, SGLang
    above its new-token reserve), then run either a block of pure-decode steps or one
    mixed step. A preempted request is recomputed and continues its output. The state is
    plain lists indexed by request id (``__slots__``, no per-request objects): this loop is
    the hot path of every prediction and of the recommender's search.

    Decoding requests are not stepped one by one: a request that starts decoding at
    tick ``t0`` with ``ctx`` tokens has ``ctx_base = ctx - t0``, so its context at any
    later tick is ``ctx_base + tick``, and it finishes at a tick kept in ``decode_heap``.
    """

    __slots__ = (
        "model", "cap", "max_seqs", "budget_cap", "n", "prompt", "outl", "arrivals",
        "closed", "next_req", "arr_t", "sched_t", "first_t", "done_t", "computed",
        "to_prefill", "generated", "ctx_base", "version", "tick", "decode_heap",
        "decoding", "sum_ctx_base", "prefilling", "order", "waiting", "reserved",
        "kv_used", "lines", "itl_chunks", "itl_counts", "t", "arr_i", "steps",
        "preempt", "rejected", "decode_batch_sum", "max_running", "peak_kv", "finished",
        "as_array", "skip", "adj", "frontend_ms", "stall_ms", "watermark", "gen_base",
        "preempted_at", "ratio", "fin_tick", "sum_finish", "sum_out_dec", "sum_pre_left",
        "recv_every", "since_recv", "ahead", "seen_t",
    )  # fmt: skip

    def __init__(
        self,
        model: StepModel,
        prompt: list[int],
        outl: list[int],
        arrivals: list[float],
        closed: bool,
        frontend_ms: float = 0.0,
    ) -> None:
        n = len(prompt)
        # The engine sees a request frontend_ms after the client sent it (HTTP, tokenization):
        # the loop runs on engine-side arrivals, the timeline reports the client's.
        self.frontend_ms = frontend_ms
        # prefill-only steps the running decodes waited through: [sequences, ms waited] per
        # group that started decoding before the same step
        self.stall_ms: list[list[float]] = []
        arrivals = [a + frontend_ms for a in arrivals]
        self.model = model
        self.cap = int(model.kv_capacity_tokens)
        self.watermark = int(model.admission_watermark_tokens)
        self.max_seqs = int(model.max_num_seqs)
        self.budget_cap = int(model.max_num_batched_tokens)
        # SGLang --scheduler-recv-interval: new requests are taken in at receive points only,
        # every recv_every-th decode step and right after a step with prompt tokens
        self.recv_every = max(1, int(model.recv_interval_steps))
        self.since_recv = 0  # decode steps since the last receive point
        # vLLM's async scheduling (StepModel.schedules_ahead): while the engine is busy, a
        # step's batch is fixed when the step before it starts, so a step takes in only the
        # requests that arrived by then (seen_t: the start of the step that just ran)
        self.ahead = model.schedules_ahead
        self.seen_t = 0.0
        self.n, self.prompt, self.outl, self.arrivals = n, prompt, outl, arrivals
        self.closed = closed
        self.next_req = len(arrivals)  # closed loop: the next request id to release
        nan = float("nan")
        self.arr_t = arrivals + [nan] * (n - len(arrivals))
        self.sched_t, self.first_t, self.done_t = [nan] * n, [nan] * n, [nan] * n
        self.computed = [0] * n  # tokens in KV of prefilling requests
        self.to_prefill = [0] * n  # prompt tokens still to compute (grows after preemption)
        self.generated = [0] * n
        self.ctx_base = [0] * n
        self.gen_base = [0] * n  # decoding: tokens generated at tick t = gen_base + t
        self.preempted_at: dict[int, float] = {}  # decoding victims: when they stopped
        # SGLang's admission reserves new_token_ratio x the running requests' remaining outputs
        # (StepModel.reserves_future_tokens): the ratio, and the sums it is applied to
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO if model.reserves_future_tokens else 0.0
        self.fin_tick = [0] * n  # decoding: the tick of its last token
        self.sum_finish = self.sum_out_dec = 0  # over decoding: finish ticks, output lengths
        self.sum_pre_left = 0  # over prefilling: outputs still to generate
        self.version = [0] * n  # bumped on preemption: stale decode_heap entries are dropped
        self.tick = 0
        self.decode_heap: list[tuple[int, int, int]] = []  # (finish_tick, version, id)
        self.decoding: set[int] = set()
        self.sum_ctx_base = 0
        self.prefilling: list[int] = []  # admission order
        self.order: list[int] = []  # admission order of all running requests
        self.waiting: deque[int] = deque()
        self.reserved = 0  # prompt tokens admitted but not yet computed
        self.kv_used = 0  # tokens in cache (prefilling computed + decoding contexts)
        self.lines: dict[int, DecodeLine] = {}
        self.itl_chunks: list[Any] = []
        self.itl_counts: list[Any] = []
        self.t = 0.0
        self.arr_i = 0  # next arrival index
        self.steps = self.preempt = self.rejected = self.finished = 0
        self.decode_batch_sum = 0.0
        self.max_running = self.peak_kv = 0
        self.skip = self.adj = [0] * n  # cached prompt tokens; own KV minus context (see preload)
        import numpy as np

        self.as_array = np.array  # bound once: an import per step costs a measurable share

    def preload(self, cached: KvCached) -> None:
        """Take cached prompt tokens into account: they are skipped by prefill but count
        in every attention context; only ``own`` ones count in the request's KV use."""
        self.skip = [
            min(max(0, int(c)), p - 1) for c, p in zip(cached.tokens, self.prompt, strict=True)
        ]
        self.adj = [0] * self.n if cached.own else [-c for c in self.skip]
        self.cap = max(1, self.cap - int(cached.shared_kv_tokens))

    def run(self, max_steps: int) -> None:
        """Step until every request finished or was rejected; checks the compute budget
        (:mod:`.deadline`) every 512 iterations."""
        # Bound methods and containers in locals: this loop runs once per engine step.
        arrivals, order, waiting, decoding = self.arrivals, self.order, self.waiting, self.decoding
        preempt, schedule = self._preempt_until_decodes_fit, self._schedule_chunks
        mixed_step, decode_block = self._mixed_step, self._decode_block
        n, cap, loops = self.n, self.cap, 0
        while self.finished + self.rejected < n and self.steps < max_steps:
            loops += 1
            if not loops & 511:
                deadline.check()
                time.sleep(0)  # hand the GIL over: a server's event loop shares this process
            if (
                self.arr_i < len(arrivals)
                and arrivals[self.arr_i] <= (self.seen_t if self.ahead else self.t)
                and not self.since_recv
            ):
                self._queue_arrivals()
            if not order and not waiting:
                if self.ratio:  # an idle server starts its estimate over
                    self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO
                if not self._jump_to_next_arrival():
                    break
                continue
            preempted = decoding and self.kv_used + self.reserved + len(decoding) > cap
            if preempted:
                preempt()
            admit = not (preempted and self.model.no_admission_after_preemption)
            chunks = schedule(admit)
            if chunks:
                mixed_step(chunks)
            elif decoding:
                decode_block()
            elif not admit:
                continue  # everything was preempted: the next step admits again
            elif not self._jump_to_next_arrival():
                break  # nothing can run and nothing will arrive

    def _queue_arrivals(self) -> None:
        arrivals, t = self.arrivals, (self.seen_t if self.ahead else self.t)
        while self.arr_i < len(arrivals) and arrivals[self.arr_i] <= t:
            self.waiting.append(self.arr_i)
            self.arr_i += 1

    def _jump_to_next_arrival(self) -> bool:
        if self.arr_i >= len(self.arrivals):
            return False
        self.t = self.seen_t = max(self.t, self.arrivals[self.arr_i])
        self.since_recv = 0  # an idle scheduler polls for requests at once
        return True

    def _release_next(self, now: float) -> None:
        """Closed loop: the client whose request just ended sends its next one."""
        if self.closed and self.next_req < self.n:
            self.arr_t[self.next_req] = now + self.frontend_ms
            self.arrivals.append(now + self.frontend_ms)
            self.next_req += 1

    def _finish(self, i: int, now: float) -> None:
        self.done_t[i] = now
        self.finished += 1
        self.order.remove(i)
        self._release_next(now)

    def _preempt_until_decodes_fit(self) -> None:
        """Recompute-preempt the newest requests until every decode fits its next token
        (SGLang then raises its new-token ratio to what the remaining batch has shown)."""
        order, decoding = self.order, self.decoding
        while decoding and self.kv_used + self.reserved + len(decoding) > self.cap and order:
            victim = order.pop()
            self.preempt += 1
            if victim in decoding:
                ctx = self.ctx_base[victim] + self.tick
                # the tokens it has generated stay generated: after the recompute it
                # continues from there, it does not start its output over
                self.generated[victim] = self.gen_base[victim] + self.tick
                self.preempted_at[victim] = self.t
                self.sum_finish -= self.fin_tick[victim]
                self.sum_out_dec -= self.outl[victim]
                decoding.discard(victim)
                self.version[victim] += 1
                self.sum_ctx_base -= self.ctx_base[victim]
                self.kv_used -= ctx + self.adj[victim]
                # prompt + generated so far, recomputed (cached tokens are found again)
                self.to_prefill[victim] = ctx - self.skip[victim]
            else:
                self.prefilling.remove(victim)
                self.sum_pre_left -= self.outl[victim] - self.generated[victim]
                self.kv_used -= self.computed[victim] + self.skip[victim] + self.adj[victim]
                self.reserved -= self.to_prefill[victim]
                self.to_prefill[victim] += self.computed[victim]
            self.computed[victim] = 0
            self.waiting.appendleft(victim)
        if self.ratio and decoding:
            self._raise_ratio()

    def _raise_ratio(self) -> None:
        """SGLang's retract: the new-token ratio becomes (tokens the remaining decodes have
        generated + RETRACT_DECODE_STEPS each) / their output lengths, at most 1."""
        d = len(self.decoding)
        left = self.sum_finish - d * self.tick
        decoded = self.sum_out_dec - left
        estimate = (decoded + SGLANG_RETRACT_DECODE_STEPS * d) / max(1, self.sum_out_dec)
        self.ratio = min(1.0, max(SGLANG_MIN_NEW_TOKEN_RATIO, estimate))

    def _future_tokens(self, d: int) -> float:
        """KV the running requests are expected to still need (SGLang's reservation)."""
        return self.ratio * (self.sum_finish - d * self.tick + self.sum_pre_left)

    def _schedule_chunks(self, admit: bool = True) -> list[tuple[int, int]]:
        """This step's prefill chunks: running prompts first, then (if `admit`) FIFO
        admissions while the sequence limit, the token budget and the KV cache allow."""
        to_prefill = self.to_prefill
        d = len(self.decoding)
        # mixed steps share the token budget with the decodes; prefill-only steps have it all
        budget = self.budget_cap - (0 if self.model.prefill_first else d)
        chunks: list[tuple[int, int]] = []
        for i in self.prefilling:
            if budget <= 0:
                return chunks
            c = min(to_prefill[i], budget)
            chunks.append((i, c))
            budget -= c
        waiting, order, cap = self.waiting, self.order, self.cap
        future = self._future_tokens(d) if self.ratio else 0.0
        while admit and waiting and len(order) < self.max_seqs and budget > 0:
            i = waiting[0]
            need = to_prefill[i] or self.prompt[i] - self.skip[i]
            held = self.skip[i] + self.adj[i]  # cached KV this request holds itself
            if need + held > cap:  # can never fit: fail it rather than block the queue forever
                waiting.popleft()
                self.rejected += 1
                self._release_next(self.t)
                continue
            left = self.outl[i] - self.generated[i]
            # the engine's reserve protects running requests; an idle engine takes any prompt
            # that fits (else one whose prompt fits but not beside the reserve waits forever)
            reserve = self.watermark + future + self.ratio * left if order else 0.0
            if self.kv_used + self.reserved + d + need + held + reserve > cap:
                break  # this step's decodes need room, and the engine keeps its reserve
            waiting.popleft()
            future += self.ratio * left
            self.sum_pre_left += left
            to_prefill[i] = need
            self.reserved += need
            self.kv_used += held
            order.append(i)
            self.prefilling.append(i)
            if self.sched_t[i] != self.sched_t[i]:  # first time scheduled (NaN check)
                self.sched_t[i] = self.t
            c = min(need, budget)
            chunks.append((i, c))
            budget -= c
        return chunks

    def _decode_block(self) -> None:
        """Pure decode: advance to the next completion (or arrival, or KV limit) at once."""
        heap, decoding, version = self.decode_heap, self.decoding, self.version
        while heap and (heap[0][2] not in decoding or version[heap[0][2]] != heap[0][1]):
            heapq.heappop(heap)  # stale: preempted since it was pushed
        d = len(decoding)
        k = heap[0][0] - self.tick if heap else 1
        k = max(1, min(k, (self.cap - self.kv_used - self.reserved) // d))
        line = self.lines.get(d)
        if line is None:
            line = self.lines[d] = self.model.decode_line(d)
        pending = self.arr_i < len(self.arrivals) and len(self.order) < self.max_seqs
        limit = self.arrivals[self.arr_i] if pending else None
        kv0 = self.sum_ctx_base + d * self.tick
        every = self.recv_every
        times, self.t = _decode_block(
            line,
            self.t,
            kv0,
            d,
            k,
            limit,
            every=every,
            since_recv=self.since_recv,
            ahead=self.ahead,
        )
        k = len(times)
        self.seen_t = self.t - float(times[-1])
        self.since_recv = (self.since_recv + k) % every
        if self.ratio:
            self.ratio = max(SGLANG_MIN_NEW_TOKEN_RATIO, self.ratio - k * SGLANG_RATIO_DECAY)
        self._record_itl(times, d)
        self.decode_batch_sum += d * k
        self.steps += k
        self.tick += k
        self.kv_used += d * k
        self.peak_kv = max(self.peak_kv, self.kv_used + self.reserved)
        self._retire_decodes()

    def _record_itl(self, times: Any, d: int) -> None:
        """Decode step times of `d` sequences as intervals between their tokens: for the
        sequences that waited through prefill-only steps the first interval spans them too."""
        if not self.stall_ms:
            self.itl_chunks.append(times)
            self.itl_counts.append(d)
            return
        left = d
        for seqs, waited in self.stall_ms:
            n = min(int(seqs), left)  # fewer when some were preempted since
            if n:
                self.itl_chunks.append(times[:1] + waited)
                self.itl_counts.append(n)
                left -= n
        self.stall_ms = []
        if left:
            self.itl_chunks.append(times[:1])
            self.itl_counts.append(left)
        if len(times) > 1:
            self.itl_chunks.append(times[1:])
            self.itl_counts.append(d)

    def _mixed_step(self, chunks: list[tuple[int, int]]) -> None:
        """One step of the prefill chunks and, unless the engine prefills first, every
        decode; prompts that complete emit their first token."""
        computed, to_prefill, skip = self.computed, self.to_prefill, self.skip
        self.since_recv = 0  # a prompt step weighs past the receive interval at once
        prefill_only = self.model.prefill_first
        d = 0 if prefill_only else len(self.decoding)
        p_tokens = ctx_prefill = 0
        pairs = 0.0
        completing = []
        for i, c in chunks:
            done = computed[i] + skip[i]
            pairs += c * (done + c / 2.0)
            ctx_prefill += done
            p_tokens += c
            computed[i] += c
            if c == to_prefill[i]:
                completing.append(i)
            to_prefill[i] -= c
        tick = self.tick
        # a prefill-only step reads the prompts' own KV, not the waiting decodes'
        kv_ctx = (0 if prefill_only else self.sum_ctx_base + d * tick) + ctx_prefill
        dt = self.model.step_ms(
            p_tokens, d, kv_ctx, prefill_pairs=pairs, sampled=d + len(completing)
        )
        self.seen_t = self.t
        self.t += dt
        self.steps += 1
        if self.ratio:
            self.ratio = max(SGLANG_MIN_NEW_TOKEN_RATIO, self.ratio - SGLANG_RATIO_DECAY)
        if prefill_only:
            self._prefill_only_done(dt, p_tokens, completing)
            return
        if d:
            self._record_itl(self.as_array((dt,)), d)
            self.decode_batch_sum += d
        self.tick = tick + 1
        kv_used = self.kv_used = self.kv_used + d + p_tokens
        reserved = self.reserved = self.reserved - p_tokens
        if kv_used + reserved > self.peak_kv:
            self.peak_kv = kv_used + reserved
        if self.decode_heap and self.decode_heap[0][0] <= tick + 1:
            self._retire_decodes()
        for i in completing:
            self._start_decoding(i)
        if len(self.order) > self.max_running:
            self.max_running = len(self.order)

    def _prefill_only_done(self, dt: float, p_tokens: int, completing: list[int]) -> None:
        """After a prefill-only step: the decodes got no token (their next interval grows by
        the step), the tick stands still, the completed prompts start decoding."""
        if self.decoding:
            waited = sum(int(n) for n, _ in self.stall_ms)
            for group in self.stall_ms:
                group[1] += dt
            if len(self.decoding) > waited:  # started decoding after the last decode step
                self.stall_ms.append([len(self.decoding) - waited, dt])
        self.kv_used += p_tokens
        self.reserved -= p_tokens
        self.peak_kv = max(self.peak_kv, self.kv_used + self.reserved)
        for i in completing:
            self._start_decoding(i)
        self.max_running = max(self.max_running, len(self.order))

    def _start_decoding(self, i: int) -> None:
        """A prompt just completed and emitted its first token: finish it or decode on."""
        self.prefilling.remove(i)
        self.sum_pre_left -= self.outl[i] - self.generated[i]
        if self.first_t[i] != self.first_t[i]:
            self.first_t[i] = self.t
        elif i in self.preempted_at:  # resumed: its next token came a whole recompute later
            self.itl_chunks.append(self.as_array((self.t - self.preempted_at.pop(i),)))
            self.itl_counts.append(1)
        self.generated[i] += 1
        ctx = self.computed[i] + self.skip[i]
        self.computed[i] = 0
        if self.generated[i] >= self.outl[i]:
            self.kv_used -= ctx + self.adj[i]
            self._finish(i, self.t)
            return
        self.ctx_base[i] = ctx - self.tick
        self.gen_base[i] = self.generated[i] - self.tick
        self.sum_ctx_base += self.ctx_base[i]
        self.version[i] += 1
        finish_tick = self.tick + (self.outl[i] - self.generated[i])
        self.fin_tick[i] = finish_tick
        self.sum_finish += finish_tick
        self.sum_out_dec += self.outl[i]
        heapq.heappush(self.decode_heap, (finish_tick, self.version[i], i))
        self.decoding.add(i)

    def _retire_decodes(self) -> None:
        """Finish the decodes whose last token came at this tick (stale heap entries of
        preempted requests carry an old version and are dropped)."""
        heap, decoding, tick = self.decode_heap, self.decoding, self.tick
        while heap and heap[0][0] <= tick:
            _, ver, i = heapq.heappop(heap)
            if i in decoding and self.version[i] == ver:
                decoding.discard(i)
                self.sum_finish -= self.fin_tick[i]
                self.sum_out_dec -= self.outl[i]
                self.sum_ctx_base -= self.ctx_base[i]
                self.kv_used -= self.ctx_base[i] + tick + self.adj[i]
                self.generated[i] = self.outl[i]
                self._finish(i, self.t)

    def timeline(self) -> _Timeline:
        """Event times with arrivals as the client sent them (before the front end)."""
        sent = [a - self.frontend_ms for a in self.arr_t]
        return _Timeline(sent, self.sched_t, self.first_t, self.done_t, self.frontend_ms)

    def counters(self) -> _Counters:
        return _Counters(
            self.rejected,
            self.steps,
            self.preempt,
            self.decode_batch_sum,
            self.max_running,
            self.peak_kv,
            self.cap,
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
    line: DecodeLine,
    t: float,
    kv0: float,
    d: int,
    k: int,
    limit: float | None,
    *,
    every: int = 1,
    since_recv: int = 0,
    ahead: bool = False,
) -> tuple[Any, float]:
    """Step times of up to ``k`` pure-decode steps of ``d`` sequences from time ``t`` (KV
    tokens ``kv0``, growing by ``d`` a step), stopping at the first receive point at or after
    ``limit`` (the next arrival). With ``every`` = 1 every step is one; with SGLang's
    --scheduler-recv-interval (``every`` > 1) the steps that complete a multiple of ``every``
    decode steps since the last receive (``since_recv`` of them done before this block).
    With ``ahead`` (vLLM's async scheduling) an arrival is taken in only after a step that
    started after it, so the block runs on to the end of that step.
    Returns the times and the end time."""
    import numpy as np

    c0, c1, m0, m1, fixed, floor, knee, share = line
    if k <= 48:
        # Few steps: plain arithmetic beats numpy's per-call cost.
        times_l: list[float] = []
        now = t
        kv = kv0
        windowed = knee != math.inf
        for _ in range(k):
            # DecodeLine.attended_tokens inlined: a method call per step costs here
            a = kv - share * (kv - knee) if windowed and kv > knee else kv
            dt_s = max(c0 + c1 * a, m0 + m1 * a, floor) + fixed
            seen = now if ahead else now + dt_s
            now += dt_s
            times_l.append(dt_s)
            kv += d
            since_recv += 1
            if limit is not None and seen >= limit and not since_recv % every:
                break
        return np.array(times_l), now
    kvs = line.attended_tokens(kv0 + d * np.arange(k, dtype=float))
    times = np.maximum(np.maximum(c0 + c1 * kvs, m0 + m1 * kvs), floor) + fixed
    ends = t + np.cumsum(times)
    if limit is not None:
        seen = ends - times if ahead else ends
        if every == 1:
            cut = int(np.searchsorted(seen, limit, side="left")) + 1
        else:
            received = (seen >= limit) & ((since_recv + np.arange(1, k + 1)) % every == 0)
            cut = int(np.argmax(received)) + 1 if received.any() else k
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
    frontend_ms: float = 0.0
    """Client send to engine arrival (the request overhead), not part of the queue."""


@dataclass(frozen=True)
class _Counters:
    rejected: int
    steps: int
    preemptions: int
    decode_batch_sum: float
    max_running: int
    peak_kv: int
    kv_capacity: int


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
        queue_ms=np.array(tl.scheduled) - arr - tl.frontend_ms,
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
        kv_capacity_tokens=int(k.kv_capacity),
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
    cached: KvCached | None = None,
    whole_run: bool = False,
) -> tuple[SimResult, LoadStats]:
    """The requests under one load shape, and its statistics: a closed loop of
    `concurrency` clients (first requests spread over `stagger_ms`), an open loop
    at `rate_per_s` with gamma(`burstiness`) arrivals drawn from `seed`, or, with
    neither (or an infinite rate), every request at once (offline). `cached`: prompt
    tokens found in the KV cache (see :class:`KvCached`).

    A closed loop's statistics leave its ramps out (the steady state) unless
    `whole_run`: then they cover every request over the wall-clock duration, as
    vllm bench serve and SGLang's bench_serving report a run, the opening wave of
    `concurrency` prompts that arrive at once included."""
    if concurrency is not None:
        res = simulate(
            model,
            input_tokens,
            output_tokens,
            concurrency=concurrency,
            stagger_ms=stagger_ms,
            cached=cached,
        )
        return res, load_stats(res, None if whole_run else concurrency)
    arrivals = None
    if rate_per_s is not None and not math.isinf(rate_per_s):
        arrivals = poisson_arrivals_ms(len(input_tokens), float(rate_per_s), burstiness, seed=seed)
    res = simulate(model, input_tokens, output_tokens, arrival_ms=arrivals, cached=cached)
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
