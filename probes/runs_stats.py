"""Is a difference between two runs real? Bootstrap intervals and rank tests.

Latency percentiles are compared with a bootstrap of the difference
(candidate - baseline) that resamples *requests*, not tokens: the inter-token
latencies of one request are correlated, so resampling tokens would make
intervals too narrow and call noise a change. Each resample draws request
weights (how often each request is picked) and evaluates a weighted
percentile over the pooled values, which is one vectorised pass per resample.

Throughputs have no per-request value; they are compared over equal time
slices of each run's window (tokens or requests finished per slice), which
captures how much the rate wanders within a run.

A Mann-Whitney U test on per-request values (per-request median ITL for
ITL) is reported beside the interval: it answers "did the distribution
shift", the interval answers "by how much, for this percentile".

numpy/scipy are imported inside functions (this module is imported by the
registry's `runs` models only lazily, but keep the habit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Samples:
    """Values of one metric and, for each value, the request it belongs to (0..n_requests-1)."""

    values: Any
    owners: Any
    n_requests: int


def per_request(values: list[float]) -> Samples:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return Samples(arr, np.arange(len(arr)), len(arr))


def pooled(groups: list[list[float]]) -> Samples:
    """Several values per request (ITL gaps), kept with their request."""
    import numpy as np

    values = np.asarray([v for g in groups for v in g], dtype=float)
    owners = np.asarray([i for i, g in enumerate(groups) for _ in g], dtype=int)
    return Samples(values, owners, len(groups))


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    resamples: int


def _weighted_percentiles_sorted(values: Any, weights: Any, qs: Any) -> Any:
    """Inverted-CDF percentiles of sorted `values` where value i counts `weights[i]` times."""
    import numpy as np

    cum = np.cumsum(weights)
    total = cum[-1]
    if total <= 0:
        return np.full(len(qs), np.nan)
    idx = np.searchsorted(cum, np.asarray(qs) / 100.0 * total, side="left")
    return values[np.minimum(idx, len(values) - 1)]


def bootstrap_percentile_diffs(
    base: Samples,
    cand: Samples,
    qs: tuple[float, ...],
    *,
    resamples: int,
    confidence: float,
    seed: int,
) -> dict[float, Interval] | None:
    """Intervals of percentile_q(candidate) - percentile_q(baseline) for each q, resampling requests."""
    import numpy as np

    if base.n_requests < 2 or cand.n_requests < 2 or len(base.values) == 0 or len(cand.values) == 0:
        return None
    rng = np.random.default_rng(seed)

    def prepare(s: Samples) -> tuple[Any, Any]:
        order = np.argsort(s.values, kind="stable")
        return s.values[order], s.owners[order]

    bv, bo = prepare(base)
    cv, co = prepare(cand)
    # keep the work bounded: values x resamples
    budget = 4e7
    resamples = int(max(200, min(resamples, budget / max(len(bv) + len(cv), 1))))
    pb = np.full(base.n_requests, 1.0 / base.n_requests)
    pc = np.full(cand.n_requests, 1.0 / cand.n_requests)
    diffs = np.empty((resamples, len(qs)))
    for i in range(resamples):
        wb = rng.multinomial(base.n_requests, pb)
        wc = rng.multinomial(cand.n_requests, pc)
        diffs[i] = _weighted_percentiles_sorted(cv, wc[co], qs) - _weighted_percentiles_sorted(
            bv, wb[bo], qs
        )
    alpha = (1.0 - confidence) / 2.0
    out: dict[float, Interval] = {}
    for j, q in enumerate(qs):
        col = diffs[:, j]
        col = col[np.isfinite(col)]
        if len(col):
            low, high = np.quantile(col, [alpha, 1.0 - alpha])
            out[q] = Interval(float(low), float(high), resamples)
    return out


def bootstrap_mean_diff(
    base: list[float], cand: list[float], *, resamples: int, confidence: float, seed: int
) -> Interval | None:
    """Interval of mean(candidate) - mean(baseline) (used for per-slice throughputs)."""
    import numpy as np

    if len(base) < 2 or len(cand) < 2:
        return None
    rng = np.random.default_rng(seed)
    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    resamples = int(max(200, min(resamples, 20_000)))
    mb = b[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    mc = c[rng.integers(0, len(c), size=(resamples, len(c)))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(mc - mb, [alpha, 1.0 - alpha])
    return Interval(float(low), float(high), resamples)


def mann_whitney_p(base: list[float], cand: list[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value; None when either side has fewer than 3 values."""
    if len(base) < 3 or len(cand) < 3:
        return None
    from scipy.stats import mannwhitneyu

    if len(set(base) | set(cand)) == 1:
        return 1.0
    return float(mannwhitneyu(cand, base, alternative="two-sided").pvalue)


def slice_rates(
    ends_s: list[float], weights: list[float], start_s: float, end_s: float, slices: int
) -> list[float]:
    """Per-slice rate (sum of weights finishing in the slice / slice length) over [start_s, end_s]."""
    if end_s <= start_s or slices < 1:
        return []
    width = (end_s - start_s) / slices
    sums = [0.0] * slices
    for t, w in zip(ends_s, weights, strict=True):
        k = int((t - start_s) / width)
        if 0 <= k < slices:
            sums[k] += w
        elif k == slices:  # the last request ends exactly at end_s
            sums[-1] += w
    return [s / width for s in sums]
