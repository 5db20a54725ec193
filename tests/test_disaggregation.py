"""Prefill/decode disaggregation in predict (issue 15): transfer physics, pools, bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferwise.calculators.predict import PredictRequest, predict_performance

L8 = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
LONG = {"input_tokens": 4000, "output_tokens": 300, "input_tokens_p95": 8000}
LONG["output_tokens_p95"] = 600


def test_the_kv_transfer_takes_bytes_over_the_link_rate_plus_its_latency():
    r = predict_performance(
        PredictRequest(
            **L8,
            input_tokens=4000,
            output_tokens=50,
            request_rate=0.2,
            disaggregate="1:1",
            kv_transfer_gbps=100,
            kv_transfer_latency_ms=2.0,
        )
    )
    d = r.disaggregation
    wire_ms = 4000 * d.kv_bytes_per_token * 8 / 100e9 * 1e3
    assert d.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B, bf16 KV
    assert d.kv_transfer_ms_p50 == pytest.approx(wire_ms + 2.0, rel=1e-6)


def test_ttft_is_prefill_plus_transfer_plus_the_first_decode_step_on_an_idle_replica():
    base = PredictRequest(**L8, input_tokens=4000, output_tokens=50, request_rate=0.1)
    agg = predict_performance(base)
    r = predict_performance(base.model_copy(update={"disaggregate": "1:1"}))
    d = r.disaggregation
    step = agg.step.decode_step_ms
    expected = agg.ttft_ms.p50 + d.kv_transfer_ms_p50 + step
    assert r.ttft_ms.p50 == pytest.approx(expected, rel=0.05)


def test_decodes_see_no_prefill_interference_under_long_prompts():
    # 3.5 requests/s on each of the two aggregated replicas: more than 5 % of their decode
    # tokens share a step with a prefill chunk, so the chunks reach their ITL p95
    r = predict_performance(PredictRequest(**L8, **LONG, request_rate=7, disaggregate="1:1"))
    d = r.disaggregation
    assert d.itl_p95_gain > 2  # aggregated ITL p95 carries 8k-token prefill chunks
    assert r.itl_ms.p95 < d.aggregated.itl_ms_p95
    assert 0 < d.prefill_utilization < 1.5 and 0 < d.decode_utilization < 1.5
    assert d.kv_transfer_gbps_needed > 0 and 0 <= d.link_utilization <= 1
    assert d.break_even and len(d.scan) == 4


def test_a_slow_link_costs_ttft_and_says_how_much_it_needs():
    fast = predict_performance(PredictRequest(**L8, **LONG, request_rate=4, disaggregate="1:1"))
    slow = predict_performance(
        PredictRequest(**L8, **LONG, request_rate=4, disaggregate="1:1", kv_transfer_gbps=10)
    )
    assert slow.ttft_ms.p50 > fast.ttft_ms.p50 + 0.5 * slow.disaggregation.kv_transfer_ms_p50
    assert slow.disaggregation.link_utilization > fast.disaggregation.link_utilization


def test_the_balanced_split_follows_the_pools_rates():
    # long prompts, short answers: prefill dominates, so most workers should prefill
    r = predict_performance(
        PredictRequest(
            **L8, input_tokens=16000, output_tokens=20, request_rate=2, disaggregate="2:2"
        )
    )
    p, d = (int(x) for x in r.disaggregation.balanced_split.split(":"))
    assert p + d == 4 and p > d


def test_a_closed_loop_finds_the_rate_its_clients_offer():
    r = predict_performance(PredictRequest(**L8, **LONG, concurrency=16, disaggregate="1:1"))
    # Little's law: throughput x E2E = concurrency, within the fixed point's tolerance
    assert r.requests_per_s * r.e2e_ms.mean / 1e3 == pytest.approx(16, rel=0.15)


@pytest.mark.parametrize(
    ("value", "needle"), [("0:2", "1 to 64"), ("65:1", "1 to 64"), ("a:b", "disaggregate")]
)
def test_bad_splits_are_refused_naming_the_flag(value, needle):
    cmd = [sys.executable, "-m", "inferwise.server", "predict", "--model", L8["model"]]
    cmd += ["--gpu", L8["gpu"], "--disaggregate", value]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "disaggregate" in p.stderr and needle in p.stderr


def test_a_split_needing_more_gpus_than_allowed_is_refused():
    from inferwise.calculators.disaggregation import parse_split
    from inferwise.calculators.errors import InputError

    req = PredictRequest(**L8, tensor_parallel_size=8, disaggregate="40:40")
    with pytest.raises(InputError, match="disaggregate"):
        parse_split(req, max_gpus=64)


def test_disaggregation_does_not_raise_throughput_on_the_same_gpus():
    """vLLM's docs: disaggregated prefill does not improve throughput (it tunes TTFT and ITL
    apart); at a saturating load the two pools carry no more than the aggregated replicas."""
    r = predict_performance(PredictRequest(**L8, **LONG, request_rate=20, disaggregate="1:1"))
    assert r.output_tokens_per_s <= 1.05 * r.disaggregation.aggregated.output_tokens_per_s


def test_budget_sizes_a_p_d_replica_under_a_tight_itl_target():
    """DistServe's point: under a tight tail-ITL target a P:D pair carries more per GPU than
    two aggregated replicas whose decodes share steps with long prefills (a few per cent of
    the steps carry a prompt, so the p99 feels them where the p95 need not)."""
    from inferwise.calculators.budget import BudgetRequest, decompose_budget

    base = {**L8, **LONG, "request_rate": 4.0}
    base.update(slo_ttft_ms={"p99": 2000}, slo_itl_ms={"p99": 40})
    plain = decompose_budget(BudgetRequest(**base))
    pair = decompose_budget(BudgetRequest(**base, disaggregate="1:1"))
    assert pair.max_rate_under_slo / 2 > plain.max_rate_under_slo
    assert any("1 prefill + 1 decode workers" in a for a in pair.assumptions)


def test_a_split_over_the_gpu_limit_is_exit_2_naming_the_flag():
    cmd = [sys.executable, "-m", "inferwise.server", "predict", "--model", L8["model"]]
    cmd += ["--gpu", L8["gpu"], "--disaggregate", "64:64", "--tensor-parallel-size", "8"]
    cmd += ["--pipeline-parallel-size", "4"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "--disaggregate" in p.stderr and "4096 GPUs" in p.stderr
