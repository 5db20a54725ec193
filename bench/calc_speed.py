"""Calls per second of the in-process calculator API a deployment search uses
(``inferwise.calculators.api``): the issue's aim is >= 500 fit and >= 50 predict
calls/s on one core for an 8B model.

Three streams per calculator, each timed over several rounds (the median is printed):

* ``distinct``: every request new (a search's first pass over candidates), memo off;
* ``repeated``: a rotation of a few requests (a search revisiting candidates), memo on;
* ``direct``: the calculator function without the API (what the memo saves).

    taskset -c 0 python bench/calc_speed.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from inferwise.calculators import api
from inferwise.calculators.fit import FitRequest, estimate_fit
from inferwise.calculators.predict import PredictRequest, predict_performance

MODEL = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}


def fit_requests(n: int) -> list[FitRequest]:
    lens = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
    seqs = (32, 64, 128, 256, 512)
    combos = itertools.islice(itertools.cycle(itertools.product(lens, seqs, (0.85, 0.9, 0.95))), n)
    return [
        FitRequest(**MODEL, max_model_len=L, max_num_seqs=s, gpu_memory_utilization=u)
        for L, s, u in combos
    ]


def predict_requests(n: int) -> list[PredictRequest]:
    grid = itertools.product((1, 2, 4, 8, 16, 32, 64), (256, 1024, 4096), (64, 256))
    return [
        PredictRequest(**MODEL, concurrency=c, input_tokens=i, output_tokens=o, num_requests=200)
        for c, i, o in itertools.islice(itertools.cycle(grid), n)
    ]


def per_second(call, requests) -> float:
    t0 = time.perf_counter()
    for r in requests:
        call(r)
    return len(requests) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fits, preds = fit_requests(105), predict_requests(42)
    estimate_fit(fits[0])
    predict_performance(preds[0])  # imports and the step model's first build
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        api.clear_memos()
        rows.setdefault("fit distinct (api)", []).append(per_second(api.fit, fits))
        rows.setdefault("fit repeated (api)", []).append(per_second(api.fit, fits[:5] * 20))
        rows.setdefault("fit direct", []).append(per_second(estimate_fit, fits))
        api.clear_memos()
        rows.setdefault("predict distinct (api)", []).append(per_second(api.predict, preds))
        rows.setdefault("predict repeated (api)", []).append(per_second(api.predict, preds[:5] * 8))
        rows.setdefault("predict direct", []).append(per_second(predict_performance, preds))
    print(f"{'stream':<26}{'calls/s (median of ' + str(args.rounds) + ')':>26}")
    for name, values in rows.items():
        print(f"{name:<26}{statistics.median(values):>26,.0f}")


if __name__ == "__main__":
    main()
