"""Load behaviour of a real engine, as the probe, the run store, compare and diagnosis see it.

One sweep over concurrency 1, 2, 4, 8 against a server with 4 slots feeds
every test here: latencies as slots fill and once requests queue, the
``llamacpp:*`` series stored with each run, ``inferwise runs compare`` between
the points, and ``inferwise diagnose --run`` on the saturated point.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inferwise.probes.llamacpp import LlamaServer

pytestmark = pytest.mark.engine

SWEEP = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def sweep(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from inferwise.probes.runner import ProbeRequest, run_probe

    db = tmp_path_factory.mktemp("engine-sweep") / "runs.db"
    req = ProbeRequest(
        url=llama_server.base_url,
        db=str(db),
        sweep=list(SWEEP),
        requests=12,
        input_tokens=48,
        output_tokens=32,
        metrics_interval_s=0.1,
        label={"engine": "llama.cpp", "slots": str(llama_server.n_parallel)},
    )
    result = asyncio.run(run_probe(req))
    points = {p.concurrency: p for p in result.sweep}
    assert sorted(points) == list(SWEEP)
    return {"db": db, "result": result, "points": points, "slots": llama_server.n_parallel}


def _p50(point: Any, metric: str) -> float:
    value = getattr(point.summary, metric).p50
    assert value is not None, metric
    return float(value)


def test_every_point_completes_with_exact_lengths(sweep: dict[str, Any]) -> None:
    for c, point in sweep["points"].items():
        assert point.status == "complete", c
        assert point.summary.completed == 12 and point.summary.failed == 0, c
        assert point.summary.total_output_tokens == 12 * 32, c


def test_itl_rises_and_per_request_speed_falls_as_slots_fill(sweep: dict[str, Any]) -> None:
    """Continuous batching: more sequences per decode step, longer steps for each of them."""
    p = sweep["points"]
    # mean ITL (total decode time / decode steps) and the median request's TPOT: both
    # robust to a client that, on a busy machine, reads a few chunks at once
    itl = {c: p[c].summary.itl_ms.mean for c in SWEEP}
    # per-request generation speed: tokens per second one user sees, 1000 / TPOT
    speed = {c: 1000.0 / _p50(p[c], "tpot_ms") for c in SWEEP}
    # a shared step is slower than one sequence alone, at 2 slots and at 4; 2 and 4 are not
    # ordered: llama.cpp's CPU matrix kernels make a two-sequence step cost about what a
    # four-sequence one does (ITL 15-24 ms at 2, 14-23 ms at 4 seen, see test_engine_calibrate;
    # 13.8 at 2 vs 12.1 at 4 in one CI run), so requiring 4 >= 2 tested noise, not batching
    assert itl[2] > 1.15 * itl[1], itl
    assert itl[4] > 1.3 * itl[1], itl
    # per-request speed falls once slots are shared; between 2 and 4 slots on two cores the
    # step grows by less than the noise (58 vs 48 tokens/s seen inverted), so only the
    # fall from one slot is required of both
    assert speed[2] < speed[1] and speed[4] < speed[1], speed
    # beyond the slot count the batch cannot grow: ITL stays near the 4-slot value
    assert itl[8] < 1.5 * itl[4], itl


def test_ttft_rises_once_requests_queue_beyond_the_slots(sweep: dict[str, Any]) -> None:
    p = sweep["points"]
    ttft = {c: _p50(p[c], "ttft_ms") for c in SWEEP}
    decode4 = _p50(p[4], "e2e_ms") - ttft[4]
    # up to 4 streams every request has a slot: TTFT grows only by sharing prefill batches.
    # With 8 streams on 4 slots a typical request first waits for a running one to finish,
    # i.e. for a good part of a decode phase.
    assert ttft[8] > 1.5 * ttft[4], ttft
    assert ttft[8] - ttft[4] > 0.5 * decode4, (ttft, decode4)


def test_server_metrics_are_scraped_and_stored_with_each_run(sweep: dict[str, Any]) -> None:
    from inferwise.probes.store import RunStore

    slots = sweep["slots"]
    with RunStore(sweep["db"]) as store:
        full = sweep["points"][8].run_id
        running = [m.value for m in store.metric_samples(full, "llamacpp:requests_processing")]
        waiting = [m.value for m in store.metric_samples(full, "llamacpp:requests_deferred")]
        predicted = [m.value for m in store.metric_samples(full, "llamacpp:tokens_predicted_total")]
        single = sweep["points"][1].run_id
        running_1 = [m.value for m in store.metric_samples(single, "llamacpp:requests_processing")]
    assert len(running) >= 3, "too few scrapes during the concurrency-8 run"
    assert max(running) == slots  # every slot busy
    assert max(waiting) >= 1  # and requests waiting behind them
    assert predicted == sorted(predicted) and predicted[-1] > predicted[0]  # a counter moving
    assert running_1 and max(running_1) <= 1
    normalised = sweep["result"].server_metrics
    assert {"requests_running", "requests_waiting"} <= set(normalised)


def test_runs_compare_reports_the_queueing_point_as_worse(sweep: dict[str, Any]) -> None:
    """Through the real CLI: ``inferwise runs compare BASELINE CANDIDATE --json``."""
    base, cand = sweep["points"][1].run_id, sweep["points"][8].run_id
    proc = subprocess.run(
        [sys.executable, "-m", "inferwise.server.cli", "runs", "compare", base, cand,
         "--db", str(sweep["db"]), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["baseline_id"] == base
    (candidate,) = out["candidates"]
    assert candidate["run_id"] == cand
    assert "concurrency" in candidate["load_changes"]
    verdicts = {(m["metric"], m["statistic"]): m for m in candidate["metrics"]}
    for key in (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("e2e_ms", "p50")):
        assert verdicts[key]["verdict"] == "worse", verdicts[key]
        assert verdicts[key]["candidate"] > verdicts[key]["baseline"]


def test_diagnosis_of_the_saturated_run_names_queueing(sweep: dict[str, Any]) -> None:
    """Requests waiting while every slot is busy is queueing / saturation, by the engine's own metrics."""
    diagnosis = pytest.importorskip("inferwise.knowledge.diagnosis")
    result = diagnosis.diagnose(
        diagnosis.DiagnoseRequest(run=sweep["points"][8].run_id, db=str(sweep["db"]))
    )
    top = [h.id for h in result.hypotheses[:3]]
    assert {"queueing", "saturation"} & set(top), top
    facts = {f.name: f.value for f in result.facts}
    # the evidence is the engine's own gauges, scraped during the run
    assert facts.get("run.metric.requests_waiting_max", 0) >= 1, facts
    assert facts.get("run.metric.requests_running_max") == sweep["slots"], facts


def test_runs_are_labelled_with_the_sweep_point(sweep: dict[str, Any], tmp_path: Path) -> None:
    from inferwise.probes.store import RunStore

    with RunStore(sweep["db"]) as store:
        for c, point in sweep["points"].items():
            run = store.get_run(point.run_id)
            assert run.labels.get("sweep_value") == str(c)
            assert run.labels.get("engine") == "llama.cpp"
