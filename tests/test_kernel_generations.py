"""Kernel generations: an engine release older than the kernels the factors were fitted on
gets that generation's rates (data/efficiency.toml [generation.*]), and says so."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferwise.calculators.calibration import generation_factors, kernel_generation
from inferwise.calculators.deployment import Deployment
from inferwise.calculators.roofline import StepModel

EARLY = "mla-moe-early-2025"
R1 = {"model": "deepseek-ai/DeepSeek-R1", "gpu": "h200-sxm-141gb", "tensor_parallel_size": 8}


@pytest.mark.parametrize(
    ("engine", "version", "vendor", "arch", "expected"),
    [
        ("vllm", "0.7.4", "nvidia", "mla-moe", EARLY),
        ("vllm", "0.7.4.dev181+gf35f8e22", "nvidia", "mla-moe", EARLY),
        # vLLM's defaults match the fitted run from 0.11.0 (DeepGEMM, full decode graphs)
        ("vllm", "0.8.4", "nvidia", "mla-moe", EARLY),
        ("vllm", "0.10.2", "nvidia", "mla-moe", EARLY),
        ("vllm", "0.11.0", "nvidia", "mla-moe", None),
        ("sglang", "0.4.3.post2", "nvidia", "mla-moe", EARLY),
        ("sglang", "0.4.4", "nvidia", "mla-moe", None),
        ("trtllm", "0.17.post1.dev", "nvidia", "mla-moe", EARLY),
        ("trtllm", "1.0", "nvidia", "mla-moe", None),
        ("vllm", "0.7.4", "amd", "mla-moe", None),  # no early-2025 ROCm measurement fits it
        ("vllm", "0.7.4", "nvidia", "other", None),  # dense and GQA models: the factors as fitted
        ("vllm", None, "nvidia", "mla-moe", None),  # no release given: the current one
    ],
)
def test_which_releases_run_on_the_early_kernels(engine, version, vendor, arch, expected):
    assert kernel_generation(engine, version, vendor, arch) == expected


def test_an_early_release_gets_the_generations_rates_and_names_them():
    current = StepModel.from_deployment(Deployment(**R1, engine_version="0.11.0"))
    early = StepModel.from_deployment(Deployment(**R1, engine_version="0.7.4"))
    k = float(generation_factors(EARLY)["kernel_fraction"])
    assert 0 < k < 1
    assert early.efficiency.bandwidth_fraction == pytest.approx(
        current.efficiency.bandwidth_fraction * k
    )
    assert early.efficiency.moe_fraction == pytest.approx(current.efficiency.moe_fraction * k)
    assert early.efficiency.step_overhead_ms == current.efficiency.step_overhead_ms
    # the releases' FlashAttention kernels were today's: attention keeps today's rate
    assert early.efficiency.attention_fraction == pytest.approx(current.efficiency.compute_fraction)
    assert early.efficiency.compute_fraction == pytest.approx(
        current.efficiency.compute_fraction * k
    )
    assert any(f"[generation.{EARLY}]" in n for n in early.notes)
    assert f"generation.{EARLY}" in early.efficiency.source
    assert early.decode_ms(8, 4000) > current.decode_ms(8, 4000)


def test_a_dense_model_on_the_same_release_is_not_touched():
    llama = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
    old = StepModel.from_deployment(Deployment(**llama, engine_version="0.7.3"))
    assert "generation." not in old.efficiency.source


def test_early_tensorrt_llm_serves_deepseek_without_cuda_graphs():
    """TensorRT-LLM before 0.18 ran DeepSeek on its PyTorch backend with use_cuda_graph off
    by default: the step model is eager (a decode floor of the host's dispatch) and says so;
    1.x and dense models on the same release keep graphs."""
    early = StepModel.from_deployment(Deployment(**R1, engine="trtllm", engine_version="0.17"))
    current = StepModel.from_deployment(Deployment(**R1, engine="trtllm", engine_version="1.0"))
    assert early.enforce_eager and not current.enforce_eager
    assert any("use_cuda_graph" in n for n in early.notes)
    assert early.decode_ms(4, 3500) >= early.eager_floor_ms() > 2 * current.decode_ms(4, 3500)
    llama = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
    dense = StepModel.from_deployment(Deployment(**llama, engine="trtllm", engine_version="0.17"))
    assert not dense.enforce_eager


def test_vllm_v0_keeps_its_block_managers_watermark_and_v1_skips_admission_on_preemption():
    """vLLM V0 (before 0.8) admits while 1 % of the KV cache stays free; V1 keeps no
    watermark but admits nothing in a step that had to preempt."""
    v0 = StepModel.from_deployment(Deployment(**R1, engine_version="0.7.4"))
    v1 = StepModel.from_deployment(Deployment(**R1, engine_version="0.11.0"))
    assert v0.admission_watermark_tokens == int(0.01 * v0.kv_capacity_tokens) > 0
    assert v1.admission_watermark_tokens == 0
    # V1 instead starts nothing new in a step that preempted; V0 schedules prefills first
    assert v1.no_admission_after_preemption and not v0.no_admission_after_preemption


def test_only_sglang_reserves_the_running_requests_outputs():
    """SGLang's new-token-ratio admission is SGLang's; vLLM and TensorRT-LLM have their own."""
    assert StepModel.from_deployment(Deployment(**R1, engine="sglang")).reserves_future_tokens
    for engine in ("vllm", "trtllm"):
        assert not StepModel.from_deployment(Deployment(**R1, engine=engine)).reserves_future_tokens


def test_sglang_and_vllm_v0_run_prompt_steps_without_cuda_graphs():
    """SGLang replays CUDA graphs for decode batches only, vLLM V0 for decode-only steps: a
    short prompt's step lasts at least the host's dispatch of every layer, while a decode
    step keeps its graph. vLLM V1 (piecewise graphs) and TensorRT-LLM (C++ launches) do not
    pay it, and an eager deployment pays it on every step anyway."""
    qwen = {"model": "Qwen/Qwen3-235B-A22B", "gpu": "b200", "tensor_parallel_size": 8}
    sglang = StepModel.from_deployment(Deployment(**qwen, engine="sglang", engine_version="0.5.6"))
    v0 = StepModel.from_deployment(Deployment(**qwen, engine_version="0.7.3"))
    v1 = StepModel.from_deployment(Deployment(**qwen, engine_version="0.11.0"))
    trt = StepModel.from_deployment(Deployment(**qwen, engine="trtllm"))
    assert sglang.prefill_eager and v0.prefill_eager
    assert not v1.prefill_eager and not trt.prefill_eager
    assert any("without CUDA graphs" in n for n in sglang.notes)
    floor = sglang.eager_floor_ms()
    assert sglang.step_ms(64, 0, 0) >= floor * (1 - 1e-9)
    assert floor > v1.step_ms(64, 0, 0)
    graphed_decode = replace(sglang, prefill_eager=False).decode_ms(8, 1000)
    assert sglang.decode_ms(8, 1000) == pytest.approx(graphed_decode)  # decode replays its graph
    assert graphed_decode < floor
    # a long prompt hides the dispatch behind the GPU's work: no floor on top of it
    gpu_bound = sglang.breakdown(60_000, 0, 0)
    assert gpu_bound.total_ms > floor
    graphed = replace(sglang, prefill_eager=False)
    assert gpu_bound.total_ms == pytest.approx(graphed.step_ms(60_000, 0, 0))
    assert sglang.step_ms(64, 0, 0) > graphed.step_ms(64, 0, 0)


def test_sglang_moe_layers_on_rocm_carry_a_decode_floor_of_their_own():
    """SGLang on MI300X: a routed-expert layer adds [vendor.amd.engine.sglang]
    moe_layer_overhead_us to a step's fixed cost (its fused-MoE launches), so a MoE model's
    batch-1 decode is slower than its weight reads. vLLM on the same GPU pays none (the fit
    does not speak for its kernels); SGLang on an NVIDIA GPU pays the far smaller floor fitted
    there ([vendor.nvidia.engine.sglang], with its overlap scheduler's small step cost)."""
    coder = {
        "model": "Qwen/Qwen3-Coder-480B-A35B-Instruct",
        "tensor_parallel_size": 8,
        "max_model_len": 8192,
        "quantization": "fp8",
    }
    amd = StepModel.from_deployment(Deployment(**coder, gpu="mi300x", engine="sglang"))
    assert amd.efficiency.moe_layer_overhead_us > 100 and amd.shape.moe_layers == 62
    assert "vendor.amd.engine.sglang" in amd.efficiency.source
    rocm_vllm = StepModel.from_deployment(Deployment(**coder, gpu="mi300x", engine="vllm"))
    assert rocm_vllm.efficiency.moe_layer_overhead_us == 0
    nvidia = StepModel.from_deployment(Deployment(**coder, gpu="h200", engine="sglang"))
    assert 0 < nvidia.efficiency.moe_layer_overhead_us < amd.efficiency.moe_layer_overhead_us / 5
    floor_ms = amd.efficiency.moe_layer_overhead_us * amd.shape.moe_layers * 1e-3
    without = replace(amd, efficiency=replace(amd.efficiency, moe_layer_overhead_us=0.0))
    assert amd.decode_ms(1, 600) == pytest.approx(without.decode_ms(1, 600) + floor_ms)
