"""Aggregate rate and timing error of `probe --cluster local:N` for N = 1, 2, 4 Dask workers.

The reference server (``bench/refserver.py``) logs the monotonic time of every send, so
each request's measured TTFT and chunk gaps are compared with the truth exactly as in
``bench/probe_precision.py`` (same analysis, same matching by prompt hash); the load goes
through the real path: `run_probe` with ``cluster="local:N"``, which starts a Dask
``LocalCluster`` of N worker processes on 127.0.0.1, each running one client process.
A plain local run (``--workers 1``, no Dask) is measured first as the baseline.

Figures: achieved requests/s (completed over the measurement window), TTFT error
median/p90/p99, |ITL error| median, the clients' loop-lag P99, and wall time (the Dask
start-up included). On a machine with fewer cores than N + 2 the extra workers only
share the same cores, so quote ratios against the baseline, not absolute rates.

Usage: ``python bench/cluster_probe.py [--concurrency 128] [--requests 768] [--workers 1 2 4]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _point(base: str, n: int | None, args: argparse.Namespace, db: str) -> dict:
    from bench import probe_precision

    ns = argparse.Namespace(
        transport="probe", workers=1, input_tokens=args.input_tokens,
        output_tokens=args.output_tokens, slo_ttft_ms=110.0, slo_e2e_ms=600.0,
        cluster=None if n is None else f"local:{n}",
    )  # fmt: skip
    t0 = time.monotonic()
    point = probe_precision.run_point(base, args.concurrency, args.requests, ns, db)
    point["wall_s"] = time.monotonic() - t0
    return point


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--requests", type=int, default=768)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--ttft-lo-ms", type=float, default=20)
    ap.add_argument("--ttft-hi-ms", type=float, default=200)
    ap.add_argument("--itl-ms", type=float, default=15)
    args = ap.parse_args()

    from bench.probe_precision import _free_port

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "refserver.py"), "--port", str(port),
         "--ttft-lo-ms", str(args.ttft_lo_ms), "--ttft-hi-ms", str(args.ttft_hi_ms),
         "--itl-ms", str(args.itl_ms)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    rows = []
    try:
        assert server.stdout is not None
        if not server.stdout.readline().startswith("ready"):
            raise SystemExit("reference server did not start")
        base = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as tmp:
            for n in [None, *args.workers]:
                rows.append((n, _point(base, n, args, str(Path(tmp) / f"runs-{n}.db"))))
    finally:
        server.terminate()
        server.wait(5)
    print(
        f"concurrency {args.concurrency}, {args.requests} requests, {args.output_tokens} tokens at "
        f"{args.itl_ms:g} ms, cpus={os.cpu_count()}, load1={os.getloadavg()[0]:.1f}"
    )
    print(
        "  client          req/s  x base  TTFT err med/p90/p99 ms   |ITL err| med ms  lag p99 ms  wall s"
    )
    rate0 = rows[0][1]["request_throughput"] or float("nan")
    for n, p in rows:
        t, lag = p["ttft_error_ms"], p["client_health"]["loop_lag_p99_ms"] or 0.0
        name = "local (no Dask)" if n is None else f"cluster local:{n}"
        rate = p["request_throughput"] or float("nan")
        print(
            f"  {name:<15} {rate:6.1f}  {rate / rate0:5.2f}  {t['median']:+6.2f} {t['p90']:+6.2f} "
            f"{t['p99']:+7.2f}        {p['itl_error_ms']['median_abs']:6.3f}        {lag:6.2f}  {p['wall_s']:6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
