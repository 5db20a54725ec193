"""What the deployment search answers (``inferwise recommend --json``; names are a contract)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .levers import LeverVerdict


class Tail(BaseModel):
    """A latency distribution at the design load, ms."""

    p50: float
    p95: float
    p99: float


class Predicted(BaseModel):
    ttft_ms: Tail
    itl_ms: Tail | None = Field(description="Null when requests generate one token.")
    e2e_ms: Tail


class ColdStart(BaseModel):
    """Seconds from a scale-up decision to a replica that serves."""

    image_pull_s: float
    weight_load_s: float
    engine_start_s: float
    total_s: float
    source: str = Field(description="Stated by the user, or how each part was computed.")


class AutoscalingReplay(BaseModel):
    """The 24-hour profile replayed against the scaling rule (minute steps)."""

    rule: str
    cold_start: ColdStart
    gpu_hours_per_day: float
    fixed_fleet_gpu_hours_per_day: float
    gpu_hours_saved_per_day: float
    usd_per_day: float
    fixed_fleet_usd_per_day: float
    requests_missing_slo_during_scale_up: float = Field(
        description="Share of the day's requests that arrive while capacity is still starting."
    )
    first_requests_after_idle_miss_ttft: bool = Field(
        description="Scale to zero with a cold start above the TTFT target: the first requests "
        "after an idle period wait for a replica to start."
    )
    notes: list[str] = Field(default_factory=list)


class Candidate(BaseModel):
    """One priced deployment: a replica configuration and the fleet of it that carries the peak."""

    model: str
    quality: float | None = None
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel: bool
    quantization: str = Field(
        description="bf16 (the checkpoint's 16-bit weights), fp8, int4, "
        "or the checkpoint's own method."
    )
    kv_cache_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    engine: str
    engine_version: str
    calibration: str | None = Field(
        default=None, description="The calibration its numbers use (null: published factors)."
    )
    gpus_per_replica: int
    kv_cache_tokens: int
    replicas: int = Field(description="Replicas that carry the peak (serving).")
    spare_replicas: int = Field(
        description="Added for availability (see assumptions for the rule)."
    )
    total_gpus: int
    max_rate_under_slo_per_replica: float = Field(
        description="Requests/s one replica carries with every target met (the budget's rate search)."
    )
    design_rate_per_replica: float = Field(description="Peak / serving replicas, requests/s.")
    utilisation: float = Field(
        description="Design rate per replica / the replica's saturation rate (0-1)."
    )
    usd_per_gpu_hour: float
    usd_per_hour: float = Field(description="total_gpus x usd_per_gpu_hour.")
    usd_per_million_output_tokens: float = Field(
        description="The day's fleet cost (autoscaled when autoscaling is on) / the day's tokens."
    )
    usd_per_million_input_tokens: float = Field(description="As usd_per_million_output_tokens.")
    usd_per_successful_request: float = Field(
        description="Fleet cost per hour / successful requests per hour at the mean rate."
    )
    slo_attainment: float = Field(
        description="Share of simulated requests at the design load that meet every target."
    )
    gpu_hours_per_day: float
    usd_per_day: float
    output_tokens_per_s_per_gpu: float = Field(description="At the design load.")
    output_tokens_per_s_per_user: float = Field(description="1000 / ITL p50 at the design load.")
    predicted: Predicted
    meets_slo: bool
    autoscaling: AutoscalingReplay | None = None
    serve_command: str
    verify_command: str
    notes: list[str] = Field(default_factory=list)


class ParetoPoint(BaseModel):
    """A simulated candidate no other beats on both throughput per GPU and speed per user."""

    output_tokens_per_s_per_gpu: float
    output_tokens_per_s_per_user: float
    model: str
    gpu: str
    tensor_parallel_size: int
    quantization: str
    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    meets_slo: bool
    usd_per_million_output_tokens: float


class Rejection(BaseModel):
    reason: str
    count: int = Field(description="Configurations rejected for this reason.")
    example: str = Field(description="One of them, as a short configuration label.")


class Searched(BaseModel):
    configurations: int = Field(description="Configurations considered.")
    fitted: int = Field(description="Memory fits computed.")
    simulated: int = Field(description="Configurations whose load was simulated.")
    elapsed_s: float


class PriceUsed(BaseModel):
    gpu: str
    usd_per_gpu_hour: float
    source: str = Field(description="Where the price came from (URL and date, or 'user').")


class FleetOption(BaseModel):
    """One way to serve mixed online and offline traffic."""

    name: str
    usd_per_hour: float
    total_gpus: int
    detail: str


class MixedTraffic(BaseModel):
    """Online and offline work: one shared fleet or two pools, the cheaper that keeps the SLO."""

    batch_share: float
    chosen: str
    reason: str
    options: list[FleetOption]


class RecommendResult(BaseModel):
    feasible: bool
    verdict: str
    recommended: Candidate | None
    candidates: list[Candidate] = Field(
        description="Ranked by the objective; meeting every target first."
    )
    pareto: list[ParetoPoint]
    rejected: list[Rejection]
    nearest: list[str] = Field(
        description="When nothing is feasible: the nearest changes that would make something work."
    )
    mixed_traffic: MixedTraffic | None = None
    levers: list[LeverVerdict] = Field(
        default_factory=list,
        description="Speculative decoding, prefix caching and disaggregation tried on the "
        "recommended fleet: worth it or not, by how much.",
    )
    searched: Searched
    prices: list[PriceUsed]
    objective: str
    design_rate_per_s: float = Field(description="The peak the fleet is sized for, requests/s.")
    mean_rate_per_s: float
    assumptions: list[str]
    warnings: list[str]
