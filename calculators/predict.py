"""Predict TTFT, ITL, TPOT, end-to-end latency and throughput of a deployment at a load.

Two models combined: the per-step roofline (``roofline.StepModel``: how long
one engine step of a given composition takes on these GPUs, with calibrated
efficiency factors) and the continuous-batching simulation
(``batching_sim``: how the scheduler composes those steps as requests
arrive, queue, prefill in chunks, decode and get preempted). The simulation
yields per-request distributions, so latencies are reported as percentile
objects ``{mean, p50, p90, p95, p99}`` in milliseconds, the same shape as a
probe run's ``summary`` so predicted and measured numbers compare directly.

Registry entry points: :class:`PredictRequest`, :class:`PredictResult`,
:func:`predict_performance`. Module level: stdlib, pydantic and light project
modules only (numpy is imported by the functions that need it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .bounds import MAX_BURSTINESS, MAX_SEED, MIN_BURSTINESS, check_rate
from .deployment import Deployment
from .disaggregation import DisaggregationFields, DisaggregationResult
from .disaggregation_eval import aggregated_share
from .errors import InputError, OperationalError
from .intervals import PredictIntervals
from .prefix_cache import PrefixCacheFields, PrefixCacheResult, PrefixPlan
from .spec_decode import SpeculativeFields, SpeculativeResult
from .trace_load import TraceFields
from .user_calibration import AppliedCalibration

Bound = Literal["compute", "memory-bandwidth", "communication", "overhead"]
PERCENTILES = (50, 90, 95, 99)
MAX_REQUESTS = 4000


class PredictRequest(
    TraceFields, DisaggregationFields, PrefixCacheFields, SpeculativeFields, Deployment
):
    """A deployment and the load to predict it under."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = Field(
        default=1024,
        ge=1,
        le=2_000_000,
        description="Prompt length per request in tokens (the median when input_tokens_p95 is given).",
    )
    output_tokens: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="Generated tokens per request (the median when output_tokens_p95 is given).",
    )
    input_tokens_p95: int | None = Field(
        default=None,
        ge=1,
        le=2_000_000,
        description="95th percentile prompt length; lengths are then drawn from a lognormal fitted to the median and p95.",
    )
    output_tokens_p95: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="95th percentile output length; lengths are then lognormal (median, p95).",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Closed loop: this many requests in flight at all times (benchmark --max-concurrency).",
    )
    request_rate: float | None = Field(
        default=None,
        gt=0,
        description="Open loop: mean arrival rate in requests per second; inf = offline, every request at once.",
    )
    burstiness: float = Field(
        default=1.0,
        ge=MIN_BURSTINESS,
        le=MAX_BURSTINESS,
        description="Gamma shape of inter-arrival gaps for request_rate: 1 = Poisson, < 1 burstier, > 1 smoother.",
    )
    num_requests: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REQUESTS,
        description=f"Requests to simulate, at most {MAX_REQUESTS}. Given (a benchmark's --num-prompts), a closed loop's figures cover all of them, as benchmark clients report a run; not given: enough for stable percentiles (10 x concurrency, or ~60 s of arrivals), the ramps left out.",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=MAX_SEED,
        description="Seed for arrivals and length draws (same seed, same answer).",
    )
    calibration: str | None = Field(
        default=None,
        max_length=64,
        description="Name of a stored calibration (inferwise calibrate) whose fitted factors replace the published ones.",
    )

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, v: float | None) -> float | None:
        return check_rate(v, allow_inf=True)

    @model_validator(mode="after")
    def _one_load(self) -> PredictRequest:
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give concurrency or request_rate, not both")
        check_p95_lengths(self)
        return self


def check_p95_lengths(req: Any) -> None:
    """A p95 length below the median cannot describe a distribution (predict and budget)."""
    if req.input_tokens_p95 is not None and req.input_tokens_p95 < req.input_tokens:
        raise ValueError("input_tokens_p95 must be >= input_tokens (the median)")
    if req.output_tokens_p95 is not None and req.output_tokens_p95 < req.output_tokens:
        raise ValueError("output_tokens_p95 must be >= output_tokens (the median)")


class Percentiles(BaseModel):
    """A distribution over requests (tokens for ITL), milliseconds."""

    mean: float
    p50: float
    p90: float
    p95: float
    p99: float


class Load(BaseModel):
    mode: Literal["concurrency", "rate", "offline", "trace"]
    concurrency: int | None = None
    request_rate: float | None = Field(
        default=None, description="Requests per second; null for closed-loop or offline."
    )
    burstiness: float | None = None
    num_requests: int
    input_tokens: dict[str, float] = Field(description="Simulated prompt lengths: mean, p50, p95.")
    output_tokens: dict[str, float] = Field(description="Simulated output lengths: mean, p50, p95.")
    trace: dict[str, Any] | None = Field(
        default=None, description="The replayed trace (name, sha256, format, requests)."
    )


class StepBreakdown(BaseModel):
    """A typical decode step at the simulated mean batch and context, and one prompt's prefill alone."""

    decode_batch: float = Field(description="Mean sequences decoding per step in the simulation.")
    decode_step_ms: float
    compute_ms: float
    memory_ms: float
    communication_ms: float
    overhead_ms: float
    prefill_ms: float = Field(
        description="Prefill of one median prompt on an idle engine (chunked)."
    )
    bound_shares: dict[str, float] = Field(
        description="Share of modelled GPU time per bound over the run."
    )


class Saturation(BaseModel):
    """Where one replica stops absorbing more load."""

    max_requests_per_s: float = Field(
        description="Highest sustainable request rate (offered load above it queues without bound)."
    )
    max_output_tokens_per_s: float
    batch_at_saturation: int = Field(description="Sequences running at once at saturation.")
    limited_by: Literal["max_num_seqs", "kv_cache"]
    utilization: float | None = Field(
        default=None, description="Offered request rate / max_requests_per_s (rate mode)."
    )


class PredictResult(BaseModel):
    """Predicted serving performance; latencies in ms as {mean, p50, p90, p95, p99}."""

    model: str
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    engine: str
    load: Load
    ttft_ms: Percentiles = Field(description="Time to first token per request (queueing included).")
    itl_ms: Percentiles | None = Field(
        description="Inter-token latency over all token gaps of all requests; null when every "
        "request generates one token (there is no gap)."
    )
    tpot_ms: Percentiles | None = Field(
        description="Per request: (e2e - ttft) / (output tokens - 1); null for one-token outputs."
    )
    e2e_ms: Percentiles = Field(
        description="Request latency from arrival to last token, server side."
    )
    queue_ms: Percentiles = Field(description="Arrival to first scheduling step.")
    output_tokens_per_s: float
    requests_per_s: float
    total_tokens_per_s: float
    bound: Bound = Field(
        description="Term that contributes most GPU time: compute, memory-bandwidth, communication or overhead."
    )
    step: StepBreakdown
    saturation: Saturation
    kv_cache_tokens: int = Field(description="KV cache capacity from the memory fit.")
    peak_kv_cache_usage: float = Field(
        description="Peak share of the KV cache in use during the run."
    )
    max_num_seqs: int
    max_num_batched_tokens: int
    preemptions: int
    factors: dict[str, float] = Field(
        description="Efficiency factors used (calibrated, data/efficiency.toml)."
    )
    factors_source: str
    assumptions: list[str]
    warnings: list[str]
    speculative: SpeculativeResult | None = Field(
        default=None,
        description="What speculative decoding buys at this load (null when speculative_method is not set).",
    )
    prefix_cache: PrefixCacheResult | None = Field(
        default=None,
        description="What the prefix cache buys at this load (null when prefix_cache_hit_rate is not set).",
    )
    disaggregation: DisaggregationResult | None = Field(
        default=None,
        description="The P:D split against aggregated replicas on the same GPUs (null when aggregated).",
    )
    intervals: PredictIntervals | None = Field(
        default=None,
        description="p10-p90 range of each metric from held-out published measurements.",
    )
    replicas: int = Field(
        default=1,
        description="Data-parallel replicas (num_gpus / (tensor x pipeline parallel)); latencies are one replica's, throughputs the fleet's.",
    )
    calibration: AppliedCalibration | None = Field(
        default=None,
        description="The calibration used (its sources and residual_spread); null: published factors.",
    )


# --------------------------------------------------------------------------- helpers shared with budget


def percentiles(values: Any) -> Percentiles | None:
    """The distribution of the finite values; None when there are none (a TPOT of
    one-token outputs): a number where there is none would be a NaN in the output."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    p = np.percentile(v, PERCENTILES)
    return Percentiles(
        mean=float(v.mean()), p50=float(p[0]), p90=float(p[1]), p95=float(p[2]), p99=float(p[3])
    )


def weighted_percentiles(values: Any, weights: Any) -> Percentiles | None:
    from .batching_sim import weighted_summary

    mean, (p50, p90, p95, p99) = weighted_summary(values, weights, PERCENTILES)
    if not math.isfinite(mean):
        return None
    return Percentiles(mean=mean, p50=p50, p90=p90, p95=p95, p99=p99)


def measured(dist: Percentiles | None, what: str) -> Percentiles:
    """A distribution every completed request has (TTFT, E2E): none means nothing completed."""
    if dist is None:
        raise OperationalError(
            f"no simulated request completed, so there is no {what}; check the memory fit "
            "(inferwise fit) for the context length and concurrency"
        )
    return dist


def _dist(values: Any) -> dict[str, float]:
    import numpy as np

    v = np.asarray(values, dtype=float)
    return {
        "mean": float(v.mean()),
        "p50": float(np.percentile(v, 50)),
        "p95": float(np.percentile(v, 95)),
    }


def check_lengths(req: Any) -> None:
    """A request longer than the context window (max_model_len, by default the model's
    own) can never be served."""
    max_model_len = req.max_model_len or _model_max_len(req)
    if max_model_len is None:
        return
    longest_in = req.input_tokens_p95 or req.input_tokens
    longest_out = req.output_tokens_p95 or req.output_tokens
    if req.input_tokens + req.output_tokens > max_model_len:
        raise InputError(
            "input_tokens",
            f"input_tokens + output_tokens = {req.input_tokens + req.output_tokens} exceeds the "
            f"context window max_model_len {max_model_len}",
        )
    if longest_in + longest_out > 4 * max_model_len:
        raise InputError(
            "input_tokens_p95", f"p95 lengths far beyond max_model_len {max_model_len}"
        )


def workload_arrays(req: Any, n: int, max_len: int | None) -> tuple[Any, Any]:
    """Per-request input and output lengths (fixed, or lognormal from p50/p95), capped to the window."""
    import numpy as np

    from .batching_sim import lognormal_lengths

    inp = lognormal_lengths(req.input_tokens, req.input_tokens_p95, n, seed=req.seed + 1)
    out = lognormal_lengths(req.output_tokens, req.output_tokens_p95, n, seed=req.seed + 2)
    if max_len:
        inp = np.minimum(inp, max(1, max_len - 1))
        out = np.minimum(out, np.maximum(1, max_len - inp))
    return inp, out


def default_num_requests(concurrency: int | None, rate: float | None) -> int:
    """Enough requests for stable percentiles, few enough to stay fast."""
    if concurrency:
        n = max(10 * concurrency, 200)
    elif rate is not None and math.isfinite(rate):
        n = int(max(200, min(rate * 60.0, 1000)))
    else:
        n = 500
    return min(n, MAX_REQUESTS)


def whole_run(req: Any) -> bool:
    """Whether a closed loop's figures cover every request: yes when the request count is
    given, since that describes a benchmark run (``--num-prompts``) and benchmark clients
    report all of it, the opening wave of `concurrency` prompts included; no when the count
    is ours, where the ramps are left out and the figures are the steady state."""
    return getattr(req, "num_requests", None) is not None


def saturation_point(
    model: Any, mean_in: float, mean_out: float, cached_share: float = 0.0
) -> Saturation:
    """Analytical capacity: the batch the engine can hold and how fast it turns over.

    At saturation the engine runs B = min(max_num_seqs, KV capacity / mean
    context) sequences; each request costs its prefill compute plus its share
    of B-wide decode steps, so requests/s = B / (out x t_decode(B) + B x
    t_prefill_marginal).
    """
    ctx = mean_in + mean_out / 2.0
    kv_limit = int(model.context_capacity_tokens(ctx) // max(1.0, mean_in + mean_out))
    batch = max(1, min(model.max_num_seqs, kv_limit))
    limited_by: Literal["max_num_seqs", "kv_cache"] = (
        "max_num_seqs" if model.max_num_seqs <= kv_limit else "kv_cache"
    )
    t_dec = model.decode_ms(batch, ctx)
    # Marginal prefill cost: the prefill steps minus the fixed per-step overhead they share
    # with decodes; prefix-cache hits (``cached_share`` of the prompt) are not computed.
    t_pf = model.marginal_prefill_ms(max(1.0, mean_in * (1.0 - cached_share)))
    per_batch_ms = mean_out * t_dec + batch * t_pf
    rps = batch / (per_batch_ms / 1e3) if per_batch_ms > 0 else math.inf
    return Saturation(
        max_requests_per_s=rps,
        max_output_tokens_per_s=rps * mean_out,
        batch_at_saturation=batch,
        limited_by=limited_by,
    )


@dataclass(frozen=True)
class LoadRun:
    """One simulated load: the engine's result, the client's statistics, the lengths, and
    (with prefix-cache hits) the hits and the same load's statistics without them."""

    res: Any
    stats: Any
    inp: Any
    out: Any
    prefix: PrefixPlan | None = None
    stats_without_cache: Any = None


def run_load(req: Any, model: Any, n: int | None = None) -> LoadRun:
    """Simulate the request's load on `model`, with its prefix-cache hits if it has any."""
    from .batching_sim import simulate_load
    from .prefix_cache import plan_hits

    rate = req.request_rate
    conc = req.concurrency
    if conc is None and rate is None:
        conc = 1
    n = n or req.num_requests or default_num_requests(conc, rate)
    inp, out = workload_arrays(req, n, getattr(req, "max_model_len", None))
    load = {
        "concurrency": conc,
        "rate_per_s": rate,
        "burstiness": req.burstiness,
        "seed": req.seed,
        "whole_run": whole_run(req),
    }
    prefix = plan_hits(req, model, inp, out, conc)
    res, stats = simulate_load(model, inp, out, cached=prefix and prefix.cached, **load)
    baseline = simulate_load(model, inp, out, **load)[1] if prefix else None
    return LoadRun(res, stats, inp, out, prefix, baseline)


def bound_of(
    model: Any, res: Any, mean_in: float, mean_out: float
) -> tuple[Bound, dict[str, float], Any]:
    """Dominant term over a run: per request, its prefill alone plus its decode
    steps at the simulated mean batch (each step's time shared by the batch)."""
    batch = max(1.0, res.mean_decode_batch)
    dec = model.breakdown(0, int(round(batch)), int(batch * (mean_in + mean_out / 2.0)))
    chunk = max(1.0, min(mean_in, model.max_num_batched_tokens))
    pf = model.breakdown(int(chunk), 0, 0, sampled=1)
    per_req = dict.fromkeys(("compute", "memory-bandwidth", "communication", "overhead"), 0.0)
    for step, weight in ((pf, mean_in / chunk), (dec, mean_out / batch)):
        roof = "compute" if step.compute_ms >= step.memory_ms else "memory-bandwidth"
        per_req[roof] += max(step.compute_ms, step.memory_ms) * weight
        per_req["communication"] += step.communication_ms * weight
        per_req["overhead"] += step.overhead_ms * weight
    total = sum(per_req.values()) or 1.0
    shares = {k: v / total for k, v in per_req.items()}
    bound: Bound = max(shares, key=lambda k: shares[k])  # type: ignore[assignment]
    return bound, shares, dec


# --------------------------------------------------------------------------- entry point


def predict_performance(
    req: PredictRequest, calibration: AppliedCalibration | None = None
) -> PredictResult:
    """Simulate the deployment under the requested load; see the module docstring.

    Without max_model_len, a model whose default context does not fit is predicted
    at the longest context that does (``context_window``), said in the assumptions.
    A calibration (loaded by the door from req.calibration) replaces the published factors."""
    from .context_window import with_fitting_context

    req, context_note = with_fitting_context(req)
    replica, replicas = one_replica(req)
    result = _predict(replica, calibration)
    if replicas > 1:
        _as_fleet(result, req, replica, replicas)
    if context_note:
        result.assumptions.insert(0, context_note)
    from .intervals import predict_intervals
    from .roofline import StepModel

    experts = StepModel.from_deployment(replica).shape.num_experts  # cached: the run's own model
    result.intervals = predict_intervals(  # the regime is one replica's load
        result, req.engine, replica.concurrency, replica.request_rate, experts
    )
    if calibration is not None:
        _apply_calibration(req, result, calibration)
    return result


def one_replica(req: PredictRequest) -> tuple[PredictRequest, int]:
    """The request one data-parallel replica serves, and how many replicas there are.

    GPUs beyond tensor x pipeline parallelism are more replicas of the same engine behind a
    load balancer (as ``fit`` reads num_gpus), each taking an even share of the load: a
    closed loop's concurrency (rounded up: the busiest replica), an arrival rate, an offline
    batch. A trace replay and a P:D split are simulated on one replica only."""
    world = req.world_size
    gpus = req.gpus_named()
    if gpus == world:
        return req, 1
    if gpus % world:
        raise InputError(
            "num_gpus",
            f"{gpus} GPUs is not a whole number of replicas of {world} GPU(s) "
            "(tensor_parallel_size x pipeline_parallel_size)",
            f"a multiple of {world}",
        )
    if req.trace is not None or req.disaggregate is not None:
        raise InputError(
            "num_gpus",
            "a trace replay and a P:D split are predicted on one replica",
            f"{world} (tensor_parallel_size x pipeline_parallel_size), or leave it out",
        )
    n = gpus // world
    share: dict[str, Any] = {"num_gpus": world}
    if req.concurrency is not None:
        share["concurrency"] = math.ceil(req.concurrency / n)
    elif req.request_rate is not None and not math.isinf(req.request_rate):
        share["request_rate"] = req.request_rate / n
    if req.num_requests is not None:
        share["num_requests"] = math.ceil(req.num_requests / n)
    return req.model_copy(update=share), n


def _as_fleet(result: PredictResult, req: PredictRequest, replica: PredictRequest, n: int) -> None:
    """One replica's prediction restated for `n` of them: the fleet's load and throughputs;
    latencies stay one replica's (every replica sees the same share)."""
    result.replicas = n
    # a closed loop that does not divide evenly: the busiest replica's share was simulated,
    # and the fleet's in-flight requests are the asked concurrency, not n x that share
    scale = req.concurrency / replica.concurrency if req.concurrency and replica.concurrency else n
    result.output_tokens_per_s *= scale
    result.requests_per_s *= scale
    result.total_tokens_per_s *= scale
    if result.load.concurrency is not None and req.concurrency is not None:
        result.load.concurrency = req.concurrency
    if result.load.request_rate is not None and req.request_rate is not None:
        result.load.request_rate = req.request_rate
    load = (
        f"concurrency {replica.concurrency}"
        if replica.concurrency is not None
        else f"{replica.request_rate:.4g} requests/s"
        if replica.request_rate is not None and not math.isinf(replica.request_rate)
        else "its share of the batch"
    )
    result.assumptions.insert(
        0,
        f"{n} data-parallel replicas of {replica.world_size} GPU(s) on the {req.num_gpus} GPUs, the load split evenly by a balancer: each replica "
        f"is simulated at {load} ({result.load.num_requests} requests); latencies are one "
        "replica's, throughputs the fleet's (arrivals split at random stay Poisson; a "
        "round-robin balancer is a little smoother)",
    )


def _apply_calibration(req: PredictRequest, result: PredictResult, calibration: Any) -> None:
    from .intervals import calibrated_intervals
    from .user_calibration import calibration_notes

    result.calibration = calibration
    if result.intervals is not None:
        load = (result.load.concurrency, result.load.request_rate)
        result.intervals = calibrated_intervals(
            result.intervals, _interval_values(result), calibration, load
        )
    result.factors_source = f"calibration {calibration.name!r} over {result.factors_source}"
    result.assumptions[:0] = calibration_notes(calibration, req.model, req.gpu)


def _interval_values(result: PredictResult) -> dict[str, float | None]:
    """The predicted values the intervals bound (the latencies' medians, the throughputs)."""
    return {
        "ttft_ms": result.ttft_ms.p50,
        "itl_ms": result.itl_ms.p50 if result.itl_ms else None,
        "tpot_ms": result.tpot_ms.p50 if result.tpot_ms else None,
        "e2e_ms": result.e2e_ms.p50,
        "output_tokens_per_s": result.output_tokens_per_s,
        "requests_per_s": result.requests_per_s,
    }


def step_model_for(req: Any, calibration: AppliedCalibration | None) -> Any:
    """The deployment's step model, with a calibration's factors when one is given."""
    from .roofline import StepModel

    model = StepModel.from_deployment(req)
    if calibration is None:
        return model
    from .user_calibration import calibrated_efficiency

    return StepModel.from_deployment(
        req, calibrated_efficiency(model.efficiency, calibration.factors)
    )


def _predict(req: PredictRequest, calibration: AppliedCalibration | None) -> PredictResult:
    import numpy as np

    from .disaggregation import parse_split

    model = step_model_for(req, calibration)
    split = parse_split(req)
    run_req = aggregated_share(req, split) if split else req
    run, trace = _simulated(req, run_req, model)
    res, stats, inp, out = run.res, run.stats, run.inp, run.out
    mean_in, mean_out = float(inp.mean()), float(out.mean())
    bound, shares, dec = bound_of(model, res, mean_in, mean_out)
    sat = saturation_point(
        model, mean_in, mean_out, run.prefix.effective_hit_rate if run.prefix else 0
    )
    mode = "trace" if trace is not None else _load_mode(req)
    warnings = _sim_warnings(run_req, model, res, sat, mode, len(inp), trace)
    itl = weighted_percentiles(stats.itl_values, stats.itl_weights)
    from .spec_decode import at_load

    spec = at_load(
        req,
        model,
        res,
        mean_in,
        mean_out,
        itl,
        stats.output_tokens_per_s,
        trace is None and (req.concurrency is not None or req.request_rate is None),
    )
    result = PredictResult(
        model=req.model,
        gpu=model.hardware.name,
        tensor_parallel_size=req.tensor_parallel_size,
        pipeline_parallel_size=req.pipeline_parallel_size,
        engine=req.engine,
        load=_load(req, mode, inp, out, trace),
        ttft_ms=measured(percentiles(stats.ttft_ms), "TTFT"),
        itl_ms=itl,
        tpot_ms=percentiles(stats.tpot_ms),
        e2e_ms=measured(percentiles(stats.e2e_ms), "end-to-end latency"),
        queue_ms=measured(percentiles(stats.queue_ms), "queue time"),
        output_tokens_per_s=stats.output_tokens_per_s,
        requests_per_s=stats.requests_per_s,
        total_tokens_per_s=stats.total_tokens_per_s,
        bound=bound,
        step=StepBreakdown(
            decode_batch=float(res.mean_decode_batch),
            decode_step_ms=dec.total_ms,
            compute_ms=dec.compute_ms,
            memory_ms=dec.memory_ms,
            communication_ms=dec.communication_ms,
            overhead_ms=dec.overhead_ms,
            prefill_ms=model.prefill_ms(int(np.median(inp))),
            bound_shares={k: round(v, 4) for k, v in shares.items()},
        ),
        saturation=sat,
        kv_cache_tokens=int(model.kv_capacity_tokens),
        peak_kv_cache_usage=min(
            1.0, res.peak_kv_tokens / max(1, res.kv_capacity_tokens or model.kv_capacity_tokens)
        ),
        max_num_seqs=admitted_batch(model, mean_in + mean_out),
        max_num_batched_tokens=model.max_num_batched_tokens,
        preemptions=int(res.preemptions),
        factors=model.efficiency.describe(),
        factors_source=model.efficiency.source,
        assumptions=_predict_assumptions(req, model, mode, trace, mean_in + mean_out),
        warnings=warnings,
        speculative=spec,
        prefix_cache=_prefix_result(run, itl),
    )
    return _disaggregated(req, model, split, run, result) if split else result


def _simulated(req: PredictRequest, run_req: Any, model: Any) -> tuple[LoadRun, Any]:
    """The simulated load and, for a trace, the trace: its own arrivals and lengths (each
    row checked against the context as it is read), else the asked load shape."""
    if req.trace is None:
        check_lengths(req)
        return run_load(run_req, model), None
    from .trace_load import run_trace_load

    return run_trace_load(req, model)


def _load(req: PredictRequest, mode: str, inp: Any, out: Any, trace: Any) -> Load:
    rate = req.request_rate if mode == "rate" else None
    return Load(
        mode=mode,  # type: ignore[arg-type]
        concurrency=(req.concurrency or 1) if mode == "concurrency" else None,
        request_rate=_trace_rate(trace) if trace is not None else rate,
        burstiness=req.burstiness if mode == "rate" else None,
        num_requests=len(inp),
        input_tokens=_dist(inp),
        output_tokens=_dist(out),
        trace=trace.describe() if trace is not None else None,
    )


def _disaggregated(
    req: Any, model: Any, split: Any, run: LoadRun, result: PredictResult
) -> PredictResult:
    """Predict's figures for the disaggregated replica; the aggregated ones (the same GPUs
    as P + D replicas) go into the comparison."""
    from .disaggregation import as_sim_result
    from .disaggregation_eval import for_predict

    o, disagg = for_predict(req, model, split, run)
    sim = as_sim_result(o, run.inp, o.output_tokens)  # its TPOT and completions, as budget's
    tps = o.output_tokens_per_s
    rps = sim.completed / (o.duration_ms / 1e3) if o.duration_ms > 0 else 0.0
    tpot = sim.tpot_ms
    return result.model_copy(
        update={
            "ttft_ms": measured(percentiles(o.ttft_ms), "TTFT"),
            "itl_ms": weighted_percentiles(o.itl_values, o.itl_weights),
            "tpot_ms": percentiles(tpot),
            "e2e_ms": measured(percentiles(o.e2e_ms), "end-to-end latency"),
            "queue_ms": measured(percentiles(o.queue_ms), "queue time"),
            "output_tokens_per_s": tps,
            "requests_per_s": rps,
            "total_tokens_per_s": tps + rps * float(run.inp.mean()),
            "disaggregation": disagg,
            "assumptions": [*result.assumptions, *disagg.notes],
        }
    )


def _prefix_result(run: LoadRun, itl: Percentiles | None) -> PrefixCacheResult | None:
    if run.prefix is None:
        return None
    from .prefix_cache import compare

    ttft = percentiles(run.stats.ttft_ms)
    return compare(
        run.prefix,
        run.inp,
        ttft.p50 if ttft else 0.0,
        run.stats.output_tokens_per_s,
        run.stats_without_cache,
    )


def _trace_rate(trace: Any) -> float:
    from .trace_load import trace_rate_per_s

    return trace_rate_per_s(trace)


def _load_mode(req: PredictRequest) -> Literal["concurrency", "rate", "offline"]:
    if req.request_rate is None:
        return "concurrency"
    return "offline" if math.isinf(req.request_rate) else "rate"


def _sim_warnings(
    req: PredictRequest, model: Any, res: Any, sat: Saturation, mode: str, n: int, trace: Any
) -> list[str]:
    """Overload, preemption and dropped requests, in words. Sets the saturation's
    utilization for an open loop."""
    warnings: list[str] = []
    if trace is not None and sat.max_requests_per_s:
        sat.utilization = _trace_rate(trace) / sat.max_requests_per_s
    if mode == "rate" and req.request_rate is not None:
        sat.utilization = (
            req.request_rate / sat.max_requests_per_s if sat.max_requests_per_s else None
        )
        if sat.utilization is not None and sat.utilization >= 1.0:
            warnings.append(
                f"offered load {req.request_rate:g} req/s is at or above the saturation point "
                f"({sat.max_requests_per_s:.3g} req/s): the queue grows for as long as the load lasts, "
                "so TTFT and E2E percentiles depend on how long it lasts (here: "
                f"{n} requests)"
            )
    if res.preemptions:
        warnings.append(
            f"{res.preemptions} preemptions: the KV cache ({model.kv_capacity_tokens:,} tokens) cannot "
            "hold every running sequence; preempted requests are recomputed (longer tails)"
        )
    if res.rejected:
        warnings.append(f"{res.rejected} requests longer than the whole KV cache were dropped")
    warnings.extend(_frontend_warning(req, res.output_tokens_per_s))
    return warnings


VLLM_API_SERVER_TOKENS_PER_S = 15_000.0
"""Streamed output tokens a second one vLLM API server process carries before its own CPU
work (output handling, detokenizing, SSE chunks) sets the pace: 14,791 at 73.7 requests/s in
the run vllm PR 15137 (2025-03) sped up with a faster detokenizer; 34,079 with gpt-oss-20b on a
B200 host (vllm PR 27869, 2025-11), which --stream-interval lifted by about half (vLLM blog,
2026-02). The lower figure is the one to plan with; the model does not simulate the frontend."""


def _frontend_warning(req: PredictRequest, output_tokens_per_s: float) -> list[str]:
    """A vLLM replica whose predicted stream outruns one API server process, in words."""
    if req.engine != "vllm" or output_tokens_per_s < VLLM_API_SERVER_TOKENS_PER_S:
        return []
    return [
        f"{output_tokens_per_s:,.0f} output tokens/s per replica: one vLLM API server process "
        f"streams about {VLLM_API_SERVER_TOKENS_PER_S:,.0f}-35,000 tokens/s before its CPU sets "
        "the pace (vllm PRs 15137 and 27869), which this model does not simulate; serve with "
        "--api-server-count 2 or more, or --stream-interval 10, or expect lower throughput "
        "and longer TTFT than predicted"
    ]


def admitted_batch(model: Any, mean_tokens: float) -> int:
    """The most requests the engine runs at once: max_num_seqs, or for an engine that
    reserves each request's whole length (TensorRT-LLM) what the KV cache holds of them."""
    if not model.reserves_whole_request:
        return int(model.max_num_seqs)
    from .batching_sim import no_evict_admission

    return int(no_evict_admission(model, round(mean_tokens)).max_num_seqs)


def _predict_assumptions(
    req: PredictRequest, model: Any, mode: str, trace: Any, mean_tokens: float
) -> list[str]:
    assumptions: list[str] = []
    if trace is not None:
        from .trace_load import MAX_TRACE_SIM_REQUESTS, trace_note

        assumptions.append(trace_note(trace, MAX_TRACE_SIM_REQUESTS))
    elif req.concurrency is None and req.request_rate is None:
        assumptions.append("no load given: concurrency 1 (one request at a time)")
    spread = bool(req.input_tokens_p95 or req.output_tokens_p95)
    if trace is not None:
        pass
    elif spread:
        assumptions.append(
            "lengths drawn from lognormal distributions fitted to the given median and p95"
        )
    else:
        assumptions.append("every request has exactly input_tokens and output_tokens")
    assumptions += [
        "step time = max(compute, memory) + tensor-parallel all-reduces + per-step overhead, with the "
        "calibrated efficiency factors listed under factors",
        _scheduler_phrase(req.engine, admitted_batch(model, mean_tokens), model.prefill_first),
        f"{_hits_phrase(req)}, no speculative decoding; no network time",
        _request_cost_phrase(req, model.efficiency.request_overhead_ms),
        *model.notes,
    ]
    if req.speculative_method is not None:
        assumptions = [
            a.replace("no speculative decoding", "the plain engine simulated, speculation on top")
            for a in assumptions
        ]
    if mode == "concurrency" and whole_run(req):
        assumptions.append(
            f"closed loop of {req.num_requests} requests, every one counted over the wall-clock "
            "duration as benchmark clients report a run: the opening wave, whose prompts all "
            "arrive at once, raises mean TTFT"
        )
    elif mode == "concurrency":
        assumptions.append(
            "closed loop: the first and last `concurrency` requests (ramp up/down) are left out"
        )
    if mode == "concurrency" and not spread and (req.concurrency or 1) > 1:
        assumptions.append(
            "identical lengths in a closed loop make requests start and finish in lock-step "
            "waves (as benchmarks with fixed lengths do); give input_tokens_p95 / "
            "output_tokens_p95 for a spread"
        )
    return assumptions


def _scheduler_phrase(engine: str, batch: int, prefill_first: bool = False) -> str:
    """How the simulated engine schedules (vLLM V1's mixed steps; SGLang's and vLLM V0's
    prefill-first steps; TensorRT-LLM's no-evict admission shows as the batch cap)."""
    vllm = (
        "decodes first, then chunked prefill within max_num_batched_tokens; "
        "preemption by recompute of the newest request"
    )
    if engine == "trtllm":
        return (
            "scheduler as TensorRT-LLM's GUARANTEED_NO_EVICT: a request starts only when its "
            f"whole input + output fits (batch capped at {batch}), never preempted; "
            "in-flight batching with chunked context as vLLM V1's decodes-first steps"
        )
    if engine == "sglang":
        return (
            "scheduler as SGLang's default (no --enable-mixed-chunk): waiting prompts are "
            "prefilled first, in steps of their own within the chunked-prefill size, while the "
            "running decodes wait; preemption by recompute of the newest request"
        )
    if prefill_first:
        return (
            "scheduler as vLLM V0 without chunked prefill: waiting prompts are prefilled "
            "first, whole, in steps of their own within max_num_batched_tokens, while the "
            "running decodes wait; preemption by recompute of the newest request"
        )
    return f"scheduler as vLLM V1: {vllm}"


def _request_cost_phrase(req: PredictRequest, overhead_ms: float) -> str:
    """What TTFT and E2E carry besides the GPU steps. Said either way: the cost is published
    for some engines only (SGLang's fitted, vLLM's measured), and where it is not, low-load
    TTFTs come out short by that much."""
    if overhead_ms > 0:
        ranks = req.tensor_parallel_size
        return (
            f"every TTFT and E2E carries {req.engine}'s published per-request cost outside the "
            f"GPU steps ({overhead_ms:.1f} ms at tensor parallel {ranks}: HTTP handling, "
            "tokenization, hand-off to the engine loop"
            + (", and to the other ranks" if ranks > 1 else "")
            + ")"
        )
    return (
        f"{req.engine}'s per-request cost outside the GPU steps (HTTP handling, tokenization, "
        "hand-off to the engine loop) is not in the published calibration data and counts as "
        "0 here: at low load it adds to every TTFT and E2E (`inferwise calibrate` with a "
        "concurrency-1 run of your own fits it as request_overhead_ms)"
    )


def _hits_phrase(req: Any) -> str:
    hit = getattr(req, "prefix_cache_hit_rate", None)
    if not hit:
        return "no prefix-cache hits"
    return (
        f"prefix-cache hits on {hit:.0%} of prompt tokens (prefill skipped, attention reads them)"
    )


def _model_max_len(dep: Deployment) -> int | None:
    """The model's own context window when max_model_len is not set."""
    from .architecture import from_config
    from .catalog import load_model

    try:
        return int(
            from_config(
                load_model(dep.model, revision=dep.revision).config, dep.hf_overrides
            ).max_position_embeddings
        )
    except Exception:  # noqa: BLE001 - only a bound check; the step model already validated the model
        return None
