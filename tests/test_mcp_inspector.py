"""The MCP Inspector CLI (the reference client) lists and calls our tools.

Optional: runs only where `npx` exists and can fetch the inspector from the npm
registry (set INFERWISE_SKIP_INSPECTOR=1 to skip it on purpose).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NPX = shutil.which("npx")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NPX is None, reason="npx not installed"),
    pytest.mark.skipif(
        bool(os.environ.get("INFERWISE_SKIP_INSPECTOR")), reason="INFERWISE_SKIP_INSPECTOR set"
    ),
]

SERVER = [str(Path(sys.executable).with_name("inferwise")), "mcp"]


def _inspector(*args: str, tmp_path: Path) -> dict:
    env = {**os.environ, "INFERWISE_DB": str(tmp_path / "runs.db")}
    try:
        proc = subprocess.run(
            [NPX, "-y", "@modelcontextprotocol/inspector", "--cli", *SERVER, *args],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("the inspector could not be fetched in time")
    if (
        proc.returncode != 0
        and "npm" in proc.stderr
        and ("ERR" in proc.stderr or "network" in proc.stderr)
    ):
        pytest.skip(f"npm could not fetch the inspector: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_inspector_lists_tools_and_calls_fit(tmp_path) -> None:
    listed = _inspector("--method", "tools/list", tmp_path=tmp_path)
    names = {t["name"] for t in listed["tools"]}
    assert {"estimate_memory_fit", "probe_endpoint", "plan_experiments"} <= names
    called = _inspector(
        "--method",
        "tools/call",
        "--tool-name",
        "estimate_memory_fit",
        "--tool-arg",
        "model=meta-llama/Llama-3.1-8B-Instruct",
        "--tool-arg",
        "gpu=h100",
        tmp_path=tmp_path,
    )
    assert called["structuredContent"]["kv_cache_tokens"] > 0
    assert "Memory fit" in called["content"][0]["text"]
