"""The deployment recommender: the fleet it picks is consistent with the project's own
calculators, priced exactly, cheapest in its space, and honest when nothing works."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwise.calculators import api
from inferwise.calculators.budget import decompose_budget
from inferwise.calculators.errors import InputError
from inferwise.calculators.recommend.evaluate import budget_request, evaluate
from inferwise.calculators.recommend.screen import Screen, spare_replicas
from inferwise.calculators.recommend.search import recommend
from inferwise.calculators.recommend.space import Config
from inferwise.knowledge.recommending import RecommendRequest, recommend_deployment, search_spec

MODEL_8B = "meta-llama/Llama-3.1-8B-Instruct"
BASE = {
    "model": [MODEL_8B],
    "gpus": ["h100-sxm-80gb", "l40s"],
    "request_rate": 8.0,
    "peak_to_mean": 2.0,
    "input_tokens": 800,
    "input_tokens_p95": 2400,
    "output_tokens": 150,
    "output_tokens_p95": 400,
    "slo_ttft_ms": {"p95": 1000},
    "slo_itl_ms": {"p95": 60},
}


def _run(**over):
    return recommend_deployment(RecommendRequest(**{**BASE, **over}))


@pytest.fixture(scope="module")
def chat():
    """An 8B chat workload at 99.9 % availability on two GPU types."""
    return _run(availability=0.999, gpu_price={"h100": 4.0, "l40s": 1.5})


def test_recommended_fleet_passes_the_budget_at_its_design_load(chat):
    c = chat.recommended
    assert chat.feasible and c is not None and c.meets_slo
    spec = search_spec(RecommendRequest(**BASE, availability=0.999))
    req = decompose_budget(
        _budget_for(c, spec, spec.peak_rate_per_s / c.replicas), find_max_rate=False
    )
    assert req.feasible
    # the serving replicas carry the peak within the SLO, the spare comes on top
    assert c.replicas * c.max_rate_under_slo_per_replica >= spec.peak_rate_per_s - 1e-9
    assert c.spare_replicas == 1


def _budget_for(c, spec, rate):
    from inferwise.calculators.budget import BudgetRequest

    return BudgetRequest(
        model=c.model,
        gpu=c.gpu,
        tensor_parallel_size=c.tensor_parallel_size,
        quantization=None if c.quantization == "bf16" else c.quantization,
        kv_cache_dtype=c.kv_cache_dtype,
        max_model_len=c.max_model_len,
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
        slo_ttft_ms=spec.slo_ttft_ms,
        slo_itl_ms=spec.slo_itl_ms,
        input_tokens=spec.input_tokens.p50,
        input_tokens_p95=spec.input_tokens.p95,
        output_tokens=spec.output_tokens.p50,
        output_tokens_p95=spec.output_tokens.p95,
        request_rate=rate,
    )


def test_cost_arithmetic_is_exact(chat):
    spec = search_spec(RecommendRequest(**BASE))
    price = {"h100-sxm-80gb": 4.0, "l40s": 1.5}
    for c in chat.candidates:
        assert c.total_gpus == (c.replicas + c.spare_replicas) * c.gpus_per_replica
        assert c.usd_per_gpu_hour == price[c.gpu]
        assert c.usd_per_hour == pytest.approx(c.total_gpus * price[c.gpu], rel=1e-12)
        per_hour = spec.mean_rate_per_s * 3600
        out_m = per_hour * spec.output_tokens.mean / 1e6
        in_m = per_hour * spec.input_tokens.mean / 1e6
        assert c.usd_per_million_output_tokens == pytest.approx(c.usd_per_hour / out_m)
        assert c.usd_per_million_input_tokens == pytest.approx(c.usd_per_hour / in_m)
        assert c.usd_per_successful_request == pytest.approx(
            c.usd_per_hour / (per_hour * c.slo_attainment)
        )
        assert c.usd_per_day == pytest.approx(c.usd_per_hour * 24)
    assert {p.gpu: p.source for p in chat.prices}["l40s"].startswith("user")


def test_candidates_are_ranked_cheapest_first_and_carry_runnable_commands(chat):
    costs = [c.usd_per_hour for c in chat.candidates if c.meets_slo]
    assert costs == sorted(costs)
    c = chat.recommended
    assert c.serve_command.startswith(f"vllm serve {MODEL_8B} --tensor-parallel-size")
    assert f"--max-model-len {c.max_model_len}" in c.serve_command
    assert f"--max-num-seqs {c.max_num_seqs}" in c.serve_command
    assert c.verify_command.startswith("inferwise probe http://HOST:8000")
    assert f"--request-rate {c.design_rate_per_replica:.3g}" in c.verify_command
    assert "--slo ttft_ms=1000" in c.verify_command
    assert chat.searched.configurations >= 200 and chat.searched.simulated >= 1
    assert chat.pareto, "the frontier of the simulated candidates"


def test_availability_rule():
    assert spare_replicas(None) == 0
    assert spare_replicas(0.99) == 0
    assert spare_replicas(0.999) == 1
    assert spare_replicas(0.9999) == 2


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    rate=st.sampled_from([2.0, 6.0, 15.0]),
    ttft=st.sampled_from([600.0, 1500.0]),
    itl=st.sampled_from([40.0, 80.0]),
)
def test_no_cheaper_grid_point_meets_the_same_slo(rate, ttft, itl):
    """Brute force over GPU x TP x {bf16, fp8} at the engine's default batch limits."""
    over = {
        "request_rate": rate,
        "slo_ttft_ms": {"p95": ttft},
        "slo_itl_ms": {"p95": itl},
        "gpu_price": {"h100": 4.0, "l40s": 1.5},
        "top": 1,
    }
    req = RecommendRequest(**{**BASE, **over})
    spec = search_spec(req)
    result = recommend(spec)
    best = result.recommended.usd_per_hour if result.feasible else math.inf
    screen = Screen(spec, {"h100-sxm-80gb": 4.0, "l40s": 1.5})
    for gpu in ("h100-sxm-80gb", "l40s"):
        for tp in (1, 2):
            for quant in ("bf16", "fp8"):
                cfg = Config(MODEL_8B, None, gpu, tp, 1, quant, "auto", None, None)
                v = screen.check(cfg)
                if v.screened is None:
                    continue
                e = evaluate(v.screened, spec)
                if e.meets_slo:
                    usd = e.total_gpus * v.screened.usd_per_gpu_hour
                    assert best <= usd + 1e-9, (cfg.label(), usd, best)


def test_an_infeasible_workload_says_why_and_what_would_work():
    r = recommend_deployment(
        RecommendRequest(
            model=["deepseek-ai/DeepSeek-R1"],
            gpus=["l4"],
            max_gpus=4,
            request_rate=1,
            input_tokens=1000,
            output_tokens=200,
            slo_ttft_ms={"p95": 2000},
        )
    )
    assert r.feasible is False and r.recommended is None
    assert any("does not fit" in x.reason for x in r.rejected)
    assert r.nearest and any("fits" in n for n in r.nearest)


def test_quality_floor_picks_the_cheapest_model_that_passes():
    r = _run(
        model=[MODEL_8B, "meta-llama/Llama-3.2-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct"],
        model_quality={MODEL_8B: 0.90, "meta-llama/Llama-3.2-3B-Instruct": 0.80},
        quality_floor_score=0.85,
        gpus=["l40s"],
        top=3,
    )
    assert r.feasible
    assert all(c.model != "meta-llama/Llama-3.2-3B-Instruct" for c in r.candidates)
    assert any("quality below the floor" in x.reason for x in r.rejected)
    assert r.recommended.quality in (0.90, None)


def test_mixed_traffic_compares_a_shared_fleet_with_two_pools():
    r = _run(batch_share=0.4, gpus=["l40s"])
    m = r.mixed_traffic
    assert m is not None and {o.name for o in m.options} == {"shared", "separate"}
    assert m.chosen == min(m.options, key=lambda o: o.usd_per_hour).name
    # the online fleet is sized for the online share only
    assert r.design_rate_per_s == pytest.approx(8.0 * 0.6 * 2.0)


def test_scale_to_zero_with_a_long_cold_start_misses_the_first_requests():
    hourly = [0.0] * 6 + [4.0] * 12 + [1.0] * 6
    wl = {"traffic": {"hourly_rate_rps": hourly}}
    r = _run(workload=wl, request_rate=None, scale_to_zero=True, gpus=["l40s"], top=1)
    a = r.recommended.autoscaling
    assert a is not None
    assert a.cold_start.total_s > 1.0
    assert a.first_requests_after_idle_miss_ttft is True
    assert 0 < a.gpu_hours_per_day < a.fixed_fleet_gpu_hours_per_day
    assert a.requests_missing_slo_during_scale_up > 0


def test_flags_override_the_workload_and_the_workload_fills_the_rest():
    wl = {
        "traffic": {
            "arrival_rate_rps": 3,
            "peak_to_mean": 2,
            "input_tokens": {"p50": 500, "p95": 2000},
            "output_tokens": {"p50": 100},
        },
        "slo": {"ttft_ms": {"p95": 900}, "availability": 0.9999},
        "constraints": {"gpus": ["l40s"], "gpu_prices_usd_per_hour": {"l40s": 1.0}},
        "deployment": {"model": MODEL_8B},
    }
    spec = search_spec(RecommendRequest(workload=wl, request_rate=5, gpu_price={"l40s": 2.0}))
    assert spec.mean_rate_per_s == 5 and spec.peak_to_mean == 2
    assert spec.input_tokens.p95 == 2000 and spec.slo_ttft_ms == {"p95": 900}
    assert spec.gpus == ["l40s"] and spec.gpu_prices_usd_per_hour == {"l40s": 2.0}
    assert spec.availability == 0.9999 and spec.models[0].model == MODEL_8B


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--gpus", "h900"], "--gpus"),
        (["--gpus", ",,"], "--gpus"),  # not "every GPU": a flag given empty is a slip
        (["--gpu-price", "l40s=-1"], "--gpu-price"),
        (["--budget-usd-per-hour", "0"], "--budget-usd-per-hour"),
        (["--slo-ttft-ms", "p97=500"], "slo_ttft_ms"),
    ],
)
def test_bad_input_is_exit_2_naming_the_field(args, field):
    cmd = [sys.executable, "-m", "inferwise.server", "recommend", "--model", MODEL_8B]
    cmd += ["--request-rate", "1", "--input-tokens", "100", "--output-tokens", "10", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert field.lstrip("-").replace("-", "_") in p.stderr.replace("-", "_"), p.stderr
    assert "Traceback" not in p.stderr


def test_missing_rate_names_both_ways_to_give_it():
    with pytest.raises(InputError) as exc:
        search_spec(RecommendRequest(model=[MODEL_8B], input_tokens=100, output_tokens=10))
    assert exc.value.field == "request_rate" and "arrival_rate_rps" in str(exc.value.accepted)


def test_json_output_has_the_contract_fields():
    cmd = [sys.executable, "-m", "inferwise.server", "recommend", "--json", "--top", "2"]
    for k, v in BASE.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, list):
            cmd += [flag, ",".join(v)]
        elif isinstance(v, dict):
            cmd += [flag, *(f"{a}={b}" for a, b in v.items())]
        else:
            cmd += [flag, str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for key in (
        "feasible",
        "recommended",
        "candidates",
        "pareto",
        "rejected",
        "searched",
        "prices",
        "assumptions",
    ):
        assert key in out
    c = out["recommended"]
    for key in (
        "gpu",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "expert_parallel",
        "quantization",
        "kv_cache_dtype",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "engine",
        "replicas",
        "spare_replicas",
        "total_gpus",
        "max_rate_under_slo_per_replica",
        "usd_per_hour",
        "usd_per_million_output_tokens",
        "usd_per_million_input_tokens",
        "usd_per_successful_request",
        "predicted",
        "meets_slo",
        "serve_command",
        "verify_command",
    ):
        assert key in c
    assert set(c["predicted"]) == {"ttft_ms", "itl_ms", "e2e_ms"}
    assert set(c["predicted"]["ttft_ms"]) == {"p50", "p95", "p99"}
    assert set(out["searched"]) >= {"configurations", "simulated", "elapsed_s"}


def test_the_memo_makes_a_repeated_search_cheap():
    spec = search_spec(RecommendRequest(**{**BASE, "gpus": ["l40s"], "top": 1}))
    first = recommend(spec)
    hits = api._BUDGET.hits
    again = recommend(spec)
    assert again.recommended == first.recommended
    assert api._BUDGET.hits > hits


def test_budget_request_of_a_screened_config_is_the_users_budget_call():
    spec = search_spec(RecommendRequest(**BASE))
    screen = Screen(spec, {"h100-sxm-80gb": 4.0, "l40s": 1.5})
    s = screen.check(Config(MODEL_8B, None, "h100-sxm-80gb", 1, 1, "bf16", "auto", None, None))
    req = budget_request(s.screened, spec, 3.0)
    assert req.model == MODEL_8B and req.request_rate == 3.0 and req.slo_itl_ms == {"p95": 60}


@pytest.mark.slow
def test_closed_loop_the_recommended_replica_meets_the_slo_when_probed():
    """The top recommendation started as `inferwise sim` with its flags and probed at its
    per-replica design load with the workload's lengths: the measured p95s meet the SLO."""
    import re
    import shlex

    r = _run(
        gpus=["h100-sxm-80gb"],
        request_rate=3.0,
        output_tokens=40,
        output_tokens_p95=80,
        slo_ttft_ms={"p95": 1500},
        slo_itl_ms={"p95": 80},
        top=1,
    )
    c = r.recommended
    sim = [sys.executable, "-m", "inferwise.server", "sim", "--port", "0", "--model", c.model]
    sim += ["--gpu", c.gpu, "--tensor-parallel-size", str(c.tensor_parallel_size)]
    sim += ["--kv-cache-dtype", c.kv_cache_dtype, "--max-model-len", str(c.max_model_len)]
    sim += ["--max-num-seqs", str(c.max_num_seqs)]
    sim += ["--max-num-batched-tokens", str(c.max_num_batched_tokens)]
    if c.quantization != "bf16":
        sim += ["--quantization", c.quantization]
    for flag in sim[sim.index("--tensor-parallel-size") :: 2]:
        assert flag in c.serve_command
    proc = subprocess.Popen(sim, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)
        probe = shlex.split(c.verify_command.replace("http://HOST:8000", url))
        probe[probe.index("--requests") + 1] = "60"
        cmd = [sys.executable, "-m", "inferwise.server", *probe[1:], "--json", "--db", ":memory:"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr
        summary = json.loads(p.stdout)["summary"]
        assert summary["completed"] >= 55
        assert summary["ttft_ms"]["p95"] <= 1500, summary["ttft_ms"]
        assert summary["itl_ms"]["p95"] <= 80, summary["itl_ms"]
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_plan_on_a_running_deployment_shows_the_cheapest_fleet_that_meets_the_slo():
    from inferwise.knowledge.planning import PlanRequest, plan_experiments

    wl = {
        "traffic": {
            "arrival_rate_rps": 4,
            "input_tokens": {"p50": 800},
            "output_tokens": {"p50": 150},
        },
        "slo": {"ttft_ms": {"p95": 1000}},
        "deployment": {"model": MODEL_8B, "gpu": "l40s", "tensor_parallel_size": 2},
        "observations": {"ttft_ms": {"p95": 2500}, "queue_depth": 12},
    }
    p = plan_experiments(PlanRequest(workload=wl))
    assert p.mode == "diagnostic"
    c = p.cheapest_meeting_slo
    assert c is not None and c.gpu == "l40s" and c.meets_slo and c.usd_per_hour > 0


def test_sglang_gets_its_own_launch_line_and_moe_says_expert_parallelism_is_not_searched():
    r = _run(engine="sglang", gpus=["h100-sxm-80gb"], top=1)
    assert r.recommended.serve_command.startswith(
        f"python -m sglang.launch_server --model-path {MODEL_8B} --tp "
    )
    assert "--context-length" in r.recommended.serve_command
    moe = _run(model=["Qwen/Qwen3-30B-A3B"], gpus=["h100-sxm-80gb"], top=1)
    assert any("expert parallelism not searched" in x.reason for x in moe.rejected)


def test_mcp_tool_takes_the_workload_as_an_inline_object():
    import asyncio

    from inferwise.server.mcp_server import make_tool_function
    from inferwise.server.registry import BY_TOOL

    fn = make_tool_function(BY_TOOL["recommend_deployment"])
    wl = {
        "traffic": {
            "arrival_rate_rps": 2,
            "input_tokens": {"p50": 600},
            "output_tokens": {"p50": 120},
        },
        "slo": {"ttft_ms": {"p95": 1200}},
        "constraints": {"gpus": ["l40s"]},
        "deployment": {"model": MODEL_8B},
    }
    result = asyncio.run(fn(workload=wl, top=1))
    data = result.structured_content
    assert data["feasible"] is True and data["recommended"]["gpu"] == "l40s"
    assert "Recommended deployment" in result.content[0].text


@pytest.mark.parametrize("objective", ["latency", "throughput_per_gpu"])
def test_other_objectives_rank_by_their_own_metric(objective):
    r = _run(gpus=["l40s"], objective=objective, top=4)
    ok = [c for c in r.candidates if c.meets_slo]
    assert len(ok) >= 2
    if objective == "latency":
        keys = [c.predicted.e2e_ms.p95 for c in ok]
    else:
        keys = [-c.max_rate_under_slo_per_replica / c.gpus_per_replica for c in ok]
    assert keys == sorted(keys)


def test_plan_prices_the_stated_deployment_as_its_cost_baseline():
    from inferwise.knowledge.planning import PlanRequest, plan_experiments

    wl = {
        "constraints": {"budget_usd_per_hour": 40, "gpu_prices_usd_per_hour": {"h100": 2.5}},
        "deployment": {"model": MODEL_8B, "gpu": "h100", "tensor_parallel_size": 2, "replicas": 3},
    }
    cost = next(
        b
        for b in plan_experiments(PlanRequest(workload=wl)).baseline
        if b.metric == "cost_usd_per_hour"
    )
    assert cost.source == "computed" and cost.value == pytest.approx(3 * 2 * 2.5)


def test_review_findings_stay_fixed():
    """From a new-user review: the flag wins over a profile, replicas stay under saturation,
    an FP8 checkpoint is not 'quantized at load time', a min_replicas floor is not a spare."""
    hourly = [1.0] * 12 + [3.0] * 12
    spec = search_spec(
        RecommendRequest(
            **{**BASE, "workload": {"traffic": {"hourly_rate_rps": hourly}}, "request_rate": 4.0}
        )
    )
    assert spec.daily_mean_rate_per_s == pytest.approx(4.0)
    assert max(spec.hourly_rate_per_s) == pytest.approx(6.0)
    r = _run(gpus=["l40s"], top=2, request_rate=0.05, min_replicas=3)
    c = r.recommended
    assert c.spare_replicas == 0 and c.replicas + c.spare_replicas < 3
    assert c.total_gpus == 3 * c.gpus_per_replica
    assert any("min_replicas adds" in n for n in c.notes)
    for c in _run(gpus=["h100"], top=3).candidates:
        assert c.utilisation <= 0.9 + 1e-9
    fp8 = _run(model=["Qwen/Qwen3-32B-FP8"], gpus=["h100"], top=1).recommended
    assert fp8.quantization == "fp8" and "--quantization" not in fp8.serve_command
    assert not any("at load time" in n for n in fp8.notes)
    with pytest.raises(Exception, match="finite"):
        RecommendRequest(**{**BASE, "quality_floor_score": float("nan")})


def test_a_shared_prompt_prefix_is_priced_in_as_prefix_cache_hits():
    """Issue 15: the workload's shared_prefix_fraction is the prefix-cache hit rate the
    search budgets with: long shared prompts need fewer replicas than the same unshared."""

    def workload(shared: float | None) -> dict:
        traffic = {
            "arrival_rate_rps": 6,
            "input_tokens": {"p50": 6000, "p95": 8000},
            "output_tokens": {"p50": 150, "p95": 300},
        }
        if shared is not None:
            traffic["shared_prefix_fraction"] = shared
        return {
            "traffic": traffic,
            "slo": {"ttft_ms": {"p95": 800}, "itl_ms": {"p95": 80}},
            "constraints": {"gpus": ["h100-sxm-80gb"]},
            "deployment": {"model": MODEL_8B},
        }

    plain = recommend_deployment(RecommendRequest(workload=workload(None)))
    shared = recommend_deployment(RecommendRequest(workload=workload(0.8)))
    assert shared.recommended.total_gpus < plain.recommended.total_gpus
    assert any("priced in as the prefix-cache hit rate" in a for a in shared.assumptions)


def test_the_levers_are_tried_on_the_recommended_fleet(chat):
    """Issue 15: speculative decoding, prefix caching and (for two or more replicas)
    disaggregation, each with a verdict that follows its numbers."""
    levers = {lv.lever: lv for lv in chat.levers}
    assert {"speculative_decoding", "prefix_caching"} <= set(levers)
    assert ("disaggregation" in levers) == (chat.recommended.replicas >= 2)
    spec = levers["speculative_decoding"]
    speedups = [float(x) for x in re.findall(r"x(\d+\.\d+)", spec.effect)]
    assert spec.worth_it == all(s >= 1.05 for s in speedups[:2])
    assert not levers["prefix_caching"].worth_it  # BASE states no shared prefix


def test_an_acceptance_of_one_token_per_step_is_not_worth_a_drafter():
    r = _run(spec_acceptance_length=1.0, gpus=["h100-sxm-80gb"])
    spec = next(lv for lv in r.levers if lv.lever == "speculative_decoding")
    assert not spec.worth_it and "not worth it" in spec.effect


def test_a_trace_fills_the_traffic_the_flags_leave_open():
    """Issue 16: recommend --trace sizes for the trace's own fitted rate, peak and lengths."""
    from pathlib import Path

    from inferwise.knowledge.trace_workload import WorkloadFromTraceRequest, workload_from_trace

    trace = str(Path(__file__).parent / "data" / "traces" / "mooncake.jsonl")
    fitted = workload_from_trace(WorkloadFromTraceRequest(from_trace=trace)).workload["traffic"]
    spec = search_spec(RecommendRequest(trace=trace, model=[MODEL_8B], slo_ttft_ms={"p95": 900}))
    assert spec.mean_rate_per_s == pytest.approx(fitted["arrival_rate_rps"])
    assert spec.peak_to_mean == pytest.approx(fitted["peak_to_mean"])
    assert spec.input_tokens.p50 == pytest.approx(fitted["input_tokens"]["p50"])
    flagged = search_spec(RecommendRequest(trace=trace, model=[MODEL_8B], request_rate=9))
    assert flagged.mean_rate_per_s == 9  # flags still win
    with pytest.raises(InputError):
        search_spec(RecommendRequest(trace="/nonexistent/trace.jsonl", model=[MODEL_8B]))


def test_config_overrides_reach_the_search_and_the_launch_line():
    """Llama 4's multimodal checkpoint is refused with the override that serves its language
    model alone; recommend takes that override, sizes the text model with it and starts the
    engine with it (vLLM --hf-overrides, SGLang --json-model-override-args)."""
    scout = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
    with pytest.raises(InputError) as e:
        _run(model=[scout], gpus=["h100-sxm-80gb"], top=1)
    assert "--hf-overrides model_type=llama4_text" in e.value.message
    text = {"model_type": "llama4_text"}
    r = _run(model=[scout], hf_overrides=text, gpus=["h100-sxm-80gb"], top=1)
    line = r.recommended.serve_command
    assert line.endswith("""--hf-overrides '{"model_type": "llama4_text"}'""")
    sglang = _run(model=[scout], hf_overrides=text, engine="sglang", gpus=["h100-sxm-80gb"], top=1)
    assert """--json-model-override-args '{"model_type": "llama4_text"}'""" in (
        sglang.recommended.serve_command
    )
    # the sizing itself reads the overridden config: half the layers, faster steps
    half = {"num_hidden_layers": "16"}
    spec = search_spec(RecommendRequest(**{**BASE, "hf_overrides": half}))
    screen = Screen(spec, {"h100-sxm-80gb": 4.0, "l40s": 1.5})
    facts = (MODEL_8B, None, "h100-sxm-80gb", 1, 1, "bf16", "auto", None, None)
    s = screen.check(Config(*facts, hf_overrides=tuple(half.items())))
    whole = screen.check(Config(*facts))
    assert budget_request(s.screened, spec, 3.0).hf_overrides == half
    assert s.screened.saturation_rate_per_s > 1.3 * whole.screened.saturation_rate_per_s
