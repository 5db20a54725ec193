"""How llama.cpp's decode step grows with the batch on this machine's CPU: figures.

Issue 14 asks for a calibration on concurrency 1 and 2 that predicts 4 and 8; this prints the
measurement that shows why a step time linear in the batch cannot pass through both, and so
why the calibration fits a single sequence's step as a factor of its own
(``single_seq_step_factor``, tests/engine/test_engine_calibrate.py). For each batch size b it sends b requests at once to a
llama-server with 8 slots (one thread, the generated test model) and reads the server's own
``timings.predicted_per_token_ms``: with all b sequences decoding together from the first to
the last token, that is the duration of one decode step of b sequences, free of prefill
stalls and client effects. Every size is measured twice (up and down the list), so a change
of the machine's speed shows as two disagreeing rows.

On the development machine (2 cores, 2026-12-04, f16, both passes within 7 %) a step took
4.6 ms at b = 1, 7.8 at 2, 8.5 at 3, 10.4 at 4, 11.9 at 6 and 14.1 at 8: from 2 on about
5.7 + 1.05 b ms, with b = 1 2.1 ms below that line (earlier runs: 5.3-6.7 at 1, 8.7-9.7 at 2,
11.5-15.4 at 4, 17.3 at 8). A step model linear in the batch fitted on b = 1 and 2 draws the
1 -> 2 jump as a per-sequence cost of 3.2 ms and over-predicts b = 4 by 36 % and b = 8 by
91 %; with b = 1 a factor of its own, the line from 2 on carries.

    python -m bench.llamacpp_step_shape [--dtype f16|f32] [--output-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import httpx

from inferwise.probes.llamacpp import LlamaServer, ensure_llama_server, write_test_model
from tests.engine.conftest import MODEL_SEED

BATCHES = (1, 2, 3, 4, 6, 8)
PROMPT = "hello world " * 12


async def step_ms(url: str, batch: int, output_tokens: int) -> float:
    """The median over the batch of the server's ms per generated token, all sent at once."""
    async with httpx.AsyncClient(timeout=120) as client:

        async def one() -> float:
            body = {"prompt": PROMPT, "n_predict": output_tokens, "cache_prompt": False}
            reply = await client.post(f"{url}/completion", json=body)
            reply.raise_for_status()
            return float(reply.json()["timings"]["predicted_per_token_ms"])

        return statistics.median(await asyncio.gather(*(one() for _ in range(batch))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_test_model(Path(tmp) / "m.gguf", seed=MODEL_SEED, dtype=args.dtype)
        with LlamaServer(
            model_path=model.path, binary=ensure_llama_server(), n_parallel=max(BATCHES),
            log_path=Path(tmp) / "llama-server.log",
        ) as server:  # fmt: skip
            asyncio.run(step_ms(server.base_url, 1, 8))  # warm-up
            rows: dict[int, list[float]] = {}
            for b in (*BATCHES, *reversed(BATCHES)):
                rows.setdefault(b, []).append(
                    asyncio.run(step_ms(server.base_url, b, args.output_tokens))
                )
    print(f"{'batch':>5} {'step ms (up, down)':>20} {'per sequence':>13}")
    for b, (up, down) in rows.items():
        print(f"{b:5d} {up:9.2f} {down:9.2f} {(up + down) / 2 / b:13.2f}")
    one, two = (sum(rows[b]) / 2 for b in (1, 2))
    for b in (4, 8):
        linear = one + (two - one) * (b - 1)
        measured = sum(rows[b]) / 2
        print(f"linear from b = 1, 2 at b = {b}: {linear:.2f} ms ({linear / measured - 1:+.0%})")


if __name__ == "__main__":
    main()
