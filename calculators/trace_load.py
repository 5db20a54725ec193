"""`predict --trace` and `budget --trace`: simulate a trace's own arrivals and lengths.

A fitted distribution (Poisson or gamma arrivals, lognormal lengths) smooths
away what makes a production tail: a burst of long prompts, a quiet minute
then twenty requests at once. With a trace, the continuous-batching simulation
(:func:`inferwise.calculators.batching_sim.simulate`) is fed the trace's
arrival times and lengths as they are, and the percentiles come from those
requests.

Bounded: the simulation takes the first :data:`MAX_TRACE_SIM_REQUESTS` (predict)
or ``BUDGET_TRACE_REQUESTS`` (budget, which simulates about ten times while it
searches the highest rate) requests of the window, and the result says so.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from .errors import InputError
from .traces import Trace, TraceWindow, load_trace

MAX_TRACE_SIM_REQUESTS = 4000
BUDGET_TRACE_REQUESTS = 1000


class TraceFields(BaseModel):
    """The trace flags predict and budget share (the probe has the window flags too)."""

    trace: str | None = Field(
        default=None,
        max_length=4096,
        description="Simulate this request trace file's own arrivals and lengths. "
        "Instead of a fitted distribution; formats as in probe --trace.",
    )
    trace_format: Literal["mooncake", "burstgpt", "azure", "jsonl"] | None = Field(
        default=None, description="Format of the trace; default: guessed from its first line."
    )
    trace_time_scale: float = Field(
        default=1.0,
        ge=0.001,
        le=1000,
        description="Replay speed of the trace: inter-arrival times are divided by it.",
    )

    @model_validator(mode="after")
    def _trace_is_the_load(self) -> TraceFields:
        if self.trace is None:
            if self.trace_format is not None or self.trace_time_scale != 1.0:
                raise ValueError("trace_format and trace_time_scale need a trace")
            return self
        clash = (
            "concurrency",
            "request_rate",
            "input_tokens_p95",
            "output_tokens_p95",
            "disaggregate",
        )
        for name in clash:
            if getattr(self, name, None) is not None:
                raise ValueError(f"a trace sets the load and the lengths: give trace or {name}")
        for name in ("input_tokens", "output_tokens"):  # defaulted: a changed value clashes
            field = type(self).model_fields.get(name)
            if field is not None and getattr(self, name) != field.default:
                raise ValueError(f"a trace sets the load and the lengths: give trace or {name}")
        return self


def read_trace(req: Any, limit: int) -> Trace:
    """The request's trace, its first `limit` requests, checked against the context window."""
    trace = load_trace(
        req.trace,
        req.trace_format,
        TraceWindow(time_scale=req.trace_time_scale, max_requests=limit),
    )
    max_len = _max_len(req)
    if max_len is not None:
        trace.check_context(max_len)
    return trace


def _max_len(req: Any) -> int | None:
    from .predict import _model_max_len

    return req.max_model_len or _model_max_len(req)


def trace_arrays(trace: Trace) -> tuple[Any, Any, Any]:
    """(input tokens, output tokens, arrival ms from the first request) as numpy arrays."""
    import numpy as np

    arr = np.asarray(trace.arrival_s, dtype=float)
    return (
        np.asarray(trace.input_tokens, dtype=np.int64),
        np.asarray(trace.output_tokens, dtype=np.int64),
        (arr - arr[0]) * 1e3,
    )


def run_trace_load(req: Any, model: Any, n: int | None = None) -> tuple[Any, Trace]:
    """Simulate the trace (at most `n` or MAX_TRACE_SIM_REQUESTS of its requests), with the
    request's prefix-cache hits when it gives a hit rate; a LoadRun as predict's."""
    from .batching_sim import load_stats, simulate
    from .predict import LoadRun
    from .prefix_cache import plan_hits

    limit = min(n or req.num_requests or MAX_TRACE_SIM_REQUESTS, MAX_TRACE_SIM_REQUESTS)
    trace = read_trace(req, limit)
    inp, out, arrival_ms = trace_arrays(trace)
    prefix = plan_hits(req, model, inp, out, None)
    res = simulate(model, inp, out, arrival_ms=arrival_ms, cached=prefix and prefix.cached)
    baseline = load_stats(simulate(model, inp, out, arrival_ms=arrival_ms)) if prefix else None
    return LoadRun(res, load_stats(res), inp, out, prefix, baseline), trace


def scaled_arrivals_ms(arrival_ms: Any, trace_rate: float, rate: float) -> Any:
    """The trace's arrivals replayed at mean rate `rate` instead of its own `trace_rate`."""
    if not (rate > 0 and math.isfinite(rate)) or trace_rate <= 0:
        raise InputError("request_rate", f"cannot replay a trace at {rate:g} req/s")
    return arrival_ms * (trace_rate / rate)


def trace_rate_per_s(trace: Trace) -> float:
    """Mean arrivals per second of the simulated requests (n / span)."""
    return trace.mean_rate_per_s


def trace_note(trace: Trace, limit: int) -> str:
    """The assumption line: what was replayed, and the cap when it cut the trace."""
    cut = (
        f" (the first {len(trace):,} of {trace.total_rows:,}: at most {limit:,} are simulated)"
        if len(trace) < trace.total_rows
        else ""
    )
    scale = trace.window.time_scale
    speed = f" at {scale:g}x speed" if scale != 1 else ""
    return (
        f"arrivals and lengths replayed from trace {trace.name} ({trace.format}, sha256 "
        f"{trace.sha256[:12]}){speed}: {len(trace):,} requests{cut}, mean "
        f"{trace_rate_per_s(trace):.3g} req/s"
    )
