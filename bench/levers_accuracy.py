"""The serving levers' predictions beside published measurements (issue 15).

Reads tests/data/lever_measurements.toml (every value with its source, date and the quoted
sentence) and prints, for each row whose conditions map onto a `predict` call, the
prediction beside the published figure and the ratio. Nothing here was fitted to these
rows: the speculative-decoding constants came from vLLM PR #16035
(tests/data/spec_decode_measurements.toml), so every row is held out.

Rows that do not map are counted and named with the reason (a model outside the catalog,
a split the source does not state, a comparison confounded with other features).

    .venv/bin/python -m bench.levers_accuracy
"""

from __future__ import annotations

import statistics
import tomllib
from pathlib import Path
from typing import Any

from inferwise.calculators.predict import PredictRequest, predict_performance

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "lever_measurements.toml"
GPUS = {"NVIDIA H100": "h100-sxm-80gb", "NVIDIA H200": "h200-sxm-141gb"}
MT_BENCH = {"input_tokens": 200, "output_tokens": 512}
"""MT-Bench-like lengths for the EAGLE papers' chat sweeps (the tables state none)."""


def load() -> dict[str, list[dict[str, Any]]]:
    with DATA.open("rb") as fh:
        return tomllib.load(fh)


def spec_decode_rows(rows: list[dict[str, Any]]) -> list[tuple[str, int, float, float]]:
    """(series, batch, published, predicted) throughput speed-ups of the batch sweeps
    whose model and GPU are in the catalog."""
    out = []
    for r in rows:
        if r.get("metric") != "throughput_speedup_vs_no_spec" or r.get("gpu") not in GPUS:
            continue
        batch = r.get("concurrency") or r.get("batch_size")
        if not isinstance(batch, int) or not isinstance(r.get("speedup"), float | int):
            continue
        req = PredictRequest(
            model=r["model"],
            gpu=GPUS[r["gpu"]],
            engine="sglang" if r["engine"].lower() == "sglang" else "vllm",
            concurrency=batch,
            speculative_method=r["method"],
            num_speculative_tokens=r.get("num_speculative_tokens") or 3,
            **MT_BENCH,
        )
        spec = predict_performance(req).speculative
        out.append((r["series"], batch, float(r["speedup"]), spec.throughput_speedup))
    return out


def prefix_cache_rows(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(what, published, predicted) for the single-request TTFT ratios with a full hit."""
    out = []
    for r in rows:
        if r.get("concurrency") != 1 or not r.get("without_cache") or "ttft" not in r["metric"]:
            continue
        n = int(r["input_tokens"])
        req = PredictRequest(
            model=r["model"],
            gpu=GPUS.get(r.get("gpu", ""), "h100-sxm-80gb"),
            input_tokens=n,
            output_tokens=8,
            max_model_len=n + 64,
            concurrency=1,
            prefix_cache_hit_rate=min(1.0, r.get("shared_prefix_tokens", n) / n),
        )
        res = predict_performance(req)
        pc = res.prefix_cache
        what = (
            f"{r['model']} {n:,}-token prompt, second send (GPU unstated: H100 assumed); "
            f"published {r['without_cache']:,.0f} -> {r['with_cache']:,.0f} ms, predicted "
            f"{pc.ttft_ms_p50_without_cache:,.0f} -> {res.ttft_ms.p50:,.0f} ms server-side "
            "(no tokenization, HTTP or gateway)"
        )
        out.append((what, r["without_cache"] / r["with_cache"], pc.ttft_speedup))
    return out


def _print_spec(rows: list[tuple[str, int, float, float]]) -> None:
    print("Speculative decoding: throughput speed-up vs batch (held out)")
    print(f"{'series':34} {'batch':>5} {'published':>9} {'predicted':>9} {'ratio':>6}")
    for series, batch, pub, pred in rows:
        print(f"{series:34} {batch:5d} {pub:9.2f} {pred:9.2f} {pred / pub:6.2f}")
    ratios = [pred / pub for _, _, pub, pred in rows]
    if ratios:
        within = sum(abs(r - 1) <= 0.15 for r in ratios) / len(ratios)
        print(
            f"n={len(ratios)}  median predicted/published {statistics.median(ratios):.2f}  "
            f"within +-15 %: {within:.0%}"
        )
        for series in sorted({s for s, *_ in rows}):
            pts = [(b, pub, pred) for s, b, pub, pred in rows if s == series]
            print(
                f"  {series}: published {pts[0][1]:.2f} -> {pts[-1][1]:.2f} from batch "
                f"{pts[0][0]} to {pts[-1][0]}; predicted {pts[0][2]:.2f} -> {pts[-1][2]:.2f}"
            )


def _print_unmapped(data: dict[str, list[dict[str, Any]]]) -> None:
    print("\nRows not mapped onto a predict call (kept in the data file with their notes):")
    print(
        f"  disaggregation: {len(data.get('disaggregation', []))} rows: per-GPU goodput ratios at "
        "SLO attainment for models outside the catalog (DistServe: OPT), or the split confounded "
        "with expert parallelism, KV offload and other features (SGLang, Dynamo, TensorRT-LLM); "
        "vLLM's docs state it does not raise throughput, which the model agrees with "
        "(tests/test_disaggregation.py)"
    )
    print(
        f"  kv_transfer: {len(data.get('kv_transfer', []))} rows: link rates (Mooncake 87-190 GB/s "
        "over 4-8 RoCE NICs, NIXL 42.6 GB/s on one 400 Gb/s NIC): the basis of the 400 Gbit/s "
        "per GPU default; small blocks collapse the rate (NIXL issue #1021)"
    )


def main() -> None:
    data = load()
    _print_spec(spec_decode_rows(data["spec_decode"]))
    print("\nPrefix caching: TTFT without / with a full hit, one request (held out)")
    for what, pub, pred in prefix_cache_rows(data["prefix_cache"]):
        print(f"  {what}: published {pub:.1f}x, predicted {pred:.1f}x ({pred / pub:.2f})")
    _print_unmapped(data)


if __name__ == "__main__":
    main()
