"""The simulated engine's scheduler: one continuous-batching loop, as vLLM runs it.

Each step the loop (1) gives every running, prefilled sequence one decode
token, (2) spends what is left of the step's token budget on prefill, first of
sequences already admitted, then of waiting ones it admits while slots
(`max_num_seqs`) and KV cache allow, (3) sleeps for the step's time, and
(4) delivers the tokens. The step time comes from a timing model with one
method, `step_ms(prefill_tokens, decode_seqs, kv_tokens)`: the roofline
`StepModel` of a deployment, or `FixedTiming`, a fixed schedule. So TTFT grows
with queueing and prefill interference, and ITL with the batch, the way a real
engine behaves under load. When decode growth overflows the KV cache the
newest sequence is preempted and recomputed later (vLLM's recompute policy).

Only the stdlib here; the HTTP side is in sim_http.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import random
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

BLOCK_TOKENS = 16
"""KV block size for usage and prefix-cache accounting (vLLM's default block size)."""

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
CHAT_TOKENS_PER_MESSAGE = 4
"""Template tokens around each chat message (role header, separators)."""
CHAT_TOKENS_REPLY_PRIMER = 3
"""Template tokens that open the assistant's reply."""


def tokenize(text: str) -> list[str]:
    """The sim's tokeniser: every word (\\w+) and every other non-space character is one token.

    Deterministic and documented so that a probe can calibrate its prompt
    lengths against the `usage.prompt_tokens` it gets back.
    """
    return _TOKEN_RE.findall(text)


def chat_prompt_tokens(messages: list[tuple[str, str]]) -> list[str]:
    """Tokens of a chat prompt: the messages' text plus template tokens, as a chat template adds."""
    tokens: list[str] = []
    for role, content in messages:
        tokens.extend(["<|start|>", role, "<|sep|>", "<|end|>"][:CHAT_TOKENS_PER_MESSAGE])
        tokens.extend(tokenize(content))
    tokens.extend(["<|start|>", "assistant", "<|sep|>"][:CHAT_TOKENS_REPLY_PRIMER])
    return tokens


_WORDS = [
    "the",
    "model",
    "streams",
    "tokens",
    "while",
    "the",
    "scheduler",
    "batches",
    "requests",
    "and",
    "the",
    "cache",
    "holds",
    "keys",
    "and",
    "values",
    "for",
    "every",
    "sequence",
    "so",
    "latency",
    "depends",
    "on",
    "load",
    "prefill",
    "decode",
    "and",
    "memory",
    "bandwidth",
]


def output_token(seq_seed: int, i: int) -> str:
    """The i-th output token of a sequence: one word with a leading space (one token by `tokenize`)."""
    return " " + _WORDS[(seq_seed * 31 + i * 7) % len(_WORDS)]


class Timing(Protocol):
    """The roofline StepModel's signature; see calculators/roofline.py for the arguments."""

    def step_ms(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_tokens: int,
        prefill_pairs: float | None = None,
        sampled: int | None = None,
    ) -> float: ...


@dataclass(frozen=True)
class FixedTiming:
    """A fixed schedule: a step that prefills costs `ttft_ms`, a decode step `itl_ms`.

    Every sequence beyond the first adds `itl_per_seq_ms` to a step, so ITL
    grows with the batch; at concurrency 1 TTFT is exactly `ttft_ms` and ITL
    exactly `itl_ms`.
    """

    ttft_ms: float
    itl_ms: float
    itl_per_seq_ms: float = 0.0

    def step_ms(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_tokens: int,
        prefill_pairs: float | None = None,
        sampled: int | None = None,
    ) -> float:
        if prefill_tokens > 0:
            return self.ttft_ms + self.itl_per_seq_ms * decode_seqs
        return self.itl_ms + self.itl_per_seq_ms * max(decode_seqs - 1, 0)


class Histogram:
    """A Prometheus histogram: cumulative buckets, sum and count."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1


_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
_ITL_BUCKETS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt: list[str]
    max_tokens: int
    stop_at: int
    """Tokens after which the sequence ends (max_tokens, or an earlier simulated EOS)."""
    seed: int
    arrival_s: float = field(default_factory=time.monotonic)
    admitted_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    generated: int = 0
    prefill_target: int = 0
    prefilled: int = 0
    cached_tokens: int = 0
    kv_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    cancelled: bool = False
    delivered: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_target

    def take(self) -> int:
        """Tokens produced since the last call (for the HTTP side)."""
        n = self.generated - self.delivered
        self.delivered = self.generated
        self.ready.clear()
        return n


class PrefixCache:
    """Block hashes of prompts seen recently (LRU, bounded by the KV capacity)."""

    def __init__(self, capacity_blocks: int):
        self.capacity = max(capacity_blocks, 1)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def lookup_and_insert(self, tokens: list[str]) -> int:
        """Leading prompt tokens already cached (whole blocks); then remember this prompt's blocks."""
        h = hashlib.blake2b(digest_size=16)
        hits = 0
        matching = True
        for start in range(0, len(tokens) - len(tokens) % BLOCK_TOKENS, BLOCK_TOKENS):
            h.update("\x1f".join(tokens[start : start + BLOCK_TOKENS]).encode())
            key = h.digest()
            if matching and key in self._blocks:
                hits += BLOCK_TOKENS
                self._blocks.move_to_end(key)
            else:
                matching = False
                self._blocks[key] = None
                if len(self._blocks) > self.capacity:
                    self._blocks.popitem(last=False)
        return hits


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    steps: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(_TTFT_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(_E2E_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(_ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(_E2E_BUCKETS))


class SimEngine:
    """The continuous-batching loop. Create and use it inside one running event loop."""

    def __init__(
        self,
        timing: Timing,
        *,
        max_num_seqs: int,
        kv_capacity_tokens: int,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = True,
        eos_mean_tokens: int | None = None,
        seed: int = 0,
    ):
        self.timing = timing
        self.max_num_seqs = max_num_seqs
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefix_cache = (
            PrefixCache(kv_capacity_tokens // BLOCK_TOKENS) if enable_prefix_caching else None
        )
        self.eos_mean_tokens = eos_mean_tokens
        self.rng = random.Random(seed)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_used = 0
        self.stats = EngineStats()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._seq_counter = 0

    # ---------------------------------------------------------------- public

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def submit(
        self,
        request_id: str,
        prompt: list[str],
        max_tokens: int,
        min_tokens: int,
        ignore_eos: bool,
        *,
        natural_tokens: int | None = None,
    ) -> Sequence:
        """Queue a request; its tokens appear on the returned sequence as steps finish.
        `natural_tokens` is where the reply ends by itself (an echoed answer's length)."""
        self.ensure_started()
        self._seq_counter += 1
        stop_at = max_tokens
        if natural_tokens and not ignore_eos:
            stop_at = min(max_tokens, max(natural_tokens, min_tokens, 1))
        elif self.eos_mean_tokens and not ignore_eos:
            natural = 1 + int(self.rng.expovariate(1.0 / max(self.eos_mean_tokens, 1)))
            stop_at = min(max_tokens, max(natural, min_tokens, 1))
        seq = Sequence(
            request_id=request_id,
            prompt=prompt,
            max_tokens=max_tokens,
            stop_at=stop_at,
            seed=self._seq_counter,
        )
        seq.prefill_target = len(prompt)
        self.waiting.append(seq)
        assert self._wake is not None
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """The client went away: free the slot at the next step."""
        if not seq.finished:
            seq.cancelled = True
            if self._wake is not None:
                self._wake.set()

    @property
    def kv_usage(self) -> float:
        return min(self.kv_used / self.kv_capacity_tokens, 1.0) if self.kv_capacity_tokens else 0.0

    # ---------------------------------------------------------------- the loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        next_t = loop.time()
        while True:
            self._drop_cancelled()
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                next_t = loop.time()
                continue
            decode, prefill = self._schedule()
            if not decode and not prefill:
                # nothing admissible (e.g. KV full of cancelled work): wait for a change
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                next_t = loop.time()
                continue
            step_s = max(self._step_ms(decode, prefill), 0.0) / 1000.0
            now = loop.time()
            if next_t < now - 0.010:
                # far behind (a busy CPU, a GC pause): go on from here rather than burst steps to catch up
                next_t = now
            next_t += step_s  # an absolute schedule, so sleep overshoot does not accumulate
            # always yield, so a zero-time schedule cannot starve the HTTP side
            await asyncio.sleep(max(next_t - loop.time(), 0.0))
            self._finish_step(decode, prefill, time.monotonic())

    def _step_ms(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]) -> float:
        """Ask the timing model, with the attention work the roofline needs spelled out.

        Decode sequences attend to their whole context; a prefill chunk of n
        tokens after `done` tokens of its prompt (computed or from the prefix
        cache) attends to those and, causally, to itself: n*done + n*n/2 pairs.
        """
        prefill_tokens = sum(n for _, n in prefill)
        kv_tokens = sum(s.kv_tokens for s in decode) + sum(s.prefilled for s, _ in prefill)
        pairs = sum(n * s.prefilled + n * n / 2.0 for s, n in prefill)
        sampled = len(decode) + sum(1 for s, n in prefill if s.prefilled + n >= s.prefill_target)
        return self.timing.step_ms(prefill_tokens, len(decode), kv_tokens, pairs, sampled)

    def _drop_cancelled(self) -> None:
        if any(s.cancelled for s in self.waiting):
            self.waiting = deque(s for s in self.waiting if not s.cancelled)
        for s in [s for s in self.running if s.cancelled]:
            self._release(s, "abort")

    def _schedule(self) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        budget = self.max_num_batched_tokens or math.inf
        decode = [s for s in self.running if not s.in_prefill]
        budget -= len(decode)
        prefill: list[tuple[Sequence, int]] = []
        for s in self.running:
            if s.in_prefill and budget > 0:
                n = int(min(s.prefill_target - s.prefilled, budget))
                prefill.append((s, n))
                budget -= n
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            s = self.waiting[0]
            need_kv = s.prefill_target + 1
            if self.kv_used + need_kv > self.kv_capacity_tokens and self.running:
                break  # wait for KV to free up
            self.waiting.popleft()
            if s.admitted_s is None:
                s.admitted_s = time.monotonic()
                self.stats.queue.observe(s.admitted_s - s.arrival_s)
            if self.prefix_cache is not None and s.generated == 0:
                cached = min(
                    self.prefix_cache.lookup_and_insert(s.prompt), max(s.prefill_target - 1, 0)
                )
                self.stats.prefix_cache_queries += len(s.prompt)
                self.stats.prefix_cache_hits += cached
                s.cached_tokens = cached
                s.prefilled = cached
            s.kv_tokens = s.prefill_target
            self.kv_used += s.kv_tokens
            self.running.append(s)
            n = int(min(s.prefill_target - s.prefilled, budget))
            if n > 0 or not s.in_prefill:
                prefill.append((s, max(n, 0)))
                budget -= n
        return decode, prefill

    def _finish_step(
        self, decode: list[Sequence], prefill: list[tuple[Sequence, int]], now: float
    ) -> None:
        self.stats.steps += 1
        for s, n in prefill:
            if s.cancelled or s not in self.running:
                continue
            s.prefilled += n
            self.stats.prompt_tokens += n
            if not s.in_prefill:
                self._emit(s, now)
        for s in decode:
            if s.cancelled or s not in self.running:
                continue
            self._emit(s, now)
        self._preempt_if_full()

    def _emit(self, s: Sequence, now: float) -> None:
        s.generated += 1
        s.kv_tokens += 1
        self.kv_used += 1
        self.stats.generation_tokens += 1
        if s.first_token_s is None:
            s.first_token_s = now
            self.stats.ttft.observe(now - s.arrival_s)
        elif s.last_token_s is not None:
            self.stats.itl.observe(now - s.last_token_s)
        s.last_token_s = now
        if s.generated >= s.stop_at:
            self._release(s, "length" if s.generated >= s.max_tokens else "stop")
            self.stats.e2e.observe(now - s.arrival_s)
        s.ready.set()

    def _release(self, s: Sequence, reason: str) -> None:
        if s in self.running:
            self.running.remove(s)
            self.kv_used -= s.kv_tokens
            s.kv_tokens = 0
        s.finished = True
        s.finish_reason = reason
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        s.ready.set()

    def _preempt_if_full(self) -> None:
        while self.kv_used > self.kv_capacity_tokens and len(self.running) > 1:
            victim = self.running.pop()  # newest first, as vLLM's recompute preemption
            self.kv_used -= victim.kv_tokens
            victim.kv_tokens = 0
            victim.prefilled = 0
            victim.prefill_target = len(victim.prompt) + victim.generated
            self.waiting.appendleft(victim)
            self.stats.preemptions += 1

    # ---------------------------------------------------------------- metrics

    def metrics_text(self, model_name: str) -> str:
        """The /metrics page, with vLLM's (V1) metric names and labels."""
        lab = f'engine="0",model_name="{_escape(model_name)}"'
        st = self.stats
        lines: list[str] = []

        def metric(
            name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]
        ) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for suffix, labels, value in samples:
                lines.append(f"{name}{suffix}{{{labels}}} {_num(value)}")

        metric(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            [
                (
                    "",
                    f'block_size="{BLOCK_TOKENS}",enable_prefix_caching="{self.prefix_cache is not None}",'
                    f'engine="0",num_gpu_blocks="{self.kv_capacity_tokens // BLOCK_TOKENS}"',
                    1,
                )
            ],
        )
        metric(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("", lab, len(self.running))],
        )
        metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("", lab, len(self.waiting))],
        )
        metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("", lab, self.kv_usage)],
        )
        counters = [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                st.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                st.prefix_cache_hits,
            ),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                st.preemptions,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                st.generation_tokens,
            ),
        ]
        for name, help_text, value in counters:
            metric(f"{name}_total", "counter", help_text, [("", lab, value)])
        metric(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [("", f'{lab},finished_reason="{r}"', n) for r, n in sorted(st.finished.items())],
        )
        for name, help_text, h in (
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                st.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                st.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                st.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                st.queue,
            ),
        ):
            samples = [("_sum", lab, h.sum)]
            samples += [
                ("_bucket", f'{lab},le="{_num(b)}"', c)
                for b, c in zip(h.buckets, h.counts, strict=True)
            ]
            samples += [("_bucket", f'{lab},le="+Inf"', h.count), ("_count", lab, h.count)]
            metric(name, "histogram", help_text, samples)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: Any) -> str:
    return repr(float(value))
