"""With a deployment, the simulated engine steps at the roofline model's pace."""

from __future__ import annotations

import httpx
import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.sim import SimConfig, SimServer, build_app


def _ttft_ms(sim: SimServer, rid: str, prompt: str) -> float:
    r = httpx.post(
        sim.base_url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "stream": True},
        headers={"X-Request-Id": rid},
        timeout=30,
    )
    assert r.status_code == 200
    e = sim.send_log[rid]
    return (e.chunks[0][0] - e.arrival_s) * 1000


def test_long_prompts_cost_prefill_time_and_cached_prefixes_save_it():
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel

    cfg = dict(model="Qwen/Qwen3-8B", gpu="h100-sxm-80gb")
    step = StepModel.from_deployment(Deployment(**cfg))
    long_prompt = " ".join(f"w{i}" for i in range(6000))
    with SimServer(**cfg) as sim:
        short = _ttft_ms(sim, "short", "hello")
        engine_limits = (sim.app.engine.max_num_seqs, sim.app.engine.kv_capacity_tokens)
        first = _ttft_ms(sim, "long-1", long_prompt)
        again = _ttft_ms(sim, "long-2", long_prompt)
    assert engine_limits == (step.max_num_seqs, step.kv_capacity_tokens)
    # one prefill step of the 6000-token prompt (it fits the step's token budget), as the roofline says
    assert step.max_num_batched_tokens >= 6000
    assert first == pytest.approx(step.step_ms(6000, 0, 0), rel=0.1, abs=3)
    assert first > short + 10
    assert again < first / 2  # the whole prompt but its last block came from the prefix cache


def test_a_deployment_the_catalog_does_not_know_fails_before_serving():
    with pytest.raises(InputError):
        build_app(SimConfig(model="nobody/nothing-7b", gpu="h100-sxm-80gb"))


def test_an_sglang_deployment_pays_its_front_end_before_the_first_token():
    """The simulated SGLang server delays every request by the per-request cost its factors
    carry, as predict does: TTFT of a short prompt is that cost plus one short prefill. At
    tensor parallel 8 the cost includes rank 0's hand-off of each request to seven others."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel

    cfg = dict(model="Qwen/Qwen3-8B", gpu="h100-sxm-80gb", engine="sglang", tensor_parallel_size=8)
    front = StepModel.from_deployment(Deployment(**cfg)).efficiency.request_overhead_ms
    assert front > 50
    with SimServer(**cfg) as sim:
        sglang = _ttft_ms(sim, "s", "hello")
    with SimServer(**{**cfg, "engine": "vllm"}) as sim:
        vllm = _ttft_ms(sim, "v", "hello")
    assert sglang - vllm == pytest.approx(front, abs=15)
