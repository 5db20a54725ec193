"""Diagnosis quality: expert-labelled scenarios, coverage of the seed table and vocabulary,
measurement combined with the calculators, and stored probe runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import failed_records, store_run, streamed_records, vllm_gauges

from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose
from inferwise.knowledge.rule_engine import load_rules, load_table
from inferwise.knowledge.vocabulary import HYPOTHESES, SYMPTOMS

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.json"))


def _diag(workload: dict, **kw) -> object:
    return diagnose(DiagnoseRequest(workload=json.dumps(workload), **kw))


def _ids(result) -> list[str]:
    return [h.id for h in result.hypotheses]


def test_at_least_fifteen_scenarios():
    assert len(SCENARIOS) >= 15


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_expert_hypothesis_is_in_the_top_three(path):
    sc = json.loads(path.read_text())
    result = _diag(sc["workload"])
    top3 = _ids(result)[:3]
    for expected in sc["expect_top3"]:
        assert expected in top3, f"{path.stem}: {sc['description']} -> {top3}"
    lead = result.hypotheses[0]
    assert lead.how_to_prove and lead.decisive_metric and lead.evidence
    assert 0 < lead.confidence <= 1


def test_scenarios_cover_every_hypothesis_id():
    expected = {e for p in SCENARIOS for e in json.loads(p.read_text())["expect_top3"]}
    assert expected == set(HYPOTHESES)


def test_every_hypothesis_has_a_rule_and_a_proof_recipe():
    guides = load_table("hypotheses.toml")
    positive = {h for r in load_rules() for h, w in r.weights.items() if w > 0}
    for hyp in HYPOTHESES:
        assert hyp in positive, f"no rule can raise {hyp}"
        g = guides[hyp]
        assert len(g["how_to_prove"]) >= 2 and g["decisive"] and g["needs"]
    assert set(guides) == set(HYPOTHESES)


def test_every_symptom_has_a_rule():
    used = {
        c.split(".", 1)[1].split()[0]
        for r in load_rules()
        for c in r.when
        if c.startswith("symptom.")
    }
    assert set(SYMPTOMS) <= used


@pytest.mark.parametrize(
    ("symptoms", "row"),
    [
        (
            ["ttft_high", "itl_normal"],
            {"queueing", "long_prompts", "prefill_compute", "cold_start", "preprocessing"},
        ),
        (
            ["itl_high", "ttft_normal"],
            {"decode_bandwidth", "batch_contention", "kv_cache_pressure", "kernel_efficiency"},
        ),
        (
            ["both_degrade_with_concurrency"],
            {"queueing", "memory_capacity", "batch_policy", "admission_control", "saturation"},
        ),
        (
            ["gpu_util_low", "latency_high"],
            {"cpu_tokenization", "data_transfer", "synchronization", "network", "scheduling"},
        ),
        (["throughput_up_tail_violates"], {"batch_policy", "admission_control", "workload_mixing"}),
    ],
)
def test_seed_symptom_table_rows_raise_their_listed_causes(symptoms, row):
    ids = set(_ids(_diag({"symptoms": symptoms}, limit=24)))
    assert row <= ids


def test_measurement_beats_a_contradicting_stated_symptom():
    wl = {
        "slo": {"itl_ms": {"p95": 50}},
        "observations": {"itl_ms": {"p50": 70, "p95": 120}},
        "symptoms": ["itl_normal"],
    }
    r = _diag(wl)
    assert {s.id for s in r.symptoms} >= {"itl_high"}
    assert "itl_normal" not in {s.id for s in r.symptoms}
    assert any("measured beats stated" in a for a in r.assumptions)


def test_counter_evidence_is_reported():
    wl = {"observations": {"kv_cache_usage": 0.3, "queue_depth": 0}, "symptoms": ["itl_high"]}
    r = _diag(wl)
    against = {c.hypothesis for c in r.counter_evidence}
    assert {"kv_cache_pressure", "queueing"} <= against
    assert "queueing" not in _ids(r)


def test_pcie_interconnect_from_the_catalog_makes_communication_likely():
    base = {
        "deployment": {"gpu": "l40s", "tensor_parallel_size": 4},
        "symptoms": ["itl_high"],
    }
    pcie = _diag(base)
    nvlink = _diag({**base, "deployment": {"gpu": "h100-sxm-80gb", "tensor_parallel_size": 4}})
    single = _diag({**base, "deployment": {"gpu": "l40s", "tensor_parallel_size": 1}})
    assert _ids(pcie)[0] == "communication"
    assert "pcie" in " ".join(pcie.hypotheses[0].evidence).lower()
    assert "communication" not in _ids(nvlink)[:1]
    assert "communication" not in _ids(single)


def test_fit_shortfall_points_at_memory_capacity():
    """Computed: 70B bf16 on 2x H100 holds far fewer than 120 requests of ~7k tokens."""
    wl = {
        "traffic": {
            "input_tokens": {"p50": 6000, "p95": 7000},
            "output_tokens": {"p50": 500, "p95": 1000},
        },
        "deployment": {
            "model": "meta-llama/Llama-3.3-70B-Instruct",
            "gpu": "h100-sxm-80gb",
            "tensor_parallel_size": 2,
        },
        "observations": {"concurrency": 120},
        "symptoms": ["both_degrade_with_concurrency"],
    }
    r = _diag(wl)
    facts = {f.name: f for f in r.facts}
    assert facts["fit.max_concurrency"].source == "computed"
    assert facts["fit.max_concurrency"].value < 120
    assert _ids(r)[0] == "memory_capacity"
    assert any("computed" in e for e in r.hypotheses[0].evidence)


def test_unknown_model_degrades_gracefully_and_says_so():
    wl = {
        "traffic": {"input_tokens": {"p50": 500}, "output_tokens": {"p50": 100}},
        "deployment": {"model": "acme/secret-model-13b", "gpu": "h100-sxm-80gb"},
        "observations": {"queue_depth": 30},
        "symptoms": ["ttft_high", "itl_normal"],
    }
    r = _diag(wl)
    assert _ids(r)[0] == "queueing"
    assert any("fit" in n and "acme/secret-model-13b" in n for n in r.assumptions)
    assert not [f for f in r.facts if f.source == "computed"]


def test_unknown_gpu_is_an_assumption_not_a_crash():
    r = _diag(
        {"deployment": {"gpu": "quantum-9000", "tensor_parallel_size": 2}, "symptoms": ["itl_high"]}
    )
    assert any("quantum-9000" in a for a in r.assumptions)


def test_no_evidence_gives_no_hypotheses_and_says_what_to_add():
    r = _diag({"name": "empty"})
    assert r.hypotheses == []
    assert any("No hypothesis has evidence" in n for n in r.notes)


def test_suspected_causes_add_weight_but_are_marked_as_stated():
    r = _diag({"suspected_causes": ["network"]})
    assert _ids(r) == ["network"]
    assert "stated" in r.hypotheses[0].evidence[0]


# --------------------------------------------------------------------------- stored runs


def _store_run(db: Path, *, waiting: float, running: float, kv: float, errors: dict[str, int]):
    records = streamed_records(
        40,
        spacing_s=0.25,
        ttft_s=lambda i: 4.0 if i % 2 else 3.0,  # seconds: slow first tokens
        tokens=50,
        itl_s=0.02,
        input_tokens=1000,
    )
    records += failed_records(errors, first_index=40)
    config = {"concurrency": 64, "input_tokens": 1000, "output_tokens": 50}
    gauges = vllm_gauges([running] * 10, [waiting] * 10, kv)
    return store_run(db, records, config=config, samples=gauges)


def test_run_with_waiting_requests_and_full_slots_is_queueing(tmp_path):
    db = tmp_path / "runs.db"
    run_id = _store_run(db, waiting=25, running=64, kv=0.5, errors={})
    wl = {
        "slo": {"ttft_ms": {"p95": 1000}, "itl_ms": {"p95": 50}},
        "deployment": {"max_num_seqs": 64},
    }
    r = _diag(wl, run=run_id, db=str(db))
    assert r.run_id == run_id
    assert _ids(r)[0] == "queueing"
    assert "saturation" in _ids(r)[:3]
    facts = {f.name: f for f in r.facts}
    assert facts["observations.ttft_ms.p95"].source == "measured"
    assert facts["observations.ttft_ms.p95"].value >= 3000
    assert facts["run.metric.requests_waiting_max"].value == 25
    assert {"ttft_high", "itl_normal"} <= {s.id for s in r.symptoms}


def test_run_alone_without_workload_works_and_reads_errors(tmp_path):
    db = tmp_path / "runs.db"
    run_id = _store_run(
        db, waiting=0, running=10, kv=0.97, errors={"read_timeout": 5, "http_5xx": 3}
    )
    r = diagnose(DiagnoseRequest(run=run_id[:12], db=str(db)))
    ids = _ids(r)
    assert {"admission_control", "saturation"} & set(ids[:3])
    assert any("timeouts" in e for h in r.hypotheses for e in h.evidence)


def test_unknown_run_is_an_input_error_naming_run(tmp_path):
    from inferwise.calculators.errors import InputError

    db = tmp_path / "runs.db"
    _store_run(db, waiting=0, running=1, kv=0.1, errors={})
    with pytest.raises(InputError) as info:
        diagnose(DiagnoseRequest(run="nope-nope", db=str(db)))
    assert info.value.field == "run"
