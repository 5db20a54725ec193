"""Latency budgets: split end-to-end SLOs over the stages of a request.

A request to an LLM product passes through the network, preprocessing
(chat template, tokenization), the engine's queue, prefill (until the first
token), decode (one inter-token gap per further token) and postprocessing
(detokenization, guardrails, tool-call parsing). The engine stages come from
the same simulation ``predict`` uses, run at the design load (the arrival
rate times ``peak_to_mean``); the others from stated per-request costs whose
defaults are listed as assumptions.

How budgets are assigned (at the strictest percentile that has a target):

* network, preprocessing and postprocessing are fixed costs: their budget is
  their cost;
* decode gets ``ITL target x (output tokens - 1)`` when an ITL target is
  given;
* TTFT target minus network and preprocessing is the server's
  time-to-first-token budget; prefill gets its predicted service time and
  the queue gets what is left - queueing is the part load controls;
* an end-to-end target bounds the sum: whatever a stage-level target leaves
  free goes to the stages without one (queue + prefill and decode split in
  proportion to their predictions when neither has a target).

``slack_ms = budget_ms - predicted_ms``. The binding stage is the one that
overruns its budget most inside the tightest failing target, or, when every
target is met, the largest predicted stage inside the tightest target.
``max_rate_under_slo`` is found by bisection on the simulated arrival rate:
the highest rate whose simulated percentiles meet every target (the goodput
limit of one replica).

Registry entry points: :class:`BudgetRequest`, :class:`BudgetResult`,
:func:`decompose_budget`. Module level: stdlib, pydantic, light project modules.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .bounds import (
    MAX_BURSTINESS,
    MAX_PEAK_TO_MEAN,
    MAX_SEED,
    MAX_SLO_MS,
    MIN_BURSTINESS,
    PERCENTILE_KEYS,
    check_rate,
    check_slo_targets,
)
from .deployment import Deployment
from .disaggregation import DisaggregationFields, parse_split
from .errors import InputError
from .intervals import PredictIntervals
from .predict import MAX_REQUESTS, Percentiles, check_p95_lengths, measured
from .prefix_cache import PrefixCacheFields, plan_hits
from .spec_decode import SpeculativeFields, SpeculativeResult
from .trace_load import TraceFields

Stage = Literal["queue", "network", "preprocessing", "prefill", "decode", "postprocessing"]
STAGES: tuple[Stage, ...] = (
    "network",
    "preprocessing",
    "queue",
    "prefill",
    "decode",
    "postprocessing",
)
ENVELOPES: dict[str, tuple[Stage, ...]] = {
    "ttft_ms": ("network", "preprocessing", "queue", "prefill"),
    "itl_ms": ("decode",),
    "e2e_ms": STAGES,
}


NO_LOAD_MEETS = "the service time alone (an idle engine) exceeds a target"
"""Why no rate meets the targets when the budget's max rate is 0 (said in its warnings)."""
NEAR_SATURATION = 0.85
"""A rate meeting the targets above this share of saturation is flagged (warnings): there
latency climbs steeply with load, so a few per cent of throughput error moves it by a factor."""
MAX_AGENT_STEPS = 100
"""Steps of one agentic task; real agents plan tens at most."""


class AgentStep(BaseModel):
    """One step of an agentic task: an LLM call or a tool call."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1, max_length=200, description="Step name, shown in the critical path."
    )
    kind: Literal["llm", "tool"] = Field(
        default="llm",
        description="llm: a call to this deployment; tool: anything else with a fixed latency.",
    )
    input_tokens: int | None = Field(
        default=None, ge=1, le=2_000_000, description="LLM step: prompt tokens."
    )
    output_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000, description="LLM step: generated tokens."
    )
    latency_ms: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SLO_MS,
        description="Tool step: latency in ms at the budget percentile.",
    )
    retry_probability: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Chance that an attempt fails and is repeated (independent attempts).",
    )
    parallel_group: str | None = Field(
        default=None,
        max_length=200,
        description="Consecutive steps with the same group run in parallel; the slowest is on the critical path.",
    )

    @model_validator(mode="after")
    def _needs(self) -> AgentStep:
        if self.kind == "llm" and (self.input_tokens is None or self.output_tokens is None):
            raise ValueError(f"llm step '{self.name}' needs input_tokens and output_tokens")
        if self.kind == "tool" and self.latency_ms is None:
            raise ValueError(f"tool step '{self.name}' needs latency_ms")
        return self


def _slo_field(metric: str) -> Any:
    return Field(
        default_factory=dict,
        description=f"{metric} targets in ms by percentile, e.g. p95=800 (keys: {', '.join(PERCENTILE_KEYS)}).",
    )


class BudgetRequest(
    TraceFields, DisaggregationFields, PrefixCacheFields, SpeculativeFields, Deployment
):
    """SLO targets, the workload and the deployment to budget."""

    model_config = ConfigDict(extra="forbid")

    slo_e2e_ms: dict[str, float] = _slo_field(
        "End-to-end (client-side, whole response; whole task for agent_steps)"
    )
    slo_ttft_ms: dict[str, float] = _slo_field("Time-to-first-token (client-side)")
    slo_itl_ms: dict[str, float] = _slo_field("Inter-token latency")
    input_tokens: int = Field(
        default=1024,
        ge=1,
        le=2_000_000,
        description="Prompt tokens per request (median when input_tokens_p95 is given).",
    )
    output_tokens: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="Output tokens per request (median when output_tokens_p95 is given).",
    )
    input_tokens_p95: int | None = Field(
        default=None,
        ge=1,
        le=2_000_000,
        description="95th percentile prompt tokens (lognormal lengths).",
    )
    output_tokens_p95: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="95th percentile output tokens (lognormal lengths).",
    )
    request_rate: float | None = Field(
        default=None,
        description="Mean arrival rate, requests (tasks, with agent_steps) per second.",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Closed loop instead of a rate: requests in flight at once.",
    )
    peak_to_mean: float = Field(
        default=1.0,
        ge=1,
        le=MAX_PEAK_TO_MEAN,
        description="Peak over mean load; the budget is checked at rate x peak_to_mean.",
    )
    burstiness: float = Field(
        default=1.0,
        ge=MIN_BURSTINESS,
        le=MAX_BURSTINESS,
        description="Gamma shape of arrivals: 1 = Poisson, < 1 burstier.",
    )
    streaming: bool = Field(
        default=True,
        description="Responses streamed token by token (detokenization overlaps decode).",
    )
    network_rtt_ms: float = Field(
        default=40.0,
        ge=0,
        le=60_000,
        description="Client-to-server round trip in ms (default: same-continent internet path).",
    )
    template_ms: float = Field(
        default=1.0,
        ge=0,
        le=60_000,
        description="Chat-template rendering and request handling per request, ms.",
    )
    tokenization_tokens_per_s: float = Field(
        default=500_000.0,
        ge=1,
        le=1e10,
        description="Tokenizer speed for the prompt, tokens/s (fast HF tokenizer, one core).",
    )
    detokenization_tokens_per_s: float = Field(
        default=1_000_000.0,
        ge=1,
        le=1e10,
        description="Detokenization speed for non-streamed responses, tokens/s.",
    )
    guardrails_ms: float = Field(
        default=0.0,
        ge=0,
        le=600_000,
        description="Output guardrail / moderation check after generation, ms.",
    )
    tool_parsing_ms: float = Field(
        default=0.0,
        ge=0,
        le=600_000,
        description="Tool-call / structured-output parsing after generation, ms.",
    )
    agent_steps: list[AgentStep] | None = Field(
        default=None,
        max_length=MAX_AGENT_STEPS,
        description="Agentic task: ordered steps (LLM calls with their own lengths, tool calls with a latency, "
        "retries with a probability). The e2e target then applies to the whole task.",
    )
    num_requests: int | None = Field(
        default=None, ge=50, le=MAX_REQUESTS, description="Requests to simulate at the design load."
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Seed for arrivals and lengths.")
    calibration: str | None = Field(
        default=None, max_length=64, description="Stored calibration name, as in predict."
    )

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, v: float | None) -> float | None:
        return check_rate(v, allow_inf=True)  # inf is refused later with its own advice

    @field_validator("slo_e2e_ms", "slo_ttft_ms", "slo_itl_ms")
    @classmethod
    def _percentiles(cls, v: dict[str, float]) -> dict[str, float]:
        return check_slo_targets(v)

    @model_validator(mode="after")
    def _consistent(self) -> BudgetRequest:
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give request_rate or concurrency, not both")
        check_p95_lengths(self)
        return self


class Component(BaseModel):
    name: Stage
    budget_ms: float
    predicted_ms: float
    slack_ms: float = Field(description="budget_ms - predicted_ms; negative = over budget.")


class Check(BaseModel):
    metric: Literal["ttft_ms", "itl_ms", "e2e_ms"]
    percentile: str
    target_ms: float
    predicted_ms: float
    met: bool


class StepBudget(BaseModel):
    name: str
    kind: Literal["llm", "tool"]
    predicted_ms: float = Field(description="At the budget percentile, retries included.")
    budget_ms: float | None
    attempts: int = Field(description="Attempts counted at the budget percentile.")
    on_critical_path: bool


class TaskBudget(BaseModel):
    """An agentic task as a whole."""

    percentile: str
    predicted_ms: float = Field(
        description="Sum of the critical-path steps at the percentile (conservative: a sum of percentiles)."
    )
    budget_ms: float | None
    critical_path: list[str]
    llm_calls_per_task: float = Field(description="Expected LLM calls per task, retries included.")
    steps: list[StepBudget]


class BudgetResult(BaseModel):
    """Per-stage budgets against predictions, feasibility and the load that fits."""

    model: str
    gpu: str
    percentile: str = Field(
        description="Percentile the components are shown at (the strictest one with a target)."
    )
    design_request_rate: float | None = Field(
        description="request_rate x peak_to_mean, per second (LLM calls for agent_steps)."
    )
    design_concurrency: int | None = None
    components: list[Component]
    binding: Stage
    binding_target: str | None = Field(
        description="The target the binding stage is judged against, e.g. e2e_ms.p95."
    )
    feasible: bool
    feasible_by_percentile: dict[str, bool]
    checks: list[Check]
    why: list[str] = Field(description="For each missed target: by how much and where.")
    max_rate_under_slo: float | None = Field(
        description="Highest arrival rate (req/s per replica; tasks/s with agent_steps) whose simulated percentiles meet every target; 0 when none does; null in concurrency mode."
    )
    max_concurrency_under_slo: int | None = Field(
        default=None, description="Concurrency mode: the highest concurrency meeting every target."
    )
    saturation_request_rate: float = Field(
        description="Rate at which one replica saturates (queue grows without bound); tasks/s with agent_steps."
    )
    slo_attainment: float = Field(
        description="Share of the simulated requests at the design load that meet every target "
        "(per request: TTFT, mean ITL and end-to-end latency each at or under the metric's "
        "highest-percentile target): the goodput fraction cost per successful request divides by."
    )
    replicas_needed: int | None = Field(
        description="Replicas for request_rate x peak_to_mean at max_rate_under_slo each; null when no rate meets the targets."
    )
    ttft_ms: Percentiles = Field(description="Client-side TTFT at the design load.")
    speculative: SpeculativeResult | None = Field(
        default=None,
        description="Speculative decoding at the design load (null when speculative_method is not "
        "set); the SLO checks above are for the plain engine.",
    )
    intervals: PredictIntervals | None = Field(
        default=None,
        description="p10-p90 range of the predicted TTFT/ITL/E2E medians from held-out measurements.",
    )
    itl_ms: Percentiles | None = Field(
        description="Client-side inter-token latency; null when requests generate one token."
    )
    e2e_ms: Percentiles = Field(
        description="Client-side end-to-end latency of one request at the design load."
    )
    task: TaskBudget | None = None
    suggestions: list[str]
    assumptions: list[str]
    warnings: list[str]


# --------------------------------------------------------------------------- simulation at a load


class _Workload:
    """Request lengths for the engine: one distribution, or a mix of agent LLM calls."""

    def __init__(self, req: BudgetRequest):
        self.req = req
        self.trace: Any = None
        if req.trace is not None:  # the trace's own lengths and arrival shape
            from .trace_load import (
                BUDGET_TRACE_REQUESTS,
                read_trace,
                trace_arrays,
                trace_rate_per_s,
            )

            self.trace = read_trace(req, BUDGET_TRACE_REQUESTS)
            self.trace_inp, self.trace_out, self.trace_arrival_ms = trace_arrays(self.trace)
            self.trace_rate = trace_rate_per_s(self.trace)
        self.steps = [s for s in (req.agent_steps or []) if s.kind == "llm"]
        # engine requests per client request: one, or a task's LLM calls with their retries
        self.calls_per_task = (
            sum(1.0 / (1.0 - s.retry_probability) for s in self.steps) if self.steps else 1.0
        )

    def arrays(self, n: int) -> tuple[Any, Any]:
        import numpy as np

        from .predict import workload_arrays

        if self.trace is not None:
            return self.trace_inp, self.trace_out
        if not self.steps:
            return workload_arrays(self.req, n, self.req.max_model_len)
        weights = np.array([1.0 / (1.0 - s.retry_probability) for s in self.steps])
        rng = np.random.default_rng(self.req.seed + 3)
        pick = rng.choice(len(self.steps), size=n, p=weights / weights.sum())
        inp = np.array([self.steps[i].input_tokens for i in pick], dtype=np.int64)
        out = np.array([self.steps[i].output_tokens for i in pick], dtype=np.int64)
        return inp, out


def _simulate(
    model: Any, wl: _Workload, rate: float | None, conc: int | None, n: int, seed: int, burst: float
) -> Any:
    from .batching_sim import load_stats, simulate, simulate_load

    inp, out = wl.arrays(n)
    if wl.trace is not None and rate is not None:
        from .trace_load import scaled_arrivals_ms

        # the trace's arrival pattern, played at `rate` (its own mean rate x the speed-up)
        arrivals = scaled_arrivals_ms(wl.trace_arrival_ms, wl.trace_rate, rate)
        hits = plan_hits(wl.req, model, inp, out, None)
        res = simulate(model, inp, out, arrival_ms=arrivals, cached=hits and hits.cached)
        return res, load_stats(res)
    service = 0.0
    if conc is not None:
        # Users are independent: spread their first requests over one request's
        # service time so they do not move in lock-step as a benchmark's clients do.
        mean_in, mean_out = float(inp.mean()), float(out.mean())
        service = model.prefill_ms(int(mean_in)) + mean_out * model.decode_ms(
            conc, mean_in + mean_out / 2
        )
    prefix = plan_hits(wl.req, model, inp, out, conc)
    split = parse_split(wl.req)
    if split is not None:
        return _simulate_disaggregated(model, wl.req, split, (inp, out, prefix), conc, rate)
    return simulate_load(
        model,
        inp,
        out,
        concurrency=conc,
        rate_per_s=rate,
        burstiness=burst,
        seed=seed,
        stagger_ms=service,
        cached=prefix and prefix.cached,
    )


def _simulate_disaggregated(
    model: Any,
    req: Any,
    split: Any,
    arrays: tuple[Any, Any, Any],
    conc: int | None,
    rate: float | None,
) -> Any:
    """The budget's load on one P:D replica, as (result, stats) of the aggregated kind; a
    closed loop's rate comes from Little's law, so its stats are the wall-clock ones."""
    from . import disaggregation as dg
    from .batching_sim import load_stats
    from .disaggregation_eval import DesignLoad

    inp, out, prefix = arrays
    load = DesignLoad(conc, rate, req.burstiness, req.seed)
    outcome = dg.run_load(
        model, split, dg.link_of(req, model, split), inp, out, load, prefix and prefix.cached
    )
    res = dg.as_sim_result(outcome, inp, out)
    return res, load_stats(res)


class _Costs:
    """Per-request fixed costs outside the engine (ms)."""

    def __init__(self, req: BudgetRequest):
        self.req = req

    def network(self) -> float:
        return self.req.network_rtt_ms

    def pre(self, input_tokens: Any) -> Any:
        return self.req.template_ms + input_tokens / self.req.tokenization_tokens_per_s * 1e3

    def post(self, output_tokens: Any) -> Any:
        base = self.req.guardrails_ms + self.req.tool_parsing_ms
        if self.req.streaming:
            return base + 0.0 * output_tokens
        return base + output_tokens / self.req.detokenization_tokens_per_s * 1e3


def _pct(values: Any, key: str) -> float:
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, float(key[1:]))) if len(v) else math.nan


def _client_metrics(
    stats: Any, res: Any, costs: _Costs, frontend_ms: float = 0.0
) -> dict[str, Any]:
    """Per-request client-side arrays (steady-state requests) and the ITL sample.

    The engine's own per-request cost (``frontend_ms``, its API server's handling before the
    request reaches the scheduler) is in the simulated TTFT; it is preprocessing, not prefill."""

    mask = stats.kept  # completed requests, without a closed loop's ramp-up and ramp-down
    inp = res.input_tokens[mask].astype(float)
    out = res.output_tokens[mask].astype(float)
    queue = res.queue_ms[mask]
    ttft = res.ttft_ms[mask]
    e2e = res.e2e_ms[mask]
    pre = costs.pre(inp)  # template and tokenization as the request gives them
    post = costs.post(out)
    net = costs.network()
    return {
        "queue": queue,
        "prefill": ttft - queue - frontend_ms,
        "decode": e2e - ttft,
        "pre": pre + frontend_ms,
        "post": post,
        "network": net,
        "ttft": net + pre + ttft,
        "e2e": net + pre + e2e + post,
        "out": out,
        "tpot": res.tpot_ms[mask],
        "itl_values": res.itl_values,
        "itl_weights": res.itl_weights,
    }


def _attainment(req: BudgetRequest, m: dict[str, Any], task_ms: dict[str, float] | None) -> float:
    """Share of requests meeting every target, each metric at its highest-percentile target
    (the threshold that almost every request must stay under; as vLLM's ``--goodput``).

    Agentic tasks are judged as a whole by their percentiles, not request by request,
    so their share is 1 or 0."""
    import numpy as np

    if task_ms is not None:
        return float(all(c.met for c in _checks(req, m, task_ms)))
    n = len(m["ttft"])
    if n == 0:
        return 0.0
    ok = np.ones(n, dtype=bool)
    for slo, values in (
        (req.slo_ttft_ms, m["ttft"]),
        (req.slo_itl_ms, m["tpot"]),
        (req.slo_e2e_ms, m["e2e"]),
    ):
        if slo:
            limit = slo[max(slo, key=lambda k: float(k[1:]))]
            v = np.asarray(values, dtype=float)
            ok &= np.isnan(v) | (v <= limit)  # nan: a one-token output has no gap to judge
    return float(ok.mean())


def _itl_pct(m: dict[str, Any], key: str) -> float:
    """An ITL percentile; 0 when no request has a second token (one-token outputs wait
    for no gap, so any ITL target is met)."""
    from .batching_sim import weighted_summary

    _, (v,) = weighted_summary(m["itl_values"], m["itl_weights"], (float(key[1:]),))
    return v if math.isfinite(v) else 0.0


def _checks(req: BudgetRequest, m: dict[str, Any], task_ms: dict[str, float] | None) -> list[Check]:
    out: list[Check] = []
    for metric, slo in (
        ("ttft_ms", req.slo_ttft_ms),
        ("itl_ms", req.slo_itl_ms),
        ("e2e_ms", req.slo_e2e_ms),
    ):
        for key, target in sorted(slo.items(), key=lambda kv: float(kv[0][1:])):
            if metric == "itl_ms":
                pred = _itl_pct(m, key)
            elif metric == "ttft_ms":
                pred = _pct(m["ttft"], key)
            elif task_ms is not None:
                pred = task_ms[key]
            else:
                pred = _pct(m["e2e"], key)
            out.append(
                Check(
                    metric=metric,
                    percentile=key,
                    target_ms=target,
                    predicted_ms=pred,
                    met=bool(pred <= target),
                )
            )
    return out


# --------------------------------------------------------------------------- budgets


def _allocate(
    req: BudgetRequest, key: str, pred: dict[Stage, float], out_tokens: float
) -> dict[Stage, float]:
    """Budgets per stage at percentile `key`; see the module docstring."""
    fixed_ttft = pred["network"] + pred["preprocessing"]
    fixed_e2e = fixed_ttft + pred["postprocessing"]
    qp: float | None = None
    dec: float | None = None
    if key in req.slo_ttft_ms:
        qp = req.slo_ttft_ms[key] - fixed_ttft
    if key in req.slo_itl_ms:
        dec = req.slo_itl_ms[key] * max(0.0, out_tokens - 1)
    if key in req.slo_e2e_ms:
        flex = req.slo_e2e_ms[key] - fixed_e2e
        if qp is None and dec is None:
            engine = pred["queue"] + pred["prefill"] + pred["decode"]
            share = (pred["queue"] + pred["prefill"]) / engine if engine > 0 else 0.5
            qp, dec = flex * share, flex * (1 - share)
        elif qp is None:
            qp = flex - (dec or 0.0)
        elif dec is None:
            dec = flex - qp
        elif qp + dec > flex:
            scale = max(0.0, flex) / (qp + dec) if qp + dec > 0 else 0.0
            qp, dec = qp * scale, dec * scale
    if qp is None:
        qp = pred["queue"] + pred["prefill"]
    if dec is None:
        dec = pred["decode"]
    qp, dec = max(0.0, qp), max(0.0, dec)
    prefill = min(pred["prefill"], qp)
    return {
        "network": pred["network"],
        "preprocessing": pred["preprocessing"],
        "queue": qp - prefill,
        "prefill": prefill,
        "decode": dec,
        "postprocessing": pred["postprocessing"],
    }


def _binding(
    components: list[Component], checks: list[Check], key: str
) -> tuple[Stage, str | None]:
    by = {c.name: c for c in components}
    at_key = [c for c in checks if c.percentile == key] or checks
    if not at_key:
        worst_stage = max(components, key=lambda c: c.predicted_ms)
        return worst_stage.name, None
    tight = max(at_key, key=lambda c: c.predicted_ms / c.target_ms)
    label = f"{tight.metric}.{tight.percentile}"
    over = overrun_stage(components, label)
    if over is not None:
        return over, label
    return max((by[s] for s in ENVELOPES[tight.metric]), key=lambda c: c.predicted_ms).name, label


def overrun_stage(components: list[Component], target: str) -> Stage | None:
    """The stage most over its budget inside a target's envelope (``ttft_ms.p95``), if any is."""
    names = ENVELOPES[target.split(".")[0]]
    over = [c for c in components if c.name in names and c.slack_ms < -1e-9]
    return min(over, key=lambda c: c.slack_ms).name if over else None


_SUGGESTIONS: dict[str, list[str]] = {
    "queue": [
        "add replicas (see replicas_needed) or shed load at the peak (admission control, rate limits per tenant)",
        "raise batch capacity: FP8 KV cache (--kv-cache-dtype fp8) or a higher --gpu-memory-utilization admit more sequences",
        "smooth the peak (queue offline work, lower peak_to_mean) before buying hardware",
    ],
    "prefill": [
        "shorten prompts or enable prefix caching for shared system prompts / documents",
        "more tensor parallelism or FP8 weights on FP8-capable GPUs cut prefill compute time",
        "for long prompts, a larger --max-num-batched-tokens finishes a prompt in fewer steps (at some ITL cost); "
        "disaggregated prefill separates the two phases",
    ],
    "decode": [
        "fewer bytes per step: FP8 or 4-bit weights, FP8 KV cache",
        "speculative decoding (EAGLE, n-gram) lowers ITL at low and medium batch sizes",
        "cap the batch (--max-num-seqs) or lower --max-num-batched-tokens so prefill chunks interrupt decodes less",
        "more tensor parallelism (NVLink) splits the weight reads",
    ],
    "network": [
        "serve from a region close to the users; reuse connections (keep-alive, HTTP/2)",
        "stream the response so the first token is not held back",
    ],
    "preprocessing": [
        "cache rendered chat templates and tokenized system prompts; use a fast (Rust) tokenizer",
        "run tokenization in parallel API-server processes (vLLM --api-server-count)",
    ],
    "postprocessing": [
        "run guardrails on streamed partial output or asynchronously instead of after the full response",
        "use structured-output decoding instead of parsing and retrying tool calls",
    ],
}


def _attempts(retry_p: float, key: str) -> int:
    """Attempts needed so that the chance of needing more is below 1 - percentile."""
    if retry_p <= 0:
        return 1
    tail = 1.0 - float(key[1:]) / 100.0
    return 1 + max(0, math.ceil(math.log(tail) / math.log(retry_p)) - 1) if retry_p > tail else 1


def _task(
    req: BudgetRequest, key: str, model: Any, m: dict[str, Any], wl: _Workload
) -> tuple[TaskBudget, float]:
    """Critical path and per-step budgets of an agentic task at percentile `key`."""
    assert req.agent_steps is not None
    queue = _pct(m["queue"], key)
    tpot = _pct(m["tpot"], key)
    if tpot != tpot:
        tpot = _itl_pct(m, "p50")
    # Prefill under load runs slower than alone (mixed steps); scale each step's
    # own prefill by the ratio seen for the simulated mix at this percentile.
    mean_in = float(wl.arrays(64)[0].mean())
    slow = _pct(m["prefill"], key) / max(1e-9, model.prefill_ms(int(mean_in)))
    steps: list[StepBudget] = []
    costs = _Costs(req)
    for s in req.agent_steps:
        attempts = _attempts(s.retry_probability, key)
        if s.kind == "llm":
            one = (
                costs.network()
                + float(costs.pre(float(s.input_tokens or 0)))
                + queue
                + model.prefill_ms(int(s.input_tokens or 1)) * max(1.0, slow)
                + max(0, (s.output_tokens or 1) - 1) * tpot
                + float(costs.post(float(s.output_tokens or 0)))
            )
        else:
            one = float(s.latency_ms or 0.0)
        steps.append(
            StepBudget(
                name=s.name,
                kind=s.kind,
                predicted_ms=one * attempts,
                budget_ms=None,
                attempts=attempts,
                on_critical_path=False,
            )
        )
    # Consecutive steps of one parallel group run together; the slowest is critical.
    groups: list[list[int]] = []
    for i, s in enumerate(req.agent_steps):
        if (
            groups
            and s.parallel_group
            and req.agent_steps[groups[-1][0]].parallel_group == s.parallel_group
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
    total = 0.0
    path: list[str] = []
    for g in groups:
        crit = max(g, key=lambda i: steps[i].predicted_ms)
        steps[crit].on_critical_path = True
        path.append(steps[crit].name)
        total += steps[crit].predicted_ms
    budget = req.slo_e2e_ms.get(key)
    if budget is not None:
        for g in groups:
            crit = max(g, key=lambda i: steps[i].predicted_ms)
            share = budget * steps[crit].predicted_ms / total if total > 0 else 0.0
            for i in g:
                steps[i].budget_ms = share
    return (
        TaskBudget(
            percentile=key,
            predicted_ms=total,
            budget_ms=budget,
            critical_path=path,
            llm_calls_per_task=wl.calls_per_task,
            steps=steps,
        ),
        total,
    )


# --------------------------------------------------------------------------- entry point


def _check_request(req: BudgetRequest) -> None:
    """What the request model cannot check field by field: a target to budget, a load,
    and an agentic task this deployment takes part in."""
    if not (req.slo_e2e_ms or req.slo_ttft_ms or req.slo_itl_ms):
        raise InputError(
            "slo_e2e_ms",
            "give at least one target",
            accepted="--slo-e2e-ms p95=15000, --slo-ttft-ms p95=800, --slo-itl-ms p95=50",
        )
    for key, ttft in req.slo_ttft_ms.items():
        if key in req.slo_e2e_ms and ttft > req.slo_e2e_ms[key] and not req.agent_steps:
            raise InputError(
                "slo_ttft_ms",
                f"{key} target {ttft:g} ms is above the end-to-end target {req.slo_e2e_ms[key]:g} ms at the same percentile",
            )
    if req.trace is not None and req.agent_steps:
        raise InputError("trace", "a trace replays single requests: give trace or agent_steps")
    world = req.world_size
    if req.num_gpus is not None and req.num_gpus != world:
        raise InputError(
            "num_gpus",
            f"a budget is for one replica of tensor_parallel_size x pipeline_parallel_size = "
            f"{world} GPU(s), and replicas_needed says how many the rate takes; {req.num_gpus} "
            "GPUs would be a fleet",
            f"{world}, or leave it out and give the fleet's rate",
        )
    if req.request_rate is None and req.concurrency is None and req.trace is None:
        raise InputError(
            "request_rate",
            "give the arrival rate (requests/s) or a concurrency",
            accepted="a positive number",
        )
    if req.request_rate is not None and math.isinf(req.request_rate):
        raise InputError(
            "request_rate",
            "budgets need a finite arrival rate; for offline batches use `inferwise predict --request-rate inf`",
        )
    if req.agent_steps is not None and not req.agent_steps:
        raise InputError("agent_steps", "the task has no steps")
    if req.agent_steps and not any(s.kind == "llm" for s in req.agent_steps):
        raise InputError("agent_steps", "the task has no llm step for this deployment to serve")


def decompose_budget(
    req: BudgetRequest, find_max_rate: bool = True, calibration: Any = None
) -> BudgetResult:
    """Budget the SLOs over the stages; see the module docstring.

    ``find_max_rate=False`` skips the rate search (about ten simulations) for a
    caller that already knows the rate and only needs the design point: the
    recommender checking a fleet it sized. ``max_rate_under_slo`` and
    ``replicas_needed`` are then null. Without max_model_len, a model whose
    default context does not fit is budgeted at the longest context that does. A
    calibration (an AppliedCalibration the door loaded from req.calibration) replaces the
    published engine factors.
    """
    from .context_window import with_fitting_context

    req, context_note = with_fitting_context(req)
    result = _decompose(req, find_max_rate, calibration)
    if context_note:
        result.assumptions.insert(0, context_note)
    from .intervals import latency_intervals
    from .roofline import StepModel

    result.intervals = latency_intervals(
        result,
        req.engine,
        (result.design_concurrency, result.design_request_rate),
        (req.input_tokens, req.output_tokens),
        StepModel.from_deployment(req).shape.num_experts,
    )
    if calibration is not None:
        from .intervals import calibrated_intervals

        itl = result.itl_ms
        values = {
            "ttft_ms": result.ttft_ms.p50,
            "itl_ms": itl.p50 if itl else None,
            "e2e_ms": result.e2e_ms.p50,
        }
        load = (result.design_concurrency, result.design_request_rate)
        result.intervals = calibrated_intervals(result.intervals, values, calibration, load)
    return result


def _decompose(req: BudgetRequest, find_max_rate: bool, calibration: Any) -> BudgetResult:
    from .predict import percentiles, step_model_for, weighted_percentiles

    _check_request(req)
    model = step_model_for(req, calibration)
    if not req.agent_steps and req.trace is None:
        from .predict import check_lengths

        check_lengths(req)
    wl = _Workload(req)
    costs = _Costs(req)
    warnings: list[str] = []
    rate, conc = _design_load(req, wl)
    n = req.num_requests or (_n_for_concurrency(conc) if conc else _n_for_rate(rate or 1.0))
    res, stats = _simulate(model, wl, rate, conc, n, req.seed, req.burstiness)
    m = _client_metrics(stats, res, costs, model.efficiency.request_overhead_ms)

    keys = sorted({*req.slo_e2e_ms, *req.slo_ttft_ms, *req.slo_itl_ms}, key=lambda k: float(k[1:]))
    key = keys[-1]
    task, task_ms = _tasks(req, keys, model, m, wl)
    checks = _checks(req, m, task_ms)
    feasible_by = {k: all(c.met for c in checks if c.percentile == k) for k in keys}
    components = _components(req, m, key)
    binding, binding_target = _binding(components, checks, key)

    mean_in, mean_out, sat = _saturation(req, model, wl, conc)
    max_rate, max_conc = (
        _load_that_fits(req, model, wl, costs, conc, sat.max_requests_per_s)
        if find_max_rate
        else (None, None)
    )
    replicas = None
    offered = wl.trace_rate if wl.trace is not None else req.request_rate
    if offered is not None and max_rate:
        replicas = max(1, math.ceil(offered * req.peak_to_mean / max_rate - 1e-9))
    why = _why(checks, components, key)
    if max_rate == 0.0 or max_conc == 0:
        warnings.append(f"no load meets every target: {NO_LOAD_MEETS}")
        binding = _service_binding(components, binding_target, binding)
        why.append(_service_why(components, binding_target))
    saturation = sat.max_requests_per_s / wl.calls_per_task
    if max_rate and max_rate > NEAR_SATURATION * saturation:
        warnings.append(_near_saturation_warning(max_rate, saturation))
    itl = weighted_percentiles(m["itl_values"], m["itl_weights"])
    from .spec_decode import at_load

    spec = at_load(
        req, model, res, mean_in, mean_out, itl, stats.output_tokens_per_s, conc is not None
    )
    return BudgetResult(
        model=req.model,
        gpu=model.hardware.name,
        percentile=key,
        design_request_rate=rate,
        design_concurrency=conc,
        components=components,
        binding=binding,
        binding_target=binding_target,
        feasible=all(feasible_by.values()),
        feasible_by_percentile=feasible_by,
        checks=checks,
        why=why,
        max_rate_under_slo=max_rate,
        max_concurrency_under_slo=max_conc,
        slo_attainment=_attainment(req, m, task_ms),
        saturation_request_rate=saturation,
        replicas_needed=replicas,
        ttft_ms=measured(percentiles(m["ttft"]), "TTFT"),
        itl_ms=itl,
        e2e_ms=measured(percentiles(m["e2e"]), "end-to-end latency"),
        speculative=spec,
        task=task,
        suggestions=_budget_suggestions(req, binding, replicas, task),
        assumptions=_calibration_notes(calibration, req) + _assumptions(req, model, wl),
        warnings=warnings,
    )


def _near_saturation_warning(max_rate: float, saturation: float) -> str:
    """Why a rate close to saturation needs a margin: the predictions are least reliable there
    (README, where the predictions miss)."""
    return (
        f"the highest rate meeting the targets is {max_rate / saturation:.0%} of the replica's "
        "saturation: so close to capacity the queue, and with it TTFT and ITL, grows steeply with "
        "load, and a few per cent of throughput error moves them by a factor (MLPerf Server runs "
        "held this close were measured with TTFT 1.5-4x the prediction); plan replicas with a margin"
    )


def _calibration_notes(calibration: Any, req: BudgetRequest) -> list[str]:
    """What the budget says of the calibration it used: its sources, and the per-request
    overhead it measured outside the engine (the network and preprocessing stages here)."""
    if calibration is None:
        return []
    from .user_calibration import calibration_notes

    notes = calibration_notes(calibration, req.model, req.gpu)
    if calibration.factors.request_overhead_ms > 0:
        notes.append(
            "the calibrated per-request cost is the engine front end in the preprocessing "
            "stage; the network budget is added on top (counted twice if the calibration's "
            "runs crossed that network)"
        )
    return notes


def _frontend_note(model: Any) -> str:
    """The engine's own per-request cost, when its factors carry one (SGLang's, vLLM's)."""
    ms = model.efficiency.request_overhead_ms
    if ms <= 0:
        return ""
    return (
        f", plus the engine front end's {ms:g} ms per request (its API server before the "
        "scheduler, from the factors in use)"
    )


def _assumptions(req: BudgetRequest, model: Any, wl: _Workload) -> list[str]:
    post = (
        "detokenization overlaps streaming"
        if req.streaming
        else f"detokenization at {req.detokenization_tokens_per_s:,.0f} tokens/s"
    )
    traced = []
    if wl.trace is not None:
        from .trace_load import BUDGET_TRACE_REQUESTS, trace_note

        traced = [
            trace_note(wl.trace, BUDGET_TRACE_REQUESTS),
            "max_rate_under_slo: the trace's arrival pattern replayed faster or slower (every "
            "gap scaled alike) until a target fails",
        ]
    return [
        *traced,
        f"network: one round trip of {req.network_rtt_ms:g} ms per request",
        f"preprocessing: {req.template_ms:g} ms template + tokenization at {req.tokenization_tokens_per_s:,.0f} tokens/s"
        + _frontend_note(model),
        f"postprocessing: {post}, guardrails {req.guardrails_ms:g} ms, tool parsing {req.tool_parsing_ms:g} ms",
        f"design load = {'the trace' if wl.trace is not None else 'request_rate' if req.request_rate else 'concurrency'} x peak_to_mean ({req.peak_to_mean:g})",
        *(
            ["concurrency: independent users, first requests spread over one service time"]
            if req.concurrency
            else []
        ),
        "engine stages simulated as in `inferwise predict` (same step model and calibrated factors)",
        *_prefix_assumption(req),
        *_disaggregation_assumption(req),
        *model.notes,
    ]


def _saturation(
    req: BudgetRequest, model: Any, wl: _Workload, conc: int | None
) -> tuple[float, float, Any]:
    """(mean input, mean output, saturation point) of one replica: its prefix-cache hits
    priced in, and for a P:D replica the slower pool's capacity."""
    from .predict import saturation_point

    arrays = wl.arrays(256)
    mean_in, mean_out = (float(a.mean()) for a in arrays)
    hits = plan_hits(req, model, *arrays, conc)
    sat = saturation_point(model, mean_in, mean_out, hits.effective_hit_rate if hits else 0.0)
    split = parse_split(req)
    if split is not None:
        from .disaggregation import capacity_per_s

        sat.max_requests_per_s = capacity_per_s(model, split, mean_in, mean_out)
    return mean_in, mean_out, sat


def _disaggregation_assumption(req: BudgetRequest) -> list[str]:
    split = parse_split(req)
    if split is None:
        return []
    return [
        f"one replica = {split.prefill} prefill + {split.decode} decode workers ({split.gpus} GPUs), "
        "the KV transfer between them on the link given (`inferwise predict --disaggregate` "
        "compares it with aggregated replicas); rates and replicas are per P:D replica"
    ]


def _prefix_assumption(req: BudgetRequest) -> list[str]:
    if req.prefix_cache_hit_rate is None:
        return [
            "no prefix-cache hits (give prefix_cache_hit_rate for a workload with shared prefixes)"
        ]
    return [
        f"prefix-cache hits on {req.prefix_cache_hit_rate:.0%} of prompt tokens from "
        f"{req.prefix_cache_distinct_prefixes:,} shared prefix(es): their prefill is skipped "
        "(`inferwise predict --prefix-cache-hit-rate` shows the gain and the capacity limit)"
    ]


def _design_load(req: BudgetRequest, wl: _Workload) -> tuple[float | None, int | None]:
    """(LLM-call rate, concurrency) at the peak: exactly one of them is set."""
    if wl.trace is not None:
        return wl.trace_rate * req.peak_to_mean, None
    if req.request_rate is not None:
        return req.request_rate * req.peak_to_mean * wl.calls_per_task, None
    return None, max(1, math.ceil((req.concurrency or 1) * req.peak_to_mean))


def _tasks(
    req: BudgetRequest, keys: list[str], model: Any, m: dict[str, Any], wl: _Workload
) -> tuple[TaskBudget | None, dict[str, float] | None]:
    """An agentic task's critical path at the budget percentile, and its total per percentile."""
    if not req.agent_steps:
        return None, None
    task = None
    task_ms: dict[str, float] = {}
    for k in keys:
        tb, total = _task(req, k, model, m, wl)
        task_ms[k] = total
        if k == keys[-1]:
            task = tb
    return task, task_ms


def _components(req: BudgetRequest, m: dict[str, Any], key: str) -> list[Component]:
    """Each stage's budget beside its predicted time at the budget percentile."""
    import numpy as np

    out_tokens = float(np.median(m["out"])) if len(m["out"]) else float(req.output_tokens)
    pred: dict[Stage, float] = {
        "network": m["network"],
        "preprocessing": _pct(m["pre"], key),
        "queue": _pct(m["queue"], key),
        "prefill": _pct(m["prefill"], key),
        "decode": _pct(m["decode"], key),
        "postprocessing": _pct(m["post"], key),
    }
    budgets = _allocate(req, key, pred, out_tokens)
    return [
        Component(name=s, budget_ms=budgets[s], predicted_ms=pred[s], slack_ms=budgets[s] - pred[s])
        for s in STAGES
    ]


def _why(checks: list[Check], components: list[Component], key: str) -> list[str]:
    why = [
        f"{c.metric} {c.percentile}: predicted {c.predicted_ms:,.0f} ms > target {c.target_ms:,.0f} ms "
        f"(+{(c.predicted_ms / c.target_ms - 1) * 100:.0f}%)"
        for c in checks
        if not c.met
    ]
    if why:
        worst = min(components, key=lambda c: c.slack_ms)
        if worst.slack_ms < 0:
            why.append(
                f"largest overrun at {key}: {worst.name} {-worst.slack_ms:,.0f} ms over its budget"
            )
    return why


def _service_binding(components: list[Component], target: str | None, binding: Stage) -> Stage:
    """When no load meets the targets, the queue is not the lever (an idle engine has none):
    the binding stage is the largest one the idle engine still pays inside the target."""
    if target is None:
        return binding
    fixed = [
        c for c in components if c.name in ENVELOPES[target.split(".")[0]] and c.name != "queue"
    ]
    return max(fixed, key=lambda c: c.predicted_ms).name if fixed else binding


def _service_why(components: list[Component], target: str | None) -> str:
    """The idle engine's stages inside the binding target, in words."""
    names = ENVELOPES[target.split(".")[0]] if target else STAGES
    fixed = [c for c in components if c.name in names and c.name != "queue" and c.predicted_ms > 0]
    parts = " + ".join(f"{c.name} {c.predicted_ms:,.0f}" for c in fixed)
    total = sum(c.predicted_ms for c in fixed)
    return f"without any queue, {parts} = {total:,.0f} ms at this percentile: no load or replica count meets {target or 'the targets'}"


def _load_that_fits(
    req: BudgetRequest,
    model: Any,
    wl: _Workload,
    costs: _Costs,
    conc: int | None,
    saturation: float,
) -> tuple[float | None, int | None]:
    """The largest request (task) rate, or concurrency, that meets every target."""
    if conc is not None:
        return None, _max_concurrency(req, model, wl, costs)
    max_rate = _max_rate(req, model, wl, costs, saturation)
    return (max_rate / wl.calls_per_task if max_rate is not None else None), None


def _budget_suggestions(
    req: BudgetRequest, binding: Stage, replicas: int | None, task: TaskBudget | None
) -> list[str]:
    suggestions = list(_SUGGESTIONS[binding])
    if binding == "queue" and replicas and replicas > 1:
        suggestions.insert(
            0,
            f"{replicas} replicas carry {req.request_rate:g} req/s x {req.peak_to_mean:g} peak within the targets",
        )
    if task is None or not task.critical_path:
        return suggestions
    llm_on_path = [s for s in task.steps if s.on_critical_path and s.kind == "llm"]
    tool_on_path = [s for s in task.steps if s.on_critical_path and s.kind == "tool"]
    if tool_on_path and max(s.predicted_ms for s in tool_on_path) > max(
        (s.predicted_ms for s in llm_on_path), default=0
    ):
        suggestions.insert(
            0,
            "a tool call dominates the task's critical path: parallelise independent tool calls or cache their results",
        )
    if any(s.attempts > 1 for s in task.steps):
        suggestions.append(
            "retries reach the budget percentile: lower the failure rate (validation, structured output) before tuning latency"
        )
    return suggestions


def _n_for_rate(rate: float) -> int:
    """About a minute of arrivals: long enough for a queue above capacity to show."""
    return int(max(200, min(rate * 60.0, 800)))


def _n_for_concurrency(conc: int) -> int:
    return max(200, min(10 * conc, MAX_REQUESTS))


def _meets(
    req: BudgetRequest,
    model: Any,
    wl: _Workload,
    costs: _Costs,
    rate: float | None,
    conc: int | None,
) -> bool:
    n = req.num_requests or (
        _n_for_rate(rate) if rate is not None else _n_for_concurrency(conc or 1)
    )
    res, stats = _simulate(model, wl, rate, conc, n, req.seed, req.burstiness)
    m = _client_metrics(stats, res, costs, model.efficiency.request_overhead_ms)
    task_ms = None
    if req.agent_steps:
        keys = {*req.slo_e2e_ms}
        task_ms = {k: _task(req, k, model, m, wl)[1] for k in keys}
    return all(c.met for c in _checks(req, m, task_ms))


def _max_rate(
    req: BudgetRequest, model: Any, wl: _Workload, costs: _Costs, saturation: float
) -> float:
    """Bisection on the (LLM-call) arrival rate; ~10 simulations.

    The answer never exceeds ``saturation``: above it the queue grows for as
    long as the load lasts, so a minute-long simulation that still meets the
    targets there only means the queue had not grown long enough yet.
    """
    hi = max(saturation, 1e-6) * 1.05
    lo = hi * 1e-3
    if not _meets(req, model, wl, costs, lo, None):
        return 0.0
    if _meets(req, model, wl, costs, hi, None):
        return min(hi, saturation)
    for _ in range(9):
        mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2
        if _meets(req, model, wl, costs, mid, None):
            lo = mid
        else:
            hi = mid
    return min(lo, saturation)


def _max_concurrency(req: BudgetRequest, model: Any, wl: _Workload, costs: _Costs) -> int:
    if not _meets(req, model, wl, costs, None, 1):
        return 0
    lo, hi = 1, max(2, model.max_num_seqs * 2)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if _meets(req, model, wl, costs, None, mid):
            lo = mid
        else:
            hi = mid
    return lo
