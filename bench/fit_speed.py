"""In-process latency of the memory-fit calculator, with and without its suggestions.

`estimate_memory_fit` is called by assistants in loops (one deployment after
another), so its latency is user-visible; the MCP target (issue 6) is a p50
under 5 ms over stdio, of which the calculation is one part. Prints medians
(ms) for three request streams:

* ``same``: one request repeated (Llama-3.1-8B on an H100);
* ``varied``: a rotation over models, GPUs, parallelism, context, KV dtype
  and engine version, so no two consecutive requests are alike;
* ``varied, cold``: the varied stream with the calculator's memo caches
  (per-architecture module lists, weight splits, rules per version) emptied
  before every request: what a first request for an architecture costs.

Each figure is given with suggestions (what the CLI and MCP tool return) and
without them (what the predictor asks for). Rounds are interleaved so that
machine noise hits all streams alike.

    python bench/fit_speed.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import time

MODELS = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen3-30B-A3B",
    "google/gemma-3-27b-it",
    "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4",
    "openai/gpt-oss-20b",
    "mistralai/Mistral-7B-Instruct-v0.3",
)
GPUS = ("h100-sxm-80gb", "a100-sxm-40gb", "l40s", "h200", "mi300x")
SETTINGS = (
    {},
    {"tensor_parallel_size": 2, "context_tokens": 8192, "concurrency": 32},
    {"kv_cache_dtype": "fp8", "max_model_len": 32768},
    {"engine_version": "0.10.0", "gpu_memory_utilization": 0.85},
    {"tensor_parallel_size": 4, "concurrency": 64},
)


def _requests(fit_module) -> list:
    """The varied stream: every model once per GPU and setting, in an order that changes all three."""
    from inferwise.calculators.catalog import load_model
    from inferwise.calculators.errors import InputError

    reqs = []
    combos = itertools.product(range(len(MODELS)), range(len(GPUS)), range(len(SETTINGS)))
    for m, g, s in sorted(combos, key=lambda c: (c[0] + c[1] + c[2]) % 7):
        try:
            load_model(MODELS[m])
        except InputError:
            continue  # not in this catalog
        reqs.append(fit_module.FitRequest(model=MODELS[m], gpu=GPUS[g], **SETTINGS[s]))
    return reqs


def _clear_caches() -> None:
    from inferwise.calculators import engine_policy, params

    clear = getattr(params, "clear_caches", None)
    if clear is not None:
        clear()
    for fn in (
        getattr(engine_policy, "vllm_rules", None),
        getattr(engine_policy, "parse_version", None),
    ):
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def _time(fn, req, cold: bool) -> float:
    from inferwise.calculators.errors import InputError

    if cold:
        _clear_caches()
    t0 = time.perf_counter()
    # e.g. a TP size the model's heads do not allow: still a request answered
    with contextlib.suppress(InputError):
        fn(req)
    return (time.perf_counter() - t0) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="passes over each request stream")
    ns = parser.parse_args()

    from inferwise.calculators import fit

    def with_s(req):
        return fit._estimate(req, with_suggestions=True)

    def without_s(req):
        return fit._estimate(req, with_suggestions=False)

    same = fit.FitRequest(model=MODELS[0], gpu=GPUS[0])
    varied = _requests(fit)
    for req in varied:  # import and load everything once, as a running server has
        _time(with_s, req, cold=False)
    streams = {
        "same": ([same] * len(varied), False),
        "varied": (varied, False),
        "varied, cold": (varied, True),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(ns.rounds):
        for name, (reqs, cold) in streams.items():
            for label, fn in (("with suggestions", with_s), ("without", without_s)):
                times.setdefault((name, label), []).extend(_time(fn, r, cold) for r in reqs)
    print(f"estimate_fit in-process, median ms over {ns.rounds} rounds x {len(varied)} requests")
    print(f"{'stream':<14} {'with suggestions':>17} {'without':>9}")
    for name in streams:
        w = statistics.median(times[(name, "with suggestions")])
        wo = statistics.median(times[(name, "without")])
        print(f"{name:<14} {w:>17.2f} {wo:>9.2f}")


if __name__ == "__main__":
    main()
