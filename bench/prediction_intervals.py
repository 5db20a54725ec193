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
                    m["source_url"],
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
    """Per regime key: p10/p90 of the ratios, and the values and sources behind them."""
    groups: dict[str, list[Residual]] = {}
    for r in rs:
        if r.predicted <= 0:
            continue
        for key in r.regime():
            groups.setdefault(key, []).append(r)
    cells = {}
    for key, members in sorted(groups.items()):
        ratios = sorted(r.ratio for r in members)
        lo, hi = conformal_bounds(ratios)
        cells[key] = {
            "ratio_p10": round(lo, 4),
            "ratio_p90": round(hi, 4),
            "values": len(ratios),
            "sources": len({r.source for r in members}),
        }
    return cells


def conformal_bounds(ratios: list[float]) -> tuple[float, float]:
    """The 10th/90th percentile bounds as split-conformal order statistics: the
    floor((n+1)/10)-th smallest and ceil(9(n+1)/10)-th smallest of n sorted ratios,
    which cover a new value from the same regime with >= 80 % probability (a plain
    sample percentile of a few values is too narrow). Needs n >= 9; fewer values give
    the extremes, and the look-up skips such cells anyway (intervals.MIN_VALUES)."""
    n = len(ratios)
    k_lo = max(1, math.floor((n + 1) * 0.1))
    k_hi = min(n, math.ceil((n + 1) * 0.9))
    return ratios[k_lo - 1], ratios[k_hi - 1]


def factors_hash() -> str:
    """Short hash of data/efficiency.toml: the factor set the intervals belong to."""
    return hashlib.sha256(EFFICIENCY_FILE.read_bytes()).hexdigest()[:16]


def render(cells: dict[str, dict], rs: list[Residual]) -> str:
    """The TOML text of the interval table."""
    n_sources = len({r.source for r in rs})
    basis = (
        f"p10-p90 of measured/predicted over {sum(1 for r in rs if r.predicted > 0)} held-out "
        f"values from {n_sources} published sources (tests/data/perf_measurements.toml, splits "
        "holdout and held_out, never used for fitting), predicted with the factors of "
        f"data/efficiency.toml (sha256 {factors_hash()}); made by bench/prediction_intervals.py"
    )
    lines = [
        "# Prediction intervals: WRITTEN BY bench/prediction_intervals.py, do not edit by hand.",
        "# Per regime (metric family | engine family | load band | context band, and coarser",
        "# fallbacks): split-conformal 10th and 90th percentile bounds of measured / predicted",
        "# on held-out values (see conformal_bounds).",
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
