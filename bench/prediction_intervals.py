"""Write calculators/data/prediction_intervals.toml from the held-out measurements.

Every measurement of tests/data/perf_measurements.toml whose split is not
``calibration`` (``holdout``: sibling rows of a fitted source; ``held_out``:
whole sources never fitted) is simulated with the stored factors; each value
gives a ratio measured / predicted, filed under its regime (metric family,
engine family, load band, context band; see inferwise.calculators.intervals).
Per regime and per coarser fallback the 10th and 90th percentiles are written,
with how many values and sources they rest on, and the hash of the factor table
they were computed with (a test fails when the factors change and this was not
re-run).

    .venv/bin/python bench/prediction_intervals.py            # write the table
    .venv/bin/python bench/prediction_intervals.py --dry-run  # print it only
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from inferwise.calculators.calibration import (
    EFFICIENCY_FILE,
    load_measurements,
    simulate_measurement,
)
from inferwise.calculators.intervals import (
    INTERVALS_FILE,
    architecture_class,
    context_band,
    engine_family,
    load_band,
    metric_family,
    regime_keys,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "perf_measurements.toml"


def publication(url: str) -> str:
    """The source a measurement counts under: one publisher's harness and setup. Files of one
    GitHub repository (its result logs, its issues and pull requests) are one source however
    many files the runs were saved in; any other page is its own."""
    parts = url.split("/")
    if len(parts) > 4 and parts[2] == "github.com":
        return "/".join(parts[2:5])
    return url


@dataclass(frozen=True)
class Residual:
    """One measured value next to its prediction, with the regime it belongs to."""

    measurement: str
    metric: str
    source: str
    split: str
    family: str
    engine: str
    load: str
    context: str
    arch: str
    measured: float
    predicted: float

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted > 0 else math.inf

    def regime(self) -> tuple[str, ...]:
        return regime_keys(self.family, self.engine, self.load, self.context, self.arch)


def measurement_regime(m: dict) -> tuple[str, str, str]:
    """(engine family, load band, context band) of a measurement's conditions."""
    load = m.get("load", "offline")
    conc = int(m["concurrency"]) if load == "concurrency" else None
    rate = float(m["request_rate"]) if load == "rate" else None
    return (
        engine_family(m.get("engine", "vllm")),
        load_band(conc, rate if rate is not None else math.inf if conc is None else None),
        context_band(int(m["input_tokens"]), int(m["output_tokens"])),
    )


def measurement_architecture(m: dict) -> str:
    """dense or moe, from the model the measurement ran (dense when it cannot be built)."""
    from inferwise.calculators.calibration import measurement_deployment
    from inferwise.calculators.roofline import StepModel

    try:
        experts = StepModel.from_deployment(measurement_deployment(m)).shape.num_experts
    except Exception:  # noqa: BLE001 - a deployment the fit rejects: it has no prediction either
        experts = 0
    return architecture_class(experts)


def residuals(measurements: list[dict], efficiencies: dict | None = None) -> list[Residual]:
    """Simulate each measurement once (optionally with other factors, keyed by id)."""
    out: list[Residual] = []
    for m in measurements:
        try:
            pred = simulate_measurement(m, (efficiencies or {}).get(m["id"]))
        except Exception:  # noqa: BLE001 - a run the model refuses has no residual
            pred = {}
        engine, load, context = measurement_regime(m)
        arch = measurement_architecture(m)
        for name, measured in m["values"].items():
            p = float(pred.get(name, math.nan))
            out.append(
                Residual(
                    m["id"],
                    name,
                    publication(m["source_url"]),
                    m["split"],
                    metric_family(name),
                    engine,
                    load,
                    context,
                    arch,
                    float(measured),
                    p if p == p else -1.0,
                )
            )
    return out


def interval_cells(rs: list[Residual]) -> dict[str, dict]:
    """Per regime key: the p10/p90 bounds of the ratios for a new source, and the values and
    sources behind them."""
    groups: dict[str, list[Residual]] = {}
    for r in rs:
        if r.predicted <= 0:
            continue
        for key in r.regime():
            groups.setdefault(key, []).append(r)
    cells = {}
    for key, members in sorted(groups.items()):
        lo, hi = prediction_bounds(members)
        cells[key] = {
            "ratio_p10": float(f"{lo:.4g}"),  # significant digits: a 2-source cell's bound
            "ratio_p90": float(f"{hi:.4g}"),  # can lie far below 1e-4 and is still positive
            "values": len(members),
            "sources": len({r.source for r in members}),
        }
    return cells


def prediction_bounds(members: list[Residual]) -> tuple[float, float]:
    """The 10th/90th percentile bounds for a value of a source not yet seen.

    A new deployment is a new source: its values share its engine build, client and lengths
    and miss together, so a regime's spread is the spread between sources plus the spread
    within one, not the spread of its largest source's values. On the log of measured /
    predicted: each source's mean, their mean (every source one vote) and variance (between
    sources), and the pooled variance of values around their source's mean (within); the
    bounds are that mean +- Student's t (S - 1 degrees of freedom, S sources) x the
    predictive deviation sqrt(between x (1 + 1/S) + within), the prediction interval of a
    random-effects meta-analysis. A regime of one source has no between-source spread to
    measure and gets the widest of its values."""
    import numpy as np
    from scipy.stats import t

    by_source: dict[str, list[float]] = {}
    for r in members:
        by_source.setdefault(r.source, []).append(math.log(r.ratio))
    logs = [np.asarray(v) for v in by_source.values()]
    n = len(logs)
    if n < 2:
        values = np.concatenate(logs)
        return float(np.exp(values.min())), float(np.exp(values.max()))
    means = np.array([v.mean() for v in logs])
    spread = [v.var(ddof=1) for v in logs if len(v) > 1]
    within = float(np.mean(spread)) if spread else 0.0
    between = float(means.var(ddof=1))
    deviation = math.sqrt(between * (1 + 1 / n) + within)
    half = float(t.ppf(0.9, n - 1)) * deviation
    centre = float(means.mean())
    return math.exp(centre - half), math.exp(centre + half)


def factors_hash() -> str:
    """Short hash of data/efficiency.toml: the factor set the intervals belong to."""
    return hashlib.sha256(EFFICIENCY_FILE.read_bytes()).hexdigest()[:16]


def render(cells: dict[str, dict], rs: list[Residual]) -> str:
    """The TOML text of the interval table."""
    n_sources = len({r.source for r in rs})
    basis = (
        "p10-p90 of measured/predicted for a source not yet seen (each published source one "
        f"vote, their spread between and within) over {sum(1 for r in rs if r.predicted > 0)} "
        f"held-out values from {n_sources} sources (tests/data/perf_measurements.toml, splits "
        "holdout and held_out, never used for fitting), predicted with the factors of "
        f"data/efficiency.toml (sha256 {factors_hash()}); made by bench/prediction_intervals.py"
    )
    lines = [
        "# Prediction intervals: WRITTEN BY bench/prediction_intervals.py, do not edit by hand.",
        "# Per regime (metric family | engine family | load band | context band, and coarser",
        "# fallbacks): 10th and 90th percentile bounds of measured / predicted on held-out values",
        "# for a source not yet seen: a random-effects prediction interval over the sources (see",
        "# prediction_bounds).",
        "",
        "[meta]",
        f'basis = "{basis}"',
        f'factors_sha256 = "{factors_hash()}"',
        f'made = "{date.today().isoformat()}"',
        "",
    ]
    for key, cell in cells.items():
        lines.append(f'[regime."{key}"]')
        lines += [f"{k} = {v}" for k, v in cell.items()]
        lines.append("")
    return "\n".join(lines)


def held_out(measurements: list[dict]) -> list[dict]:
    return [m for m in measurements if m.get("split") != "calibration"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--dry-run", action="store_true", help="print the table, write nothing")
    args = ap.parse_args()
    rs = residuals(held_out(load_measurements(args.data)))
    text = render(interval_cells(rs), rs)
    if args.dry_run:
        print(text)
    else:
        INTERVALS_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {INTERVALS_FILE.relative_to(ROOT)} ({len(rs)} held-out values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
