"""Regenerate the benchmark-file fixtures in this folder (python tests/data/bench_results/make_fixtures.py).

The files have the exact layout vLLM ``bench serve --save-result``, guidellm's
benchmarks report and AIPerf's ``profile_export_aiperf.json`` write; their
numbers come from the project's own simulator on a known "truth" (the
published factors of meta-llama/Llama-3.1-8B-Instruct on one H100 SXM with
compute x 0.6, bandwidth x 0.7, per-step overhead x 2 and a 25 ms per-request
cost in place of the published one, which the simulator applies as it does every
engine's front end), so a test can check that a calibration recovers what the
published factors miss. They are test inputs, not measurements.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from inferwise.calculators.batching_sim import simulate_load
from inferwise.calculators.deployment import Deployment
from inferwise.calculators.roofline import StepModel
from inferwise.calculators.user_calibration import _efficiency_at

HERE = Path(__file__).parent
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OVERHEAD_MS = 25.0


def truth_model() -> StepModel:
    dep = Deployment(model=MODEL, gpu="h100-sxm-80gb")
    start = StepModel.from_deployment(dep).efficiency
    eff = _efficiency_at(
        start,
        {
            "compute_fraction": start.compute_fraction * 0.6,
            "bandwidth_fraction": start.bandwidth_fraction * 0.7,
            "step_overhead_ms": start.step_overhead_ms * 2.0,
        },
    )
    eff = replace(eff, request_overhead_ms=OVERHEAD_MS, request_overhead_per_rank_ms=0.0)
    return StepModel.from_deployment(dep, eff)


def run(conc: int, n: int, inp: int, out: int) -> dict:
    rng = np.random.default_rng(conc)
    ins = rng.integers(int(inp * 0.9), int(inp * 1.1) + 1, n)
    outs = np.full(n, out)
    res, stats = simulate_load(truth_model(), ins, outs, concurrency=conc)
    ttft, e2e = res.ttft_ms, res.e2e_ms  # from the client's send: the front end included
    tpot = (res.e2e_ms - res.ttft_ms) / (outs - 1)
    dur_s = float((res.arrival_ms + e2e).max() / 1e3)
    return {"ins": ins, "outs": outs, "ttft": ttft, "e2e": e2e, "tpot": tpot, "dur": dur_s}


def vllm_file(conc: int, n: int, inp: int, out: int, detailed: bool) -> dict:
    r = run(conc, n, inp, out)
    data = {
        "date": "20261201-101500",
        "backend": "vllm",
        "model_id": MODEL,
        "tokenizer_id": MODEL,
        "num_prompts": n,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": conc,
        "duration": round(r["dur"], 4),
        "completed": n,
        "total_input_tokens": int(r["ins"].sum()),
        "total_output_tokens": int(r["outs"].sum()),
        "request_throughput": round(n / r["dur"], 4),
        "output_throughput": round(float(r["outs"].sum()) / r["dur"], 3),
        "total_token_throughput": round(float(r["ins"].sum() + r["outs"].sum()) / r["dur"], 3),
        "mean_ttft_ms": round(float(r["ttft"].mean()), 3),
        "median_ttft_ms": round(float(np.median(r["ttft"])), 3),
        "std_ttft_ms": round(float(r["ttft"].std()), 3),
        "p99_ttft_ms": round(float(np.percentile(r["ttft"], 99)), 3),
        "mean_tpot_ms": round(float(r["tpot"].mean()), 3),
        "median_tpot_ms": round(float(np.median(r["tpot"])), 3),
        "p99_tpot_ms": round(float(np.percentile(r["tpot"], 99)), 3),
        "mean_itl_ms": round(float(r["tpot"].mean()), 3),
        "median_itl_ms": round(float(np.median(r["tpot"])), 3),
        "p99_itl_ms": round(float(np.percentile(r["tpot"], 99)), 3),
        "mean_e2el_ms": round(float(r["e2e"].mean()), 3),
        "median_e2el_ms": round(float(np.median(r["e2e"])), 3),
    }
    if detailed:
        data["input_lens"] = [int(x) for x in r["ins"]]
        data["output_lens"] = [int(x) for x in r["outs"]]
        data["ttfts"] = [round(float(x) / 1e3, 6) for x in r["ttft"]]
        data["itls"] = [
            [round(float(t) / 1e3, 6)] * (int(o) - 1)
            for t, o in zip(r["tpot"], r["outs"], strict=True)
        ]
        data["generated_texts"] = [""] * n
        data["errors"] = [""] * n
    return data


def stat_block(values: np.ndarray, unit: str | None = None) -> dict:
    d = {
        "avg": round(float(np.mean(values)), 4),
        "p50": round(float(np.percentile(values, 50)), 4),
        "p90": round(float(np.percentile(values, 90)), 4),
        "p99": round(float(np.percentile(values, 99)), 4),
        "min": round(float(np.min(values)), 4),
        "max": round(float(np.max(values)), 4),
        "std": round(float(np.std(values)), 4),
    }
    if unit:
        d["unit"] = unit
    return d


def guidellm_stats(values: np.ndarray) -> dict:
    return {
        "successful": {
            "mean": round(float(np.mean(values)), 4),
            "median": round(float(np.median(values)), 4),
            "std_dev": round(float(np.std(values)), 4),
            "count": int(len(values)),
            "percentiles": {
                f"p{q}": round(float(np.percentile(values, q)), 4) for q in (50, 90, 95, 99)
            },
        }
    }


def guidellm_bench(strategy: dict, conc: int, n: int, inp: int, out: int) -> dict:
    r = run(conc, n, inp, out)
    return {
        "type_": "generative_benchmark",
        "args": {"strategy": strategy, "max_number": n},
        "run_stats": {
            "requests_made": {"successful": n, "incomplete": 0, "errored": 0, "total": n},
            "total_time": round(r["dur"], 4),
        },
        "worker": {"type_": "generative_requests_worker", "backend_model": MODEL},
        "metrics": {
            "requests_per_second": guidellm_stats(np.array([n / r["dur"]])),
            "request_concurrency": guidellm_stats(np.array([float(conc)])),
            "request_latency": guidellm_stats(r["e2e"] / 1e3),
            "prompt_token_count": guidellm_stats(r["ins"].astype(float)),
            "output_token_count": guidellm_stats(r["outs"].astype(float)),
            "time_to_first_token_ms": guidellm_stats(r["ttft"]),
            "time_per_output_token_ms": guidellm_stats(r["tpot"]),
            "inter_token_latency_ms": guidellm_stats(r["tpot"]),
            "output_tokens_per_second": guidellm_stats(
                np.array([float(r["outs"].sum()) / r["dur"]])
            ),
        },
    }


def aiperf_file(conc: int, n: int, inp: int, out: int) -> dict:
    r = run(conc, n, inp, out)
    return {
        "aiperf_version": "0.3.0",
        "input_config": {
            "endpoint": {"model_names": [MODEL], "type": "chat", "streaming": True},
            "loadgen": {"concurrency": conc, "request_count": n},
        },
        "request_count": {"unit": "requests", "avg": n},
        "time_to_first_token": stat_block(r["ttft"], "ms"),
        "inter_token_latency": stat_block(r["tpot"], "ms"),
        "request_latency": stat_block(r["e2e"], "ms"),
        "input_sequence_length": stat_block(r["ins"].astype(float), "tokens"),
        "output_sequence_length": stat_block(r["outs"].astype(float), "tokens"),
        "output_token_throughput": {
            "unit": "tokens/sec",
            "avg": round(float(r["outs"].sum()) / r["dur"], 3),
        },
        "request_throughput": {"unit": "requests/sec", "avg": round(n / r["dur"], 4)},
        "benchmark_duration": {"unit": "sec", "avg": round(r["dur"], 4)},
    }


def main() -> None:
    def write(name: str, data: dict) -> None:
        (HERE / name).write_text(json.dumps(data, indent=1) + "\n")

    write("vllm_c1.json", vllm_file(1, 12, 1000, 200, detailed=True))
    write("vllm_c4.json", vllm_file(4, 24, 1000, 200, detailed=False))
    write(
        "guidellm_report.json",
        {
            "benchmarks": [
                guidellm_bench({"type_": "synchronous"}, 1, 12, 1000, 200),
                guidellm_bench({"type_": "concurrent", "streams": 16}, 16, 64, 1000, 200),
                guidellm_bench({"type_": "concurrent", "streams": 32}, 32, 96, 1000, 200),
            ]
        },
    )
    write("aiperf_c8.json", aiperf_file(8, 32, 1000, 200))
    write("aiperf_c64.json", aiperf_file(64, 192, 1000, 200))


if __name__ == "__main__":
    main()
