"""`inferwise demo` is the embedded default a new user runs first: it must work end to end."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_runs_fit_predict_probe_plan_against_the_simulated_engine(tmp_path) -> None:
    env = {**os.environ, "INFERWISE_DB": str(tmp_path / "runs.db")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwise.server",
            "demo",
            "--requests",
            "8",
            "--concurrency",
            "4",
            "--input-tokens",
            "256",
            "--output-tokens",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for heading in ("## 1. fit", "## 2. predict", "## 3. probe", "## 4. plan"):
        assert heading in out
    assert "KV" in out and "TTFT" in out
    # the probe's run is stored and the plan refers to its measurements
    listing = subprocess.run(
        [sys.executable, "-m", "inferwise.server", "runs", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert listing.returncode == 0 and '"demo"' in listing.stdout
    assert "Traceback" not in proc.stderr
