"""The expensive stage: simulate a screened configuration and size its fleet.

The budget's rate search gives the highest rate one replica carries with every
target met; the fleet is ``ceil(peak / that rate)`` serving replicas plus the
availability spares. The fleet is then checked the way a user would check it:
``budget`` at the design load of one replica (peak / serving replicas). The
rate search and the check sample different arrivals, so a fleet sized right at
the edge can fail its check; it then gets one more replica until it passes
(at most :data:`MAX_TOP_UPS` times), which keeps the answer consistent with the
calculators by construction.

Without latency targets (offline work) a replica is loaded to
:data:`OFFLINE_UTILISATION` of its saturation rate, and the design point comes
from ``predict``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import api
from .calibrated import calibration_for
from .screen import MAX_UTILISATION, Screened, deployment_fields, spare_replicas
from .spec import SearchSpec

MAX_TOP_UPS = 3
OFFLINE_UTILISATION = 0.85
"""Offline replicas run near saturation; 15 % is left for length variance and restarts."""


@dataclass
class Evaluated:
    screened: Screened
    max_rate_per_replica: float
    replicas: int
    spare_replicas: int
    design: Any | None
    """The budget (or predict) result at the design load of one replica."""
    meets_slo: bool
    slo_attainment: float
    reason: str | None = None

    @property
    def total_replicas(self) -> int:
        return self.replicas + self.spare_replicas

    @property
    def total_gpus(self) -> int:
        return self.total_replicas * self.screened.config.gpus_per_replica


def budget_request(s: Screened, spec: SearchSpec, rate: float) -> Any:
    """The ``budget`` request that checks one replica of ``s`` at ``rate``."""
    from ..budget import BudgetRequest

    return BudgetRequest(
        **deployment_fields(s.config, spec, s.max_model_len),
        slo_ttft_ms=spec.slo_ttft_ms,
        slo_itl_ms=spec.slo_itl_ms,
        slo_e2e_ms=spec.slo_e2e_ms,
        input_tokens=spec.input_tokens.p50,
        input_tokens_p95=spec.input_tokens.p95,
        output_tokens=spec.output_tokens.p50,
        output_tokens_p95=spec.output_tokens.p95,
        request_rate=rate,
        network_rtt_ms=spec.network_rtt_ms,
        prefix_cache_hit_rate=spec.shared_prefix_fraction,
    )


def _budget(s: Screened, spec: SearchSpec, rate: float, find_max_rate: bool = True) -> Any:
    """``budget`` of one replica of ``s`` at ``rate`` (calibrated where the spec's
    calibration covers the candidate's GPU; the memo keys on the calibration itself)."""
    req = budget_request(s, spec, rate)
    return api.budget(req, find_max_rate, calibration_for(s.config.gpu, spec))


def evaluate(s: Screened, spec: SearchSpec) -> Evaluated:
    """Size the fleet of one configuration and check it at its design load."""
    if not spec.has_targets:
        return _evaluate_offline(s, spec)
    peak = spec.peak_rate_per_s
    serving_guess = max(1, s.replicas_lower_bound - spare_replicas(spec.availability))
    first = _budget(s, spec, peak / serving_guess)
    max_rate = min(
        float(first.max_rate_under_slo or 0.0), first.saturation_request_rate * MAX_UTILISATION
    )
    if max_rate <= 0:
        missed = "; ".join(first.why[:2]) or "an idle replica misses a target"
        return Evaluated(s, 0.0, 0, 0, first, False, 0.0, f"no rate meets the SLO: {missed}")
    replicas = max(1, math.ceil(peak / max_rate - 1e-9))
    design = first if replicas == serving_guess else _design_point(s, spec, peak / replicas)
    for _ in range(MAX_TOP_UPS):
        if design.feasible:
            break
        replicas += 1
        design = _design_point(s, spec, peak / replicas)
    return Evaluated(
        screened=s,
        max_rate_per_replica=max_rate,
        replicas=replicas,
        spare_replicas=spare_replicas(spec.availability),
        design=design,
        meets_slo=bool(design.feasible),
        slo_attainment=float(design.slo_attainment),
        reason=None if design.feasible else "; ".join(design.why[:2]),
    )


def _design_point(s: Screened, spec: SearchSpec, rate: float) -> Any:
    """The budget of one replica at ``rate``, without a rate search."""
    return _budget(s, spec, rate, find_max_rate=False)


def _evaluate_offline(s: Screened, spec: SearchSpec) -> Evaluated:
    from ..predict import PredictRequest

    max_rate = s.saturation_rate_per_s * OFFLINE_UTILISATION
    replicas = max(1, math.ceil(spec.peak_rate_per_s / max_rate - 1e-9))
    design = api.predict(
        PredictRequest(
            **deployment_fields(s.config, spec, s.max_model_len),
            input_tokens=spec.input_tokens.p50,
            input_tokens_p95=spec.input_tokens.p95,
            output_tokens=spec.output_tokens.p50,
            output_tokens_p95=spec.output_tokens.p95,
            request_rate=spec.peak_rate_per_s / replicas,
            prefix_cache_hit_rate=spec.shared_prefix_fraction,
        ),
        calibration_for(s.config.gpu, spec),
    )
    return Evaluated(
        s, max_rate, replicas, spare_replicas(spec.availability), design, True, 1.0, None
    )
