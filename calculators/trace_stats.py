"""What a trace says about its traffic: rates, burstiness, lengths, prefix reuse, a day's profile.

These are the numbers a workload file holds (``inferwise workload --from-trace``):
the mean rate over the trace's span, the peak as the busiest minute (a sliding
60-second window; a tenth of the span for traces shorter than two minutes),
burstiness as the shape of a gamma distribution fitted to the inter-arrival
gaps (the same parameter as ``--burstiness``: 1 is Poisson, below 1 burstier),
length percentiles, the share of prompt tokens a prefix cache could serve
(Mooncake hash ids) and, when the trace covers a day, the mean rate of each hour.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .bounds import MAX_BURSTINESS, MAX_PEAK_TO_MEAN, MIN_BURSTINESS
from .traces import Trace, shared_prefix_fraction

DAY_S = 86_400.0
PEAK_WINDOW_S = 60.0


class LengthPercentiles(BaseModel):
    """Token lengths over the trace's requests."""

    p50: float
    p90: float
    p95: float
    p99: float
    mean: float
    max: float


class TraceStats(BaseModel):
    """The traffic of one trace window, as measured from its rows."""

    requests: int
    span_s: float = Field(description="First to last arrival, seconds (after the time scale).")
    mean_rate_rps: float
    peak_rate_rps: float = Field(description="Busiest window's arrivals per second.")
    peak_window_s: float = Field(description="Length of the peak window (60 s, or span / 10).")
    peak_to_mean: float
    burstiness: float | None = Field(
        description="Gamma shape of the inter-arrival gaps (1 = Poisson, < 1 burstier)."
    )
    burstiness_method: str | None = None
    input_tokens: LengthPercentiles
    output_tokens: LengthPercentiles
    shared_prefix_fraction: float | None = Field(
        description="Share of prompt tokens in 512-token blocks an earlier request sent."
    )
    hourly_rate_rps: list[float] | None = Field(
        description="24 mean rates (req/s) by hour of day, when the trace spans a day."
    )
    notes: list[str] = Field(default_factory=list)


def trace_stats(trace: Trace) -> TraceStats:
    import numpy as np

    t = np.asarray(trace.arrival_s, dtype=float)
    notes: list[str] = []
    span = float(t[-1] - t[0]) if len(t) else 0.0
    mean_rate = len(t) / span if span > 0 else float(len(t))
    window = PEAK_WINDOW_S if span >= 2 * PEAK_WINDOW_S else max(span / 10.0, 1e-3)
    if window != PEAK_WINDOW_S and span > 0:
        notes.append(f"the trace spans {span:.3g} s: the peak is the busiest {window:.3g} s")
    peak = _busiest(t, window) / window
    ratio = peak / mean_rate if span > 0 else 1.0
    if span <= 0:
        notes.append("every arrival is at one instant: no rate or peak to measure (peak_to_mean 1)")
    elif ratio > MAX_PEAK_TO_MEAN:
        notes.append(f"peak over mean {ratio:.3g} held at {MAX_PEAK_TO_MEAN:g}, the most accepted")
    shape, method = _gamma_shape(np.diff(t), notes)
    return TraceStats(
        requests=len(t),
        span_s=span,
        mean_rate_rps=mean_rate,
        peak_rate_rps=peak,
        peak_window_s=window,
        peak_to_mean=min(MAX_PEAK_TO_MEAN, max(1.0, ratio)),
        burstiness=shape,
        burstiness_method=method,
        input_tokens=_lengths(trace.input_tokens),
        output_tokens=_lengths(trace.output_tokens),
        shared_prefix_fraction=shared_prefix_fraction(trace),
        hourly_rate_rps=_hourly(trace, t, span),
        notes=notes,
    )


def _busiest(t: Any, window: float) -> int:
    """Most arrivals in any window [t_i, t_i + window) (sliding, from each arrival)."""
    import numpy as np

    ends = np.searchsorted(t, t + window, side="left")
    return int((ends - np.arange(len(t))).max()) if len(t) else 0


def _gamma_shape(gaps: Any, notes: list[str]) -> tuple[float | None, str | None]:
    """The gamma shape of the gaps: maximum likelihood (scipy) when every gap is positive;
    by moments (mean^2 / variance) when timestamps coincide (whole-second or millisecond
    timestamps put gaps at 0, where the likelihood is undefined)."""
    import numpy as np

    if len(gaps) < 2 or float(np.mean(gaps)) <= 0:
        notes.append("too few distinct arrivals to fit a burstiness")
        return None, None
    zeros = float(np.mean(gaps <= 0))
    shape = _gamma_mle(gaps) if zeros == 0.0 else None
    method = "gamma maximum likelihood (scipy.stats.gamma.fit, loc 0)"
    if shape is None:
        var = float(np.var(gaps))
        shape = float(np.mean(gaps)) ** 2 / var if var > 0 else MAX_BURSTINESS
        method = "moments (mean^2 / variance of the gaps)"
        why = (
            f"{100 * zeros:.0f} % of inter-arrival gaps are 0 (coinciding timestamps)"
            if zeros
            else "the gaps are (nearly) equal, where the likelihood has no maximum"
        )
        notes.append(f"{why}: burstiness fitted by moments")
    clipped = min(MAX_BURSTINESS, max(MIN_BURSTINESS, float(shape)))
    if clipped != shape:
        notes.append(f"burstiness {shape:.3g} clipped to {clipped:g}")
    return round(clipped, 4), method


def _gamma_mle(gaps: Any) -> float | None:
    """scipy's maximum-likelihood shape (location 0), or None where it has no answer."""
    import warnings

    import numpy as np
    from scipy import stats

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            shape, _, _ = stats.gamma.fit(gaps, floc=0)
    except (ValueError, RuntimeError, FloatingPointError):
        return None
    return float(shape) if np.isfinite(shape) and shape > 0 else None


def _lengths(values: list[int]) -> LengthPercentiles:
    import numpy as np

    v = np.asarray(values, dtype=float)
    p = np.percentile(v, (50, 90, 95, 99))
    return LengthPercentiles(
        p50=float(p[0]),
        p90=float(p[1]),
        p95=float(p[2]),
        p99=float(p[3]),
        mean=round(float(v.mean()), 2),
        max=float(v.max()),
    )


def _hourly(trace: Trace, t: Any, span: float) -> list[float] | None:
    """Mean rate per hour of day over the hours the trace covers; the wall clock (UTC)
    when the trace has date-times (Azure), else hours since its first request."""
    import numpy as np

    scale = trace.window.time_scale
    if span * scale < DAY_S * 0.999:
        return None
    base = trace.first_epoch_s if trace.first_epoch_s is not None else 0.0
    absolute = (t - t[0]) * scale + base  # wall-clock seconds (or since the first request)
    hours = np.floor(absolute / 3600.0).astype(np.int64)
    counts = np.bincount(hours % 24, minlength=24).astype(float)
    slots = np.arange(hours.min(), hours.max() + 1) % 24
    covered = np.bincount(slots, minlength=24).astype(float)
    return [round(c / (h * 3600.0), 6) if h else 0.0 for c, h in zip(counts, covered, strict=True)]
