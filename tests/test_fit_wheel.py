"""The installed wheel runs `inferwise fit` from outside the checkout.

Builds a real wheel (pip, build isolation: the build backend comes from the
package registry; the test skips when the registry is out of reach), installs
it without dependencies into a fresh venv, borrows the runtime dependencies
from the development venv through PYTHONPATH (which does not activate its
editable install), and runs the console script in an empty folder. Proves the
catalogs and the fit template ship in the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_installed_wheel_runs_fit_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0:
        pytest.skip(
            f"could not build the wheel (registry out of reach?): {build.stderr.strip()[-300:]}"
        )
    wheel = next(wheels.glob("inferwise-*.whl"))

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    subprocess.run(
        [
            str(bindir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    work = tmp_path / "elsewhere"
    work.mkdir()

    where = subprocess.run(
        [str(bindir / "python"), "-c", "import inferwise.calculators.fit as f; print(f.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert str(env_dir) in where and str(ROOT) not in where

    res = subprocess.run(
        [
            str(bindir / "inferwise"),
            "fit",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--gpu",
            "h100",
            "--json",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["fits"] and d["kv_bytes_per_token"] == 131072

    md = subprocess.run(
        [str(bindir / "inferwise"), "fit", "--model", "openai/gpt-oss-20b", "--gpu", "l40s"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert md.returncode == 0, md.stderr
    assert "GPU KV cache size" in md.stdout

    bad = subprocess.run(
        [str(bindir / "inferwise"), "fit", "--model", "no/such-model", "--gpu", "h100"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
