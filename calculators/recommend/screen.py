"""The cheap stages of the search: memory fit, then an analytic capacity bound.

A configuration that does not fit is out. One that fits gets its step model
and the analytic saturation rate of a replica (``predict``'s): no replica can
carry more under any SLO, so ``ceil(peak / saturation)`` replicas is a lower
bound on the fleet and ``gpus x price`` a lower bound on its cost. An idle
replica's latency (one request's prefill at the target percentile's prompt
length, one decode step at batch 1) is a lower bound on every percentile, so a
target an idle replica already misses rules the configuration out unsimulated.
Only what survives is simulated (``evaluate``), cheapest bound first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .. import api
from ..errors import InputError
from .space import Config
from .spec import SearchSpec

MAX_UTILISATION = 0.9
"""A replica is loaded to at most 90 % of its saturation rate: above it the queue of a burst
longer than the simulated minute grows faster than it drains (the offline path uses 85 %)."""
IDLE_MARGIN = 1.05
"""An idle bound must miss a target by 5 % before it rules a configuration out unsimulated:
the bound leaves out nothing, but the simulation samples lengths, and a near miss is its call."""


@dataclass
class Screened:
    """A configuration that fits, with its bounds."""

    config: Config
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    checkpoint_bytes: int
    engine_version: str
    saturation_rate_per_s: float
    usd_per_gpu_hour: float
    replicas_lower_bound: int
    usd_per_hour_lower_bound: float
    notes: tuple[str, ...]


@dataclass
class Verdict:
    """Why a configuration is out (a rejection reason), or its screened form."""

    screened: Screened | None = None
    reason: str | None = None
    """A category (counted in ``rejected``); the figures go in ``detail``."""
    detail: str = ""


def deployment_fields(cfg: Config, spec: SearchSpec, max_model_len: int | None) -> dict[str, Any]:
    """The Deployment fields of a configuration (shared by fit, predict and budget requests)."""
    return {
        "model": cfg.model,
        "revision": cfg.revision,
        "hf_overrides": dict(cfg.hf_overrides),
        "gpu": cfg.gpu,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "quantization": cfg.quantization_flag,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "engine": spec.engine,
        "engine_version": spec.engine_version,
    }


def _fit(cfg: Config, spec: SearchSpec, max_model_len: int | None) -> Any:
    from ..fit import FitRequest

    return api.fit(
        FitRequest(**deployment_fields(cfg, spec, max_model_len)), with_suggestions=False
    )


class Screen:
    """Fits and bounds for one search, with the context window chosen once per memory layout."""

    def __init__(self, spec: SearchSpec, prices: dict[str, float]):
        self.spec = spec
        self.prices = prices
        self._windows: dict[tuple[Any, ...], int | str] = {}
        self.fits = 0

    def window(self, cfg: Config) -> int | str:
        """The context window for the configuration's layout: the model's maximum when it fits,
        else exactly what the workload needs; a string says why neither works."""
        key = cfg.group()
        if key not in self._windows:
            self._windows[key] = self._choose_window(cfg)
        return self._windows[key]

    def _choose_window(self, cfg: Config) -> int | str:
        base = replace(cfg, max_num_seqs=None, max_num_batched_tokens=None)
        need = self.spec.context_needed
        full = self._counted_fit(base, None)
        if full.max_model_len < need:
            return (
                "the model's context window is shorter than the workload's longest prompt + output"
            )
        if full.fits:
            return int(full.max_model_len)
        short = self._counted_fit(base, need)
        return int(need) if short.fits else "does not fit in GPU memory"

    def _counted_fit(self, cfg: Config, max_model_len: int | None) -> Any:
        self.fits += 1
        return _fit(cfg, self.spec, max_model_len)

    def check(self, cfg: Config) -> Verdict:
        """Fit the configuration, bound its capacity and latency."""
        try:
            return self._check(cfg)
        except InputError as exc:
            # e.g. a tensor-parallel degree that does not divide the attention heads
            return Verdict(reason=f"the engine refuses it ({exc.field})", detail=exc.message)

    def _check(self, cfg: Config) -> Verdict:
        window = self.window(cfg)
        if isinstance(window, str):
            return Verdict(reason=window)
        fit = self._counted_fit(cfg, window)
        if not fit.fits or not fit.kv_cache_tokens:
            return Verdict(reason="does not fit in GPU memory")
        model = _step_model(cfg, self.spec, window)
        idle = self._idle_miss(model)
        if idle:
            return Verdict(
                reason=f"no rate meets the SLO: an idle replica already misses the {idle[0]} target",
                detail=idle[1],
            )
        sat = _saturation(model, self.spec, window)
        price = self.prices[cfg.gpu]
        capacity = max(sat * MAX_UTILISATION, 1e-9)
        replicas = max(1, math.ceil(self.spec.peak_rate_per_s / capacity - 1e-9))
        replicas += spare_replicas(self.spec.availability)
        return Verdict(
            screened=Screened(
                config=cfg,
                max_model_len=window,
                max_num_seqs=int(fit.max_num_seqs),
                max_num_batched_tokens=int(fit.max_num_batched_tokens),
                kv_cache_tokens=int(fit.kv_cache_tokens),
                checkpoint_bytes=int(fit.checkpoint_bytes or fit.weights_bytes_total),
                engine_version=fit.engine_version,
                saturation_rate_per_s=sat,
                usd_per_gpu_hour=price,
                replicas_lower_bound=replicas,
                usd_per_hour_lower_bound=replicas * cfg.gpus_per_replica * price,
                notes=tuple(model.notes),
            )
        )

    def _idle_miss(self, model: Any) -> tuple[str, str] | None:
        """A target an idle replica already misses (its name, and the figures); None when
        every one is reachable."""
        spec = self.spec
        # what the budget adds before prefill, and the engine front end's per-request cost
        fixed_ms = spec.network_rtt_ms + _template_ms() + model.efficiency.request_overhead_ms
        for key, target in spec.slo_ttft_ms.items():
            prompt = int(spec.input_tokens.quantile(key))
            cached = int(prompt * (spec.shared_prefix_fraction or 0.0))
            idle = fixed_ms + model.prefill_ms(max(1, prompt - cached), cached)
            if idle > target * IDLE_MARGIN:
                return f"TTFT {key}", f"{idle:,.0f} ms > {target:,.0f} ms"
        if spec.slo_itl_ms:
            target = min(spec.slo_itl_ms.values())
            ctx = spec.input_tokens.mean + spec.output_tokens.mean / 2
            idle = model.decode_ms(1, ctx)
            if idle > target * IDLE_MARGIN:
                return "ITL", f"{idle:,.1f} ms at batch 1 > {target:,.0f} ms"
        return None


def _template_ms() -> float:
    """The budget's per-request template cost (its default: the search does not change it)."""
    from ..budget import BudgetRequest

    return float(BudgetRequest.model_fields["template_ms"].default)


def spare_replicas(availability: float | None) -> int:
    """Replicas beyond the peak's: one from 99.9 % (losing one still carries the peak), two
    from 99.99 % (one lost while another is being replaced or upgraded)."""
    if availability is None or availability < 0.999:
        return 0
    return 1 if availability < 0.9999 else 2


def _step_model(cfg: Config, spec: SearchSpec, window: int) -> Any:
    from ..deployment import Deployment
    from ..predict import step_model_for
    from .calibrated import calibration_for

    dep = Deployment(**deployment_fields(cfg, spec, window))
    return step_model_for(dep, calibration_for(cfg.gpu, spec))


def _saturation(model: Any, spec: SearchSpec, window: int) -> float:
    """A replica's saturation rate with the workload's mean lengths (as the budget samples them)."""
    from ..predict import saturation_point, workload_arrays

    inp, out = workload_arrays(_length_request(spec), 256, window)
    hits = spec.shared_prefix_fraction or 0.0
    return saturation_point(model, float(inp.mean()), float(out.mean()), hits).max_requests_per_s


@dataclass(frozen=True)
class _LengthRequest:
    input_tokens: int
    input_tokens_p95: int | None
    output_tokens: int
    output_tokens_p95: int | None
    seed: int = 0


def _length_request(spec: SearchSpec) -> _LengthRequest:
    return _LengthRequest(
        spec.input_tokens.p50, spec.input_tokens.p95, spec.output_tokens.p50, spec.output_tokens.p95
    )
