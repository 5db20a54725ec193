"""How exactly `probe --trace` keeps a trace's schedule, measured at the server.

Writes a Mooncake-format trace (Poisson arrivals at --rate with bursts of
requests sharing one timestamp, as the published traces have, and shared
hash-id prefixes), replays it with ``run_probe`` against the reference server
(bench/refserver.py, in its own process, logging the monotonic time it read
each request), and compares each request's arrival at the server with its
slot in the trace.

Arrival error of request i: (server receive time_i - scheduled time_i) minus
the smallest such difference over the run. The server cannot know when the
client's clock started, so the least-late request (about one loopback
transit) is the zero; the error is how much later than that a request reached
the server. Drift would show as errors growing over the run: the first and
last tenth of the run are printed apart.

Target (issue 16): median <= 2 ms, p99 <= 10 ms.

Run: ``python bench/trace_replay.py [--requests 600 --rate 20 --workers 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.probe_precision import _pct

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def write_trace(path: Path, requests: int, rate_per_s: float, seed: int = 0) -> None:
    """A Mooncake JSONL trace: Poisson gaps, one request in five in a same-millisecond
    burst with the one before, and one prompt in two starting with a shared system block."""
    rng = random.Random(seed)
    t_ms = 0.0
    next_id = 1
    with path.open("w") as fh:
        for i in range(requests):
            if i and rng.random() >= 0.2:
                t_ms += rng.expovariate(rate_per_s) * 1000
            ids = [0] if rng.random() < 0.5 else []  # the shared system block
            ids += range(next_id, next_id + rng.randint(1, 2))  # the request's own blocks
            next_id = ids[-1] + 1
            row = {
                "timestamp": int(t_ms),
                "input_length": 512 * (len(ids) - 1) + rng.randint(64, 512),
                "output_length": rng.randint(4, 16),
                "hash_ids": ids,
            }
            fh.write(json.dumps(row) + "\n")


def arrival_errors_ms(records: list[Any], server_log: list[dict[str, Any]]) -> list[float]:
    """Per measured request (in schedule order), how much later than the least-late request
    it reached the server, against its slot (needs records stored with their prompt text)."""
    recv: dict[str, list[float]] = {}
    for e in sorted(server_log, key=lambda e: e["recv_t"], reverse=True):
        recv.setdefault(e["key"], []).append(e["recv_t"])  # identical prompts: in order
    pairs = []
    measured = [r for r in records if not r.warmup and r.scheduled_s is not None]
    for r in sorted(measured, key=lambda r: (r.scheduled_s, r.start_s)):
        if r.prompt_text is None:
            continue
        key = hashlib.sha1(r.prompt_text.encode()).hexdigest()[:16]
        if recv.get(key):
            pairs.append((r.scheduled_s, recv[key].pop() - r.scheduled_s))
    pairs.sort()
    if not pairs:
        return []
    zero = min(d for _, d in pairs)
    return [(d - zero) * 1000.0 for _, d in pairs]


def summarize(errors: list[float]) -> dict[str, float]:
    tenth = max(1, len(errors) // 10)
    return {
        "matched": len(errors),
        "median_ms": round(_pct(errors, 50), 3),
        "p90_ms": round(_pct(errors, 90), 3),
        "p99_ms": round(_pct(errors, 99), 3),
        "max_ms": round(max(errors), 3) if errors else float("nan"),
        "first_tenth_median_ms": round(_pct(errors[:tenth], 50), 3),
        "last_tenth_median_ms": round(_pct(errors[-tenth:], 50), 3),
    }


def replay(base_url: str, trace: Path, db: str, workers: int, requests: int) -> Any:
    from inferwise.probes.runner import ProbeRequest, run_probe

    req = ProbeRequest(
        url=base_url,
        model="ref-model",
        trace=str(trace),
        trace_format="mooncake",
        store_text=True,
        calibrate=False,
        metrics_interval_s=0,
        max_requests=max(1000, requests),
        db=db,
        workers=workers,
    )
    return asyncio.run(run_probe(req))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_log(base_url: str) -> list[dict[str, Any]]:
    import httpx

    return httpx.get(base_url + "/_log", timeout=30, trust_env=False).json()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=20.0, help="mean arrivals per second")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from inferwise.probes.store import RunStore

    port = _free_port()
    cmd = [sys.executable, str(HERE / "refserver.py"), "--port", str(port)]
    cmd += ["--ttft-lo-ms", "5", "--ttft-hi-ms", "20", "--itl-ms", "5"]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        cmd += ["--cpu", str(cpus[-1])]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if not server.stdout.readline().startswith("ready"):
            raise SystemExit("reference server did not start")
        base = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.jsonl"
            write_trace(trace, args.requests, args.rate, args.seed)
            db = str(Path(tmp) / "runs.db")
            t0 = time.monotonic()
            result = replay(base, trace, db, args.workers, args.requests)
            wall = time.monotonic() - t0
            records = RunStore(db).requests(result.run_id)
        errors = arrival_errors_ms(records, _server_log(base))
    finally:
        server.terminate()
        server.wait(5)
    out = {
        "requests": args.requests,
        "rate_per_s": args.rate,
        "workers": args.workers,
        "completed": result.summary.completed,
        "wall_s": round(wall, 1),
        "load1": round(os.getloadavg()[0], 2),
        **summarize(errors),
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"trace replay: {out['completed']}/{args.requests} completed, {args.rate:g} req/s, "
            f"workers={args.workers}, load1={out['load1']}, wall {out['wall_s']} s"
        )
        print(
            f"arrival error at the server (ms): median {out['median_ms']:.3f}  p90 {out['p90_ms']:.3f}  "
            f"p99 {out['p99_ms']:.3f}  max {out['max_ms']:.3f}  (target: median <= 2, p99 <= 10)"
        )
        print(
            f"drift: median error in the first tenth {out['first_tenth_median_ms']:.3f} ms, "
            f"last tenth {out['last_tenth_median_ms']:.3f} ms"
        )
    ok = out["median_ms"] <= 2.0 and out["p99_ms"] <= 10.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
