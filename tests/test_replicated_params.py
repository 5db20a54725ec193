"""Tensor parallelism does not split every matmul: what each rank multiplies in full.

DeepSeek-R1 (HF config.json): hidden 7,168, 61 layers, q_lora_rank 1,536, kv_lora_rank 512,
qk_rope_head_dim 64, 256 routed experts in 58 MoE layers. vLLM and SGLang keep its query and
KV down-projections and the MoE router as ReplicatedLinear on every rank.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferwise.calculators.architecture import from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.deployment import Deployment
from inferwise.calculators.params import replicated_matmul_params
from inferwise.calculators.roofline import StepModel


def arch_of(model_id: str):
    return from_config(load_model(model_id).config)


def test_deepseek_down_projections_and_router_count_once_per_extra_rank() -> None:
    arch = arch_of("deepseek-ai/DeepSeek-R1")
    per_layer = 7_168 * 1_536 + 7_168 * (512 + 64)  # q_a_proj + kv_a_proj_with_mqa
    router = 58 * 7_168 * 256  # gate weights of the MoE layers
    one_copy = 61 * per_layer + router
    extra = replicated_matmul_params(arch, 8)
    # 7 ranks beyond the first repeat them (the router's score-correction biases add ~0.01 %)
    assert abs(extra / (7 * one_copy) - 1) < 1e-3
    assert replicated_matmul_params(arch, 1) == 0.0


def test_grouped_query_heads_replicate_only_below_one_per_rank() -> None:
    llama70b = arch_of("meta-llama/Llama-3.1-70B-Instruct")  # 8 KV heads
    assert replicated_matmul_params(llama70b, 8) == 0.0
    qwen235b = arch_of("Qwen/Qwen3-235B-A22B")  # 4 KV heads of 128, hidden 4,096, 94 layers
    kv_heads_over = (8 - 4) * 2 * 4_096 * 128 * 94  # each of 8 ranks keeps one K and one V head
    routers = 7 * 94 * 4_096 * 128
    assert replicated_matmul_params(qwen235b, 8) == kv_heads_over + routers


def test_replicated_work_lengthens_a_tensor_parallel_prefill() -> None:
    dep = Deployment(model="deepseek-ai/DeepSeek-R1", gpu="h200-sxm-141gb", tensor_parallel_size=8)
    model = StepModel.from_deployment(dep)
    without = replace(model, shape=replace(model.shape, replicated_params=0.0))
    with_rep, even = model.breakdown(8_192, 0, 0), without.breakdown(8_192, 0, 0)
    # each of the 7 further ranks multiplies all 8,192 tokens by the replicated weights again
    extra_flops = 2 * model.shape.replicated_params * 8_192
    assert with_rep.flops - even.flops == pytest.approx(extra_flops)
    assert extra_flops > 0.15 * even.flops  # about a sixth more GEMM work per rank
    assert with_rep.compute_ms > even.compute_ms
    assert with_rep.communication_ms == even.communication_ms
