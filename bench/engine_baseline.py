"""What the real engine measures on this machine: TTFT and ITL medians at concurrency 1 and 8.

Runs the probe (``run_probe``, as ``inferwise probe`` does) against
llama.cpp's ``llama-server`` serving the generated test model, with the same
server settings as the engine tests (4 slots, 1 compute thread, prompt cache
off), and prints the probe's medians beside the server's own per-request
``timings``. The figures are recorded in ``tests/data/engine_baseline.json``
with the conditions they were taken under, so a change in the probe (or the
engine build) that shifts them is visible in review.

    .venv/bin/python bench/engine_baseline.py            # print
    .venv/bin/python bench/engine_baseline.py --write    # print and record

Needs the binary from ``.ci/prepare-engine``. Numbers from a busy machine are
noisier; the JSON keeps the load average seen at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferwise.probes.llamacpp import (
    LLAMA_CPP_PYTHON_VERSION,
    LlamaServer,
    binary_version,
    ensure_llama_server,
    write_test_model,
)

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "engine_baseline.json"
SEED = 20261129  # the engine tests' model
SLOTS = 4


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def measure(
    server: LlamaServer, db: Path, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    from inferwise.probes.runner import ProbeRequest, run_probe
    from inferwise.probes.store import RunStore

    result = asyncio.run(
        run_probe(
            ProbeRequest(
                url=server.base_url,
                db=str(db),
                concurrency=concurrency,
                requests=args.requests,
                warmup_requests=min(concurrency, 4),
                input_tokens=args.input_tokens,
                output_tokens=args.output_tokens,
                metrics_interval_s=0,
            )
        )
    )
    with RunStore(db) as store:
        recs = [r for r in store.requests(result.run_id) if r.ok and not r.warmup]
    timings = [r.server_timings or {} for r in recs]
    s = result.summary
    return {
        "concurrency": concurrency,
        "completed": s.completed,
        "failed": s.failed,
        "probe": {
            "ttft_ms_p50": s.ttft_ms.p50,
            "itl_ms_p50": s.itl_ms.p50,
            "itl_ms_mean": s.itl_ms.mean,
            "tpot_ms_p50": s.tpot_ms.p50,
            "e2e_ms_p50": s.e2e_ms.p50,
            "output_token_throughput_per_s": s.output_token_throughput,
        },
        "server": {
            "prompt_ms_p50": _median([t["prompt_ms"] for t in timings if "prompt_ms" in t]),
            "predicted_per_token_ms_p50": _median(
                [t["predicted_per_token_ms"] for t in timings if "predicted_per_token_ms" in t]
            ),
        },
        "client_minus_server_ttft_ms_p50": _median(
            [
                r.ttft_ms - t["prompt_ms"]
                for r, t in zip(recs, timings, strict=True)
                if "prompt_ms" in t
            ]
        ),
        "client_health_notes": s.client_health.notes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--input-tokens", type=int, default=48)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--write", action="store_true", help=f"record the figures in {OUT}")
    args = parser.parse_args()

    binary = ensure_llama_server()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="inferwise-engine-bench-") as tmp:
        model = write_test_model(Path(tmp) / "model.gguf", seed=SEED)
        server = LlamaServer(model_path=model.path, binary=binary, n_parallel=SLOTS)
        started = time.time()
        with server:
            points = [measure(server, Path(tmp) / "runs.db", c, args) for c in (1, 8)]
    report = {
        "what": "probe TTFT/ITL medians vs llama-server's own timings, test model, this machine",
        "command": "python bench/engine_baseline.py --write",
        "measured_at_unix": int(started),
        "conditions": {
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "load_average_1m_at_start": round(load_before[0], 2),
            "llama_cpp_python_sdist": LLAMA_CPP_PYTHON_VERSION,
            "llama_server": binary_version(binary),
            "server_args": {"slots": SLOTS, "threads": server.threads, "ctx_per_slot": server.ctx_per_slot,
                            "prompt_cache": "off", "ignore_eos": True},
            "model": {k: v for k, v in model.__dict__.items() if k != "path"},
            "workload": {"requests": args.requests, "input_tokens": args.input_tokens,
                         "output_tokens": args.output_tokens, "endpoint": "chat", "temperature": 0.0},
        },
        "points": points,
    }  # fmt: skip
    for p in points:
        print(
            f"c={p['concurrency']}: TTFT p50 {p['probe']['ttft_ms_p50']:.1f} ms "
            f"(server prefill {p['server']['prompt_ms_p50']:.1f} ms), "
            f"ITL p50 {p['probe']['itl_ms_p50']:.2f} ms, mean {p['probe']['itl_ms_mean']:.2f} ms "
            f"(server median {p['server']['predicted_per_token_ms_p50']:.2f} ms/token), "
            f"{p['completed']} ok / {p['failed']} failed"
        )
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(report, indent=2) + "\n")
        print(f"recorded in {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
