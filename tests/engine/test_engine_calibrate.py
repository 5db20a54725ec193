"""Calibration against the real engine: llama.cpp on this machine's CPU as custom hardware.

Probe at concurrency 1 (one request alone) and 4 (the four slots full), calibrate on those
runs with the CPU described by --gpu-memory-gib / --memory-bandwidth-gbps / --tflops
(deliberately rough figures: calibration is what turns them into this machine's), then
predict concurrency 6 and 8 (beyond the four slots: requests queue) for exactly those runs'
loads and lengths.

Stated tolerance: +-20 % of the probes for the TTFT mean and the output throughput at 6
and 8, and the ITL mean at 8: what the queue beyond the slots does to a user. The published
factors, which know nothing of a one-thread CPU engine, miss them by 30-50 %, 90-140 % and
about 35 %. ``python -m bench.calibrate_engine`` prints the same figures and those not
asserted, with why (three sweeps on 2026-12-04, 2 cores: TTFT -11..+10 %, throughput
-0.1..+3.8 %, ITL at 8 -8..-1 %):

- ITL at 6: predicted 10-12 % low (12-23 % in earlier sessions, before the per-sequence cost
  was fitted from the loads). The simulator admits the queued requests of a wave together
  when slots free up, llama.cpp as each one arrives, so its batch's decode is stalled by
  more, smaller prefills. A bias of the simulator, stated, not hidden by a wider tolerance.
- concurrency 2: llama.cpp's CPU matrix kernels make a two-sequence step cost about what a
  four-sequence one does (measured ITL 15-24 ms at 2, 14-23 ms at 4, 9-11 ms at 1, on CI's
  and this machine), which no step model linear in the batch represents; a calibration on
  1 and 2 therefore put the per-sequence cost at 7 ms and over-predicted ITL at 4 and 8 by
  35-110 % (why the calibration uses 1 and 4). Calibrated on 1 and 4, ITL at 2 is 26-37 %
  low and throughput 24-38 % high. ``python -m bench.llamacpp_step_shape`` measures the
  step itself (all sequences of a batch decoding together, the server's own timings): from
  2 on it is linear in the batch, with a single sequence about 2 ms below that line.
- the TTFT median at 6 falls between the admitted and the queued group (15-33 % low).
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
FIT_LOADS = (1, 4)
"""One request alone and the four slots full: the two ends of the batch the engine runs."""
ASSERTED = {
    6: ("ttft_ms", "output_tokens_per_s"),
    8: ("ttft_ms", "itl_ms", "output_tokens_per_s"),
}
"""Per predicted load, the metrics held to the tolerance (the rest is printed, see the
module docstring)."""
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


Sweep = dict[int, list[str]]
"""Run ids per concurrency, in the order measured."""

LOADS = (1, 4, 6, 8)
PALINDROME = (*LOADS, *reversed(LOADS))
"""Every load measured twice, on the way up and on the way down: a machine whose speed
changed during the sweep shows as two runs of one load that disagree."""


def calibrate_and_predict(
    db: Path, folder: Path, slots: int, runs: Sweep, fit_loads: tuple[int, ...] = FIT_LOADS
) -> dict[int, dict[str, tuple[float, float, float]]]:
    """Calibrate on every run at the fit loads; per other load, metric ->
    (measured, calibrated, published), each the mean over that load's runs, predicted for
    exactly those runs' loads and lengths (metrics: the fitted means, and the TTFT median)."""
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
    argv = [
        "calibrate",
        "--name",
        "cpu",
        *flags,
        "--db",
        str(db),
        "--run",
        *[r for c in fit_loads for r in runs[c]],
    ]
    assert main([*argv, "--json"]) == 0
    with RunStore(db) as store:
        cal = get_calibration(store, "cpu")
        points = {
            c: [point_from_run(store, r) for r in ids]
            for c, ids in runs.items()
            if c not in fit_loads
        }
    dep = Deployment(**cal.deployment)
    published = StepModel.from_deployment(dep)
    calibrated = StepModel.from_deployment(
        dep, calibrated_efficiency(published.efficiency, cal.factors)
    )
    out: dict[int, dict[str, tuple[float, float, float]]] = {}
    for c, pts in points.items():
        rows = []
        for p in pts:
            overhead = cal.factors.request_overhead_ms
            cal_v = simulate_point(calibrated, p, overhead)
            pub_v = simulate_point(published, p, 0.0)
            row = {k: (m, cal_v[k], pub_v[k]) for k, m in measured_values(p).items()}
            row["ttft_ms_p50"] = (
                float(p.ttft_ms_p50 or 0.0),
                ttft_median(calibrated, p) + overhead,
                ttft_median(published, p),
            )
            rows.append(row)
        out[c] = {
            k: tuple(sum(r[k][i] for r in rows) / len(rows) for i in range(3)) for k in rows[0]
        }
    return out


def ttft_median(model: Any, point: Any) -> float:
    """The simulated TTFT median of a point's load and lengths (as simulate_point runs it)."""
    from inferwise.calculators.batching_sim import load_stats, simulate
    from inferwise.calculators.calibration import metric_value
    from inferwise.calculators.user_calibration import point_lengths

    inp, out = point_lengths(point)
    stats = load_stats(simulate(model, inp, out, concurrency=point.concurrency))
    return metric_value(stats, "ttft_ms.p50")


def probe_sweep(server: LlamaServer, db: Path, sweep: tuple[int, ...]) -> Sweep:
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
    runs: Sweep = {}
    for p in result.sweep:
        runs.setdefault(p.concurrency, []).append(p.run_id)
    return runs


STABLE_WITHIN = 0.20
"""A sweep counts when the two runs of every load agree within 20 % (the tolerance; their
mean, which is compared, then moved by at most half of it) on the TTFT mean and the ITL
median: otherwise the machine's speed changed during the sweep (another process took the
core; a 2-core CI run once moved one load's ITL by 70 %). Not the TTFT median, which
falls in either of two groups (the request prefilled alone or those after it; the admitted
or the queued), nor the ITL mean, which a quiet machine moves by up to 12 % between two runs
(a slot hand-off stall more or less)."""


def drift(db: Path, runs: Sweep) -> float:
    """The largest disagreement between the two runs of one load (TTFT mean, ITL median)."""
    from inferwise.probes.store import RunStore

    worst = 0.0
    with RunStore(db) as store:
        for first, second in runs.values():
            a, b = store.get_run(first).summary, store.get_run(second).summary
            for x, y in ((a.ttft_ms.mean, b.ttft_ms.mean), (a.itl_ms.p50, b.itl_ms.p50)):
                worst = max(worst, abs(x / y - 1))
    return worst


@pytest.fixture(scope="module")
def calibrated(
    llama_server: LlamaServer, engine_model: GeneratedModel, tmp_path_factory: Any
) -> dict[int, Any]:
    """Probe, calibrate, predict, on a sweep during which the machine kept its speed (up to
    three tries). On a shared 2-core machine another process can take the core for seconds,
    which moves one load point against the others by more than the tolerance (seen: 40 %
    and 70 %); such a sweep says nothing about the calibration and is measured again. The
    tolerance is the same for every sweep; with no steady sweep the test skips and says so."""
    root = tmp_path_factory.mktemp("engine-calibrate")
    folder = model_folder(engine_model, root, llama_server.alias)
    seen: list[float] = []
    for attempt in range(3):
        db = root / f"runs-{attempt}.db"
        runs = probe_sweep(llama_server, db, PALINDROME)
        seen.append(drift(db, runs))
        print(f"sweep {attempt + 1}: the two runs of a load differ by up to {seen[-1]:.1%}")
        if seen[-1] <= STABLE_WITHIN:
            return calibrate_and_predict(db, folder, llama_server.n_parallel, runs)
    pytest.skip(
        "the machine's speed changed during every sweep (the two runs of one load differed by "
        + ", ".join(f"{100 * d:.0f} %" for d in seen)
        + "): too busy to test a 20 % tolerance"
    )


@pytest.mark.parametrize("concurrency", sorted(ASSERTED))
def test_calibrated_within_the_slots_predicts_the_queue_beyond(
    calibrated: dict[int, Any], concurrency: int
) -> None:
    for metric in ASSERTED[concurrency]:
        measured, cal, _ = calibrated[concurrency][metric]
        assert abs(cal / measured - 1) <= TOLERANCE, (concurrency, metric, measured, cal)


def test_calibration_beats_the_published_factors(calibrated: dict[int, Any]) -> None:
    rows = [calibrated[c][k] for c, metrics in ASSERTED.items() for k in metrics]
    cal_err = [abs(math.log(c / m)) for m, c, _ in rows]
    pub_err = [abs(math.log(p / m)) for m, _, p in rows]
    assert sum(cal_err) < sum(pub_err)
