"""Capacity in the diagnosis: one computed figure, and measurement over the model when they
disagree."""

from __future__ import annotations

from pathlib import Path

from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "workloads"


def test_an_empty_measured_queue_at_the_mean_rate_outweighs_a_computed_shortfall():
    """code-assistant serves 35 req/s with half a request waiting; the calculators put its
    capacity far below that. The measured system is not saturated, and the output says that
    the computed capacity is a lower bound."""
    r = diagnose(DiagnoseRequest(workload=str(EXAMPLES / "code-assistant.json")))
    top3 = [h.id for h in r.hypotheses[:3]]
    assert "saturation" not in top3
    sat = next(h for h in r.hypotheses if h.id == "saturation")
    assert sat.level == "low"
    assert any("no evidence of saturation" in e for e in sat.counter_evidence)
    assert any("lower bounds" in x for x in r.assumptions)


def test_a_deployment_with_nothing_measured_is_told_what_to_measure():
    """No lead at all: the diagnosis names the baseline measurements (with commands carrying
    the workload's own rate and lengths) and where the GPU choice is made."""
    r = diagnose(DiagnoseRequest(workload=str(EXAMPLES / "rag-long-documents.toml")))
    assert r.hypotheses == [] and r.summary.startswith("Not enough measured")
    fields = {m.field: m for m in r.missing_measurements}
    assert "observations.ttft_ms" in fields
    assert "--request-rate 3 --input-tokens 12000" in fields["observations.ttft_ms"].how_to_measure
    assert any("`inferwise plan` sizes each candidate" in n for n in r.notes)


def test_full_measured_throughput_above_the_computed_ceiling_is_not_saturation():
    """Scenario 08: 12 req/s offered and 12 completed, computed ceiling ~2 req/s. The model
    is wrong, not the deployment: saturation does not lead, and the output says why."""
    import json

    sc = json.loads((Path(__file__).parent / "scenarios" / "08_workload_mixing.json").read_text())
    r = diagnose(DiagnoseRequest(workload=json.dumps(sc["workload"])))
    assert r.hypotheses[0].id == "workload_mixing"
    sat = next(h for h in r.hypotheses if h.id == "saturation")
    assert any("all of the 12 req/s offered" in e for e in sat.counter_evidence)
    assert any("served in full" in x for x in r.assumptions)


def test_a_binding_sequence_cap_with_kv_room_ranks_the_policy_above_saturation():
    """Scenario 18: --max-num-seqs 8, queue 30, KV 20 %: the cap, not the hardware, is the
    limit, so batch_policy outranks saturation."""
    import json

    path = Path(__file__).parent / "scenarios" / "18_batch_policy_low_cap.json"
    r = diagnose(DiagnoseRequest(workload=json.dumps(json.loads(path.read_text())["workload"])))
    ids = [h.id for h in r.hypotheses]
    assert ids.index("batch_policy") < ids.index("saturation")


def test_the_default_context_failing_to_start_is_not_a_model_that_does_not_fit():
    """Scenario 14 runs a 70B model on two H100s without stating max_model_len: at the model's
    default 131k context vLLM would refuse to start, but the load itself fits. The diagnosis
    must not claim 'does not fit'; it asks for deployment.max_model_len instead."""
    import json

    path = Path(__file__).parent / "scenarios" / "14_decode_bandwidth.json"
    r = diagnose(DiagnoseRequest(workload=json.dumps(json.loads(path.read_text())["workload"])))
    assert not any("does not fit" in e for h in r.hypotheses for e in h.evidence)
    assert any("max_model_len" in x for x in r.assumptions)
    assert "deployment.max_model_len" in {m.field for m in r.missing_measurements}


def test_no_rate_meets_the_slo_names_the_target_an_idle_replica_misses():
    """support-chat's E2E p95 target (15 s) cannot hold for 800-token answers even on an idle
    replica; code-assistant's TTFT p95 (400 ms) cannot for 9,000-token prompts. The diagnosis
    says which target and ties it to decode or prefill, instead of a generic 'too slow'."""
    sc = diagnose(DiagnoseRequest(workload=str(EXAMPLES / "support-chat.json"), limit=24))
    facts = {f.name: f.value for f in sc.facts}
    assert "E2E p95" in facts["derived.idle_misses"] and facts["derived.idle_misses_decode"]
    big = next(h for h in sc.hypotheses if h.id == "model_too_large")
    assert any("misses a decode-bound target" in e for e in big.evidence)

    ca = diagnose(DiagnoseRequest(workload=str(EXAMPLES / "code-assistant.json"), limit=24))
    facts = {f.name: f.value for f in ca.facts}
    assert "TTFT p95" in facts["derived.idle_misses"] and facts["derived.idle_misses_ttft"]
    pre = next(h for h in ca.hypotheses if h.id == "prefill_compute")
    assert any("misses the TTFT target" in e for e in pre.evidence)
