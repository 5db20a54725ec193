"""``inferwise recommend``: the workload file and flags merged into one deployment search.

The workload file says what the product needs (traffic, lengths, SLOs,
constraints, candidate models and their quality); flags say the same things
and override it, field by field. Everything the search needs and neither
gives is an input error naming both ways to give it, never a silent default:
a recommendation sized for a guessed rate would be priced wrong.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from inferwise.calculators.bounds import MAX_PEAK_TO_MEAN, PERCENTILE_KEYS
from inferwise.calculators.deployment import HfOverrides
from inferwise.calculators.errors import InputError
from inferwise.calculators.spec_decode import SpecMethod
from inferwise.knowledge.diagnosis import WORKLOAD_HELP
from inferwise.knowledge.workload import Workload


def _slo(metric: str) -> Any:
    return Field(
        default_factory=dict,
        description=f"{metric} targets in ms by percentile, e.g. p95=800 (keys: p50, p90, p95, p99); "
        "overrides the workload's slo.",
    )


SPEC_FIELDS = ("speculative_method", "spec_acceptance_length", "num_speculative_tokens")
"""The speculative-decoding flags the search passes on unchanged (tried on the fleet)."""


class RecommendRequest(BaseModel):
    """Requirements: a workload file and/or flags (flags win)."""

    model_config = ConfigDict(extra="forbid")

    workload: str | dict[str, Any] | None = Field(default=None, description=WORKLOAD_HELP)
    trace: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A request trace file: its fitted rate, peak, burstiness, lengths and prefix "
        "reuse fill the traffic the workload and flags leave open (as `workload --from-trace`).",
    )
    trace_format: Literal["mooncake", "burstgpt", "azure", "jsonl"] | None = Field(
        default=None, description="The trace's format; default: guessed from its first line."
    )
    model: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="Candidate model(s), repeatable: catalog/Hub id or path; default: the "
        "workload's product.candidate_models, else deployment.model.",
    )
    hf_overrides: HfOverrides = Field(
        default_factory=dict,
        description="config.json overrides for the candidates, KEY=VALUE (vLLM --hf-overrides).",
    )
    model_quality: dict[str, float] = Field(
        default_factory=dict,
        description="Measured quality per model, MODEL=SCORE (same scale as the quality floor).",
    )
    quality_floor_score: float | None = Field(
        default=None, description="Minimum evaluation score; default: product.quality_floor_score."
    )
    quality_margin: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="A model passes at floor x (1 + margin); default 0.02.",
    )
    engine: Literal["vllm", "sglang", "trtllm"] | None = Field(
        default=None, description="Serving engine; default: the workload's, else vllm."
    )
    engine_version: str | None = Field(default=None, max_length=50)
    calibration: str | None = Field(
        default=None, max_length=64, description="Stored calibration, for its GPU's candidates."
    )
    gpus: list[str] = Field(
        default_factory=list,
        max_length=12,
        description="GPU types to consider (catalog ids, comma-separated); default: "
        "constraints.gpus, else every GPU with a price.",
    )
    max_gpus: int | None = Field(
        default=None, ge=1, le=4096, description="GPUs in the whole fleet, at most."
    )
    budget_usd_per_hour: float | None = Field(
        default=None, gt=0, le=1e7, description="Fleet cost ceiling, USD per hour."
    )
    gpu_price: dict[str, float] = Field(
        default_factory=dict,
        description="Your price per GPU-hour, GPU=USD (repeatable); overrides the shipped table.",
    )
    request_rate: float | None = Field(
        default=None, description="Mean arrival rate, requests/s (traffic.arrival_rate_rps)."
    )
    peak_to_mean: float | None = Field(default=None, ge=1, le=MAX_PEAK_TO_MEAN)
    input_tokens: int | None = Field(
        default=None, ge=1, le=2_000_000, description="Prompt tokens, p50."
    )
    input_tokens_p95: int | None = Field(default=None, ge=1, le=2_000_000)
    input_tokens_p99: int | None = Field(default=None, ge=1, le=2_000_000)
    output_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Output tokens, p50."
    )
    output_tokens_p95: int | None = Field(default=None, ge=1, le=1_000_000)
    output_tokens_p99: int | None = Field(default=None, ge=1, le=1_000_000)
    slo_ttft_ms: dict[str, float] = _slo("Time-to-first-token")
    slo_itl_ms: dict[str, float] = _slo("Inter-token latency")
    slo_e2e_ms: dict[str, float] = _slo("End-to-end latency")
    availability: float | None = Field(
        default=None, gt=0, lt=1, description="e.g. 0.999: one spare replica; 0.9999: two."
    )
    objective: Literal["cost", "latency", "throughput_per_gpu"] = Field(
        default="cost", description="How candidates are ranked (all meeting the SLO first)."
    )
    top: int = Field(default=5, ge=1, le=50, description="Candidates to list.")
    speculative_method: SpecMethod | None = Field(
        default=None,
        description="Drafter to try on the recommended fleet (default eagle3 with its published "
        "chat acceptance).",
    )
    spec_acceptance_length: float | None = Field(
        default=None,
        ge=1.0,
        le=17.0,
        description="Measured tokens per verify step at num_speculative_tokens, bonus included.",
    )
    num_speculative_tokens: int | None = Field(
        default=None, ge=1, le=16, description="K the acceptance was measured at (default 3)."
    )
    min_replicas: int | None = Field(default=None, ge=0, le=10_000)
    scale_to_zero: bool | None = Field(default=None, description="Autoscale down to no replica.")
    cold_start_s: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Seconds to a serving new replica; default: computed.",
    )
    batch_share: float | None = Field(
        default=None, ge=0, lt=1, description="Share of the traffic that is offline batch work."
    )

    @field_validator("quality_floor_score")
    @classmethod
    def _finite_floor(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{v!r} is not a finite score")
        return v

    @field_validator("gpu_price", "model_quality")
    @classmethod
    def _finite(cls, v: dict[str, float]) -> dict[str, float]:
        for key, value in v.items():
            if not math.isfinite(value):
                raise ValueError(f"{key}: {value!r} is not a finite number")
        return v

    @field_validator("gpu_price")
    @classmethod
    def _positive_price(cls, v: dict[str, float]) -> dict[str, float]:
        for key, value in v.items():
            if not 0 < value <= 10_000:
                raise ValueError(f"{key}: {value!r} is not a price in (0, 10000] USD per GPU-hour")
        return v


# --------------------------------------------------------------------------- merging


def _workload(req: RecommendRequest) -> Workload:
    from inferwise.knowledge.diagnosis import load_inputs

    wl = load_inputs(req.workload, None, None) if req.workload else Workload()
    return _with_trace_traffic(wl, req) if req.trace else wl


def _with_trace_traffic(wl: Workload, req: RecommendRequest) -> Workload:
    """The workload with the trace's fitted traffic wherever the workload says nothing."""
    from inferwise.knowledge.trace_workload import WorkloadFromTraceRequest, workload_from_trace

    fitted = workload_from_trace(
        WorkloadFromTraceRequest(from_trace=req.trace or "", trace_format=req.trace_format)
    )
    traced = Workload.model_validate(fitted.workload).traffic
    if traced is None:
        return wl
    if wl.traffic is None:
        return wl.model_copy(update={"traffic": traced})
    gaps = {k: v for k, v in traced if getattr(wl.traffic, k) is None and v is not None}
    return wl.model_copy(update={"traffic": wl.traffic.model_copy(update=gaps)})


def _models(req: RecommendRequest, wl: Workload) -> list[dict[str, Any]]:
    product = wl.product
    if req.model:
        names = req.model
        known = {c.model: c.quality for c in (product.candidate_models or [])} if product else {}
    elif product and product.candidate_models:
        names = [c.model for c in product.candidate_models]
        known = {c.model: c.quality for c in product.candidate_models}
    elif wl.deployment and wl.deployment.model:
        names, known = [wl.deployment.model], {}
    else:
        raise InputError(
            "model",
            "name the model(s) to deploy",
            "--model ID (repeatable), or the workload's product.candidate_models / deployment.model",
        )
    unknown = set(req.model_quality) - set(names)
    if unknown:
        raise InputError(
            "model_quality",
            f"{sorted(unknown)[0]!r} is not one of the candidate models",
            ", ".join(names),
        )
    quality = {**known, **req.model_quality}
    return [
        {"model": n, "quality": quality.get(n), "hf_overrides": _overrides(req, wl, n)}
        for n in dict.fromkeys(names)
    ]


def _overrides(req: RecommendRequest, wl: Workload, model: str) -> dict[str, str]:
    """The config overrides for one candidate: the flag's for every candidate, else the
    workload's deployment's for its own model (another candidate is another config)."""
    if req.hf_overrides:
        return req.hf_overrides
    dep = wl.deployment
    return dict(dep.hf_overrides or {}) if dep and dep.model == model else {}


def _lengths(
    field: str, p50: int | None, p95: int | None, p99: int | None, stated: Any
) -> dict[str, Any]:
    """Flags first, then the workload's percentiles."""
    if stated is not None:
        p50 = p50 or (int(stated.typical()) if stated.typical() else None)
        p95 = p95 or (int(stated.p95) if stated.p95 else None)
        p99 = p99 or (int(stated.p99) if stated.p99 else None)
    if not p50:
        raise InputError(
            field,
            "give the typical length",
            f"--{field.replace('_', '-')} N, or the workload's traffic.{field}.p50",
        )
    return {"p50": p50, "p95": p95, "p99": p99}


def _rate(req: RecommendRequest, wl: Workload) -> tuple[float, list[float] | None]:
    t = wl.traffic
    hourly = t.hourly_rate_rps if t else None
    rate = req.request_rate if req.request_rate is not None else (t.arrival_rate_rps if t else None)
    if hourly and req.request_rate is not None and sum(hourly) > 0:
        # the flag wins: the day keeps its shape, scaled to the stated mean
        scale = req.request_rate / (sum(hourly) / 24)
        hourly = [h * scale for h in hourly]
    if rate is None and hourly:
        rate = sum(hourly) / 24
    if rate is None or rate <= 0:
        raise InputError(
            "request_rate",
            "give the mean arrival rate (requests/s)",
            "--request-rate R, or the workload's traffic.arrival_rate_rps / traffic.hourly_rate_rps",
        )
    return rate, hourly


def _targets(req: RecommendRequest, wl: Workload) -> dict[str, dict[str, float]]:
    out = {}
    for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
        flag = getattr(req, f"slo_{metric}")
        stated = getattr(wl.slo, metric, None) if wl.slo else None
        if flag:
            out[f"slo_{metric}"] = flag
        elif stated is not None:
            out[f"slo_{metric}"] = {
                k: getattr(stated, k) for k in PERCENTILE_KEYS if getattr(stated, k) is not None
            }
    return out


def _engine(req: RecommendRequest, wl: Workload) -> str:
    if req.engine:
        return req.engine
    from .sizing import CALCULATOR_ENGINES

    stated = wl.deployment.engine if wl.deployment else None
    if stated is None:
        return "vllm"
    if stated in CALCULATOR_ENGINES:
        return CALCULATOR_ENGINES[stated]
    raise InputError(
        "engine",
        f"the workload's deployment.engine {stated!r} has no memory and batching model here",
        "vllm, sglang, trtllm (--engine; a workload's tensorrt-llm is trtllm)",
    )


def _check_gpus(names: list[str], field: str) -> list[str]:
    from inferwise.calculators.catalog import get_gpu

    out = []
    for name in names:
        try:
            out.append(get_gpu(name).id)
        except InputError as exc:
            raise InputError(field, exc.message, exc.accepted) from None
    return out


def search_spec(req: RecommendRequest) -> Any:
    """The typed search request for the calculators, from the workload and the flags."""
    from inferwise.calculators.recommend.spec import SearchSpec

    wl = _workload(req)
    t, c, d, p = wl.traffic, wl.constraints, wl.deployment, wl.product
    rate, hourly = _rate(req, wl)
    slo = wl.slo
    prices = {**((c.gpu_prices_usd_per_hour or {}) if c else {}), **req.gpu_price}
    fields = {
        "models": _models(req, wl),
        "engine": _engine(req, wl),
        "engine_version": req.engine_version or (d.engine_version if d else None),
        "gpus": _check_gpus(req.gpus, "gpus")
        if req.gpus
        else _check_gpus((c.gpus or []) if c else [], "workload.constraints.gpus"),
        "max_gpus": req.max_gpus or (c.max_gpus if c else None),
        "budget_usd_per_hour": req.budget_usd_per_hour or (c.budget_usd_per_hour if c else None),
        "gpu_prices_usd_per_hour": prices,
        "mean_rate_per_s": rate,
        "peak_to_mean": req.peak_to_mean or (t.peak_to_mean if t and t.peak_to_mean else 1.0),
        "hourly_rate_per_s": hourly,
        "input_tokens": _lengths(
            "input_tokens",
            req.input_tokens,
            req.input_tokens_p95,
            req.input_tokens_p99,
            t.input_tokens if t else None,
        ),
        "output_tokens": _lengths(
            "output_tokens",
            req.output_tokens,
            req.output_tokens_p95,
            req.output_tokens_p99,
            t.output_tokens if t else None,
        ),
        "shared_prefix_fraction": t.shared_prefix_fraction if t else None,
        "mode": (t.mode if t and t.mode else "online"),
        "batch_share": req.batch_share
        if req.batch_share is not None
        else (t.batch_share if t else None),
        **_targets(req, wl),
        "availability": req.availability or (slo.availability if slo else None),
        "objective": req.objective,
        "top": req.top,
        "quality_floor_score": req.quality_floor_score
        if req.quality_floor_score is not None
        else (p.quality_floor_score if p else None),
        "autoscaling": {
            "min_replicas": req.min_replicas
            if req.min_replicas is not None
            else (d.min_replicas if d else None),
            "scale_to_zero": bool(
                req.scale_to_zero
                if req.scale_to_zero is not None
                else (d.scale_to_zero if d else False)
            ),
            "cold_start_s": req.cold_start_s
            if req.cold_start_s is not None
            else (d.cold_start_s if d else None),
        },
    }
    if req.quality_margin is not None:
        fields["quality_margin"] = req.quality_margin
    if req.calibration:
        from inferwise.probes.calibrations import load_applied

        fields["calibration"] = load_applied(req.calibration)
    fields.update(req.model_dump(include=set(SPEC_FIELDS)))
    if fields["availability"] is not None and fields["availability"] >= 1:
        raise InputError("availability", "must be below 1 (e.g. 0.999)")
    try:
        return SearchSpec.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        parts = [str(x) for x in err.get("loc", ())]
        if parts:
            parts[0] = _SPEC_TO_FLAG.get(parts[0], parts[0])
            if parts[0] in ("input_tokens", "output_tokens") and len(parts) == 1:
                parts[0] += "_p95"  # the only cross-field check: a p95 below the p50
        loc = ".".join(parts) or "input"
        raise InputError(
            loc, str(err.get("msg", "invalid")).removeprefix("Value error, ")
        ) from None


_SPEC_TO_FLAG = {
    "mean_rate_per_s": "request_rate",
    "hourly_rate_per_s": "workload.traffic.hourly_rate_rps",
    "gpu_prices_usd_per_hour": "gpu_price",
    "models": "model",
}
"""Search-spec fields named as the user gave them."""


def recommend_deployment(req: RecommendRequest) -> Any:
    """Search, price and rank deployments; see ``calculators.recommend.search``."""
    from inferwise.calculators.recommend.search import recommend

    return recommend(search_spec(req))
