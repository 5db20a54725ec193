"""The load points of a sweep and where its knee is.

The knee is the load beyond which more offered load stops paying:

* with an SLO, the point of highest goodput (the earliest within 2 % of the highest, so
  a plateau's knee is where the plateau starts): past it, added load adds no requests
  that meet every target;
* without one, the last point before the first step on which P95 end-to-end latency
  grows more than twice as fast as request throughput, both relative to the point
  before, and by at least 5 % (latency paid for little throughput). No such step: the knee is not reached
  within the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwise.server.reports.runs_data import RunView

PLATEAU = 0.02
ELASTICITY = 2.0
MIN_LATENCY_RISE = 0.05
"""Smaller P95 rises are run-to-run noise at the request counts a sweep point has."""


@dataclass(frozen=True)
class LoadPoint:
    run_id: str
    offered: float | None
    request_throughput: float | None
    output_token_throughput: float | None
    goodput: float | None
    latency_ms: dict[str, dict[str, float | None]]
    """metric (ttft_ms, itl_ms, e2e_ms) -> p50/p95/p99."""


@dataclass(frozen=True)
class Knee:
    index: int
    reached: bool
    rule: str


def load_points(runs: list[RunView]) -> list[LoadPoint]:
    out = []
    for run in runs:
        s = run.detail.summary
        out.append(
            LoadPoint(
                run_id=run.run_id,
                offered=run.offered,
                request_throughput=s.request_throughput,
                output_token_throughput=s.output_token_throughput,
                goodput=s.goodput,
                latency_ms={
                    m: {q: getattr(getattr(s, m), q) for q in ("p50", "p95", "p99")}
                    for m in ("ttft_ms", "itl_ms", "e2e_ms")
                },
            )
        )
    return out


def knee(points: list[LoadPoint]) -> Knee | None:
    """The knee (module docstring); None with fewer than two points."""
    if len(points) < 2:
        return None
    goodputs = [p.goodput for p in points]
    if all(g is not None for g in goodputs):
        best = max(goodputs)  # type: ignore[type-var]
        index = next(i for i, g in enumerate(goodputs) if g >= best * (1 - PLATEAU))  # type: ignore[operator]
        reached = index < len(points) - 1
        return Knee(
            index, reached, "the highest goodput (requests meeting every SLO target per second)"
        )
    return _elasticity_knee(points)


def _elasticity_knee(points: list[LoadPoint]) -> Knee:
    rule = f"P95 E2E rising more than {ELASTICITY:g}x as fast as throughput"
    for i in range(len(points) - 1):
        a, b = points[i], points[i + 1]
        la, lb = a.latency_ms["e2e_ms"]["p95"], b.latency_ms["e2e_ms"]["p95"]
        ta, tb = a.request_throughput, b.request_throughput
        if not (la and lb and ta and tb):
            continue
        latency_rise = (lb - la) / la
        throughput_rise = max((tb - ta) / ta, 1e-9)
        if latency_rise > max(ELASTICITY * throughput_rise, MIN_LATENCY_RISE):
            return Knee(i, True, rule)
    return Knee(len(points) - 1, False, rule)
