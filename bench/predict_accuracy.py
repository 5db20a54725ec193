"""How close `inferwise predict` comes to published measurements.

Prints, for the calibration part and the held-back part of
tests/data/perf_measurements.toml, every measured value next to the model's
prediction, and the share of TTFT, ITL, end-to-end and throughput values
within +-30 %. With --fit it first re-fits the efficiency factors on the
calibration part only (NVIDIA + vLLM, AMD, TensorRT-LLM groups separately)
and prints them as TOML for calculators/data/efficiency.toml.

    .venv/bin/python bench/predict_accuracy.py            # error table with the stored factors
    .venv/bin/python bench/predict_accuracy.py --fit      # fit, then the table with fitted factors
    .venv/bin/python bench/predict_accuracy.py --fit-layers   # only the GPU-generation and engine
                                                              # layers (LAYER_FITS), one factor each
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from inferwise.calculators.calibration import (
    _table,
    fit_efficiency,
    load_efficiency,
    load_measurements,
    measurement_deployment,
    measurement_generation,
    model_class,
    simulate_measurement,
)
from inferwise.calculators.catalog import get_gpu
from inferwise.calculators.intervals import interval_table, ratio_interval

try:  # run as a script (bench/ on sys.path) or imported as bench.predict_accuracy
    from prediction_intervals import Residual, interval_cells, measurement_architecture, residuals
except ImportError:
    from bench.prediction_intervals import (
        Residual,
        interval_cells,
        measurement_architecture,
        residuals,
    )

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "perf_measurements.toml"
TOLERANCE = 0.30


def metric_class(name: str) -> str:
    """The metric family the intervals are kept per (one definition: calculators.intervals)."""
    from inferwise.calculators.intervals import metric_family

    return metric_family(name)


def group_of(m: dict) -> str:
    """The factor group a measurement is fitted in by --fit (SGLang on NVIDIA has only its
    own layer, fitted by --fit-layers; its entries do not move vLLM's shared factors)."""
    generation = measurement_generation(m)
    if generation is not None:  # fitted by --fit-layers alone, on top of the others
        return "generation." + generation
    if m.get("engine") == "trtllm" and measurement_architecture(m) != "dense":
        return "engine.trtllm.moe"  # TensorRT-LLM's MoE rate: a layer of its own (--fit-layers)
    if m.get("engine", "vllm") not in ("vllm", "sglang"):
        return "engine." + m["engine"]
    if get_gpu(m["gpu"]).vendor == "amd":  # SGLang on ROCm: its own layer (--fit-layers)
        return "vendor.amd.engine.sglang" if m.get("engine") == "sglang" else "vendor.amd"
    if runs_async_on_one_gpu(m):  # vLLM 0.14+ on one GPU: its own layer (--fit-layers)
        return "engine.vllm.one_gpu_async"
    return "engine.sglang" if m.get("engine") == "sglang" else "default"


def runs_async_on_one_gpu(m: dict) -> bool:
    """Whether `inferwise predict` gives this run [engine.vllm.one_gpu_async]'s factors."""
    from inferwise.calculators import roofline

    return roofline.runs_async_on_one_gpu(measurement_deployment(m))


def entry_efficiency(m: dict, factor_table: dict):
    """The factors a measurement's deployment gets from a (fitted) factor table."""
    generation = measurement_generation(m, factor_table)
    return load_efficiency(get_gpu(m["gpu"]), m.get("engine", "vllm"), factor_table, generation)


def table(
    measurements: list[dict], factors: dict[str, object] | None = None
) -> dict[str, list[float]]:
    """Print one row per value; return relative errors by metric class."""
    errors: dict[str, list[float]] = {}
    print(f"{'measurement':52} {'metric':20} {'measured':>10} {'predicted':>10} {'error':>7}")
    for m in measurements:
        eff = factors.get(group_of(m)) if factors else None
        try:
            pred = simulate_measurement(m, eff)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{m['id'][:52]:52} ERROR {exc}")
            for name in m["values"]:
                errors.setdefault(metric_class(name), []).append(math.inf)
            continue
        for name, measured in m["values"].items():
            p = pred[name]
            err = p / measured - 1 if p == p else math.inf
            errors.setdefault(metric_class(name), []).append(err)
            flag = "" if abs(err) <= TOLERANCE else "  *"
            print(
                f"{m['id'][:52]:52} {name:20} {measured:10.1f} {p:10.1f} {err * 100:+6.0f}%{flag}"
            )
    return errors


def summary(label: str, errors: dict[str, list[float]]) -> None:
    total = within = 0
    print(f"\n{label}: share of values within +-{TOLERANCE:.0%}")
    for cls in ("ttft", "itl", "e2e", "throughput"):
        errs = errors.get(cls, [])
        if not errs:
            continue
        ok = sum(1 for e in errs if abs(e) <= TOLERANCE)
        finite = sorted(abs(e) for e in errs if e != math.inf)
        med = finite[len(finite) // 2] if finite else math.inf
        print(
            f"  {cls:11} {ok:3d}/{len(errs):3d} = {ok / len(errs):5.0%}   median |error| {med:5.0%}"
        )
        total += len(errs)
        within += ok
    if total:
        print(f"  {'all':11} {within:3d}/{total:3d} = {within / total:5.0%}")


def covered(r: Residual, cells: dict) -> bool:
    """Whether the measured value lies in the interval the table gives its regime."""
    lo, hi, _, _ = ratio_interval(
        r.family, r.engine, r.load, r.context, {"regime": cells}, arch=r.arch
    )
    return r.predicted > 0 and lo <= r.ratio <= hi


def coverage_flags(rs: list[Residual], pool: list[Residual]) -> list[bool]:
    """Interval coverage of each residual, the interval built WITHOUT its own source
    (leave one source out), so a source never vouches for itself."""
    by_source: dict[str, dict] = {}
    flags = []
    for r in rs:
        if r.source not in by_source:
            by_source[r.source] = interval_cells([p for p in pool if p.source != r.source])
        flags.append(covered(r, by_source[r.source]))
    return flags


def split_report(rs: list[Residual], flags: list[bool]) -> None:
    """Per split, metric family and engine family: within +-30 %, median |error|, coverage."""
    print(
        f"\n{'split':12} {'metric':11} {'engine':7} {'n':>4} {'within30':>9} "
        f"{'median|err|':>12} {'coverage':>9}"
    )
    rows: dict[tuple[str, str, str], list[tuple[Residual, bool]]] = {}
    for r, f in zip(rs, flags, strict=True):
        for key in (
            (r.split, r.family, r.engine),
            (r.split, r.family, "all"),
            (r.split, "all", "all"),
        ):
            rows.setdefault(key, []).append((r, f))
    for (split, family, engine), members in sorted(rows.items()):
        errs = sorted(
            abs(r.predicted / r.measured - 1) if r.predicted > 0 else math.inf for r, _ in members
        )
        ok = sum(1 for e in errs if e <= TOLERANCE)
        cov = sum(1 for _, f in members if f) / len(members)
        print(
            f"{split:12} {family:11} {engine:7} {len(errs):4d} {ok / len(errs):9.0%} "
            f"{errs[len(errs) // 2]:12.0%} {cov:9.0%}"
        )


def source_report(rs: list[Residual], flags: list[bool]) -> None:
    """Per held-out source: one source that misses everywhere (an older engine release,
    say) shows as itself instead of hiding in the totals."""
    print(f"\n{'held-out source':76} {'n':>4} {'within30':>9} {'median|err|':>12} {'coverage':>9}")
    by: dict[str, list[tuple[Residual, bool]]] = {}
    for r, f in zip(rs, flags, strict=True):
        by.setdefault(r.source, []).append((r, f))
    shares: list[float] = []
    for source, members in sorted(by.items(), key=lambda kv: -len(kv[1])):
        errs = sorted(
            abs(r.predicted / r.measured - 1) if r.predicted > 0 else math.inf for r, _ in members
        )
        ok = sum(1 for e in errs if e <= TOLERANCE) / len(errs)
        cov = sum(1 for _, f in members if f) / len(members)
        shares.append(ok)
        print(f"{source[-76:]:76} {len(errs):4d} {ok:9.0%} {errs[len(errs) // 2]:12.0%} {cov:9.0%}")
    # one large source (dstack's 225 values) outweighs twenty small ones in the pooled share
    print(
        f"{'each source one vote: median share within +-30 %':76} {len(shares):4d} "
        f"{statistics.median(shares):9.0%}"
    )


def interval_report(measurements: list[dict]) -> None:
    """The issue's table: calibration vs held-out, with interval coverage (calibration
    rows against the stored table; held-out rows leave their own source out)."""
    cal = residuals([m for m in measurements if m.get("split") == "calibration"])
    out = residuals([m for m in measurements if m.get("split") != "calibration"])
    stored = interval_table().get("regime", {})
    out_flags = coverage_flags(out, out)
    split_report(cal + out, [covered(r, stored) for r in cal] + out_flags)
    source_report(out, out_flags)


NEW_TERMS = ("compute_half_tokens", "attn_seq_overhead_us")


def fit(
    calibration: list[dict],
    new_terms: bool = False,
    fixed: dict[str, float] | None = None,
    added: dict[str, float] | None = None,
) -> dict[str, object]:
    """Fit each group's factors on its calibration entries (with new_terms, also the
    optional GEMM ramp and per-sequence attention cost, started at 256 tokens / 0.5 us;
    `added`: further [default] factors to fit, from these starting values)."""
    groups: dict[str, list[dict]] = {}
    for m in calibration:
        groups.setdefault(group_of(m), []).append(m)
    fitted: dict[str, object] = {}
    order = ["default"] + sorted(g for g in groups if g != "default")
    for g in order:
        ms = groups.get(g, [])
        own_layer = g.endswith(("engine.sglang", ".moe", ".one_gpu_async"))
        if not ms or own_layer or g.startswith("generation."):
            continue  # layers of their own (--fit-layers)
        gpu = get_gpu(ms[0]["gpu"])
        start = load_efficiency(gpu, ms[0].get("engine", "vllm"))
        if g != "default" and "default" in fitted:
            base = fitted["default"]
            start = replace(
                start,
                **{
                    k: getattr(base, k)
                    for k in ("moe_compute_fraction", "link_fraction", "per_layer_overhead_us")
                },
            )
        if g == "default" and not start.per_layer_overhead_us:
            start = replace(start, per_layer_overhead_us=10.0)
        if start.kv_bandwidth_fraction is None:
            start = replace(start, kv_bandwidth_fraction=start.bandwidth_fraction * 0.8)
        if g == "default" and start.block_fp8_fraction == 1.0:  # start inside its range
            start = replace(start, block_fp8_fraction=0.7)
        if g == "default" and not start.moe_half_width:
            start = replace(start, moe_half_width=1000.0, moe_compute_fraction=0.5)
        if start.moe_compute_fraction is None:
            start = replace(start, moe_compute_fraction=start.compute_fraction)
        keys = (
            (
                "compute_fraction",
                "moe_compute_fraction",
                "per_layer_overhead_us",
                "bandwidth_fraction",
                "kv_bandwidth_fraction",
                "step_overhead_ms",
                "allreduce_latency_us",
                "link_fraction",
                "block_fp8_fraction",
                "moe_half_width",
            )
            if g == "default"
            else (
                "compute_fraction",
                "bandwidth_fraction",
                "step_overhead_ms",
                "per_layer_overhead_us",
                "kv_bandwidth_fraction",
                "allreduce_latency_us",
            )
        )
        if g == "vendor.amd":  # held: its TP 1 and TP 8 runs cannot tell it (efficiency.toml)
            keys = tuple(k for k in keys if k != "kv_bandwidth_fraction")
        if fixed and g == "default":  # held at a measured value instead of fitted
            start = replace(start, **fixed)
            keys = tuple(k for k in keys if k not in fixed)
        if added and g == "default":  # a candidate term, fitted with the others
            start = replace(start, **added)
            keys = (*keys, *added)
        if new_terms:
            keys = (*keys, *NEW_TERMS)
            start = replace(start, compute_half_tokens=256.0, attn_seq_overhead_us=0.5)
        t0 = time.perf_counter()
        eff, rms = fit_efficiency(ms, start, keys)
        fitted[g] = eff
        print(
            f"# [{g}] fitted on {len(ms)} calibration entries in {time.perf_counter() - t0:.0f} s, rms log error {rms:.3f}"
        )
        for k in keys:
            print(
                f"#   {k} = {getattr(eff, k):.4g}  ({gpu.interconnect} for all-reduce latency)"
                if k == "allreduce_latency_us"
                else f"#   {k} = {getattr(eff, k):.4g}"
            )
    return fitted


def sglang_on_nvidia(m: dict) -> bool:
    return m.get("engine") == "sglang" and get_gpu(m["gpu"]).vendor == "nvidia"


A100_TABLES = tuple(
    ("gpu", g) for g in ("a100-sxm-80gb", "a100-sxm-40gb", "a100-pcie-80gb", "a100-pcie-40gb")
)


@dataclass(frozen=True)
class LayerFit:
    """One factor of the tables that hold a GPU generation's or an engine's own values,
    fitted alone on the calibration entries those tables apply to (the shared factors
    stay as stored: a layer only says what is different about its GPUs or engine)."""

    tables: tuple[tuple[str, str], ...]
    key: str
    applies: Callable[[dict], bool]
    why: str
    published: bool = False
    """Score through `inferwise predict`'s own path (the candidate table installed as the stored
    one): for a layer that predict applies by deployment, not by GPU and engine alone."""


LAYER_FITS = (
    LayerFit(
        A100_TABLES,
        "compute_fraction",
        lambda m: m["gpu"].startswith("a100") and m.get("engine", "vllm") == "vllm",
        "Ampere's tensor cores reach a larger share of their (lower) peak than Hopper's",
    ),
    LayerFit(
        (("gpu", "rtx-4090"),),
        "compute_fraction",
        lambda m: m["gpu"] == "rtx-4090" and m.get("engine", "vllm") == "vllm",
        "the RTX 4090 prefills at a larger share of its GEMM maximum than the H100 fit gives",
        published=True,
    ),
    LayerFit(
        (("default", ""),),
        "mla_layer_overhead_us",
        lambda m: (
            model_class(m["model"]) == "mla-moe"
            and get_gpu(m["gpu"]).vendor == "nvidia"
            and measurement_generation(m) is None
        ),
        "an MLA layer launches about twice the small kernels of a grouped-query attention layer",
    ),
    LayerFit(
        (("vendor.amd.engine", "sglang"),),
        "moe_layer_overhead_us",
        lambda m: (
            get_gpu(m["gpu"]).vendor == "amd"
            and m.get("engine") == "sglang"
            and measurement_architecture(m) == "moe"
        ),
        "SGLang's fused-MoE path on ROCm launches kernels whose gaps do not hide at small batch",
    ),
    LayerFit(
        (("vendor.nvidia.engine", "sglang"),),
        "step_overhead_ms",
        lambda m: sglang_on_nvidia(m) and m.get("tensor_parallel_size", 1) == 1,
        "SGLang's overlap scheduler prepares the next batch on the CPU while the GPU runs this one",
    ),
    LayerFit(
        (("vendor.nvidia.engine", "sglang"),),
        "moe_layer_overhead_us",
        lambda m: sglang_on_nvidia(m) and measurement_architecture(m) != "dense",
        "SGLang's fused-MoE path launches kernels whose gaps do not hide at small batch",
    ),
    LayerFit(
        (("engine", "sglang"),),
        "request_overhead_ms",
        lambda m: sglang_on_nvidia(m) and m.get("tensor_parallel_size", 1) == 1,
        "SGLang's per-request cost outside the GPU (tokenizer manager, scheduler hand-off)",
    ),
    LayerFit(
        (("engine", "sglang"),),
        "request_overhead_per_rank_ms",
        lambda m: sglang_on_nvidia(m) and m.get("tensor_parallel_size", 1) > 1,
        "what each further tensor-parallel rank adds: rank 0 broadcasts new requests to the others",
    ),
    LayerFit(
        (("engine", "trtllm"),),
        "moe_compute_fraction",
        lambda m: m.get("engine") == "trtllm" and measurement_architecture(m) != "dense",
        "TensorRT-LLM runs the experts in its own MoE plugin (CUTLASS grouped GEMMs), not in "
        "the fused Triton kernel whose rate vLLM's and SGLang's runs fitted",
    ),
    LayerFit(
        (("engine.vllm", "one_gpu_async"),),
        "per_layer_overhead_us",
        runs_async_on_one_gpu,
        "vLLM 0.14+ on one GPU replays full decode graphs while the host prepares the next step",
        published=True,
    ),
    LayerFit(
        (("generation", "mla-moe-early-2025"),),
        "kernel_fraction",
        lambda m: measurement_generation(m) == "mla-moe-early-2025",
        "DeepSeek MLA + MoE kernels of early-2025 releases reach a fraction of today's rates",
    ),
)


def with_value(base: dict, tables: tuple[tuple[str, str], ...], key: str, value: float) -> dict:
    """A copy of a factor table with `key` set to `value` in each of `tables`."""
    out = copy.deepcopy(base)
    for kind, name in tables:
        if kind == "default":  # the shared table itself, not a layer under it
            out.setdefault("default", {})[key] = value
        else:  # a layer, or a layer nested in one ("vendor.amd.engine", "sglang")
            node = out
            for part in (*kind.split("."), name):
                node = node.setdefault(part, {})
            node[key] = value
    return out


def table_loss(ms: list[dict], factor_table: dict, published: bool = False) -> float:
    """The shared fit's loss for the measurements under a factor table (`published`: scored as
    `inferwise predict` would with that table stored, see LayerFit.published)."""
    from inferwise.calculators.calibration import capped_mean_square, log_errors

    if published:
        with stored_table(factor_table):
            return capped_mean_square(log_errors(ms, None))
    return capped_mean_square(
        [e for m in ms for e in log_errors([m], entry_efficiency(m, factor_table))]
    )


@contextmanager
def stored_table(factor_table: dict):
    """Let every reader of data/efficiency.toml see `factor_table` for a while."""
    from inferwise.calculators import calibration
    from inferwise.calculators.roofline import _cached_step_model

    stored = calibration._table
    calibration._table = lambda: factor_table  # type: ignore[assignment]
    _cached_step_model.cache_clear()
    try:
        yield
    finally:
        calibration._table = stored
        _cached_step_model.cache_clear()


def fit_layer(lf: LayerFit, ms: list[dict], base: dict) -> tuple[float, float]:
    """The value of one layer factor that fits `ms` best on top of `base` (bounded search in
    log space), and its rms log error."""
    from scipy.optimize import minimize_scalar

    from inferwise.calculators.calibration import _BOUNDS

    lo, hi = _BOUNDS[lf.key]
    res = minimize_scalar(
        lambda x: table_loss(ms, with_value(base, lf.tables, lf.key, math.exp(x)), lf.published),
        bounds=(math.log(lo), math.log(hi)),
        method="bounded",
        options={"xatol": 0.01},
    )
    return math.exp(res.x), math.sqrt(res.fun)


def fit_layers(calibration: list[dict], without: tuple[str, ...] = ()) -> dict:
    """Fit each LAYER_FITS factor in turn (later ones see the earlier fitted values);
    returns the fitted factor table and prints the values for data/efficiency.toml."""
    fitted = copy.deepcopy(_table())
    for lf in LAYER_FITS:
        if lf.key in without:
            continue
        ms = [m for m in calibration if lf.applies(m)]
        before = math.sqrt(table_loss(ms, fitted, lf.published))
        t0 = time.perf_counter()
        value, rms = fit_layer(lf, ms, fitted)
        fitted = with_value(fitted, lf.tables, lf.key, value)
        names = ", ".join(".".join(t) for t in lf.tables)
        print(
            f"# [{names}] {lf.key} = {value:.4g}: fitted on {len(ms)} calibration entries in "
            f"{time.perf_counter() - t0:.0f} s, rms log error {rms:.3f} (before: {before:.3f}); "
            f"{lf.why}"
        )
    return fitted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--fit", action="store_true", help="re-fit the factors on the calibration part first"
    )
    ap.add_argument(
        "--new-terms",
        action="store_true",
        help="with --fit: also fit compute_half_tokens and attn_seq_overhead_us",
    )
    ap.add_argument(
        "--fit-layers",
        action="store_true",
        help="fit only the GPU-generation and engine layers (LAYER_FITS) on the stored factors",
    )
    ap.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --fit: hold a default factor at a measured value (e.g. link_fraction=0.8)",
    )
    ap.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="KEY",
        help="with --fit-layers: leave this layer factor as stored (compare with and without)",
    )
    ap.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="KEY=START",
        help="with --fit: also fit this [default] factor, from START (a candidate term)",
    )
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    ms = load_measurements(args.data)
    calibration = [m for m in ms if m.get("split") == "calibration"]
    holdout = [m for m in ms if m.get("split") != "calibration"]
    fixed = {k: float(v) for k, _, v in (f.partition("=") for f in args.fix)}
    added = {k: float(v) for k, _, v in (f.partition("=") for f in args.add)}
    factors = fit(calibration, args.new_terms, fixed, added) if args.fit else None
    layered = fit_layers(calibration, tuple(args.without)) if args.fit_layers else None
    # layer fits are reported as `inferwise predict` would answer with them stored
    with stored_table(layered) if layered is not None else nullcontext():
        print(f"\n== calibration part ({len(calibration)} entries)")
        e_cal = table(calibration, factors)
        print(f"\n== held-back part ({len(holdout)} entries, never used for fitting)")
        e_hold = table(holdout, factors)
        summary("calibration", e_cal)
        summary("held back", e_hold)
        both = {k: e_cal.get(k, []) + e_hold.get(k, []) for k in set(e_cal) | set(e_hold)}
        summary("all", both)
        interval_report(ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
