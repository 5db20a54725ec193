"""MCP start-up and call latency over stdio, against a bare SDK server with one trivial tool.

A stdio server is launched once per client session, so its start-up is
something users wait for. Prints medians of:

* cold start to the first tool result (spawn, handshake, first call):
  inferwise with `estimate_memory_fit` vs a bare MCPServer with `ping`;
* `estimate_memory_fit` latency per call over an open stdio session.

Targets (issue 6): cold-start ratio <= 1.2, fit p50 <= 5 ms.

    python bench/mcp_startup.py [--rounds 5] [--calls 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

FIT_ARGS = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}

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


async def _cold_start(command: list[str], tool: str, args: dict) -> float:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=command[0], args=command[1:])
    t0 = time.perf_counter()
    async with Client(params, mode="legacy") as client:
        result = await client.call_tool(tool, args)
        elapsed = time.perf_counter() - t0
        if result.is_error:
            raise SystemExit(f"{tool} failed: {result.content[0].text}")
    return elapsed * 1000.0


async def _call_latency(calls: int) -> list[float]:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "inferwise.server", "mcp"])
    out = []
    async with Client(params, mode="legacy") as client:
        await client.call_tool("estimate_memory_fit", FIT_ARGS)
        for _ in range(calls):
            t0 = time.perf_counter()
            result = await client.call_tool("estimate_memory_fit", FIT_ARGS)
            out.append((time.perf_counter() - t0) * 1000.0)
            assert not result.is_error
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_server.py"
        bare.write_text(BARE_SERVER)
        bare_ms, ours_ms = [], []
        for _ in range(ns.rounds):  # interleaved, so machine noise hits both alike
            bare_ms.append(await _cold_start([sys.executable, str(bare)], "ping", {"x": 1}))
            ours_ms.append(await _cold_start([sys.executable, "-m", "inferwise.server", "mcp"], "estimate_memory_fit", FIT_ARGS))
    calls = await _call_latency(ns.calls)
    b, o = statistics.median(bare_ms), statistics.median(ours_ms)
    print(f"cold start to first result, median of {ns.rounds}: bare SDK {b:.0f} ms, inferwise {o:.0f} ms, ratio {o / b:.2f} (target <= 1.2)")
    print(f"estimate_memory_fit over stdio, {ns.calls} calls: p50 {statistics.median(calls):.2f} ms, "
          f"p90 {statistics.quantiles(calls, n=10)[-1]:.2f} ms (target p50 <= 5 ms)")


if __name__ == "__main__":
    asyncio.run(main())
