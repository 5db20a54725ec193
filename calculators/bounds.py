"""The ranges in which numeric inputs mean something, named once for every door.

A value outside them is not an exotic workload but a typo or an attack, and
left unchecked it costs real resources: a burstiness of 1e-310 sends numpy's
gamma sampler into an endless rejection loop, a rate of 1e-320 sleeps for
ever, a 1e308 ms target turns every slack into infinity. The bounds are wide
(a request per 17 minutes to a million per second, a day of latency), so no
real question falls outside them.
"""

from __future__ import annotations

import math

MIN_RATE_PER_S = 1e-3
MAX_RATE_PER_S = 1e6
MIN_BURSTINESS = 0.01
MAX_BURSTINESS = 100.0
MAX_PEAK_TO_MEAN = 100.0
"""Peak over mean arrival rate that budget, recommend and workload files accept."""
MAX_SLO_MS = 86_400_000.0
"""One day: the longest latency target that is still a target."""
MAX_SEED = 2**63 - 1
PERCENTILE_KEYS = ("p50", "p90", "p95", "p99")
"""The percentiles a latency target may name."""


def check_rate(value: float | None, allow_inf: bool = False) -> float | None:
    """A request rate in requests per second (``inf`` where offline is meant)."""
    if value is None:
        return None
    if allow_inf and value == math.inf:
        return value
    if not (MIN_RATE_PER_S <= value <= MAX_RATE_PER_S):
        extra = ", or inf for all at once" if allow_inf else ""
        raise ValueError(
            f"must be between {MIN_RATE_PER_S:g} and {MAX_RATE_PER_S:g} requests/s{extra}, "
            f"got {value:g}"
        )
    return value


def check_slo_ms(name: str, value: float) -> float:
    """A latency target: a positive, finite number of ms, at most a day."""
    if not (0 < value <= MAX_SLO_MS):
        raise ValueError(
            f"target for {name} must be a positive number of ms up to {MAX_SLO_MS:g}, got {value:g}"
        )
    return float(value)


def check_slo_targets(targets: dict[str, float]) -> dict[str, float]:
    """Latency targets by percentile (``{"p95": 800}``): keys normalised, each value checked."""
    out: dict[str, float] = {}
    for key, value in targets.items():
        k = key.strip().lower()
        if k not in PERCENTILE_KEYS:
            raise ValueError(f"unknown percentile '{key}' (accepted: {', '.join(PERCENTILE_KEYS)})")
        out[k] = check_slo_ms(k, value)
    return out
