"""Prediction intervals: how far published measurements fell from the model's predictions.

A prediction without its error bar invites more trust than the model has earned.
``bench/prediction_intervals.py`` simulates every measurement of
``tests/data/perf_measurements.toml`` that the factors were NOT fitted on, takes
the ratio measured / predicted per value, and writes the 10th and 90th
percentile of those ratios per regime (metric family, engine family, load band,
context band) to ``data/prediction_intervals.toml``. Predict multiplies its
value by that pair: "80 % of held-out truths in this regime lay in this range".

A regime with too few held-out values falls back to a coarser one (metric and
engine, then metric alone); with none at all the interval is a wide default and
says so. Wide where data is thin is the honest answer.

Stdlib and pydantic only at module level.
"""

from __future__ import annotations

import math
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

INTERVALS_FILE = Path(__file__).parent / "data" / "prediction_intervals.toml"
MIN_VALUES = 9  # fewer: no finite-sample 80 % bound (split conformal); use the coarser regime
MIN_SOURCES = 9
"""A regime cell (not the metric-wide one) must rest on this many published sources. A new
deployment is a new source: its values share its conditions (engine build, client, lengths) and
miss together, so the units it is exchangeable with are sources, not values (the bounds are a
random-effects prediction interval over sources, bench/prediction_intervals.prediction_bounds),
and a cell narrower than its family needs as many of them as a split-conformal bound needs
units. Held-out coverage of the p10-p90 ranges, each built without the value's own source
(bench/predict_accuracy.py, 2026-12-04): 63 % with value percentiles and 2 sources; 70 % with 9
sources; 87 % with sources as units and 9 (80 % with 3, 84 % with 5), 86 % with 9 after the
day's later factor changes (the SGLang-on-ROCm MoE floor)."""
NO_DATA_RATIOS = (1 / 3, 3.0)  # no held-out value at all for the metric: a factor of 3 each way
METRIC_FAMILIES = ("ttft", "itl", "e2e", "throughput")


def metric_family(name: str) -> str:
    """ttft / itl (ITL and TPOT) / e2e / throughput, for a metric name like ``ttft_ms.p50``."""
    if name.startswith("ttft"):
        return "ttft"
    if name.startswith(("itl", "tpot")):
        return "itl"
    if name.startswith("e2e"):
        return "e2e"
    return "throughput"


def engine_family(engine: str) -> str:
    """vllm, sglang or trtllm: the engines whose step times differ enough to need their own."""
    return engine if engine in ("vllm", "sglang", "trtllm") else "vllm"


def load_band(concurrency: int | None, rate_per_s: float | None) -> str:
    """c1 (one request at a time), c2-16, c17+ (closed loop or offline, where queueing
    and batch effects dominate), or rate (open loop below saturation)."""
    if concurrency is not None:
        return "c1" if concurrency <= 1 else ("c2-16" if concurrency <= 16 else "c17+")
    if rate_per_s is None or math.isinf(rate_per_s):
        return "c17+"
    return "rate"


def context_band(input_tokens: float, output_tokens: float) -> str:
    """ctx<=2k, ctx2k-8k or ctx>8k: tokens per request (input + output)."""
    tokens = input_tokens + output_tokens
    return "ctx<=2k" if tokens <= 2048 else ("ctx2k-8k" if tokens <= 8192 else "ctx>8k")


def architecture_class(num_experts: int) -> str:
    """dense or moe: MoE (and MLA, which comes with MoE here) models miss differently."""
    return "moe" if num_experts else "dense"


def regime_keys(
    family: str, engine: str, load: str, context: str, arch: str = "dense"
) -> tuple[str, ...]:
    """The regime's keys from most specific to coarsest (the look-up order). The
    architecture class is never dropped: a dense model's interval must not borrow the
    misses of MoE/MLA models (or the reverse); with no evidence in its class the
    interval is the wide no-data default, said as such."""
    return (
        f"{family}|{engine}|{load}|{context}|{arch}",
        f"{family}|{engine}|{load}|{arch}",
        f"{family}|{engine}|{arch}",
        f"{family}|{arch}",
    )


class Interval(BaseModel):
    """Where the measured value of one predicted metric is expected to lie."""

    low: float = Field(description="Predicted value x the 10th percentile of held-out ratios.")
    high: float = Field(description="Predicted value x the 90th percentile of held-out ratios.")
    ratio_p10: float = Field(description="10th percentile of measured / predicted.")
    ratio_p90: float
    regime: str = Field(description="The regime whose held-out values set it (or 'no data').")
    values: int = Field(description="Held-out values behind it (0: the wide default).")


class PredictIntervals(BaseModel):
    """p10-p90 ranges for the predicted metrics (the latencies' median, the throughputs)."""

    ttft_ms: Interval
    itl_ms: Interval | None = None
    tpot_ms: Interval | None = None
    e2e_ms: Interval
    output_tokens_per_s: Interval | None = Field(
        default=None, description="Null in a budget (it predicts latencies, not throughput)."
    )
    requests_per_s: Interval | None = None
    basis: str = Field(
        description="Which measurements and factor set the intervals rest on, and how made."
    )


def _table_file(path: Path) -> dict[str, Any]:
    """A bench-written TOML table, empty when its bench never ran."""
    if not path.exists():
        return {}
    with path.open("rb") as fh:
        return tomllib.load(fh)


@lru_cache(maxsize=1)
def interval_table() -> dict[str, Any]:
    """The stored interval table (empty when bench/prediction_intervals.py never ran)."""
    return _table_file(INTERVALS_FILE)


def ratio_interval(
    family: str,
    engine: str,
    load: str,
    context: str,
    table: dict[str, Any] | None = None,
    arch: str = "dense",
) -> tuple[float, float, str, int]:
    """(ratio p10, ratio p90, regime, values) for a regime, falling back to coarser ones."""
    cells = (table if table is not None else interval_table()).get("regime", {})
    keys = regime_keys(family, engine, load, context, arch)
    for key in keys:
        cell = cells.get(key)
        if not cell or int(cell["values"]) < MIN_VALUES:
            continue
        if key != keys[-1] and int(cell.get("sources", 1)) < MIN_SOURCES:
            continue  # one source's spread is not the regime's: coarser, but earned
        return float(cell["ratio_p10"]), float(cell["ratio_p90"]), key, int(cell["values"])
    return NO_DATA_RATIOS[0], NO_DATA_RATIOS[1], "no data", 0


def interval_for(value: float, family: str, regime: tuple[str, str, str, str]) -> Interval:
    """The interval of one predicted value (regime = engine, load band, context band,
    architecture class)."""
    engine, load, context, arch = regime
    lo, hi, key, n = ratio_interval(family, engine, load, context, arch=arch)
    return Interval(
        low=value * lo, high=value * hi, ratio_p10=lo, ratio_p90=hi, regime=key, values=n
    )


def latency_intervals(
    latencies: Any,
    engine: str,
    load: tuple[int | None, float | None],
    lengths: tuple[float, float],
    num_experts: int = 0,
) -> PredictIntervals:
    """Intervals for a budget's predicted TTFT / ITL / E2E medians (``latencies`` has
    ``ttft_ms``, ``itl_ms``, ``e2e_ms`` percentile objects; the design load and lengths
    pick the regime)."""
    concurrency, rate = load
    regime = (
        engine_family(engine),
        load_band(concurrency if concurrency or rate is not None else 1, rate),
        context_band(*lengths),
        architecture_class(num_experts),
    )
    itl = latencies.itl_ms
    return PredictIntervals(
        ttft_ms=interval_for(latencies.ttft_ms.p50, "ttft", regime),
        itl_ms=interval_for(itl.p50, "itl", regime) if itl else None,
        e2e_ms=interval_for(latencies.e2e_ms.p50, "e2e", regime),
        basis=_basis(),
    )


def _basis() -> str:
    return str(
        interval_table()
        .get("meta", {})
        .get("basis", "no interval table (run bench/prediction_intervals.py): factor-of-3 defaults")
    )


def predict_intervals(
    result: Any, engine: str, concurrency: int | None, rate: float | None, num_experts: int = 0
) -> Any:
    """The intervals block of a PredictResult (typed ``PredictIntervals``)."""
    regime = (
        engine_family(engine),
        load_band(concurrency if concurrency or rate is not None else 1, rate),
        context_band(result.load.input_tokens["mean"], result.load.output_tokens["mean"]),
        architecture_class(num_experts),
    )
    return PredictIntervals(
        ttft_ms=interval_for(result.ttft_ms.p50, "ttft", regime),
        itl_ms=interval_for(result.itl_ms.p50, "itl", regime) if result.itl_ms else None,
        tpot_ms=interval_for(result.tpot_ms.p50, "itl", regime) if result.tpot_ms else None,
        e2e_ms=interval_for(result.e2e_ms.p50, "e2e", regime),
        output_tokens_per_s=interval_for(result.output_tokens_per_s, "throughput", regime),
        requests_per_s=interval_for(result.requests_per_s, "throughput", regime),
        basis=_basis(),
    )


# --------------------------------------------------------------------------- calibrated

CALIBRATED_NOISE = 0.10
"""A calibrated interval is never narrower than +-10 %: two probes of one load on one
machine differ by about that much (the ITL mean of the engine calibration test moves by
up to 12 % between two runs of one load), so residuals on a few points cannot earn less."""

CALIBRATED_FILE = Path(__file__).parent / "data" / "calibrated_intervals.toml"
"""Written by ``bench/calibrate_accuracy.py --write``: measured / calibrated prediction
on published sweeps at the loads above the two each was calibrated on."""


@lru_cache(maxsize=1)
def extrapolation_table() -> dict[str, Any]:
    """p10/p90 per metric family of calibrated predictions beyond the measured loads."""
    return _table_file(CALIBRATED_FILE)


_FAMILY_OF_FIELD = {
    "ttft_ms": "ttft",
    "itl_ms": "itl",
    "tpot_ms": "itl",
    "e2e_ms": "e2e",
    "output_tokens_per_s": "throughput",
    "requests_per_s": "throughput",
}
_RESIDUALS_OF_FAMILY = {
    "ttft": ("ttft_ms",),
    "itl": ("itl_ms",),
    # E2E is TTFT plus the decode steps: its ratio lies between theirs
    "e2e": ("ttft_ms", "itl_ms"),
    "throughput": ("output_tokens_per_s",),
}


def _residual_band(spread: Any, family: str) -> tuple[float, float, int] | None:
    """(ratio low, ratio high, points) from a calibration's residual spread, or None."""
    parts = [getattr(spread, m, None) for m in _RESIDUALS_OF_FAMILY[family]]
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    lo = min(min(p.p10 for p in parts), 1 - CALIBRATED_NOISE)
    hi = max(max(p.p90 for p in parts), 1 + CALIBRATED_NOISE)
    return lo, hi, min(p.points for p in parts)


def _extrapolation_band(family: str) -> tuple[float, float] | None:
    """The held-out spread of calibrated predictions beyond the measured loads (E2E: the
    envelope of TTFT's and ITL's), or None without the table."""
    cells = extrapolation_table().get("family", {})
    parts = [cells.get(metric_family(m)) for m in _RESIDUALS_OF_FAMILY[family]]
    parts = [p for p in parts if p]
    if not parts:
        return None
    return min(float(p["ratio_p10"]) for p in parts), max(float(p["ratio_p90"]) for p in parts)


def calibrated_intervals(
    published: PredictIntervals,
    values: dict[str, float | None],
    applied: Any,
    load: tuple[int | None, float | None],
) -> PredictIntervals:
    """The intervals of a calibrated prediction: each predicted value x the p10/p90 of the
    calibration's own residuals (measured / calibrated prediction on its points), with the
    run-to-run noise as the floor. At a ``load`` (concurrency, rate) the calibration did not
    measure the band widens to what calibrated predictions beyond their measured loads
    missed by on published sweeps. A metric the calibration has no residuals for keeps its
    published interval. ``values`` maps a field (``ttft_ms``...) to the predicted value."""
    extrapolating = not applied.measured_load(*load)
    fields: dict[str, Any] = {}
    for field, value in values.items():
        family = _FAMILY_OF_FIELD[field]
        band = _residual_band(applied.residual_spread, family)
        if value is None or band is None:
            continue
        lo, hi, n = band
        wide = _extrapolation_band(family) if extrapolating else None
        if wide is not None:
            lo, hi = min(lo, wide[0]), max(hi, wide[1])
        fields[field] = Interval(
            low=value * lo,
            high=value * hi,
            ratio_p10=round(lo, 4),
            ratio_p90=round(hi, 4),
            regime=f"calibration {applied.name}" + (" (extrapolated load)" if wide else ""),
            values=n,
        )
    return published.model_copy(
        update={**fields, "basis": _calibrated_basis(applied.name, extrapolating, values, fields)}
    )


def _calibrated_basis(
    name: str, extrapolating: bool, values: dict[str, float | None], fields: dict[str, Any]
) -> str:
    where = (
        "widened to the held-out misses of calibrated predictions beyond their measured loads ("
        + str(extrapolation_table().get("meta", {}).get("basis", "no table"))
        + ")"
        if extrapolating
        else "at a load it measured"
    )
    kept = sorted(f for f, v in values.items() if v is not None and f not in fields)
    rest = f"; {', '.join(kept)} held-out published" if kept else ""
    return (
        f"calibration {name!r}: the p10/p90 of its residuals on its own points (at least "
        f"+-{CALIBRATED_NOISE:.0%}, a repeated probe's spread), {where}{rest}"
    )
