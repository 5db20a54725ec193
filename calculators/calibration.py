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
    "kv_bandwidth_fraction",
    "per_layer_overhead_us",
    "mla_layer_overhead_us",
    "moe_layer_overhead_us",
    "compute_fraction",
    "moe_compute_fraction",
    "bandwidth_fraction",
    "step_overhead_ms",
    "per_seq_overhead_ms",
    "link_fraction",
    "pcie_link_fraction",
    "eager_layer_overhead_us",
    "eager_mla_layer_overhead_us",
    "compute_half_tokens",
    "attn_seq_overhead_us",
    "request_overhead_ms",
    "request_overhead_per_rank_ms",
    "single_seq_step_factor",
    "block_fp8_fraction",
    "moe_half_width",
    "compute_scale",
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


def efficiency_layers(
    gpu_id: str, vendor: str, engine: str, table: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The merged factor table for a GPU and engine, and which tables applied (``table``:
    another factor file's contents, as a fit tries them; default the stored one)."""
    t = table if table is not None else _table()
    merged: dict[str, Any] = {}
    used: list[str] = []
    _merge(merged, t.get("default"), "default", used)
    _merge(merged, t.get("vendor", {}).get(vendor), f"vendor.{vendor}", used)
    _merge(merged, t.get("gpu", {}).get(gpu_id), f"gpu.{gpu_id}", used)
    _merge(merged, t.get("engine", {}).get(engine), f"engine.{engine}", used)
    on_vendor = t.get("vendor", {}).get(vendor, {}).get("engine", {}).get(engine)
    _merge(merged, on_vendor, f"vendor.{vendor}.engine.{engine}", used)
    return merged, used


def _link_fraction(merged: dict[str, Any], interconnect: str) -> float:
    """NCCL's share of the link's per-direction rate in a ring all-reduce: PCIe-only GPUs
    have a measured share of their own (``pcie_link_fraction``), NVLink and the rest the
    fitted ``link_fraction``."""
    if interconnect == "pcie" and "pcie_link_fraction" in merged:
        return merged["pcie_link_fraction"]
    return merged["link_fraction"]


def load_efficiency(
    gpu: Any,
    engine: str = "vllm",
    table: dict[str, Any] | None = None,
    generation: str | None = None,
) -> Efficiency:
    """Calibrated factors for a catalog GPU (``catalog.GPU``) served by `engine`; with a
    ``generation`` (:func:`kernel_generation`), that kernel generation's rates."""
    merged, used = efficiency_layers(gpu.id, gpu.vendor, engine, table)
    if generation is not None:  # its GEMM rates, not its attention kernels (Efficiency doc)
        merged.setdefault("attention_compute_fraction", merged["compute_fraction"])
        _apply_generation(merged, used, generation, table)
    _apply_compute_scale(merged)
    latency = merged["allreduce_latency_us"]
    return Efficiency(
        compute_fraction=float(merged["compute_fraction"]),
        bandwidth_fraction=float(merged["bandwidth_fraction"]),
        step_overhead_ms=float(merged["step_overhead_ms"]),
        per_seq_overhead_ms=float(merged["per_seq_overhead_ms"]),
        allreduce_latency_us=float(latency.get(gpu.interconnect, latency.get("pcie", 40.0))),
        link_fraction=float(_link_fraction(merged, gpu.interconnect)),
        eager_layer_overhead_us=float(merged.get("eager_layer_overhead_us", 270.0)),
        eager_mla_layer_overhead_us=float(merged.get("eager_mla_layer_overhead_us", 880.0)),
        moe_compute_fraction=float(
            merged.get("moe_compute_fraction") or merged["compute_fraction"]
        ),
        per_layer_overhead_us=float(merged.get("per_layer_overhead_us", 0.0)),
        mla_layer_overhead_us=float(merged.get("mla_layer_overhead_us", 0.0)),
        moe_layer_overhead_us=float(merged.get("moe_layer_overhead_us", 0.0)),
        kv_bandwidth_fraction=float(
            merged.get("kv_bandwidth_fraction") or merged["bandwidth_fraction"]
        ),
        compute_half_tokens=float(merged.get("compute_half_tokens", 0.0)),
        attn_seq_overhead_us=float(merged.get("attn_seq_overhead_us", 0.0)),
        request_overhead_ms=float(merged.get("request_overhead_ms", 0.0)),
        request_overhead_per_rank_ms=float(merged.get("request_overhead_per_rank_ms", 0.0)),
        attention_compute_fraction=merged.get("attention_compute_fraction"),
        block_fp8_fraction=float(merged.get("block_fp8_fraction", 1.0)),
        moe_half_width=float(merged.get("moe_half_width", 0.0)),
        source=_source_line(merged, used, gpu.id, table),
    )


def _source_line(
    merged: dict[str, Any], used: list[str], gpu_id: str, table: dict[str, Any] | None
) -> str:
    """Which tables applied and where their factors come from: the last table's source, and a
    GPU table's own where a later (engine) table's source replaced it."""
    line = f"data/efficiency.toml [{', '.join(used)}]: {merged.get('source', '')}"
    t = table if table is not None else _table()
    own = t.get("gpu", {}).get(gpu_id, {}).get("source")
    if own and own != merged.get("source"):
        line = f"{line}; [gpu.{gpu_id}] {own}"
    return line


# --------------------------------------------------------------------------- kernel generations

GENERATION_RATES = (
    "compute_fraction",
    "moe_compute_fraction",
    "bandwidth_fraction",
    "kv_bandwidth_fraction",
)
"""What a kernel generation's ``kernel_fraction`` scales: the rates its kernels reach, not
the fixed costs of a step."""


def kernel_generation(
    engine: str,
    engine_version: str | None,
    vendor: str,
    architecture: str,
    table: dict[str, Any] | None = None,
) -> str | None:
    """The ``[generation.<name>]`` factor set of data/efficiency.toml a deployment runs on:
    the first whose vendor and architecture class (``mla-moe`` or ``other``) match and whose
    ``releases_before`` puts this engine release before the kernels the other factors were
    fitted on. None for current releases and for a release not given."""
    from .engine_policy import parse_version

    release = release_number(engine_version)
    if release is None:
        return None
    t = table if table is not None else _table()
    for name, g in t.get("generation", {}).items():
        before = g.get("releases_before", {}).get(engine)
        if (
            before
            and g.get("vendor", vendor) == vendor
            and g.get("architecture", architecture) == architecture
            and parse_version(release) < parse_version(before)
        ):
            return str(name)
    return None


def generation_factors(name: str) -> dict[str, Any]:
    """The stored ``[generation.<name>]`` table (its rule, kernel_fraction and source)."""
    return dict(_table()["generation"][name])


def architecture_class(arch: Any) -> str:
    """``mla-moe`` for DeepSeek-V2/V3-style models (latent attention and routed experts),
    whose kernels matured separately; ``other`` for the rest."""
    return "mla-moe" if arch.uses_mla and arch.is_moe else "other"


def measurement_generation(m: dict[str, Any], table: dict[str, Any] | None = None) -> str | None:
    """The kernel generation a published measurement ran on (see :func:`kernel_generation`)."""
    from .catalog import get_gpu

    dep = measurement_deployment(m)
    return kernel_generation(
        dep.engine, dep.engine_version, get_gpu(m["gpu"]).vendor, model_class(dep.model), table
    )


@lru_cache(maxsize=64)
def model_class(model: str) -> str:
    """The architecture class (:func:`architecture_class`) of a catalog model, by name."""
    from .architecture import from_config
    from .catalog import load_model

    return architecture_class(from_config(load_model(model).config))


COMPUTE_RATES = ("compute_fraction", "moe_compute_fraction", "attention_compute_fraction")
"""The tensor-core rates a GPU's ``compute_scale`` scales (GEMMs, routed experts, attention)."""


def _apply_compute_scale(merged: dict[str, Any]) -> None:
    """A GPU whose sustained tensor-core clock differs from the one its vendor's factors were
    fitted on, at the same datasheet peak (MI325X at 1,000 W against MI300X at 750 W), carries
    the ratio of the two's measured max-achievable FLOPs as ``compute_scale``: every tensor-core
    rate of the merged table is scaled by it, whichever layer set the rate (an unset MoE or
    attention rate falls back to the scaled compute_fraction in :func:`load_efficiency`)."""
    scale = float(merged.pop("compute_scale", 1.0))
    if scale == 1.0:
        return
    for key in COMPUTE_RATES:
        if merged.get(key) is not None:
            merged[key] = float(merged[key]) * scale


def gpu_compute_scale(gpu_id: str) -> float:
    """The ``compute_scale`` a GPU's own table carries (1.0 where none): its measured GEMM share
    of the datasheet peak against the GPUs its vendor's factors were fitted on."""
    return float(_table().get("gpu", {}).get(gpu_id, {}).get("compute_scale", 1.0))


def one_gpu_async_factors() -> dict[str, Any]:
    """[engine.vllm.one_gpu_async]: the decode factors of vLLM 0.14+ on one Ampere-or-newer
    NVIDIA GPU (async scheduling, full CUDA graphs), which replace [default]'s there (roofline
    applies them to the published factors only; a user calibration fits its own)."""
    return dict(_table().get("engine", {}).get("vllm", {}).get("one_gpu_async", {}))


def _apply_generation(
    merged: dict[str, Any], used: list[str], name: str, table: dict[str, Any] | None
) -> None:
    t = table if table is not None else _table()
    k = float(t["generation"][name]["kernel_fraction"])
    merged.setdefault("moe_compute_fraction", merged["compute_fraction"])
    merged.setdefault("kv_bandwidth_fraction", merged["bandwidth_fraction"])
    for key in GENERATION_RATES:
        merged[key] = float(merged[key]) * k
    merged["source"] = (
        f"{merged.get('source', '')}; [generation.{name}] {t['generation'][name].get('source', '')}"
    )
    used.append(f"generation.{name}")


# --------------------------------------------------------------------------- measurements

DEPLOYMENT_KEYS = (
    "model",
    "scheduler_recv_interval",
    "gpu",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "quantization",
    "kv_cache_dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "enforce_eager",
)


MEASUREMENT_KEYS = (
    "id",
    "source_url",
    "conditions",
    "model",
    "gpu",
    "input_tokens",
    "output_tokens",
    "values",
)
"""What every ``[[measurement]]`` entry states (besides its ``split``)."""


STATED_SETTINGS = {
    "gpu_memory_utilization": (
        r"(?:--gpu-memory-utilization|gpu_memory_utilization|--mem-fraction-static|"
        r"mem_fraction_static|gpu-memory-utilization|mem-fraction-static)[ =:]*"
        r"([0-9]+(?:\.[0-9]+)?)(-[0-9])?"
    ),
    "max_num_batched_tokens": (
        r"(?:--max-num-batched-tokens|max_num_batched_tokens|--chunked-prefill-size|"
        r"chunked_prefill_size)[ =:]*([0-9]+)()"
    ),
}
"""Engine settings a measurement's conditions name as flags (vLLM's and SGLang's spellings;
SGLang's chunked-prefill size is the simulator's step token budget)."""


def stated_settings(conditions: str) -> dict[str, float]:
    """The STATED_SETTINGS the conditions give one value each: the engine ran with them,
    so the entry must carry them. A range ("0.85-0.88") or two values decide nothing."""
    import re

    out: dict[str, float] = {}
    for field, pattern in STATED_SETTINGS.items():
        found = list(re.finditer(pattern, conditions))
        values = {float(f.group(1)) for f in found}
        if len(values) == 1 and not any(f.group(2) for f in found):
            out[field] = values.pop()
    return out


def missing_settings(m: dict[str, Any]) -> dict[str, float]:
    """The stated settings a measurement entry does not carry (or carries otherwise)."""
    stated = stated_settings(m.get("conditions", ""))
    return {k: v for k, v in stated.items() if m.get(k) is None or float(m[k]) != v}


def load_measurements(path: str | Path) -> list[dict[str, Any]]:
    """The ``[[measurement]]`` entries of a measurements TOML file."""
    with Path(path).open("rb") as fh:
        return list(tomllib.load(fh).get("measurement", []))


def measurement_deployment(m: dict[str, Any]) -> Any:
    """The Deployment a measurement was taken on (an engine the fit does not know uses
    vLLM's memory policy and its own efficiency table)."""
    from .deployment import Deployment

    fields = {k: m[k] for k in DEPLOYMENT_KEYS if k in m}
    engine = m.get("engine", "vllm")
    fields["engine"] = engine if engine in ("vllm", "sglang", "trtllm") else "vllm"
    version = release_number(m.get("engine_version"))
    if version:  # the release's memory rules and defaults, as `--engine-version` gives them
        fields["engine_version"] = version
    return Deployment(**fields)


def release_number(text: Any) -> str | None:
    """The release in a measurement's engine_version ("0.6.3.dev116+g151ef4ef" -> "0.6.3"),
    or None where the source names none ("2025-03 (not published)", "main-2026-06")."""
    import re

    found = re.fullmatch(r"v?(\d+\.\d+(?:\.\d+)?)(?:[.+-].*)?", str(text or "").strip())
    return found.group(1) if found else None


def simulate_measurement(
    m: dict[str, Any], efficiency: Efficiency | None = None
) -> dict[str, float]:
    """Predicted value of every metric a measurement reports."""

    from .batching_sim import simulate_load
    from .context_window import with_fitting_context
    from .roofline import StepModel

    # a source that does not print --max-model-len is predicted as `inferwise predict` would
    # answer it: at the longest context that fits when the model's default does not
    need = int(m["input_tokens"]) + int(m["output_tokens"])
    dep, _ = with_fitting_context(measurement_deployment(m), need)
    model = StepModel.from_deployment(dep, efficiency)  # None: the factors predict would use
    load = m.get("load", "offline")
    n = min(int(m.get("num_prompts", 100)), MAX_SIMULATED_REQUESTS)
    concurrency = int(m["concurrency"]) if load == "concurrency" else None
    if concurrency and m.get("steady_state"):
        n = max(n, 10 * concurrency)  # a measurement window: the opening burst diluted away
    # otherwise the run as the benchmark ran it: vllm bench serve and SGLang's bench_serving
    # report every request, the first wave that arrives all at once included
    inp = measurement_lengths(int(m["input_tokens"]), m.get("range_ratio"), n, seed=1)
    out = measurement_lengths(int(m["output_tokens"]), m.get("range_ratio"), n, seed=2)
    rate = float(m["request_rate"]) if load == "rate" else None
    whole_run = not m.get("steady_state")
    _, stats = simulate_load(
        model, inp, out, concurrency=concurrency, rate_per_s=rate, whole_run=whole_run
    )
    return {name: metric_value(stats, name) for name in m["values"]}


def measurement_lengths(mean_tokens: int, range_ratio: float | None, n: int, seed: int) -> Any:
    """A measurement's request lengths: fixed, or (``range_ratio`` r set) drawn uniformly
    from [r x L, L] as SGLang's bench_serving random dataset draws them, with L chosen so
    that the mean is the published one (totals / prompts). Fixed lengths make every request
    of a closed loop finish in lock-step, a synchronisation the real run never had."""
    import numpy as np

    if range_ratio is None or range_ratio >= 1.0:
        return np.full(n, mean_tokens)
    top = 2.0 * mean_tokens / (1.0 + range_ratio)
    rng = np.random.default_rng(seed)
    drawn = rng.uniform(max(1.0, range_ratio * top), top, size=n)
    # a few draws (10 prompts at concurrency 1) miss the published mean: rescale to it, never
    # past L (the benchmark draws no prompt longer than the length it was given)
    scaled = np.rint(drawn * mean_tokens / drawn.mean())
    return np.clip(scaled, 1, max(1, int(top))).astype(np.int64)


MAX_SIMULATED_REQUESTS = 4000  # steady state long before; 30,000-request offline runs stay fast


def metric_value(stats: Any, name: str) -> float:
    """One named metric (``ttft_ms.p50``, ``total_tokens_per_s``...) of a simulated load."""
    import numpy as np

    if name in ("output_tokens_per_s", "requests_per_s", "total_tokens_per_s"):
        return float(getattr(stats, name))
    metric, _, stat = name.partition(".")
    if metric == "itl_ms":
        from .batching_sim import weighted_summary

        q = 50.0 if stat == "mean" else float(stat.lstrip("p"))
        mean, (value,) = weighted_summary(stats.itl_values, stats.itl_weights, (q,))
        return mean if stat == "mean" else value
    values = getattr(stats, metric)
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan")
    if stat == "mean":
        return float(values.mean())
    return float(np.percentile(values, float(stat.lstrip("p"))))


# --------------------------------------------------------------------------- fitting

FIT_KEYS = (
    "kv_bandwidth_fraction",
    "per_layer_overhead_us",
    "mla_layer_overhead_us",
    "compute_fraction",
    "moe_compute_fraction",
    "bandwidth_fraction",
    "step_overhead_ms",
    "allreduce_latency_us",
    "link_fraction",
)
_BOUNDS = {
    "compute_fraction": (0.05, 0.95),
    "moe_compute_fraction": (0.03, 0.95),
    "bandwidth_fraction": (0.2, 0.92),
    "step_overhead_ms": (0.05, 20.0),
    "per_layer_overhead_us": (0.5, 300.0),
    "mla_layer_overhead_us": (0.5, 300.0),
    "moe_layer_overhead_us": (0.5, 600.0),
    "kv_bandwidth_fraction": (0.1, 0.92),
    "per_seq_overhead_ms": (0.0, 0.2),
    "allreduce_latency_us": (2.0, 200.0),
    "link_fraction": (0.1, 0.95),
    "compute_half_tokens": (1.0, 4096.0),
    "attn_seq_overhead_us": (0.01, 20.0),
    "request_overhead_ms": (0.1, 300.0),
    "request_overhead_per_rank_ms": (0.01, 100.0),
    "kernel_fraction": (0.05, 1.0),
    "block_fp8_fraction": (0.3, 1.0),
    "moe_half_width": (1.0, 20000.0),
}


def log_errors(measurements: list[dict[str, Any]], efficiency: Efficiency | None) -> list[float]:
    """log(predicted / measured) for every value of every measurement."""
    import math

    out: list[float] = []
    for m in measurements:
        try:
            pred = simulate_measurement(m, efficiency)
        except Exception:  # an entry the model cannot run counts as a large miss
            out.extend([math.log(4.0)] * len(m["values"]))
            continue
        for name, measured in m["values"].items():
            p = pred.get(name, float("nan"))
            out.append(math.log(p / measured) if p == p and p > 0 else math.log(4.0))
    return out


def capped_mean_square(errors: list[float]) -> float:
    """Mean squared log error, each error capped at a factor of 3 so that one odd
    measurement cannot dominate a fit."""
    import math

    cap = math.log(3)
    return sum(max(-cap, min(cap, e)) ** 2 for e in errors) / len(errors)


def fit_efficiency(
    measurements: list[dict[str, Any]],
    start: Efficiency,
    keys: tuple[str, ...] = FIT_KEYS,
    max_evaluations: int = 300,
) -> tuple[Efficiency, float]:
    """Fit `keys` of `start` to the measurements (least squares on log errors,
    each error capped at a factor of 3 so one odd measurement cannot dominate).

    Returns the fitted factors and the final root-mean-square log error.
    """
    import math
    from dataclasses import replace

    import numpy as np
    from scipy.optimize import minimize

    lo = np.array([math.log(_BOUNDS[k][0]) for k in keys])
    hi = np.array([math.log(_BOUNDS[k][1]) for k in keys])

    def unpack(x: Any) -> Efficiency:
        vals = {
            k: float(math.exp(min(max(v, a), b)))
            for k, v, a, b in zip(keys, x, lo, hi, strict=True)
        }
        return replace(start, **vals)

    def loss(x: Any) -> float:
        return capped_mean_square(log_errors(measurements, unpack(x)))

    x0 = np.array([math.log(max(getattr(start, k) or 1e-3, 1e-3)) for k in keys])
    res = minimize(
        loss,
        x0,
        method="Nelder-Mead",
        options={"maxfev": max_evaluations, "xatol": 1e-3, "fatol": 1e-5},
    )
    return unpack(res.x), math.sqrt(float(res.fun))
