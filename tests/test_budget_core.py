"""`inferwise budget`: allocation, binding stage, feasibility, load search, agentic tasks, bad input."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from inferwise.calculators.budget import BudgetRequest, BudgetResult, decompose_budget
from inferwise.calculators.errors import InputError
from inferwise.server.cli import main

L8 = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "gpu": "h100-sxm-80gb",
    "input_tokens": 1500,
    "output_tokens": 250,
}


def run(**kw) -> BudgetResult:
    return decompose_budget(BudgetRequest(**{**L8, **kw}))


@pytest.fixture(scope="module")
def chat() -> BudgetResult:
    return run(
        request_rate=2,
        peak_to_mean=2,
        slo_ttft_ms={"p95": 800},
        slo_itl_ms={"p95": 60},
        slo_e2e_ms={"p95": 20_000},
    )


def test_components_cover_every_stage_and_slack_is_budget_minus_prediction(chat):
    names = [c.name for c in chat.components]
    assert names == ["network", "preprocessing", "queue", "prefill", "decode", "postprocessing"]
    for c in chat.components:
        assert c.slack_ms == pytest.approx(c.budget_ms - c.predicted_ms)
    by = {c.name: c for c in chat.components}
    assert by["network"].predicted_ms == 40.0  # default RTT, listed as an assumption
    from inferwise.calculators.calibration import load_efficiency
    from inferwise.calculators.catalog import get_gpu

    front = load_efficiency(get_gpu("h100-sxm-80gb"), "vllm").request_overhead_ms
    # the stated preprocessing (1 ms + 2 us a prompt token) and the engine's own front end
    assert by["preprocessing"].predicted_ms == pytest.approx(1.0 + 1500 / 500_000 * 1e3 + front)
    # TTFT target minus network and preprocessing goes to prefill and queue.
    assert by["queue"].budget_ms + by["prefill"].budget_ms == pytest.approx(
        800 - 40 - by["preprocessing"].predicted_ms
    )
    assert by["decode"].budget_ms == pytest.approx(60 * 249)
    assert any("round trip" in a for a in chat.assumptions)


def test_light_load_is_feasible_with_room_to_grow(chat):
    assert chat.feasible and chat.feasible_by_percentile == {"p95": True}
    assert chat.max_rate_under_slo > chat.design_request_rate
    assert chat.replicas_needed == 1
    assert chat.max_rate_under_slo <= chat.saturation_request_rate * 1.2


def test_max_rate_is_the_goodput_limit():
    base = dict(slo_ttft_ms={"p95": 500}, slo_e2e_ms={"p95": 10_000})
    r = run(request_rate=1, **base)
    limit = r.max_rate_under_slo
    assert limit > 0
    assert run(request_rate=limit * 0.9, **base).feasible
    over = run(request_rate=limit * 1.6, **base)
    assert not over.feasible
    assert over.binding in ("queue", "prefill")
    assert over.why and "ttft" in " ".join(over.why) or "e2e" in " ".join(over.why)
    # Replicas for a load above one replica's limit.
    big = run(request_rate=limit * 2.5, peak_to_mean=2, **base)
    assert big.replicas_needed == math.ceil(limit * 2.5 * 2 / big.max_rate_under_slo - 1e-9)


def test_a_rate_close_to_saturation_comes_with_a_margin_warning():
    """Targets met up to near capacity: the budget says how close the rate is, where the
    predictions are least reliable; a rate well below saturation says nothing."""
    loose = run(request_rate=2, slo_ttft_ms={"p95": 60_000}, slo_itl_ms={"p95": 500})
    share = loose.max_rate_under_slo / loose.saturation_request_rate
    assert share > 0.85
    assert any(f"{share:.0%} of the replica's saturation" in w for w in loose.warnings)
    tight = run(request_rate=2, slo_itl_ms={"p95": 20})  # ITL binds far below saturation
    assert tight.max_rate_under_slo < 0.85 * tight.saturation_request_rate
    assert not any("saturation" in w for w in tight.warnings)


def test_more_load_never_gives_more_queue_slack():
    slo = dict(slo_ttft_ms={"p95": 2000}, slo_e2e_ms={"p95": 30_000})
    slack = []
    for rate in (0.5, 2, 6):
        comps = {c.name: c for c in run(request_rate=rate, **slo).components}
        slack.append(comps["queue"].slack_ms)
    assert slack == sorted(slack, reverse=True)


def test_an_impossible_target_is_a_result_not_an_error():
    r = run(request_rate=1, slo_e2e_ms={"p99": 300})
    assert r.feasible is False
    assert r.max_rate_under_slo == 0.0
    assert r.replicas_needed is None
    assert r.binding == "decode"
    assert any("decode" in w for w in r.why)
    assert r.suggestions


def test_a_target_below_the_idle_service_time_binds_a_fixed_stage_not_the_queue():
    """1 ms TTFT is below network + preprocessing + prefill even with no queue: no rate or
    replica count helps, so the binding stage is the largest fixed one and the advice is not
    'add replicas'."""
    r = run(request_rate=5, slo_ttft_ms={"p95": 1})
    assert r.max_rate_under_slo == 0.0 and r.feasible is False
    fixed = {
        c.name: c.predicted_ms
        for c in r.components
        if c.name in ("network", "preprocessing", "prefill")
    }
    assert r.binding == max(fixed, key=fixed.get) != "queue"
    assert not any("replicas" in s for s in r.suggestions)
    assert any(w.startswith("without any queue") for w in r.why)


def test_itl_target_binds_decode():
    r = run(request_rate=1, slo_itl_ms={"p50": 2.0})
    assert not r.feasible and r.binding == "decode"


def test_non_streaming_adds_detokenization_and_guardrails():
    r = run(request_rate=1, slo_e2e_ms={"p95": 20_000}, streaming=False, guardrails_ms=120)
    post = next(c for c in r.components if c.name == "postprocessing")
    assert post.predicted_ms == pytest.approx(120 + 250 / 1_000_000 * 1e3)


def test_concurrency_mode_finds_the_largest_concurrency():
    r = run(concurrency=4, slo_ttft_ms={"p95": 400})
    assert r.max_rate_under_slo is None
    assert r.max_concurrency_under_slo >= 4
    assert r.design_concurrency == 4


def test_agentic_task_critical_path_retries_and_step_budgets():
    steps = [
        {"name": "plan", "input_tokens": 2000, "output_tokens": 200},
        {"name": "search", "kind": "tool", "latency_ms": 900, "parallel_group": "fetch"},
        {"name": "lookup", "kind": "tool", "latency_ms": 200, "parallel_group": "fetch"},
        {"name": "answer", "input_tokens": 5000, "output_tokens": 400, "retry_probability": 0.1},
    ]
    r = decompose_budget(
        BudgetRequest(
            model=L8["model"],
            gpu="h100",
            request_rate=0.5,
            slo_e2e_ms={"p95": 60_000},
            agent_steps=steps,
        )
    )
    t = r.task
    assert t is not None and t.percentile == "p95"
    assert t.critical_path == ["plan", "search", "answer"]
    by = {s.name: s for s in t.steps}
    assert by["answer"].attempts == 2  # a 10 % failure rate reaches p95
    assert by["plan"].attempts == 1
    assert not by["lookup"].on_critical_path
    assert t.predicted_ms == pytest.approx(
        by["plan"].predicted_ms + 900 + by["answer"].predicted_ms
    )
    assert sum(by[n].budget_ms for n in t.critical_path) == pytest.approx(60_000)
    assert t.llm_calls_per_task == pytest.approx(1 + 1 / 0.9)
    e2e = next(c for c in r.checks if c.metric == "e2e_ms")
    assert e2e.predicted_ms == pytest.approx(t.predicted_ms)


def test_bad_input_names_the_field():
    with pytest.raises(ValidationError, match="unknown percentile"):
        BudgetRequest(**L8, request_rate=1, slo_e2e_ms={"p97": 1000})
    with pytest.raises(ValidationError, match="positive"):
        BudgetRequest(**L8, request_rate=1, slo_ttft_ms={"p95": -5})
    with pytest.raises(ValidationError):
        BudgetRequest(**L8, request_rate=0, slo_e2e_ms={"p95": 1000})
    with pytest.raises(ValidationError):
        BudgetRequest(**L8, request_rate=1, peak_to_mean=0.5, slo_e2e_ms={"p95": 1000})
    with pytest.raises(ValidationError, match="input_tokens"):
        BudgetRequest(**L8, request_rate=1, slo_e2e_ms={"p95": 1000}, agent_steps=[{"name": "x"}])
    for kw, field in (
        (dict(request_rate=1), "slo_e2e_ms"),
        (dict(slo_e2e_ms={"p95": 1000}), "request_rate"),
        (dict(request_rate=math.inf, slo_e2e_ms={"p95": 1000}), "request_rate"),
        (dict(request_rate=1, slo_ttft_ms={"p95": 5000}, slo_e2e_ms={"p95": 1000}), "slo_ttft_ms"),
        (
            dict(
                request_rate=1,
                slo_e2e_ms={"p95": 1000},
                agent_steps=[{"name": "t", "kind": "tool", "latency_ms": 5}],
            ),
            "agent_steps",
        ),
    ):
        with pytest.raises(InputError) as e:
            run(**kw)
        assert e.value.field == field


def test_cli_json_contract_and_exit_codes(capsys):
    budget = ["budget", "--model", L8["model"], "--gpu", "h100"]
    args = [*budget, "--request-rate", "2", "--slo-e2e-ms", "p95=20000", "--slo-ttft-ms", "p95=800"]
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {
        "components",
        "binding",
        "feasible",
        "max_rate_under_slo",
        "replicas_needed",
        "suggestions",
        "assumptions",
    } <= set(d)
    assert set(d["components"][0]) == {"name", "budget_ms", "predicted_ms", "slack_ms"}
    assert main(args) == 0
    assert "Latency budget" in capsys.readouterr().out
    agent = '[{"name":"a","input_tokens":500,"output_tokens":50},{"name":"t","kind":"tool","latency_ms":100}]'
    assert main([*args, "--agent-steps", agent]) == 0
    assert "critical path" in capsys.readouterr().out
    assert main([*budget, "--request-rate", "2", "--slo-e2e-ms", "p42=1"]) == 2
    assert "--slo-e2e-ms" in capsys.readouterr().err
    assert main([*budget, "--request-rate", "-2", "--slo-e2e-ms", "p95=100"]) == 2


def test_the_engine_front_end_is_preprocessing_not_prefill():
    """An engine's per-request cost (its API server before the scheduler; SGLang's larger than
    vLLM's) counts in the preprocessing stage: the prefill stage stays the GPU's, and the
    stages still add up to the predicted TTFT."""
    kw = {"engine": "sglang", "concurrency": 2, "slo_ttft_ms": {"p95": 2000}}
    vllm, sglang = run(**{**kw, "engine": "vllm"}), run(**kw)
    stage = {
        e: {c.name: c.predicted_ms for c in r.components}
        for e, r in (("vllm", vllm), ("sglang", sglang))
    }
    from inferwise.calculators.calibration import load_efficiency
    from inferwise.calculators.catalog import get_gpu

    front = {e: load_efficiency(get_gpu("h100-sxm-80gb"), e).request_overhead_ms for e in stage}
    assert front["sglang"] > front["vllm"] > 0
    assert stage["sglang"]["preprocessing"] == pytest.approx(
        stage["vllm"]["preprocessing"] + front["sglang"] - front["vllm"], rel=1e-6
    )
    assert stage["sglang"]["prefill"] == pytest.approx(stage["vllm"]["prefill"], rel=0.05)
    assert any("front end" in a for a in sglang.assumptions)
    ttft = next(c for c in sglang.checks if c.metric == "ttft_ms")
    assert sum(stage["sglang"][s] for s in ("network", "preprocessing", "queue", "prefill")) == (
        pytest.approx(ttft.predicted_ms, rel=0.05)
    )
