"""Does the simulated engine keep the schedule it promises? (not a test: prints figures)

Runs `inferwise sim` in its own process (fixed schedule: TTFT 50 ms, ITL 10 ms,
+0.1 ms per extra running sequence), drives it with the probe at
concurrency 1 and 64, and reads the server's own send log: server-side TTFT
(request read -> first token chunk written), per-chunk gaps against the model's
decode step, and the sim's CPU time per chunk. The probe's view is printed
beside it; the difference is the client's share (see bench/probe_precision.py
for that side).

    .venv/bin/python bench/sim_fidelity.py [--db /tmp/sim_fidelity.db]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    from inferwise.probes.runner import ProbeRequest, run_probe
    from inferwise.probes.sim import SimServer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=os.path.join(tempfile.mkdtemp(), "sim_fidelity.db"))
    args = ap.parse_args()
    print(
        "| c | server TTFT p50/p99 ms | server ITL p50/mean/p99 ms | model decode step ms | "
        "probe TTFT p50 | probe ITL p50 | out tok/s | sim CPU µs/chunk |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for c, n in ((1, 20), (64, 256)):
        with SimServer(
            ttft_ms=50, itl_ms=10, itl_per_seq_ms=0.1, max_num_seqs=256, process=True
        ) as sim:
            cpu0 = _cpu_s(sim._proc.pid)  # type: ignore[union-attr]
            t0 = time.monotonic()
            res = asyncio.run(
                run_probe(
                    ProbeRequest(
                        url=sim.base_url,
                        concurrency=c,
                        requests=n,
                        input_tokens=64,
                        output_tokens=64,
                        db=args.db,
                        metrics_interval_s=0,
                    )
                )
            )
            _ = time.monotonic() - t0
            cpu = _cpu_s(sim._proc.pid) - cpu0  # type: ignore[union-attr]
            log = sim.send_log
        entries = [e for e in log.values() if e.chunks and e.completion_tokens >= 32]
        ttft = [(e.chunks[0][0] - e.arrival_s) * 1000 for e in entries]
        gaps = [
            (b[0] - a[0]) * 1000
            for e in entries
            for a, b in zip(e.chunks[1:], e.chunks[2:], strict=False)
        ]
        chunks = sum(len(e.chunks) for e in log.values())
        s = res.summary
        print(
            f"| {c} | {_q(ttft, 0.5):.1f} / {_q(ttft, 0.99):.1f} | {_q(gaps, 0.5):.2f} / {statistics.mean(gaps):.2f} / "
            f"{_q(gaps, 0.99):.2f} | {10 + 0.1 * (c - 1):.1f} | {s.ttft_ms.p50:.1f} | {s.itl_ms.p50:.2f} | "
            f"{s.output_token_throughput:.0f} | {cpu / max(chunks, 1) * 1e6:.0f} |"
        )


if __name__ == "__main__":
    main()
