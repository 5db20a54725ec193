"""Fit one deployment's step-time factors to the user's own measurements.

The published factors (``calibration.py``, ``data/efficiency.toml``) are fitted
on other people's benchmarks and are 25-60 % off on any one deployment; a user
who measured theirs should get predictions from their numbers. This module
fits, for one deployment, the factors the roofline and the batching simulation
depend on, from measured load points (:class:`bench_files.MeasuredPoint`):

* ``compute_fraction``     scales the dense and MoE GEMM fractions (prefill, large batches);
* ``bandwidth_fraction``   scales the weight and KV-cache bandwidth fractions (decode);
* ``step_overhead_ms``     scales the per-step and per-layer fixed costs;
* ``single_seq_step_factor`` how a step of one sequence alone compares with the line the
  batched steps follow (matrix-vector kernels against matrix-matrix ones);
* ``per_seq_overhead_ms``  the per-sequence cost in each step (sampling, detokenize);
* ``request_overhead_ms``  a fixed cost per request outside the engine's steps
  (HTTP, tokenization, the client): the simulator delays each request's arrival at
  the engine by it, as it does the published front-end cost, so it adds to TTFT and
  end-to-end latency and, under load, decides which step a request lands in.

The fit is bounded least squares (``scipy.optimize.least_squares``) on the log
of predicted / measured mean TTFT, ITL (TPOT where ITL is missing) and output
throughput, each point simulated at exactly its load and lengths. Before
fitting, the sensitivity of every residual to every factor is measured: a
factor the points cannot move (all points at one load cannot separate bandwidth
from per-step overhead) or cannot tell apart from another is held at its
published value, with a warning that says why. What the fit leaves is reported
per point and as the spread of measured / predicted ratios per metric, which
prediction intervals can be narrowed to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .bench_files import MeasuredPoint
from .errors import InputError

METRICS = ("ttft_ms", "itl_ms", "output_tokens_per_s")
MAX_SIM_REQUESTS = 400
"""Requests simulated per point and evaluation: stable means, milliseconds per simulation."""
MIN_VALUES = 2
"""Two measured values (the TTFT and ITL of one load level) fit at least two factors."""
SENSITIVITY_FLOOR = 0.01
"""A factor whose 28 % change moves the residuals by less than 1 % on average is not identified."""
COLLINEARITY_FLOOR = 0.1
MIN_LOADS_PER_SEQ = 3
"""A per-sequence cost is a third shape of ITL over the batch beside the per-step cost
(flat) and the rates (weights, experts touched, KV read): two loads fix a line through
two ITLs, which both of the others already draw. Below that it is fitted only where the
others leave the points off by more than POINT_NOISE_LOG."""
POINT_NOISE_LOG = 0.10
"""What two probes of one load differ by (about 10 %): a fit this close has nothing left to explain."""
PER_SEQ_GAIN = 0.7
"""A per-sequence cost fitted beyond its loads must take the rms log error below this share."""
SINGLE_SEQ_ON_LINE = (0.85, 1.15)
"""A fitted single-sequence factor within this band is noise around the batched line (two
probes of one load differ by about 10 %); outside it the fit says the engine steps one
sequence differently."""


@dataclass(frozen=True)
class Factor:
    """One fitted quantity: how it maps onto the Efficiency and its bounds."""

    name: str
    log_scale: bool
    lower: float
    upper: float
    why: str


FACTORS = (
    Factor("compute_fraction", True, 0.01, 1.0, "prefill and large-batch GEMMs"),
    Factor("bandwidth_fraction", True, 0.02, 1.0, "decode steps reading weights and KV cache"),
    Factor("step_overhead_ms", True, 0.005, 200.0, "fixed cost of every engine step"),
    Factor(
        "single_seq_step_factor", True, 0.2, 2.0, "a step of one sequence alone (matrix-vector)"
    ),
    Factor("per_seq_overhead_ms", True, 1e-4, 50.0, "per sequence in every step"),
    Factor("request_overhead_ms", False, 0.0, 30_000.0, "per request outside the engine's steps"),
)


class CalibratedFactors(BaseModel):
    """What a calibration changes in the model: the efficiency factors and the per-request cost."""

    model_config = ConfigDict(extra="forbid")

    efficiency: dict[str, float] = Field(
        description="Efficiency factors (names as in predict's factors)."
    )
    request_overhead_ms: float = Field(
        0.0,
        ge=0,
        description=(
            "Per-request cost outside the engine's steps: the simulator delays each "
            "request's arrival at the engine by it."
        ),
    )


class MetricSpread(BaseModel):
    """Measured / calibrated-prediction ratios of one metric over the calibration points."""

    model_config = ConfigDict(extra="forbid")

    p10: float
    p90: float
    points: int


class ResidualSpread(BaseModel):
    """Per metric, the p10/p90 of measured / predicted after the fit: a prediction
    interval calibrated on these points may be narrowed to [p10, p90] x prediction."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: MetricSpread | None = None
    itl_ms: MetricSpread | None = None
    output_tokens_per_s: MetricSpread | None = None


class PointResidual(BaseModel):
    """One measured load point against the prediction before and after the fit."""

    model_config = ConfigDict(extra="forbid")

    source: str
    load: str
    concurrency: int | None = Field(default=None, description="Closed-loop clients.")
    request_rate_per_s: float | None = Field(
        default=None, description="Open-loop arrival rate (null: closed loop or offline)."
    )
    input_tokens_mean: float
    output_tokens_mean: float
    measured: dict[str, float]
    published: dict[str, float] = Field(description="Predicted with the published factors.")
    calibrated: dict[str, float] = Field(description="Predicted with the fitted factors.")
    ratio: dict[str, float] = Field(description="measured / calibrated prediction.")


class CalibrationFit(BaseModel):
    """The outcome of one fit."""

    model_config = ConfigDict(extra="forbid")

    factors: CalibratedFactors
    published: CalibratedFactors
    fitted: list[str]
    held: dict[str, str] = Field(description="Factors held at the published value, and why.")
    points: list[PointResidual]
    residual_spread: ResidualSpread
    rms_log_error_published: float
    rms_log_error_calibrated: float
    warnings: list[str]


# --------------------------------------------------------------------------- applying


def calibrated_efficiency(published: Any, factors: CalibratedFactors) -> Any:
    """The published Efficiency with a calibration's values in place."""
    known = {k: float(v) for k, v in factors.efficiency.items() if hasattr(published, k)}
    if "moe_compute_fraction" in known and published.moe_compute_fraction is None:
        known.pop("moe_compute_fraction")
    # the calibration's per-request cost replaces the published one (whose per-rank share it
    # already holds: it was fitted on the whole deployment); the simulator applies it
    known["request_overhead_ms"] = float(factors.request_overhead_ms)
    known["request_overhead_per_rank_ms"] = 0.0
    return replace(published, **known, source=published.source)


def _efficiency_at(start: Any, x: dict[str, float]) -> Any:
    """Factors in x applied as the fit sees them: fractions scale their pair together."""
    fields: dict[str, float] = {}
    if "compute_fraction" in x:
        s = x["compute_fraction"] / start.compute_fraction
        fields["compute_fraction"] = x["compute_fraction"]
        fields["moe_compute_fraction"] = min(1.0, start.moe_fraction * s)
        if start.attention_compute_fraction is not None:  # an early kernel generation's own
            fields["attention_compute_fraction"] = min(1.0, start.attention_compute_fraction * s)
    if "bandwidth_fraction" in x:
        s = x["bandwidth_fraction"] / start.bandwidth_fraction
        fields["bandwidth_fraction"] = x["bandwidth_fraction"]
        fields["kv_bandwidth_fraction"] = min(1.0, start.kv_fraction * s)
    if "step_overhead_ms" in x:
        s = x["step_overhead_ms"] / max(start.step_overhead_ms, 1e-9)
        fields["step_overhead_ms"] = x["step_overhead_ms"]
        fields["per_layer_overhead_us"] = start.per_layer_overhead_us * s
    if "per_seq_overhead_ms" in x:
        fields["per_seq_overhead_ms"] = x["per_seq_overhead_ms"]
    if "single_seq_step_factor" in x:
        fields["single_seq_step_factor"] = x["single_seq_step_factor"]
    return replace(start, **fields)


# --------------------------------------------------------------------------- simulating a point


def point_lengths(point: MeasuredPoint) -> tuple[Any, Any]:
    """The point's own per-request lengths when it has them, else its means."""
    import numpy as np

    n = min(MAX_SIM_REQUESTS, max(point.num_requests, point.concurrency or 1))
    if point.input_lens and point.output_lens and len(point.input_lens) == len(point.output_lens):
        idx = np.arange(n) % len(point.input_lens)
        inp = np.asarray(point.input_lens)[idx]
        out = np.maximum(1, np.asarray(point.output_lens)[idx])
        return inp.astype(int), out.astype(int)
    if point.length_spread == "uniform":  # a range ratio of 0, as the published runs drew them
        from .calibration import measurement_lengths

        inp_mean, out_mean = round(point.input_tokens_mean), round(point.output_tokens_mean)
        return measurement_lengths(inp_mean, 0.0, n, 1), measurement_lengths(out_mean, 0.0, n, 2)
    inp = np.full(n, max(1, round(point.input_tokens_mean)))
    out = np.full(n, max(1, round(point.output_tokens_mean)))
    return inp, out


def simulate_point(
    model: Any, point: MeasuredPoint, request_overhead_ms: float | None = None
) -> dict[str, float]:
    """Mean TTFT, ITL and output throughput of `model` at the point's load and lengths,
    over as many requests as the point measured (up to MAX_SIM_REQUESTS), all of them.

    `request_overhead_ms`, where given, replaces the model's own per-request cost. The
    simulator applies it as predict does: the engine sees each request that long after
    the client sent it, so under load a request can also land mid-step and wait."""
    from .batching_sim import load_stats, poisson_arrivals_ms, simulate
    from .calibration import metric_value

    if request_overhead_ms is not None:
        eff = replace(
            model.efficiency,
            request_overhead_ms=float(request_overhead_ms),
            request_overhead_per_rank_ms=0.0,
        )
        model = replace(model, efficiency=eff)
    inp, out = point_lengths(point)
    conc = point.concurrency
    rate = point.request_rate if conc is None else None
    arrivals = None
    if rate is not None and math.isfinite(rate):
        arrivals = poisson_arrivals_ms(len(inp), float(rate), 1.0, seed=0)
    res = simulate(model, inp, out, arrival_ms=arrivals, concurrency=conc)
    # a benchmark tool's figures cover every request, ramp-up and ramp-down included
    stats = load_stats(res)
    return {
        "ttft_ms": metric_value(stats, "ttft_ms.mean"),
        "itl_ms": metric_value(stats, "itl_ms.mean"),
        "output_tokens_per_s": float(stats.output_tokens_per_s),
    }


def measured_values(point: MeasuredPoint) -> dict[str, float]:
    """The metrics a point measured (ITL from TPOT when only TPOT was written)."""
    values = {
        "ttft_ms": point.ttft_ms,
        "itl_ms": point.itl_ms if point.itl_ms else point.tpot_ms,
        "output_tokens_per_s": point.output_tokens_per_s,
    }
    return {k: float(v) for k, v in values.items() if v is not None and v > 0}


# --------------------------------------------------------------------------- the fit


class _Problem:
    """The residual function over the chosen factors, and its bookkeeping."""

    def __init__(self, build: Any, start: Any, points: list[MeasuredPoint], overhead0: float):
        self.build, self.start, self.points = build, start, points
        self.overhead0 = overhead0
        self.measured = [measured_values(p) for p in points]
        self.names: list[str] = [f.name for f in FACTORS]
        self.by_name = {f.name: f for f in FACTORS}

    def start_values(self) -> dict[str, float]:
        s = self.start
        return {
            "compute_fraction": s.compute_fraction,
            "bandwidth_fraction": s.bandwidth_fraction,
            "step_overhead_ms": max(s.step_overhead_ms, 0.01),
            "per_seq_overhead_ms": max(s.per_seq_overhead_ms, 1e-3),
            "single_seq_step_factor": s.single_seq_step_factor,
            "request_overhead_ms": self.overhead0,
        }

    def to_x(self, values: dict[str, float], names: list[str]) -> list[float]:
        return [math.log(values[n]) if self.by_name[n].log_scale else values[n] for n in names]

    def values(self, x: Any, names: list[str], base: dict[str, float]) -> dict[str, float]:
        out = dict(base)
        for n, v in zip(names, x, strict=True):
            f = self.by_name[n]
            out[n] = min(max(math.exp(v) if f.log_scale else float(v), f.lower), f.upper)
        return out

    def predict(self, values: dict[str, float]) -> list[dict[str, float]]:
        eff = _efficiency_at(self.start, values)
        model = self.build(eff)
        return [simulate_point(model, p, values["request_overhead_ms"]) for p in self.points]

    def residuals(self, values: dict[str, float]) -> list[float]:
        return self.log_errors(self.predict(values))

    def log_errors(self, predictions: list[dict[str, float]]) -> list[float]:
        """log(predicted / measured) per measured value, of predictions already made."""
        out: list[float] = []
        for pred, meas in zip(predictions, self.measured, strict=True):
            for k, m in meas.items():
                p = pred.get(k, float("nan"))
                out.append(math.log(p / m) if p == p and p > 0 else math.log(10.0))
        return out


def _sensitivities(prob: _Problem, base: dict[str, float], r0: Any) -> dict[str, Any]:
    """Per factor, the residual change for a 28 % step (log 1.28 = 0.25; the request
    overhead steps by a quarter of the mean measured TTFT)."""
    import numpy as np

    cols: dict[str, Any] = {}
    for f in FACTORS:
        v = dict(base)
        v[f.name] = probe_value(prob, f, base[f.name])
        if v[f.name] == base[f.name]:
            cols[f.name] = np.zeros_like(r0)
            continue
        cols[f.name] = np.asarray(prob.residuals(v)) - r0
    return cols


def probe_value(prob: _Problem, f: Factor, value: float) -> float:
    """A change of the factor big enough to show in the measurements if they depend on it:
    28 % for a fraction; for a fixed cost, at least a tenth of the measured ITL (per step)
    or of the ITL per running sequence (per sequence), since a published cost of
    microseconds moved by 28 % shows nowhere even where the real one is milliseconds."""
    import numpy as np

    itls = [m["itl_ms"] for m in prob.measured if "itl_ms" in m]
    itl = float(np.median(itls)) if itls else 0.0
    batch = float(np.mean([p.concurrency or 1 for p in prob.points]))
    if f.name == "request_overhead_ms":
        ttfts = [m["ttft_ms"] for m in prob.measured if "ttft_ms" in m]
        return value + 0.25 * (float(np.mean(ttfts)) if ttfts else 0.0)
    floor = {"step_overhead_ms": 0.1 * itl, "per_seq_overhead_ms": 0.1 * itl / batch}
    return min(f.upper, max(value * math.exp(0.25), floor.get(f.name, 0.0)))


def identifiable(
    prob: _Problem, cols: dict[str, Any], r0: Any, exclude: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, str], bool]:
    """The factors the points can fix, the others with why not, and whether the
    per-sequence cost was held only for want of loads (fit_deployment may still add it).

    Factors are taken in FACTORS order, rates before fixed costs: a factor joins when the
    points depend on it and its effect is not (nearly) a combination of those already
    chosen. Two points that a bandwidth fraction and a per-sequence cost explain equally
    well keep the rate, whose shape over the batch (experts touched, KV read) is the
    engine's; a per-sequence cost would extrapolate the same two points linearly.
    ``cols``: each factor's effect on the residuals (:func:`_sensitivities`)."""
    import numpy as np

    n = max(1, len(r0))
    loads = len({p.load_label for p in prob.points})
    held: dict[str, str] = {}
    chosen: list[str] = []
    basis: list[Any] = []
    deferred = False
    lone = any(p.concurrency == 1 for p in prob.points)
    for f in FACTORS:
        col = cols[f.name]
        if f.name in exclude:
            continue  # the caller says why
        if f.name == "single_seq_step_factor" and not lone:
            held[f.name] = "no point at concurrency 1, where a sequence steps alone"
        elif float(np.linalg.norm(col)) / math.sqrt(n) < SENSITIVITY_FLOOR:
            held[f.name] = f"the points do not depend on it ({f.why})"
        elif f.name == "per_seq_overhead_ms" and loads < MIN_LOADS_PER_SEQ:
            held[f.name] = (
                f"{loads} load level(s) cannot show it: it differs from the per-step cost and "
                "the bandwidth only in how ITL grows over the batch (measure a third load)"
            )
            deferred = True
        elif (direction := _new_direction(col, basis)) is None or len(chosen) >= len(r0):
            held[f.name] = (
                "the points move it the same way as " + ", ".join(chosen) + " and cannot tell "
                "them apart (measure at more loads or other lengths)"
            )
        else:
            chosen.append(f.name)
            basis.append(direction)
    return chosen, held, deferred


def _new_direction(col: Any, basis: list[Any]) -> Any:
    """The unit part of a factor's effect that the chosen factors' effects (orthonormal
    `basis`) do not already make, or None when that part is under COLLINEARITY_FLOOR."""
    import numpy as np

    unit = col / float(np.linalg.norm(col))
    left = unit - sum((float(b @ unit) * b for b in basis), np.zeros_like(unit))
    size = float(np.linalg.norm(left))
    return left / size if size >= COLLINEARITY_FLOOR else None


def _starting_values(
    prob: _Problem, base: dict[str, float], names: list[str], cost0: float
) -> dict[str, float]:
    """The published values, except fixed costs whose probe value fits better: a fit in
    log space that starts microseconds away from a cost of milliseconds crawls."""
    import numpy as np

    start = dict(base)
    for n in names:
        if n not in ("step_overhead_ms", "per_seq_overhead_ms"):
            continue
        trial = dict(start)
        trial[n] = probe_value(prob, prob.by_name[n], base[n])
        cost = float(np.sum(np.asarray(prob.residuals(trial)) ** 2))
        if cost < cost0:
            start, cost0 = trial, cost
    return start


def _load_warnings(points: list[MeasuredPoint]) -> list[str]:
    loads = {p.load_label for p in points}
    warnings: list[str] = []
    if len(loads) < 2:
        warnings.append(
            f"all {len(points)} point(s) at one load ({next(iter(loads))}): the factors that "
            "change with the batch (per-step overhead against bandwidth, per-sequence cost) "
            "cannot be separated; measure at a second concurrency"
        )
    if len({round(p.input_tokens_mean) for p in points}) < 2 and len(points) > 1:
        warnings.append(
            "every point has the same prompt length: prefill compute is fitted from TTFT alone"
        )
    return warnings


def fit_deployment(
    build: Any, start: Any, points: list[MeasuredPoint], max_evaluations: int = 60
) -> CalibrationFit:
    """Fit the identifiable factors; `build(efficiency)` returns the deployment's step model.

    Raises InputError when the points hold fewer values than a fit needs."""
    import numpy as np

    # the per-request cost is fitted as its own term, starting from the published one (the
    # engine's front end); simulate_point puts each trial value in place of the start's
    overhead0 = build(start).efficiency.request_overhead_ms  # the deployment's, ranks folded in
    prob = _Problem(build, start, points, overhead0=overhead0)
    count = sum(len(m) for m in prob.measured)
    if count < MIN_VALUES:
        raise InputError(
            "run",
            f"the measurements hold {count} usable value(s) (mean TTFT, ITL or TPOT, output "
            f"throughput); a calibration needs at least {MIN_VALUES}, e.g. TTFT and ITL of one load",
        )
    base = prob.start_values()
    r0 = np.asarray(prob.residuals(base))
    cols = _sensitivities(prob, base, r0)  # one simulation per factor: measured once
    names, held, deferred = identifiable(prob, cols, r0)
    if not names:
        raise InputError(
            "run", "the measurements cannot identify any factor: " + "; ".join(held.values())
        )
    fitted, rms = _least_squares(prob, base, r0, names, max_evaluations)
    if _on_the_line(fitted, names):
        # one sequence steps as the batch does: its ITL then tells the batched line too, and
        # what was held for overlapping with the factor is identified again without it
        why = (
            f"fitted at {fitted['single_seq_step_factor']:.2f}, within "
            f"{SINGLE_SEQ_ON_LINE[0]:.2f}-{SINGLE_SEQ_ON_LINE[1]:.2f}: one sequence alone steps "
            "on the line the batches follow, so its ITL is kept for that line"
        )
        names, held, deferred = identifiable(prob, cols, r0, exclude=("single_seq_step_factor",))
        held["single_seq_step_factor"] = why
        fitted, rms = _least_squares(prob, base, r0, names, max_evaluations)
    warnings = _load_warnings(points)
    if deferred and rms > POINT_NOISE_LOG and len(names) < len(r0):
        trial = [*names, "per_seq_overhead_ms"]
        fitted2, rms2 = _least_squares(prob, base, r0, trial, max_evaluations)
        if rms2 <= PER_SEQ_GAIN * rms:
            names, fitted = trial, fitted2
            held.pop("per_seq_overhead_ms")
            warnings.append(_per_seq_note(rms, rms2))
    if "single_seq_step_factor" in names:
        warnings.append(_single_seq_note(fitted["single_seq_step_factor"]))
    return _result(prob, base, fitted, names, held, r0, warnings)


def _on_the_line(fitted: dict[str, float], names: list[str]) -> bool:
    """Whether a fitted single-sequence factor is noise around the batched line."""
    lo, hi = SINGLE_SEQ_ON_LINE
    return "single_seq_step_factor" in names and lo <= fitted["single_seq_step_factor"] <= hi


def _least_squares(
    prob: _Problem, base: dict[str, float], r0: Any, names: list[str], max_evaluations: int
) -> tuple[dict[str, float], float]:
    """The bounded fit of `names` (the others at `base`), and its rms log error."""
    import numpy as np
    from scipy.optimize import least_squares

    chosen = [prob.by_name[n] for n in names]
    lo = [math.log(f.lower) if f.log_scale else f.lower for f in chosen]
    hi = [math.log(f.upper) if f.log_scale else f.upper for f in chosen]
    start_at = _starting_values(prob, base, names, float(np.sum(r0**2)))
    x0 = np.clip(prob.to_x(start_at, names), np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    scale = [1.0 if prob.by_name[n].log_scale else max(1.0, abs(base[n]) + 10.0) for n in names]

    def fun(x: Any) -> Any:
        return np.clip(np.asarray(prob.residuals(prob.values(x, names, base))), -5.0, 5.0)

    sol = least_squares(
        fun, x0, bounds=(lo, hi), x_scale=scale, diff_step=0.05, max_nfev=max_evaluations
    )
    fitted = prob.values(sol.x, names, start_at)
    # the solver's residuals at its answer (clipped at +-5, 150x off): no further simulation
    return fitted, float(np.sqrt(np.mean(np.asarray(sol.fun) ** 2)))


def _per_seq_note(rms: float, rms_with: float) -> str:
    """Why a per-sequence cost was fitted from fewer loads than show it: the rates and the
    per-step cost left the points further off than a repeated probe differs (a CPU engine:
    prefill pins the compute rate, and only a per-sequence cost gives decode its own slope)."""
    return (
        f"per_seq_overhead_ms fitted from fewer than {MIN_LOADS_PER_SEQ} loads: without it the "
        f"points were {rms:.0%} off (rms log error), with it {rms_with:.0%}; it extrapolates ITL "
        "linearly over the batch, so measure a third load before trusting far loads"
    )


def _single_seq_note(factor: float) -> str:
    """Why a single-sequence factor was fitted: one sequence alone steps off the line the
    batches follow (the engine runs other kernels for a batch of one), so concurrency 1 no
    longer tells that line."""
    return (
        f"a single sequence steps in {factor:.2f}x the time the batched steps' line gives "
        "(single_seq_step_factor): the engine runs other kernels for a batch of one (llama.cpp's "
        "CPU backend does); concurrency 1 is predicted with it, batches from 2 on follow the line"
    )


def _factors(prob: _Problem, values: dict[str, float]) -> CalibratedFactors:
    eff = _efficiency_at(prob.start, values)
    return CalibratedFactors(
        efficiency={k: round(float(v), 6) for k, v in eff.describe().items()},
        request_overhead_ms=round(values["request_overhead_ms"], 3),
    )


def _result(
    prob: _Problem,
    base: dict[str, float],
    fitted: dict[str, float],
    names: list[str],
    held: dict[str, str],
    r0: Any,
    warnings: list[str],
) -> CalibrationFit:
    import numpy as np

    before, after = prob.predict(base), prob.predict(fitted)
    rows: list[PointResidual] = []
    for p, meas, b, a in zip(prob.points, prob.measured, before, after, strict=True):
        rows.append(
            PointResidual(
                source=p.source,
                load=p.load_label,
                concurrency=p.concurrency,
                request_rate_per_s=_finite_rate(p.request_rate),
                input_tokens_mean=round(p.input_tokens_mean, 1),
                output_tokens_mean=round(p.output_tokens_mean, 1),
                measured={k: round(v, 3) for k, v in meas.items()},
                published={k: round(b[k], 3) for k in meas},
                calibrated={k: round(a[k], 3) for k in meas},
                ratio={k: round(v / a[k], 4) for k, v in meas.items() if a[k] > 0},
            )
        )
    r1 = np.asarray(prob.log_errors(after))  # the fitted predictions, not simulated again
    return CalibrationFit(
        factors=_factors(prob, fitted),
        published=_factors(prob, base),
        fitted=names,
        held=held,
        points=rows,
        residual_spread=residual_spread(rows),
        rms_log_error_published=round(float(np.sqrt(np.mean(r0**2))), 4),
        rms_log_error_calibrated=round(float(np.sqrt(np.mean(r1**2))), 4),
        warnings=warnings + [f"{k} held at the published value: {v}" for k, v in held.items()],
    )


def _finite_rate(rate: float | None) -> float | None:
    return rate if rate is not None and math.isfinite(rate) else None


def residual_spread(rows: list[PointResidual]) -> ResidualSpread:
    """p10/p90 of measured / predicted per metric over the points."""
    import numpy as np

    spread: dict[str, MetricSpread] = {}
    for metric in METRICS:
        ratios = [r.ratio[metric] for r in rows if metric in r.ratio]
        if ratios:
            spread[metric] = MetricSpread(
                p10=round(float(np.percentile(ratios, 10)), 4),
                p90=round(float(np.percentile(ratios, 90)), 4),
                points=len(ratios),
            )
    return ResidualSpread(**spread)


def check_model_matches(point: MeasuredPoint, model: str, field: str) -> None:
    """A point measured on another model than the deployment's cannot calibrate it."""
    if not point.model:
        return
    a = point.model.rstrip("/").rsplit("/", 1)[-1].lower()
    b = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if a.removesuffix(".gguf") != b.removesuffix(".gguf"):
        raise InputError(
            field,
            f"{point.source} measured model {point.model!r}, not {model!r} (the deployment's "
            "--model); calibrate each model with its own measurements",
        )


# --------------------------------------------------------------------------- used by predict


class AppliedCalibration(BaseModel):
    """A stored calibration as a prediction uses it (the doors load it by name)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    model: str = Field(description="The model the calibration was fitted on.")
    gpu: str | None = Field(default=None, description="Its GPU (null: custom hardware).")
    engine: str = Field(default="vllm", description="The engine it was measured on.")
    sources: list[str] = Field(description="The measurements it was fitted on (files, runs).")
    fitted: list[str] = Field(description="Factors fitted; the others kept their published value.")
    factors: CalibratedFactors
    residual_spread: ResidualSpread = Field(
        description="p10/p90 of measured / predicted per metric on the calibration points."
    )
    concurrency_range: tuple[int, int] | None = Field(
        default=None, description="Lowest and highest closed-loop load it measured."
    )
    rate_range_per_s: tuple[float, float] | None = Field(
        default=None, description="Lowest and highest open-loop rate it measured."
    )
    created_at: str

    def measured_load(self, concurrency: int | None, rate_per_s: float | None) -> bool:
        """Whether a load lies within the loads the calibration measured (else the
        prediction extrapolates, and its interval says so). Offline and trace loads (neither
        given) count as not measured."""
        if rate_per_s is not None:
            lo_hi = self.rate_range_per_s
            return lo_hi is not None and lo_hi[0] <= rate_per_s <= lo_hi[1]
        lo_hi_c = self.concurrency_range
        if concurrency is None or lo_hi_c is None:
            return False
        return lo_hi_c[0] <= concurrency <= lo_hi_c[1]


def load_range(values: list[Any]) -> Any:
    """(lowest, highest) of the values that are set, or None."""
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else None


def calibration_notes(applied: AppliedCalibration, model: str, gpu: str | None) -> list[str]:
    """What a prediction says about the calibration it used, and where it may not carry."""
    notes = [
        f"calibrated: factors {', '.join(applied.fitted)} fitted by calibration "
        f"{applied.name!r} on {len(applied.sources)} measurement(s): "
        + ", ".join(applied.sources[:6])
        + (" ..." if len(applied.sources) > 6 else "")
    ]
    if applied.factors.request_overhead_ms > 0:
        notes.append(
            f"a per-request cost of {applied.factors.request_overhead_ms:.1f} ms outside the "
            "engine's steps (fitted, in place of the published front-end cost): the engine "
            "sees each request that long after it was sent"
        )
    if applied.model.rsplit("/", 1)[-1].lower() != model.rsplit("/", 1)[-1].lower():
        notes.append(f"the calibration was fitted on {applied.model}, not {model}")
    if (applied.gpu or "custom") != (gpu or "custom"):
        notes.append(f"the calibration was fitted on {applied.gpu or 'custom hardware'}, not {gpu}")
    return notes
