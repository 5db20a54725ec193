"""Diagnosis of stored probe runs: slots are "full" only against a known limit, and momentary
waiting between engine steps is not a queue.

The scraped series are written straight into a run store, shaped like what `inferwise probe`
stores against the simulator (a closed-loop probe at concurrency 32 against an engine with
room to spare; the same probe against an engine limited to 8 running requests)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import store_run, streamed_records, vllm_gauges

from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose


def _store(
    db: Path,
    *,
    running: list[float],
    waiting: list[float],
    kv: float = 0.03,
    concurrency: int = 32,
    labels: dict[str, str] | None = None,
    ttft_s: float = 0.2,
    input_distribution: str = "fixed",
) -> str:
    records = streamed_records(
        40, spacing_s=0.05, ttft_s=ttft_s, tokens=64, itl_s=0.01, input_tokens=256
    )
    config = {
        "concurrency": concurrency,
        "request_rate": None,
        "input_tokens": 256,
        "output_tokens": 64,
        "input_distribution": input_distribution,
        "input_spread": 0.25 if input_distribution == "fixed" else 1.0,
        "url": "http://127.0.0.1:8011",
    }
    return store_run(
        db, records, config=config, labels=labels, samples=vllm_gauges(running, waiting, kv)
    )


def _run(db: Path, run_id: str, workload: str | None = None):
    return diagnose(DiagnoseRequest(run=run_id, db=str(db), workload=workload))


def test_probe_concurrency_is_not_the_engines_slot_limit(tmp_path):
    """The ramp-up scrape (14 waiting while 18 of 32 start) and a running count pinned at the
    probe's own concurrency say nothing about the engine's slots: no saturation lead, and a
    verdict that says nothing is saturated."""
    db = tmp_path / "runs.db"
    run_id = _store(db, running=[18, 32, 32, 32, 32, 32], waiting=[14, 0, 0, 0, 0, 0])
    r = _run(db, run_id)
    facts = {f.name: f.value for f in r.facts}
    assert "run.metric.slots_full" not in facts
    assert facts["run.metric.client_limited"] is True
    assert facts["observations.queue_depth"] == 0  # the median, not the ramp-up spike
    assert all(h.level == "low" for h in r.hypotheses)
    assert not {"saturation", "queueing"} & {h.id for h in r.hypotheses}
    assert r.summary.startswith("No bottleneck")
    assert "no standing queue" in r.summary and "probe's own concurrency (32)" in r.summary
    assert "--sweep 32,64,128,256" in r.summary


def test_a_plateau_below_the_probe_load_with_a_standing_queue_is_full_slots(tmp_path):
    """Engine capped at 8 running while the probe offers 32: the plateau is the limit."""
    db = tmp_path / "runs.db"
    run_id = _store(db, running=[8] * 8, waiting=[24] * 8, ttft_s=3.0)
    r = _run(db, run_id)
    facts = {f.name: f.value for f in r.facts}
    assert facts["run.metric.slots_full"] is True and facts["run.metric.slot_limit"] == 8
    top3 = [h.id for h in r.hypotheses[:3]]
    assert top3[0] == "queueing" and {"saturation", "batch_policy"} <= set(top3)
    assert any("limit of 8 (plateau" in e for e in r.hypotheses[0].evidence)
    # proof commands go to the run's endpoint at the rate the closed-loop run carried
    steps = " ".join(s for h in r.hypotheses for s in h.how_to_prove)
    assert "inferwise probe http://127.0.0.1:8011 --request-rate " in steps
    assert not re.search(r"\b(URL|RATE|OVERLOAD_RATE|RATE_SWEEP|P50_PROMPT)\b", steps), steps


def test_a_stated_limit_decides_full_slots(tmp_path):
    """With max_num_seqs stated, running at the limit with a standing queue is full; running
    far below it is not, whatever the probe's concurrency."""
    db = tmp_path / "runs.db"
    full = _store(db, running=[4] * 6, waiting=[4] * 6, concurrency=8, labels={"slots": "4"})
    facts = {f.name: f.value for f in _run(db, full).facts}
    assert facts["run.metric.slots_full"] is True
    assert facts["run.metric.slot_limit_basis"] == "run label slots=4"

    room = _store(db, running=[32] * 6, waiting=[0, 3, 0, 0, 0, 0])
    r = _run(db, room, workload='{"deployment": {"max_num_seqs": 1024}}')
    facts = {f.name: f.value for f in r.facts}
    assert facts["run.metric.slots_full"] is False
    assert "saturation" not in [h.id for h in r.hypotheses]
    assert "below the engine's limit" not in r.summary  # the client capped it, said first
    assert "probe's own concurrency" in r.summary


def test_sustained_waiting_without_a_known_limit_is_a_lead_not_a_verdict(tmp_path):
    """Open-loop style: requests keep waiting but no limit is known: queueing is suspected, and
    the evidence asks for the limit instead of calling the slots full."""
    db = tmp_path / "runs.db"
    run_id = _store(
        db, running=[20, 26, 31, 28, 30, 27], waiting=[3, 5, 2, 6, 4, 5], concurrency=64
    )
    r = _run(db, run_id)
    facts = {f.name: f.value for f in r.facts}
    assert "run.metric.slots_full" not in facts
    lead = next(h for h in r.hypotheses if h.id == "queueing")
    assert any("slot limit is not known" in e for e in lead.evidence)


def test_a_plan_from_a_healthy_run_reproduces_and_then_raises_its_load(tmp_path):
    """Plan on the run alone: probe commands go to the run's endpoint at the run's own load
    (the probe's concurrency, not the mean running count), the sweep raises it, and the
    lengths are labelled as probe settings rather than the workload's."""
    from inferwise.knowledge.planning import PlanRequest, plan_experiments

    db = tmp_path / "runs.db"
    run_id = _store(db, running=[18, 32, 32, 32, 32, 32], waiting=[14, 0, 0, 0, 0, 0])
    p = plan_experiments(PlanRequest(run=run_id, db=str(db)))
    assert p.leading_hypothesis is None
    base = p.stages[0].measure[0]
    assert base.startswith("inferwise probe http://127.0.0.1:8011 --concurrency 32 ")
    sweep = next(s for s in p.stages if s.title == "Load sweep to find the knee")
    assert "--sweep 32,64,128,256" in sweep.measure[0]
    assert any("stored run's probe settings" in x for x in p.assumptions)
    assert p.summary.startswith("No bottleneck")  # the same verdict as `inferwise diagnose`


def test_slot_count_reported_by_the_server_counts_as_the_limit() -> None:
    """llama.cpp reports its slots (/props total_slots); the probe stores them in the run's meta."""
    from inferwise.knowledge.evidence import LoadedRun, _slot_limit
    from inferwise.probes.summary import ProbeSummary

    class _A:
        def value(self, path):
            return None

    def run(meta: dict, labels: dict) -> LoadedRun:
        return LoadedRun("r", "complete", ProbeSummary(), {}, labels, meta, {})

    cap, basis = _slot_limit(_A(), run({"server": {"engine": "llama.cpp", "max_num_seqs": 4}}, {}))
    assert cap == 4 and "llama.cpp" in basis
    cap, _ = _slot_limit(_A(), run({}, {"slots": "8"}))
    assert cap == 8


def test_closed_loop_beyond_the_known_slots_is_queueing_even_when_scrapes_miss_the_queue(
    tmp_path: Path,
) -> None:
    """8 clients against 4 slots: 4 wait at every moment. A short run's scrapes may see the queue
    only now and then (median 0); the structural queue must still lead, not a 'no backlog' verdict."""
    db = tmp_path / "runs.db"
    run_id = _store(
        db,
        running=[4.0] * 10,
        waiting=[4, 0, 0, 0, 0, 0, 3, 0, 0, 0],
        concurrency=8,
        labels={"slots": "4"},
        ttft_s=0.6,
    )
    result = diagnose(DiagnoseRequest(run=run_id, db=str(db)))
    assert result.hypotheses and result.hypotheses[0].id == "queueing", result.summary
    assert any("wait for a slot at any moment" in e for e in result.hypotheses[0].evidence)


def test_gpu_util_low_symptom_without_a_figure_leaves_no_placeholder() -> None:
    import json

    for cpu in (0.0, 0.95):
        workload = {"symptoms": ["gpu_util_low"], "observations": {"cpu_util": cpu}}
        result = diagnose(DiagnoseRequest(workload=json.dumps(workload)))
        text = " ".join(e for h in result.hypotheses for e in h.evidence)
        assert "reported low (symptom, no figure given)" in text
        assert "(?)" not in text and " ? " not in text


def test_a_few_very_slow_first_tokens_without_a_queue_point_at_warm_up(tmp_path):
    """Four of 40 requests at 3 s against 0.2 s for the rest lift the TTFT mean to about 2x
    its median: with one prompt length and no standing queue that is the warm-up lead
    (kernels compiled for new shapes), its ratio in the evidence. Not raised without the slow
    four, nor when prompt lengths vary widely (TTFT then follows the prompt), nor with a
    standing queue (the queue explains the tail)."""
    db = tmp_path / "runs.db"
    flat, quiet = [8, 8, 8, 8, 8, 8], [0, 0, 0, 0, 0, 0]

    def slow_four(i: int) -> float:
        return 3.0 if i in (1, 5, 9, 13) else 0.2

    def lead(run_id: str) -> bool:
        found = [e for h in _run(db, run_id).hypotheses for e in h.evidence]
        return any("x its median with no standing queue" in e for e in found)

    assert lead(_store(db, running=flat, waiting=quiet, ttft_s=slow_four))
    assert not lead(_store(db, running=flat, waiting=quiet))
    assert not lead(
        _store(db, running=flat, waiting=quiet, ttft_s=slow_four, input_distribution="lognormal")
    )
    queued = [6, 6, 6, 6, 6, 6]
    assert not lead(_store(db, running=flat, waiting=queued, ttft_s=slow_four))
