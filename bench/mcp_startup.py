"""MCP start-up and call latency over stdio, against a bare SDK server with one trivial tool.

A stdio server is launched once per client session, so its start-up is
something users wait for. Prints medians of:

* cold start to the first tool result (spawn, handshake, first call, and the
  tools/list the SDK client sends to validate the result): inferwise with
  `estimate_memory_fit` vs a bare MCPServer with `ping`. inferwise is started
  twice per round: as a client normally starts it (its tool-listing and
  template caches under the user cache directory current), and with an empty
  cache directory (the first start after an install or an edit);
* `estimate_memory_fit` latency per call over an open stdio session, for the
  same request repeated and for a varied stream (models, GPUs, parallelism,
  context, KV dtype), interleaved call by call.

Targets (issue 6): cold-start ratio <= 1.2, fit p50 <= 5 ms.

    python bench/mcp_startup.py [--rounds 5] [--calls 50]

The servers inherit this process's environment (PYTHONPATH, INFERWISE_CACHE_DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

FIT_ARGS = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
VARIED_ARGS = [
    {"model": m, "gpu": g, **extra}
    for m, g, extra in zip(
        itertools.cycle(
            (
                "meta-llama/Llama-3.1-70B-Instruct",
                "Qwen/Qwen3-30B-A3B",
                "google/gemma-3-27b-it",
                "openai/gpt-oss-20b",
                "mistralai/Mistral-7B-Instruct-v0.3",
                "deepseek-ai/DeepSeek-V2-Lite-Chat",
                "meta-llama/Llama-3.1-8B-Instruct",
            )
        ),
        itertools.cycle(("h100-sxm-80gb", "a100-sxm-80gb", "l40s", "h200", "mi300x")),
        itertools.islice(
            itertools.cycle(
                (
                    {},
                    {"tensor_parallel_size": 2, "context_tokens": 8192, "concurrency": 32},
                    {"kv_cache_dtype": "fp8", "max_model_len": 32768},
                    {"engine_version": "0.10.0"},
                )
            ),
            140,
        ),
    )
]
"""Distinct requests in a row: 7 models x 5 GPUs x 4 settings, none repeated back to back."""

BARE_SERVER = textwrap.dedent(
    """
    from mcp.server import MCPServer
    server = MCPServer(name="bare")
    @server.tool()
    def ping(x: int = 1) -> int:
        return x
    server.run("stdio")
    """
)


async def _cold_start(command: list[str], tool: str, args: dict, env: dict | None = None) -> float:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=command[0], args=command[1:], env={**os.environ, **(env or {})}
    )
    t0 = time.perf_counter()
    async with Client(params, mode="legacy") as client:
        result = await client.call_tool(tool, args)
        elapsed = time.perf_counter() - t0
        if result.is_error:
            raise SystemExit(f"{tool} failed: {result.content[0].text}")
    return elapsed * 1000.0


async def _call_latency(calls: int) -> tuple[list[float], list[float]]:
    """(same request repeated, varied requests), interleaved call by call in one session."""
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "inferwise.server", "mcp"], env=dict(os.environ)
    )
    same, varied = [], []
    async with Client(params, mode="legacy") as client:
        await client.call_tool("estimate_memory_fit", FIT_ARGS)
        for i in range(calls):
            for args, out in ((FIT_ARGS, same), (VARIED_ARGS[i % len(VARIED_ARGS)], varied)):
                t0 = time.perf_counter()
                result = await client.call_tool("estimate_memory_fit", args)
                out.append((time.perf_counter() - t0) * 1000.0)
                assert not result.is_error, result.content[0].text
    return same, varied


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    ns = parser.parse_args()
    ours = [sys.executable, "-m", "inferwise.server", "mcp"]
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_server.py"
        bare.write_text(BARE_SERVER)
        bare_ms, ours_ms, empty_ms = [], [], []
        for i in range(ns.rounds):  # interleaved, so machine noise hits all alike
            bare_ms.append(await _cold_start([sys.executable, str(bare)], "ping", {"x": 1}))
            ours_ms.append(await _cold_start(ours, "estimate_memory_fit", FIT_ARGS))
            empty = {"INFERWISE_CACHE_DIR": str(Path(tmp) / f"cache-{i}")}
            empty_ms.append(await _cold_start(ours, "estimate_memory_fit", FIT_ARGS, env=empty))
    same, varied = await _call_latency(ns.calls)
    b, o, e = (statistics.median(x) for x in (bare_ms, ours_ms, empty_ms))
    print(
        f"cold start to first result, median of {ns.rounds}: bare SDK {b:.0f} ms, inferwise {o:.0f} ms, ratio {o / b:.2f} (target <= 1.2)"
    )
    print(
        f"  with an empty cache directory (first start after install or edit): {e:.0f} ms, ratio {e / b:.2f}"
    )
    for name, ms in (("same request", same), ("varied requests", varied)):
        print(
            f"estimate_memory_fit over stdio, {name}, {ns.calls} calls: p50 {statistics.median(ms):.2f} ms, "
            f"p90 {statistics.quantiles(ms, n=10)[-1]:.2f} ms (target p50 <= 5 ms)"
        )


if __name__ == "__main__":
    asyncio.run(main())
