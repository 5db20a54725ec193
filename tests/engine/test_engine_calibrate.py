"""Calibration against the real engine: llama.cpp on this machine's CPU as custom hardware.

Probe at concurrency 1 and 2, calibrate on those two runs with the CPU described by
--gpu-memory-gib / --memory-bandwidth-gbps / --tflops (deliberately rough figures:
calibration is what turns them into this machine's), then predict concurrency 4 and 8
(beyond the four slots: requests queue) for exactly those runs' loads and lengths.

Stated tolerance: TTFT, ITL and output throughput within +-20 % of the probes at 4 and 8.
The published factors, which know nothing of a one-thread CPU engine, miss by far more.
bench/calibrate_accuracy.py --engine prints the same figures.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from inferwise.probes.llamacpp import GeneratedModel, LlamaServer

pytestmark = pytest.mark.engine

TOLERANCE = 0.20
CPU = ["--gpu-memory-gib", "8", "--memory-bandwidth-gbps", "50", "--tflops", "0.1"]


def model_folder(model: GeneratedModel, root: Path, name: str) -> Path:
    """A Hugging Face config.json of the generated GGUF, in a folder named as the server
    serves it (so the runs' model and --model agree)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.n_vocab,
        "hidden_size": model.n_embd,
        "intermediate_size": model.n_ff,
        "num_hidden_layers": model.n_layer,
        "num_attention_heads": model.n_head,
        "num_key_value_heads": model.n_head_kv,
        "max_position_embeddings": model.n_ctx_train,
        "torch_dtype": "float16",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def deployment_flags(folder: Path, slots: int) -> list[str]:
    return [
        "--model", str(folder), *CPU, "--max-num-seqs", str(slots),
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.5",
    ]  # fmt: skip


def calibrate_and_predict(
    db: Path, folder: Path, slots: int, runs: dict[int, str]
) -> dict[int, dict[str, tuple[float, float, float]]]:
    """Calibrate on concurrency 1 and 2; per other load, metric -> (measured, calibrated,
    published) for exactly that run's load and lengths."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import (
        calibrated_efficiency,
        measured_values,
        simulate_point,
    )
    from inferwise.probes.calibrations import get_calibration, point_from_run
    from inferwise.probes.store import RunStore
    from inferwise.server.cli import main

    flags = deployment_flags(folder, slots)
    argv = ["calibrate", "--name", "cpu", *flags, "--db", str(db), "--run", runs[1], runs[2]]
    assert main([*argv, "--json"]) == 0
    with RunStore(db) as store:
        cal = get_calibration(store, "cpu")
        points = {c: point_from_run(store, runs[c]) for c in runs if c > 2}
    dep = Deployment(**cal.deployment)
    published = StepModel.from_deployment(dep)
    calibrated = StepModel.from_deployment(
        dep, calibrated_efficiency(published.efficiency, cal.factors)
    )
    out: dict[int, dict[str, tuple[float, float, float]]] = {}
    for c, p in points.items():
        cal_v = simulate_point(calibrated, p, cal.factors.request_overhead_ms)
        pub_v = simulate_point(published, p, 0.0)
        out[c] = {k: (m, cal_v[k], pub_v[k]) for k, m in measured_values(p).items()}
    return out


def probe_sweep(server: LlamaServer, db: Path, sweep: tuple[int, ...]) -> dict[int, str]:
    from inferwise.probes.runner import ProbeRequest, run_probe

    req = ProbeRequest(
        url=server.base_url,
        db=str(db),
        sweep=list(sweep),
        requests=12,
        input_tokens=48,
        output_tokens=32,
        metrics_interval_s=0.5,
        label={"engine": "llama.cpp", "purpose": "calibration"},
    )
    result = asyncio.run(run_probe(req))
    return {p.concurrency: p.run_id for p in result.sweep}


STABLE_WITHIN = 0.10
"""A sweep counts when concurrency 1, measured again after it, agrees on ITL within 10 %, and
so do 8 and 4 (the same four busy slots): otherwise the machine's speed changed during the
sweep (another process took the core)."""


def speed_check(server: LlamaServer, db: Path) -> str:
    """One more concurrency-1 run after the sweep, to see whether the machine kept its speed."""
    from inferwise.probes.runner import ProbeRequest, run_probe

    req = ProbeRequest(
        url=server.base_url, db=str(db), concurrency=1, requests=12, input_tokens=48,
        output_tokens=32, label={"engine": "llama.cpp", "purpose": "speed-check"},
    )  # fmt: skip
    return asyncio.run(run_probe(req)).run_id


def itl_of(db: Path, run_id: str) -> float:
    from inferwise.probes.store import RunStore

    with RunStore(db) as store:
        return float(store.get_run(run_id).summary.itl_ms.mean)


@pytest.fixture(scope="module")
def calibrated(
    llama_server: LlamaServer, engine_model: GeneratedModel, tmp_path_factory: Any
) -> dict[int, Any]:
    """Probe, calibrate, predict, on a sweep during which the machine kept its speed (up to
    three tries). On a shared 2-core machine another process can take the core for seconds,
    which moves one load point against the others by more than the tolerance (seen: 40 %);
    such a sweep says nothing about the calibration and is measured again. The tolerance is
    the same for every sweep; with no steady sweep the test skips and says so."""
    root = tmp_path_factory.mktemp("engine-calibrate")
    folder = model_folder(engine_model, root, llama_server.alias)
    drift: list[float] = []
    for attempt in range(3):
        db = root / f"runs-{attempt}.db"
        runs = probe_sweep(llama_server, db, (1, 2, 4, 8))
        again = speed_check(llama_server, db)
        # two checks of the machine's speed: concurrency 1 before and after, and 8 against 4
        # (four slots: both decode four sequences a step, so their ITL is the same engine's)
        drift.append(
            max(
                abs(itl_of(db, again) / itl_of(db, runs[1]) - 1),
                abs(itl_of(db, runs[8]) / itl_of(db, runs[4]) - 1),
            )
        )
        if drift[-1] <= STABLE_WITHIN:
            return calibrate_and_predict(db, folder, llama_server.n_parallel, runs)
    pytest.skip(
        "the machine's speed changed during every sweep (ITL of the same engine batch moved by "
        + ", ".join(f"{100 * d:.0f} %" for d in drift)
        + "): too busy to test a 20 % tolerance"
    )


@pytest.mark.parametrize("concurrency", [4, 8])
def test_calibrated_on_two_loads_predicts_four_and_eight(
    calibrated: dict[int, Any], concurrency: int
) -> None:
    for metric, (measured, cal, _) in calibrated[concurrency].items():
        assert abs(cal / measured - 1) <= TOLERANCE, (concurrency, metric, measured, cal)


def test_calibration_beats_the_published_factors(calibrated: dict[int, Any]) -> None:
    cal_err = [abs(math.log(c / m)) for v in calibrated.values() for m, c, _ in v.values()]
    pub_err = [abs(math.log(p / m)) for v in calibrated.values() for m, _, p in v.values()]
    assert sum(cal_err) < sum(pub_err)
