"""The calibrated efficiency factors, and the published measurements they come from.

A roofline with vendor peaks is 25-60 % optimistic: GEMMs reach a fraction of
peak, HBM a fraction of its bandwidth, and every engine step pays scheduling
and launch costs. Those fractions are fitted on public measurements
(``tests/data/perf_measurements.toml``, each with its source and conditions) and
stored in ``data/efficiency.toml``; this module reads them and evaluates the
model against the measurements.

Stdlib only at module level.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

from .roofline import Efficiency

EFFICIENCY_FILE = Path(__file__).parent / "data" / "efficiency.toml"

_KEYS = (
    "compute_fraction",
    "bandwidth_fraction",
    "step_overhead_ms",
    "per_seq_overhead_ms",
    "link_fraction",
    "eager_overhead_factor",
)


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    with EFFICIENCY_FILE.open("rb") as fh:
        return tomllib.load(fh)


def _merge(into: dict[str, Any], layer: dict[str, Any] | None, label: str, used: list[str]) -> None:
    if not layer:
        return
    changed = False
    for key in (*_KEYS, "allreduce_latency_us", "source"):
        if key in layer:
            if key == "allreduce_latency_us":
                into[key] = {**into.get(key, {}), **layer[key]}
            else:
                into[key] = layer[key]
            changed = True
    if changed:
        used.append(label)


def efficiency_layers(gpu_id: str, vendor: str, engine: str) -> tuple[dict[str, Any], list[str]]:
    """The merged factor table for a GPU and engine, and which tables applied."""
    t = _table()
    merged: dict[str, Any] = {}
    used: list[str] = []
    _merge(merged, t.get("default"), "default", used)
    _merge(merged, t.get("vendor", {}).get(vendor), f"vendor.{vendor}", used)
    _merge(merged, t.get("gpu", {}).get(gpu_id), f"gpu.{gpu_id}", used)
    _merge(merged, t.get("engine", {}).get(engine), f"engine.{engine}", used)
    return merged, used


def load_efficiency(gpu: Any, engine: str = "vllm") -> Efficiency:
    """Calibrated factors for a catalog GPU (``catalog.GPU``) served by `engine`."""
    merged, used = efficiency_layers(gpu.id, gpu.vendor, engine)
    latency = merged["allreduce_latency_us"]
    return Efficiency(
        compute_fraction=float(merged["compute_fraction"]),
        bandwidth_fraction=float(merged["bandwidth_fraction"]),
        step_overhead_ms=float(merged["step_overhead_ms"]),
        per_seq_overhead_ms=float(merged["per_seq_overhead_ms"]),
        allreduce_latency_us=float(latency.get(gpu.interconnect, latency.get("pcie", 40.0))),
        link_fraction=float(merged["link_fraction"]),
        eager_overhead_factor=float(merged.get("eager_overhead_factor", 3.0)),
        source=f"data/efficiency.toml [{', '.join(used)}]: {merged.get('source', '')}",
    )
