"""What the deployment search is asked: typed requirements, already merged and checked.

The door (``knowledge.recommending``) turns a workload file and flags into one
:class:`SearchSpec`; the search reads nothing else. Rates are requests per
second, lengths tokens, targets milliseconds, prices USD per GPU-hour.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..bounds import check_rate, check_slo_targets
from ..deployment import HfOverrides
from ..spec_decode import SpecMethod
from ..user_calibration import AppliedCalibration

Objective = Literal["cost", "latency", "throughput_per_gpu"]
Mode = Literal["online", "offline", "mixed"]

DEFAULT_QUALITY_MARGIN = 0.02
"""A candidate model must score at least floor x (1 + margin): 2 % above the floor, so
an evaluation's run-to-run noise (about a point on a 0-100 score) does not decide."""
MAX_MODELS = 8
MAX_GPU_TYPES = 12


class ModelOption(BaseModel):
    """One model the product may use, with its measured quality when known."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=4096)
    revision: str | None = Field(default=None, max_length=200)
    hf_overrides: HfOverrides = Field(default_factory=dict)
    """config.json fields to override (vLLM's --hf-overrides), as predict takes them."""
    quality: float | None = Field(
        default=None, description="The product's evaluation score for this model."
    )


class Lengths(BaseModel):
    """A token-length distribution by its percentiles (lognormal between p50 and p95)."""

    model_config = ConfigDict(extra="forbid")

    p50: int = Field(ge=1, le=2_000_000)
    p95: int | None = Field(default=None, ge=1, le=2_000_000)
    p99: int | None = Field(default=None, ge=1, le=2_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> Lengths:
        if self.p95 is not None and self.p95 < self.p50:
            raise ValueError(f"p95 ({self.p95}) is below p50 ({self.p50})")
        if self.p99 is not None and self.p99 < (self.p95 or self.p50):
            raise ValueError(f"p99 ({self.p99}) is below p95/p50")
        return self

    @property
    def sigma(self) -> float:
        return math.log(self.p95 / self.p50) / 1.6448536269514722 if self.p95 else 0.0

    @property
    def mean(self) -> float:
        """Mean of the lognormal through p50 and p95 (the p50 itself when fixed)."""
        return self.p50 * math.exp(self.sigma**2 / 2)

    @property
    def cv(self) -> float:
        """Coefficient of variation (the probe's ``--input-spread``)."""
        return math.sqrt(math.exp(self.sigma**2) - 1.0)

    def quantile(self, key: str) -> float:
        """The length at percentile ``key`` (p50 ... p99) of the fitted lognormal."""
        z = {"p50": 0.0, "p90": 1.2815515655446004, "p95": 1.6448536269514722}.get(key, 2.3263)
        if key == "p99" and self.p99 is not None:
            return float(self.p99)
        return self.p50 * math.exp(self.sigma * z)

    @property
    def longest_needed(self) -> int:
        """The length the context window must hold: p99, else p95, else p50."""
        return int(self.p99 or self.p95 or self.p50)


class Autoscaling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int | None = Field(default=None, ge=0, le=10_000)
    scale_to_zero: bool = False
    cold_start_s: float | None = Field(
        default=None, ge=0, le=86_400, description="Stated cold start; default: computed."
    )

    @property
    def enabled(self) -> bool:
        return self.scale_to_zero or self.min_replicas is not None


class SearchSpec(BaseModel):
    """Everything the search needs; see the module docstring for units."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelOption] = Field(min_length=1, max_length=MAX_MODELS)
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    engine_version: str | None = None
    calibration: AppliedCalibration | None = None
    """A stored calibration: its factors for the candidates on its GPU (see .calibrated)."""
    gpus: list[str] = Field(default_factory=list, max_length=MAX_GPU_TYPES)
    max_gpus: int | None = Field(default=None, ge=1, le=4096)
    budget_usd_per_hour: float | None = Field(default=None, gt=0, le=1e7)
    gpu_prices_usd_per_hour: dict[str, float] = Field(default_factory=dict)
    mean_rate_per_s: float
    peak_to_mean: float = Field(default=1.0, ge=1, le=100)
    hourly_rate_per_s: list[float] | None = Field(default=None, min_length=24, max_length=24)
    input_tokens: Lengths
    output_tokens: Lengths
    shared_prefix_fraction: float | None = Field(default=None, ge=0, le=1)
    mode: Mode = "online"
    batch_share: float | None = Field(default=None, ge=0, lt=1)
    slo_ttft_ms: dict[str, float] = Field(default_factory=dict)
    slo_itl_ms: dict[str, float] = Field(default_factory=dict)
    slo_e2e_ms: dict[str, float] = Field(default_factory=dict)
    availability: float | None = Field(default=None, gt=0, lt=1)
    objective: Objective = "cost"
    top: int = Field(default=5, ge=1, le=50)
    quality_floor_score: float | None = None
    quality_margin: float = Field(default=DEFAULT_QUALITY_MARGIN, ge=0, le=1)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    network_rtt_ms: float = Field(default=40.0, ge=0, le=60_000)
    speculative_method: SpecMethod | None = None
    spec_acceptance_length: float | None = Field(default=None, ge=1.0, le=17.0)
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=16)

    @field_validator("mean_rate_per_s")
    @classmethod
    def _rate(cls, v: float) -> float:
        checked = check_rate(v)
        assert checked is not None
        return checked

    @field_validator("hourly_rate_per_s")
    @classmethod
    def _profile(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        for i, x in enumerate(v):
            if not (math.isfinite(x) and 0 <= x <= 1e6):
                raise ValueError(f"hour {i}: {x!r} is not a rate in 0..1e6 requests/s")
        if max(v) <= 0:
            raise ValueError("the profile has no traffic in any hour")
        return v

    @field_validator("gpu_prices_usd_per_hour")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        for gpu, usd in v.items():
            if not (math.isfinite(usd) and 0 < usd <= 10_000):
                raise ValueError(f"{gpu}: {usd!r} is not a price in (0, 10000] USD per GPU-hour")
        return v

    @field_validator("slo_ttft_ms", "slo_itl_ms", "slo_e2e_ms")
    @classmethod
    def _percentiles(cls, v: dict[str, float]) -> dict[str, float]:
        return check_slo_targets(v)

    @property
    def peak_rate_per_s(self) -> float:
        """The rate the fleet must carry: the busiest hour (x peak_to_mean within it when a
        profile is given), else the mean x peak_to_mean."""
        if self.hourly_rate_per_s:
            return max(self.hourly_rate_per_s) * self.peak_to_mean
        return self.mean_rate_per_s * self.peak_to_mean

    @property
    def daily_mean_rate_per_s(self) -> float:
        if self.hourly_rate_per_s:
            return sum(self.hourly_rate_per_s) / 24.0
        return self.mean_rate_per_s

    @property
    def has_targets(self) -> bool:
        return bool(self.slo_ttft_ms or self.slo_itl_ms or self.slo_e2e_ms)

    @property
    def context_needed(self) -> int:
        """Prompt plus output at their longest stated percentile: the smallest window allowed."""
        return self.input_tokens.longest_needed + self.output_tokens.longest_needed
