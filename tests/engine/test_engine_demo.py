"""`inferwise demo --target llama.cpp` measures the real engine when its binary is cached."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.engine
def test_demo_probes_the_real_engine(engine_binary, tmp_path) -> None:
    env = {
        **os.environ,
        "INFERWISE_DB": str(tmp_path / "runs.db"),
        "INFERWISE_LLAMA_SERVER": str(engine_binary),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwise.server",
            "demo",
            "--target",
            "llama.cpp",
            "--requests",
            "4",
            "--concurrency",
            "2",
            "--input-tokens",
            "48",
            "--output-tokens",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "measured against the llama.cpp engine" in proc.stdout
    assert "4 completed, 0 failed" in proc.stdout


def test_demo_without_the_binary_is_a_clear_input_error(tmp_path) -> None:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "empty-cache"),
        "INFERWISE_DB": str(tmp_path / "r.db"),
    }
    env.pop("INFERWISE_LLAMA_SERVER", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwise.server",
            "demo",
            "--target",
            "llama.cpp",
            "--requests",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 2
    assert "prepare-engine" in proc.stderr and "Traceback" not in proc.stderr
