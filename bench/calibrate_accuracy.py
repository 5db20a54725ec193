"""Calibrated vs published factors on published concurrency / batch sweeps.

For every series of tests/data/calibration_sweeps.toml (SGLang and vLLM, dense and
MoE, NVIDIA and AMD, each with its source and conditions): calibrate on the two
lowest loads, predict every other load of the series at exactly its load and
lengths, and print the error of the calibrated and of the published prediction per
value. Target: >= 75 % of the predicted values within +-25 %, and every series
better calibrated than not (by its mean absolute log error). A series whose points the
published factors were fitted on (``published_fitted_on_these_points``) is printed but
left out of that comparison: its uncalibrated prediction has seen the answers.

``--write`` stores the p10/p90 of measured / calibrated per metric family in
calculators/data/calibrated_intervals.toml: the interval a calibrated prediction
carries at a load its calibration did not measure.

    python -m bench.calibrate_accuracy [--write]
"""

from __future__ import annotations

import math
import sys
import time
import tomllib
from datetime import date
from pathlib import Path

from inferwise.calculators.bench_files import MeasuredPoint
from inferwise.calculators.deployment import Deployment
from inferwise.calculators.roofline import StepModel
from inferwise.calculators.user_calibration import (
    calibrated_efficiency,
    fit_deployment,
    measured_values,
    simulate_point,
)

SWEEPS = Path(__file__).resolve().parent.parent / "tests" / "data" / "calibration_sweeps.toml"
DEPLOYMENT = set(Deployment.model_fields)


def load_series() -> list[dict]:
    with SWEEPS.open("rb") as fh:
        return tomllib.load(fh)["series"]


def points_of(series: dict) -> list[MeasuredPoint]:
    pts = [
        MeasuredPoint(
            source=f"{series['id']}#{i}",
            tool="vllm-bench",
            length_spread=series.get("length_spread", "fixed"),
            **p,
        )
        for i, p in enumerate(series["point"])
    ]
    return sorted(pts, key=lambda p: p.concurrency or p.num_requests)


def evaluate(series: dict) -> list[tuple[str, str, float, float, float]]:
    """(load, metric, measured, calibrated, published) for every held-out value."""
    dep = Deployment(**{k: v for k, v in series.items() if k in DEPLOYMENT})
    published = StepModel.from_deployment(dep)
    pts = points_of(series)
    fit = fit_deployment(lambda e: StepModel.from_deployment(dep, e), published.efficiency, pts[:2])
    calibrated = StepModel.from_deployment(
        dep, calibrated_efficiency(published.efficiency, fit.factors)
    )
    rows = []
    for p in pts[2:]:
        cal = simulate_point(calibrated, p)
        pub = simulate_point(published, p)
        for name, m in measured_values(p).items():
            rows.append((p.load_label, name, m, cal[name], pub[name]))
    return rows


def write_table(ratios: dict[str, list[float]], series: int) -> None:
    """The extrapolation intervals (see the module docstring), with what they rest on."""
    import numpy as np

    from inferwise.calculators.intervals import CALIBRATED_FILE, metric_family

    by_family: dict[str, list[float]] = {}
    for metric, values in ratios.items():
        by_family.setdefault(metric_family(metric), []).extend(values)
    n = sum(len(v) for v in by_family.values())
    lines = [
        "# Written by bench/calibrate_accuracy.py --write: measured / calibrated prediction",
        "# on published sweeps (tests/data/calibration_sweeps.toml), at every load above the",
        "# two lowest each series was calibrated on.",
        "[meta]",
        f'basis = "{n} held-out values of {series} published sweeps '
        f'(bench/calibrate_accuracy.py, {date.today().isoformat()})"',
    ]
    for family, values in sorted(by_family.items()):
        lines += [
            "",
            f"[family.{family}]",
            f"ratio_p10 = {float(np.percentile(values, 10)):.4f}",
            f"ratio_p90 = {float(np.percentile(values, 90)):.4f}",
            f"values = {len(values)}",
        ]
    CALIBRATED_FILE.write_text("\n".join(lines) + "\n")
    print(f"wrote {CALIBRATED_FILE}")


def main() -> int:
    within = total = 0
    worse: list[str] = []
    ratios: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    all_series = load_series()
    for series in all_series:
        rows = evaluate(series)
        print(
            f"\n{series['id']}  ({series['engine']}, {series['gpu']}, {'MoE' if series['moe'] else 'dense'})"
        )
        print(
            f"  {'load':<16} {'metric':<20} {'measured':>10} {'calibrated':>10} {'err':>7} {'published':>10} {'err':>7}"
        )
        cal_err = pub_err = 0.0
        for load, name, m, c, p in rows:
            print(
                f"  {load:<16} {name:<20} {m:10.2f} {c:10.2f} {100 * (c / m - 1):6.1f}% {p:10.2f} {100 * (p / m - 1):6.1f}%"
            )
            ratios.setdefault(name, []).append(m / c)
            within += abs(c / m - 1) <= 0.25
            total += 1
            cal_err += abs(math.log(c / m))
            pub_err += abs(math.log(p / m))
        seen = series.get("published_fitted_on_these_points", False)
        verdict = "better" if cal_err < pub_err else "NOT better"
        if seen:
            verdict += "; published factors fitted on these points, not compared"
        print(
            f"  mean |log error|: calibrated {cal_err / len(rows):.3f}, published {pub_err / len(rows):.3f} ({verdict})"
        )
        if cal_err >= pub_err and not seen:
            worse.append(series["id"])
    share = within / total if total else 0.0
    print(
        f"\n{within}/{total} held-out values within +-25 % calibrated ({100 * share:.0f} %; target >= 75 %)"
    )
    print(
        f"series not better calibrated: {', '.join(worse) or 'none'}  ({time.perf_counter() - t0:.1f} s)"
    )
    if "--write" in sys.argv[1:]:
        write_table(ratios, len(all_series))
    return 0 if share >= 0.75 and not worse else 1


if __name__ == "__main__":
    sys.exit(main())
