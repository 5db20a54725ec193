"""Prefix caching in the simulation, predict and budget (issue 15): the physics a user relies on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from step_models import toy_8b

from inferwise.calculators.batching_sim import KvCached, simulate
from inferwise.calculators.budget import BudgetRequest, decompose_budget
from inferwise.calculators.predict import PredictRequest, predict_performance

L8 = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}

model = toy_8b


def test_a_hit_prefills_only_the_missed_tokens_but_attends_to_the_whole_prompt():
    m = model()
    res = simulate(m, [1000], [1], concurrency=1, cached=KvCached([900]))
    expected = m.step_ms(100, 0, 900, prefill_pairs=100 * (900 + 50), sampled=1)
    assert res.ttft_ms[0] == pytest.approx(expected)
    assert res.ttft_ms[0] < simulate(m, [1000], [1], concurrency=1).ttft_ms[0] / 3


def test_shared_prefix_blocks_are_held_once_so_more_requests_run_at_once():
    m = model(kv_capacity_tokens=10_000)
    plain = simulate(m, [4000] * 4, [50] * 4)
    shared = simulate(m, [4000] * 4, [50] * 4, cached=KvCached([3000] * 4, shared_kv_tokens=3000))
    assert plain.max_running == 2
    assert shared.max_running == 4


def test_transferred_kv_of_a_decode_worker_counts_in_the_cache():
    m = model(kv_capacity_tokens=10_000)
    res = simulate(m, [4000] * 4, [50] * 4, cached=KvCached([3999] * 4, own=True))
    assert res.max_running == 2
    # and the prompt costs one token of compute, not four thousand
    assert res.ttft_ms[0] < m.prefill_ms(4000) / 10


def test_hit_rate_0_9_cuts_prefill_work_by_90_percent_and_speeds_up_ttft():
    r = predict_performance(
        PredictRequest(
            **L8, input_tokens=4000, output_tokens=100, concurrency=1, prefix_cache_hit_rate=0.9
        )
    )
    pc = r.prefix_cache
    assert pc is not None
    assert pc.prefill_work_saved_share == pytest.approx(0.9, abs=1e-3)
    assert pc.effective_hit_rate == pytest.approx(0.9)
    assert pc.ttft_speedup > 3
    assert r.ttft_ms.p50 == pytest.approx(pc.ttft_ms_p50_without_cache / pc.ttft_speedup)


def test_no_hits_buy_nothing():
    r = predict_performance(
        PredictRequest(**L8, input_tokens=2000, concurrency=4, prefix_cache_hit_rate=0.0)
    )
    assert r.prefix_cache.ttft_speedup == pytest.approx(1.0)
    assert r.prefix_cache.throughput_speedup == pytest.approx(1.0)


def test_more_prefixes_than_the_cache_holds_lose_their_hits_and_say_so():
    r = predict_performance(
        PredictRequest(
            **L8,
            input_tokens=6000,
            request_rate=1.0,
            prefix_cache_hit_rate=0.8,
            prefix_cache_distinct_prefixes=5000,
        )
    )
    pc = r.prefix_cache
    assert pc.effective_hit_rate < 0.2
    assert any("evicted" in n for n in pc.notes)


def test_budget_carries_more_load_with_hits():
    base = {**L8, "input_tokens": 6000, "output_tokens": 200, "request_rate": 5.0}
    base["slo_ttft_ms"] = {"p95": 300}
    without = decompose_budget(BudgetRequest(**base))
    with_hits = decompose_budget(BudgetRequest(**base, prefix_cache_hit_rate=0.8))
    assert with_hits.max_rate_under_slo > 3 * without.max_rate_under_slo
    assert any("prefix-cache hits on 80%" in a for a in with_hits.assumptions)


@pytest.mark.parametrize("value", ["1.5", "-0.1"])
def test_a_hit_rate_outside_0_1_is_refused_naming_the_flag(value):
    cmd = [sys.executable, "-m", "inferwise.server", "predict", "--model", L8["model"]]
    cmd += ["--gpu", L8["gpu"], "--prefix-cache-hit-rate", value]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "prefix_cache_hit_rate" in p.stderr or "prefix-cache-hit-rate" in p.stderr


def test_the_json_output_carries_the_prefix_cache_block():
    cmd = [sys.executable, "-m", "inferwise.server", "predict", "--model", L8["model"]]
    cmd += ["--gpu", L8["gpu"], "--prefix-cache-hit-rate", "0.5", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["prefix_cache"]["hit_rate"] == 0.5
