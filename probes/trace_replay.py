"""`probe --trace`: replay a production trace's arrivals, lengths and shared prefixes.

The trace (read by :mod:`inferwise.calculators.traces`) becomes the open loop's
schedule as it is: request k is sent at the run's start + its (windowed,
scaled) arrival, by the same absolute-time scheduler as a Poisson run
(:func:`inferwise.probes.loadgen.open_loop`), so a late send is measured as
schedule delay and never shifts the rest.

Prompts are synthetic words sized by the probe's tokenizer calibration to the
trace's input length, and the output is capped (and, with ignore_eos, fixed) at
its output length. A Mooncake trace names its prompt's 512-token blocks by
hash id: block ``h`` is always the same words (from ``h`` and the run's salt),
so two requests that share their first hash ids share exactly that prompt
prefix, and a server's prefix cache sees the trace's real reuse; words past the
named blocks are the request's own. Warm-up requests take the trace's lengths
with words of their own, so they warm the server without filling its prefix
cache with the trace's blocks.

Runs on the trace are one load point: a sweep of speeds is several calls with
``--trace-time-scale``.
"""

from __future__ import annotations

import functools
import json
import random
from typing import Any

from inferwise.calculators.errors import InputError
from inferwise.calculators.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceWindow, load_trace
from inferwise.probes.prompts import WORDS, PromptItem
from inferwise.probes.runner import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS


def load_probe_trace(req: Any) -> Trace:
    """The trace a ProbeRequest names, windowed and scaled, at most `requests` long."""
    window = TraceWindow(
        start_s=req.trace_start,
        duration_s=req.trace_duration,
        time_scale=req.trace_time_scale,
        max_requests=req.requests,
    )
    trace = load_trace(req.trace, req.trace_format, window)
    for what, values, cap in (
        ("input", trace.input_tokens, MAX_PROMPT_TOKENS),
        ("output", trace.output_tokens, MAX_OUTPUT_TOKENS),
    ):
        longest = max(values)
        if longest > cap:
            i = values.index(longest)
            raise InputError(
                "trace",
                f"row {trace.rows[i]}: {what} {longest:,} tokens is over the probe's cap of {cap:,}",
            )
    return trace


def with_trace(req: Any, trace: Trace) -> Any:
    """The request the run executes: an open loop at the trace's mean rate (its words and
    the stored config), the trace's length as the request count, its mean lengths."""
    n = len(trace)
    mean_in = max(1, round(sum(trace.input_tokens) / n))
    mean_out = max(1, round(sum(trace.output_tokens) / n))
    return req.model_copy(
        update={
            "request_rate": trace.mean_rate_per_s or 1.0,
            "requests": n if req.requests is None else min(req.requests, n),
            "input_tokens": mean_in,
            "output_tokens": mean_out,
        }
    )


def trace_schedule(
    trace: Trace, start_s: float, count: int | None, duration_s: float | None
) -> list[float]:
    """The open loop's absolute send times: the trace's arrivals from `start_s`."""
    out: list[float] = []
    for a in trace.arrival_s:
        if count is not None and len(out) >= count:
            break
        if duration_s is not None and a > duration_s:
            break
        out.append(start_s + a)
    return out


async def check_server_context(ctx: Any, trace: Trace) -> str | None:
    """Refuse the trace before anything is measured when a request is longer than the
    model's context window the server states (vLLM and the simulated engine list
    ``max_model_len`` at /v1/models). A note when the server does not say."""
    from inferwise.probes.client import exchange

    out = await exchange(
        ctx.pool, "/models", b"", api_key=ctx.api_key, timeouts=ctx.timeouts, method="GET"
    )
    limit = None
    try:
        data = json.loads(b"".join(d for _, d in out.reads))
        for m in data.get("data", []):
            if m.get("id") == ctx.model or limit is None:
                v = m.get("max_model_len")
                limit = int(v) if isinstance(v, int) and v > 0 else limit
    except (ValueError, TypeError, AttributeError):
        limit = None
    if limit is None:
        return "the server does not state its context window: trace lengths were not checked"
    trace.check_context(limit)
    return None


class TracePrompts:
    """PromptItems of a trace's requests, for :class:`inferwise.probes.prompts.Workload`."""

    def __init__(self, trace: Trace, first_index: int) -> None:
        self.trace = trace
        self.first_index = first_index

    def item(self, workload: Any, index: int) -> PromptItem:
        n = len(self.trace)
        k = index - self.first_index
        rng = random.Random(f"trace-{workload.seed}-{workload.salt}-{index}")
        if k < 0:  # warm-up: the trace's lengths, words of its own
            row = index % n
            target = self.trace.input_tokens[row]
            return PromptItem(
                workload.synthetic_text(rng, target), self.trace.output_tokens[row], target
            )
        k %= n
        target = self.trace.input_tokens[k]
        words = workload.words_for(target)
        ids = self.trace.hash_ids[k] if self.trace.hash_ids else []
        per_block = max(1, round(MOONCAKE_BLOCK_TOKENS / workload.tokens_per_word))
        parts: list[str] = []
        used = 0
        for h in ids:
            if used >= words:
                break
            take = min(per_block, words - used)
            parts.extend(_block_words(workload.salt, h, per_block)[:take])
            used += take
        if used < words:
            parts.extend(rng.choices(WORDS, k=words - used))
        return PromptItem(" ".join(parts), self.trace.output_tokens[k], target)


@functools.lru_cache(maxsize=8192)
def _block_words(salt: int, hash_id: int, words: int) -> tuple[str, ...]:
    """The words of one 512-token block: the same for every request naming `hash_id` in a
    run (a fresh salt per run, so a rerun does not find them cached)."""
    return tuple(random.Random(f"block-{salt}-{hash_id}").choices(WORDS, k=words))
