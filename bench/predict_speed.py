"""How long `predict` and `budget` take (the issue's targets: predict < 50 ms,
budget with its rate search < 2 s on two cores).

Prints the median and worst of several runs per case, in-process (what an MCP
call costs; the CLI adds Python start-up). The first call per deployment builds
the step model through the memory-fit calculator and is shown separately as
"first"; later calls reuse it.

    .venv/bin/python bench/predict_speed.py
    taskset -c 0,1 .venv/bin/python bench/predict_speed.py     # pin to two cores
"""

from __future__ import annotations

import statistics
import time

from inferwise.calculators.budget import BudgetRequest, decompose_budget
from inferwise.calculators.predict import PredictRequest, predict_performance

L8 = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
L70 = {
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "gpu": "h100-sxm-80gb",
    "tensor_parallel_size": 4,
}
MOE = {"model": "Qwen/Qwen3-30B-A3B", "gpu": "h100-sxm-80gb"}
DSR1 = {"model": "deepseek-ai/DeepSeek-R1", "gpu": "h200-sxm-141gb", "tensor_parallel_size": 8}

PREDICT = [
    ("8B conc 1", dict(**L8, input_tokens=1000, output_tokens=200, concurrency=1)),
    (
        "8B conc 64, lognormal",
        dict(
            **L8,
            input_tokens=1500,
            input_tokens_p95=6000,
            output_tokens=250,
            output_tokens_p95=800,
            concurrency=64,
        ),
    ),
    ("70B TP4 rate 4", dict(**L70, input_tokens=2000, output_tokens=300, request_rate=4)),
    ("30B-A3B MoE rate 10", dict(**MOE, input_tokens=1000, output_tokens=300, request_rate=10)),
    (
        "R1 TP8 offline 500",
        dict(
            **DSR1,
            input_tokens=2000,
            output_tokens=200,
            request_rate=float("inf"),
            num_requests=500,
        ),
    ),
]
SLO = {"slo_ttft_ms": {"p95": 800}, "slo_itl_ms": {"p95": 50}, "slo_e2e_ms": {"p95": 15000}}
BUDGET = [
    (
        "8B chat rate 5 x2 peak",
        dict(**L8, input_tokens=1500, output_tokens=250, request_rate=5, peak_to_mean=2, **SLO),
    ),
    (
        "70B TP4 lognormal rate 2",
        dict(
            **L70,
            input_tokens=1500,
            input_tokens_p95=6000,
            output_tokens=250,
            output_tokens_p95=800,
            request_rate=2,
            **SLO,
        ),
    ),
    ("MoE conc 16", dict(**MOE, input_tokens=1500, output_tokens=250, concurrency=16, **SLO)),
    (
        "8B agent task",
        dict(
            **L8,
            request_rate=1,
            slo_e2e_ms={"p95": 30000},
            agent_steps=[
                {"name": "plan", "input_tokens": 3000, "output_tokens": 300},
                {"name": "search", "kind": "tool", "latency_ms": 800},
                {
                    "name": "answer",
                    "input_tokens": 6000,
                    "output_tokens": 500,
                    "retry_probability": 0.1,
                },
            ],
        ),
    ),
]


def timed(fn, arg, repeats: int) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    fn(arg)
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(arg)
        runs.append(time.perf_counter() - t0)
    return first, statistics.median(runs), max(runs)


def main() -> None:
    print(f"{'case':34} {'first ms':>9} {'median ms':>10} {'max ms':>8}")
    for name, kw in PREDICT:
        first, med, worst = timed(predict_performance, PredictRequest(**kw), 7)
        print(f"predict  {name:25} {first * 1e3:9.1f} {med * 1e3:10.1f} {worst * 1e3:8.1f}")
    for name, kw in BUDGET:
        first, med, worst = timed(decompose_budget, BudgetRequest(**kw), 3)
        print(f"budget   {name:25} {first * 1e3:9.1f} {med * 1e3:10.1f} {worst * 1e3:8.1f}")


if __name__ == "__main__":
    main()
