"""How long ``inferwise recommend`` searches, and how much of the space it looks at.

The issue's aims, on one core: at least 1,000 configurations considered and the top
ones simulated in under 10 s for a typical workload (an 8B chat model, four GPU types),
and under 60 s for the largest (a 70B model, four GPU types, every lever). Each case
runs from a cold memo (``api.clear_memos``) so the figures are a user's first call.

    taskset -c 0 python -m bench.recommend_speed
"""

from __future__ import annotations

import argparse
import time

from inferwise.calculators import api
from inferwise.calculators.recommend.search import recommend
from inferwise.knowledge.recommending import RecommendRequest, search_spec

GPUS = ["h100-sxm-80gb", "a100-sxm-80gb", "l40s", "h200-sxm-141gb"]
CHAT = {
    "request_rate": 20,
    "peak_to_mean": 3,
    "input_tokens": 1500,
    "input_tokens_p95": 6000,
    "output_tokens": 250,
    "output_tokens_p95": 800,
    "slo_ttft_ms": {"p95": 1500},
    "slo_itl_ms": {"p95": 50},
    "availability": 0.999,
}
CASES = {
    "typical: Llama-3.1-8B, 4 GPU types": {
        **CHAT,
        "model": ["meta-llama/Llama-3.1-8B-Instruct"],
        "gpus": GPUS,
    },
    "largest: Llama-3.3-70B, 4 GPU types, all levers": {
        **CHAT,
        "model": ["meta-llama/Llama-3.3-70B-Instruct"],
        "gpus": GPUS,
    },
    "two candidate models, every priced GPU": {
        **CHAT,
        "model": ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"],
    },
}


def run_case(name: str, fields: dict) -> None:
    api.clear_memos()
    spec = search_spec(RecommendRequest(**fields))
    t0 = time.perf_counter()
    r = recommend(spec)
    wall = time.perf_counter() - t0
    best = r.recommended
    verdict = (
        f"{best.total_gpus} x {best.gpu} TP{best.tensor_parallel_size} {best.quantization} "
        f"${best.usd_per_hour:,.2f}/h"
        if best
        else "infeasible"
    )
    print(
        f"{name:<52} configurations {r.searched.configurations:>5}  fits {r.searched.fitted:>5}  "
        f"simulated {r.searched.simulated:>3}  {wall:6.1f} s   -> {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES), help="one case only")
    args = parser.parse_args()
    for name, fields in CASES.items():
        if args.case is None or args.case == name:
            run_case(name, fields)


if __name__ == "__main__":
    main()
