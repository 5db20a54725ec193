"""`inferwise predict`: the contract fields, load modes, bad input and the CLI."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from inferwise.calculators.errors import InputError
from inferwise.calculators.predict import PredictRequest, PredictResult, predict_performance
from inferwise.server.cli import main

L8 = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}


def run(**kw) -> PredictResult:
    return predict_performance(PredictRequest(**{**L8, **kw}))


def test_light_load_ttft_is_the_prefill_and_itl_the_decode_step():
    """Alone, a request's TTFT is its prefill step plus the engine's per-request cost outside
    the GPU steps (vLLM's server path), and its ITL the decode step."""
    r = run(input_tokens=1000, output_tokens=100, concurrency=1)
    front_ms = r.factors["request_overhead_ms"]
    assert front_ms > 0
    assert r.ttft_ms.p50 == pytest.approx(r.step.prefill_ms + front_ms, rel=1e-6)
    assert r.queue_ms.p99 == 0
    assert r.itl_ms.p50 == pytest.approx(r.step.decode_step_ms, rel=0.01)
    assert r.output_tokens_per_s == pytest.approx(100 / (r.e2e_ms.mean / 1e3), rel=1e-6)
    assert r.bound == "memory-bandwidth"
    assert r.load.mode == "concurrency"


def test_async_scheduling_hides_the_host_step_on_one_gpu():
    """vLLM 0.14+ prepares the next step on the host while the GPU runs this one, so on one GPU
    the host's step cost bounds a decode step instead of adding to it; the 0.11 release and a
    tensor-parallel deployment keep it serial. The notes say which applies. (A T4 keeps the
    other factors of 0.11 on one GPU, so the step cost is the only difference there.)"""
    q8 = {"model": "Qwen/Qwen3-8B", "input_tokens": 1000, "output_tokens": 100, "concurrency": 1}
    t4 = {**q8, "model": "Qwen/Qwen2.5-0.5B-Instruct", "gpu": "t4"}
    new, old = run(**t4), run(**t4, engine_version="0.11.0")
    step_ms = new.factors["step_overhead_ms"]
    assert new.step.decode_step_ms == pytest.approx(old.step.decode_step_ms - step_ms, rel=1e-6)
    assert any("bounds a step" in n for n in new.assumptions)
    assert not any("asynchronously" in n for n in old.assumptions)
    tp2 = run(**q8, tensor_parallel_size=2)
    assert any("asynchronously" in n for n in tp2.assumptions)
    assert not any("bounds a step" in n for n in tp2.assumptions)
    tp2_old = run(**q8, tensor_parallel_size=2, engine_version="0.11.0")
    assert tp2.step.decode_step_ms == pytest.approx(tp2_old.step.decode_step_ms, rel=1e-6)


def test_recent_vllm_releases_decode_on_one_gpu_with_factors_of_their_own():
    """vLLM 0.14+ on one Ampere-or-newer GPU reads the weights at the measured copy rate and
    pays the full-graph per-layer floor of [engine.vllm.one_gpu_async], and says so; 0.11,
    tensor parallelism, --enforce-eager and a T4 (no BF16 tensor cores) keep [default]'s."""
    from inferwise.calculators.calibration import one_gpu_async_factors

    own = one_gpu_async_factors()
    q8 = {"model": "Qwen/Qwen3-8B", "input_tokens": 1000, "output_tokens": 100, "concurrency": 1}
    new, old = run(**q8), run(**q8, engine_version="0.11.0")
    assert new.factors["bandwidth_fraction"] == own["bandwidth_fraction"]
    assert new.factors["per_layer_overhead_us"] == own["per_layer_overhead_us"]
    assert any("[engine.vllm.one_gpu_async]" in n for n in new.assumptions)
    assert new.step.decode_step_ms < 0.8 * old.step.decode_step_ms
    for kept in (
        old,
        run(**q8, tensor_parallel_size=2),
        run(**q8, enforce_eager=True),
        run(**{**q8, "model": "Qwen/Qwen2.5-0.5B-Instruct"}, gpu="t4"),
    ):
        assert kept.factors["per_layer_overhead_us"] != own["per_layer_overhead_us"]
        assert not any("[engine.vllm.one_gpu_async]" in n for n in kept.assumptions)


def test_a_gpu_measured_above_the_fitted_gemm_share_computes_faster_and_says_so():
    """An RTX 4090 sustains its full FP32-accumulate rating in plain GEMMs where the H100 the
    factors were fitted on reaches 80 %, and its serving runs reach a larger share of that than
    the H100's (fitted on its own runs): its compute rate is its own share times that ratio,
    above the H100's share times it, and the output names the ratio and the runs the share was
    fitted on. An H100 carries neither."""
    import tomllib

    from inferwise.calculators.calibration import EFFICIENCY_FILE, gpu_compute_scale

    q7 = {"model": "Qwen/Qwen3-8B", "gpu": "rtx-4090", "input_tokens": 8000}
    r = run(**q7, output_tokens=64, concurrency=1)
    scale = gpu_compute_scale("rtx-4090")
    assert scale > 1.2
    own = tomllib.loads(EFFICIENCY_FILE.read_text())["gpu"]["rtx-4090"]["compute_fraction"]
    compute_fraction = r.factors["compute_fraction"]
    h100 = run(model="Qwen/Qwen3-8B", input_tokens=8000, output_tokens=64, concurrency=1)
    assert compute_fraction == pytest.approx(own * scale)
    assert compute_fraction > h100.factors["compute_fraction"] * scale
    assert "[gpu.rtx-4090] compute_fraction fitted on the RTX 4090" in r.factors_source
    assert "[gpu." not in h100.factors_source
    assert any("1.25x the share of its datasheet" in n for n in r.assumptions)
    assert not any("datasheet tensor-core peak" in n for n in h100.assumptions)


def test_a_stream_faster_than_one_api_server_is_flagged():
    """A 0.6B model on an H100 streams more tokens a second than one vLLM API server process
    carries (about 15k, vllm PR 15137): the warning names the limit and --api-server-count.
    An 8B model at a modest rate stays far below it."""
    tiny = run(
        model="Qwen/Qwen3-0.6B",
        input_tokens=512,
        output_tokens=128,
        request_rate=math.inf,
        num_requests=500,
    )
    assert tiny.output_tokens_per_s > 15_000
    assert any("--api-server-count" in w for w in tiny.warnings)
    modest = run(input_tokens=1000, output_tokens=200, request_rate=4)
    assert not any("API server" in w for w in modest.warnings)


def test_percentile_objects_are_ordered():
    r = run(
        input_tokens=1500,
        input_tokens_p95=6000,
        output_tokens=250,
        output_tokens_p95=800,
        request_rate=6,
    )
    for p in (r.ttft_ms, r.itl_ms, r.tpot_ms, r.e2e_ms, r.queue_ms):
        assert p.p50 <= p.p90 <= p.p95 <= p.p99
    assert r.load.input_tokens["p95"] == pytest.approx(6000, rel=0.25)


def test_more_load_means_more_throughput_and_longer_latency_until_saturation():
    low, high = run(request_rate=1), run(request_rate=8)
    assert high.requests_per_s > low.requests_per_s
    assert high.ttft_ms.p95 >= low.ttft_ms.p95
    assert high.itl_ms.mean >= low.itl_ms.mean
    assert low.saturation.utilization == pytest.approx(1 / low.saturation.max_requests_per_s)


def test_overload_warns_and_offline_reports_a_queue():
    r = run(request_rate=1000, num_requests=300)
    assert r.saturation.utilization > 1
    assert any("saturation" in w for w in r.warnings)
    off = run(request_rate=math.inf, num_requests=300)
    assert off.load.mode == "offline"
    assert off.ttft_ms.p99 > 10 * off.step.prefill_ms


def test_factors_and_assumptions_are_reported():
    r = run()
    assert {
        "compute_fraction",
        "bandwidth_fraction",
        "step_overhead_ms",
        "allreduce_latency_us",
    } <= set(r.factors)
    assert "efficiency.toml" in r.factors_source
    assert any("concurrency 1" in a for a in r.assumptions)


def test_assumptions_say_whether_the_per_request_cost_is_in_ttft():
    """SGLang's fitted and vLLM's measured cost outside the GPU steps are in every TTFT and
    said with their values; TensorRT-LLM's is not published, and the output says it counts as
    0 and how to fit it."""
    trtllm = run(engine="trtllm", input_tokens=500, output_tokens=50)
    for engine in ("sglang", "vllm"):
        r = run(engine=engine, input_tokens=500, output_tokens=50)
        overhead = r.factors["request_overhead_ms"]
        assert overhead > 0
        assert any(f"({overhead:.1f} ms at tensor parallel 1:" in a for a in r.assumptions)
    assert trtllm.factors["request_overhead_ms"] == 0
    assert any("counts as 0 here" in a and "inferwise calibrate" in a for a in trtllm.assumptions)


def test_sglang_request_cost_grows_with_its_tensor_parallel_ranks():
    """SGLang's rank 0 hands every new request to the other tensor-parallel ranks before any
    can schedule it: the cost TTFT carries is the TP 1 cost plus a fitted share per further
    rank, folded in once; vLLM's measured cost has no per-rank share (vLLM hands each step, not
    each request, to the other ranks), and a user calibration, which fits the whole cost itself,
    starts from no published share."""
    import tomllib

    from inferwise.calculators.calibration import EFFICIENCY_FILE, load_efficiency
    from inferwise.calculators.catalog import get_gpu
    from inferwise.calculators.roofline import for_tensor_parallel
    from inferwise.calculators.user_calibration import CalibratedFactors, calibrated_efficiency

    layer = tomllib.loads(EFFICIENCY_FILE.read_text())["engine"]["sglang"]
    qwen = {"model": "Qwen/Qwen3-8B", "input_tokens": 500, "output_tokens": 50}
    tp1 = run(**qwen, engine="sglang").factors
    tp8 = run(**qwen, engine="sglang", tensor_parallel_size=8).factors
    assert tp1["request_overhead_ms"] == pytest.approx(layer["request_overhead_ms"])
    per_rank = layer["request_overhead_per_rank_ms"]
    assert tp8["request_overhead_ms"] == pytest.approx(tp1["request_overhead_ms"] + 7 * per_rank)
    assert "request_overhead_per_rank_ms" not in tp8  # folded in once, not listed apart
    vllm_layer = tomllib.loads(EFFICIENCY_FILE.read_text())["engine"]["vllm"]
    vllm_tp8 = run(**qwen, tensor_parallel_size=8).factors["request_overhead_ms"]
    assert vllm_tp8 == pytest.approx(vllm_layer["request_overhead_ms"])
    published = load_efficiency(get_gpu("h100-sxm-80gb"), "sglang")
    assert for_tensor_parallel(for_tensor_parallel(published, 8), 8) == for_tensor_parallel(
        published, 8
    )
    user = calibrated_efficiency(published, CalibratedFactors(efficiency={}))
    assert user.request_overhead_ms == 0 and user.request_overhead_per_rank_ms == 0


def test_same_seed_same_answer():
    a = run(request_rate=5, input_tokens_p95=4000)
    b = run(request_rate=5, input_tokens_p95=4000)
    assert a.model_dump() == b.model_dump()


def test_moe_and_tensor_parallel_deployments_predict():
    r = predict_performance(PredictRequest(model="Qwen/Qwen3-30B-A3B", gpu="h100", concurrency=16))
    assert r.output_tokens_per_s > 0
    r = predict_performance(
        PredictRequest(
            model="meta-llama/Llama-3.1-70B-Instruct",
            gpu="h100",
            tensor_parallel_size=4,
            concurrency=8,
        )
    )
    assert r.step.communication_ms > 0


def test_sglangs_receive_interval_delays_the_first_token_not_the_decode():
    """--scheduler-recv-interval 30 at concurrency 16 with varied outputs: TTFT grows by
    about 14.5 decode steps, the decode itself does not slow down, and the output says why."""
    base = dict(L8, engine="sglang", concurrency=16, output_tokens_p95=600)
    every, once = (
        predict_performance(PredictRequest(**base, scheduler_recv_interval=n)) for n in (30, 1)
    )
    step_ms = once.tpot_ms.p50
    assert every.ttft_ms.p50 - once.ttft_ms.p50 == pytest.approx(14.5 * step_ms, rel=0.35)
    assert every.tpot_ms.p50 == pytest.approx(once.tpot_ms.p50, rel=0.05)
    assert any("every 30 decode steps" in a for a in every.assumptions)


def test_bad_input():
    with pytest.raises(ValidationError):
        PredictRequest(**L8, request_rate=0)
    with pytest.raises(ValidationError):
        PredictRequest(**L8, request_rate=-1)
    with pytest.raises(ValidationError):
        PredictRequest(**L8, request_rate=1, concurrency=2)
    with pytest.raises(ValidationError):
        PredictRequest(**L8, input_tokens=1000, input_tokens_p95=10)
    with pytest.raises(InputError) as e:
        run(input_tokens=200_000, output_tokens=10)
    assert e.value.field == "input_tokens"
    with pytest.raises(ValidationError, match="scheduler_recv_interval is an SGLang setting"):
        PredictRequest(**L8, concurrency=2, scheduler_recv_interval=30)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        PredictRequest(**L8, engine="sglang", concurrency=2, scheduler_recv_interval=0)
    with pytest.raises(InputError) as e:
        predict_performance(PredictRequest(model="no/such-model", gpu="h100"))
    assert e.value.field == "model"


def test_cli_json_contract(capsys):
    predict = ["predict", "--model", L8["model"], "--gpu", "h100"]
    code = main(
        [*predict, "--input-tokens", "512", "--output-tokens", "64", "--concurrency", "4", "--json"]
    )
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    for field in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(d[field]) == {"mean", "p50", "p90", "p95", "p99"}
    for field in (
        "output_tokens_per_s",
        "requests_per_s",
        "bound",
        "factors",
        "assumptions",
        "saturation",
    ):
        assert field in d
    assert d["bound"] in ("compute", "memory-bandwidth", "communication", "overhead")


def test_cli_markdown_and_exit_codes(capsys):
    predict = ["predict", "--model", L8["model"], "--gpu", "h100"]
    assert main([*predict, "--request-rate", "inf", "--num-requests", "60"]) == 0
    out = capsys.readouterr().out
    assert "Predicted performance" in out and "TTFT" in out and "Factors used" in out
    assert main([*predict, "--request-rate", "0"]) == 2
    assert "--request-rate" in capsys.readouterr().err
    assert main([*predict, "--concurrency", "2", "--request-rate", "1"]) == 2
    assert main(["predict", "--model", L8["model"], "--gpu", "nonexistent-gpu"]) == 2
    assert "--gpu" in capsys.readouterr().err


def test_a_given_request_count_reports_the_whole_benchmark_run():
    """A closed loop of --num-prompts requests, as benchmark clients report it: the opening
    wave (every client's first prompt arrives at once) is counted, so mean TTFT is higher
    than the steady state's, and predict agrees with the published-run simulation that
    bench/predict_accuracy.py scores."""
    from inferwise.calculators.calibration import simulate_measurement

    shape = {"input_tokens": 4000, "output_tokens": 300, "concurrency": 64}
    run_of_200 = run(**shape, num_requests=200)
    steady = run(**shape)  # our own count, the ramps left out
    assert run_of_200.ttft_ms.mean > 1.2 * steady.ttft_ms.mean
    assert any("every one counted" in a for a in run_of_200.assumptions)
    assert any("ramp up/down) are left out" in a for a in steady.assumptions)
    published = simulate_measurement(
        {**L8, **shape, "num_prompts": 200, "load": "concurrency",
         "values": {"ttft_ms.mean": 1.0, "output_tokens_per_s": 1.0}},
    )  # fmt: skip
    assert run_of_200.ttft_ms.mean == pytest.approx(published["ttft_ms.mean"], rel=1e-6)
    assert run_of_200.output_tokens_per_s == pytest.approx(
        published["output_tokens_per_s"], rel=1e-6
    )


def test_a_source_without_max_model_len_is_scored_at_the_context_predict_would_assume():
    """Many published runs do not print --max-model-len. The accuracy harness must answer
    them as `inferwise predict` answers the same question (the longest context that fits
    when the model's default does not), not fail them as unfittable: on one L4, Llama-3.1-8B's
    131k default does not fit, a 1,000-token workload does."""
    from inferwise.calculators.calibration import simulate_measurement

    shape = {"input_tokens": 1000, "output_tokens": 200, "concurrency": 4}
    m = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "l4", "num_prompts": 40,
         "load": "concurrency", "values": {"ttft_ms.p50": 1.0, "itl_ms.p50": 1.0}, **shape}  # fmt: skip
    scored = simulate_measurement(m)
    asked = predict_performance(
        PredictRequest(model=m["model"], gpu="l4", num_requests=40, **shape)
    )
    assert any("longest that fits" in a for a in asked.assumptions)
    assert scored["ttft_ms.p50"] == pytest.approx(asked.ttft_ms.p50, rel=1e-6)
    with pytest.raises(InputError) as e:
        simulate_measurement({**m, "input_tokens": 60_000})
    assert e.value.field == "max_model_len"


def test_gpus_beyond_the_parallel_degree_are_data_parallel_replicas():
    """8 GPUs at TP 2 are four replicas behind a balancer: each serves a quarter of the rate,
    so latencies are one replica's at that share and throughput is four times it; a count
    that is not a whole number of replicas is refused naming num_gpus."""
    one = run(tensor_parallel_size=2, request_rate=6)
    fleet = run(tensor_parallel_size=2, num_gpus=8, request_rate=24)
    assert fleet.replicas == 4 and one.replicas == 1
    assert fleet.load.request_rate == 24
    assert fleet.ttft_ms.p50 == pytest.approx(one.ttft_ms.p50)
    assert fleet.output_tokens_per_s == pytest.approx(4 * one.output_tokens_per_s)
    assert fleet.assumptions[0].startswith("4 data-parallel replicas of 2 GPU(s)")
    closed = run(num_gpus=4, concurrency=10)
    busiest = run(concurrency=3)
    assert closed.load.concurrency == 10 and closed.ttft_ms.p50 == busiest.ttft_ms.p50
    assert closed.requests_per_s == pytest.approx(busiest.requests_per_s * 10 / 3)
    with pytest.raises(InputError) as e:
        run(tensor_parallel_size=2, num_gpus=7)
    assert e.value.field == "num_gpus"


def test_budget_is_for_one_replica_and_refuses_a_fleet_of_gpus():
    from inferwise.calculators.budget import BudgetRequest, decompose_budget

    with pytest.raises(InputError) as e:
        decompose_budget(BudgetRequest(**L8, num_gpus=8, request_rate=20, slo_ttft_ms={"p95": 500}))
    assert e.value.field == "num_gpus" and "replicas_needed" in e.value.message
