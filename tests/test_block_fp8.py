"""Block-scaled FP8 checkpoints run slower GEMMs than per-tensor FP8 ones.

DeepSeek-V3/R1 store FP8 weights with a scale per 128 x 128 block (``weight_block_size``)
and quantize activations per group of 128 before each GEMM; the engines run block-scaled
kernels, which published timings put near the BF16 rate (vLLM PR 23280). The step model
takes ``Efficiency.block_fp8_fraction`` of the FP8 peak for them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferwise.calculators.deployment import Deployment
from inferwise.calculators.quantization import scheme_from_config
from inferwise.calculators.roofline import StepModel


def test_weight_block_size_marks_a_checkpoint_block_scaled() -> None:
    block = scheme_from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
    per_tensor = scheme_from_config({"quant_method": "fp8"})
    assert block.block_scaled and not per_tensor.block_scaled


@pytest.mark.parametrize(("strategy", "block"), [("block", True), ("channel", False)])
def test_compressed_tensors_block_strategy_is_block_scaled(strategy: str, block: bool) -> None:
    weights = {"num_bits": 8, "type": "float", "strategy": strategy}
    if strategy == "block":
        weights["block_structure"] = [128, 128]
    group = {"targets": ["Linear"], "weights": weights, "input_activations": weights}
    cfg = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    assert scheme_from_config(cfg).block_scaled is block


def test_block_scaled_gemms_run_at_their_share_of_the_fp8_rate() -> None:
    model = StepModel.from_deployment(
        Deployment(model="deepseek-ai/DeepSeek-R1", gpu="h200-sxm-141gb", tensor_parallel_size=8)
    )
    assert model.shape.block_scaled_fp8
    share = model.efficiency.block_fp8_fraction
    assert 0.3 <= share < 1.0  # the stored, fitted share
    at_fp8_rate = replace(model, shape=replace(model.shape, block_scaled_fp8=False))
    # GEMMs only (no attention pairs): their time scales with 1 / share
    gemm = model.breakdown(8_192, 0, 0, prefill_pairs=0.0).compute_ms
    assert gemm == pytest.approx(
        at_fp8_rate.breakdown(8_192, 0, 0, prefill_pairs=0.0).compute_ms / share
    )


def test_without_fp8_units_the_block_rate_does_not_apply() -> None:
    """On an A100 (no FP8 tensor cores) the FP8 weights are dequantized for BF16 GEMMs."""
    model = StepModel.from_deployment(
        Deployment(model="Qwen/Qwen3-30B-A3B-FP8", gpu="a100-sxm-80gb")
    )
    assert not model.shape.block_scaled_fp8


def test_narrow_expert_slices_run_further_from_peak() -> None:
    """Routed-expert GEMMs reach moe_compute_fraction x w / (w + moe_half_width), w one
    expert's intermediate size per rank: DeepSeek-R1's 2,048 split 8 ways (256) runs well
    below Mixtral's 14,336 on one GPU, which sits near the asymptote."""
    mixtral = StepModel.from_deployment(
        Deployment(
            model="mistralai/Mixtral-8x7B-Instruct-v0.1", gpu="h100-sxm-80gb", quantization="fp8"
        )
    )
    deepseek = StepModel.from_deployment(
        Deployment(model="deepseek-ai/DeepSeek-R1", gpu="h200-sxm-141gb", tensor_parallel_size=8)
    )
    e = mixtral.efficiency
    assert e.moe_half_width > 0
    assert mixtral._moe_rate() == pytest.approx(
        e.moe_fraction * 14_336 / (14_336 + e.moe_half_width)
    )
    width = 2_048 / 8
    expected = deepseek.efficiency.moe_fraction * width / (width + e.moe_half_width)
    assert deepseek._moe_rate() == pytest.approx(expected, rel=1e-3)
    assert deepseek._moe_rate() < 0.8 * mixtral._moe_rate()
    off = replace(mixtral, efficiency=replace(e, moe_half_width=0.0))
    assert off._moe_rate() == e.moe_fraction
