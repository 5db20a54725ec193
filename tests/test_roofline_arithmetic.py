"""The per-step roofline against hand-computed cases.

Efficiency factors are set to round numbers here so each expected value can
be computed by hand; the calibrated factors are tested in
test_predict_calibration.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from inferwise.calculators.deployment import Deployment
from inferwise.calculators.errors import InputError
from inferwise.calculators.roofline import Efficiency, Hardware, ModelShape, StepModel, dense_shape

# Llama-3.1-8B: 8,030,261,248 parameters, vocab 128,256, hidden 4,096, 32 layers,
# 32 query heads, 8 KV heads of 128 (HF config.json).
LLAMA8B_PARAMS = 8_030_261_248
EMBED = 128_256 * 4_096
H100 = Hardware(
    "h100-sxm-80gb",
    peak_tflops=989.5,
    bandwidth_gb_per_s=3350,
    interconnect="nvlink",
    link_gb_per_s=450,
)
IDEAL = Efficiency(
    compute_fraction=1.0,
    bandwidth_fraction=1.0,
    step_overhead_ms=0.0,
    per_seq_overhead_ms=0.0,
    allreduce_latency_us=0.0,
    link_fraction=1.0,
)


def llama8b(eff: Efficiency = IDEAL, **kw) -> StepModel:
    shape = dense_shape(
        "llama-3.1-8b",
        LLAMA8B_PARAMS,
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        head_dim=128,
        num_kv_heads=8,
        vocab_size=128_256,
    )
    return StepModel(shape, H100, eff, **kw)


def test_decode_batch1_reads_every_weight_once():
    # Per step: every matmul weight (all but the input embedding) once, bf16.
    weight_bytes = (LLAMA8B_PARAMS - EMBED) * 2
    assert weight_bytes == pytest.approx(15.01e9, rel=1e-3)
    step = llama8b().breakdown(prefill_tokens=0, decode_seqs=1, kv_tokens=0)
    assert step.memory_ms == pytest.approx(weight_bytes / 3.35e12 * 1e3, rel=1e-9)  # 4.48 ms
    assert step.bound == "memory-bandwidth"
    # The figure: ~16.06 GB of checkpoint / 3.35 TB/s x efficiency. Our bytes are the
    # checkpoint minus the embedding table, which decode looks up rather than reads.
    assert (LLAMA8B_PARAMS * 2 - weight_bytes) == pytest.approx(EMBED * 2)


def test_decode_reads_the_kv_of_every_running_sequence():
    m = llama8b()
    kv_per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 heads of 128, bf16 = 131,072 B
    base = m.breakdown(0, 64, 0).memory_ms
    with_kv = m.breakdown(0, 64, 64 * 2000).memory_ms
    assert with_kv - base == pytest.approx(64 * 2000 * kv_per_token / 3.35e12 * 1e3, rel=1e-9)


def test_prefill_flops_are_two_per_parameter_per_token_plus_attention():
    m = llama8b()
    tokens = 4096
    step = m.breakdown(tokens, 0, 0, sampled=1)
    body = LLAMA8B_PARAMS - 2 * EMBED  # matmuls other than the LM head
    attention = 2 * 32 * (128 + 128) * 32 * tokens * tokens / 2  # QK^T and PV over the causal half
    expected = 2 * body * tokens + 2 * EMBED * 1 + attention
    assert step.flops == pytest.approx(expected, rel=1e-9)
    assert step.compute_ms == pytest.approx(expected / 989.5e12 * 1e3, rel=1e-9)
    assert step.bound == "compute"


def test_efficiency_fractions_scale_the_roofline_terms():
    eff = Efficiency(0.5, 0.8, 1.5, 0.01, 0.0, 1.0)
    ideal, real = llama8b(), llama8b(eff)
    assert real.breakdown(0, 1, 0).memory_ms == pytest.approx(
        ideal.breakdown(0, 1, 0).memory_ms / 0.8
    )
    assert real.breakdown(4096, 0, 0).compute_ms == pytest.approx(
        ideal.breakdown(4096, 0, 0).compute_ms / 0.5
    )
    # Overhead: per step plus per sampled sequence.
    assert real.breakdown(0, 10, 0).overhead_ms == pytest.approx(1.5 + 10 * 0.01)
    # The step takes the larger roofline term plus overhead.
    b = real.breakdown(0, 10, 1000)
    assert b.total_ms == pytest.approx(
        max(b.compute_ms, b.memory_ms) + b.communication_ms + b.overhead_ms
    )


def test_eager_mode_is_a_floor_of_the_hosts_dispatch_not_a_surcharge():
    """Without CUDA graphs a step lasts at least step overhead + 32 layers x 300 us (the host
    launching every kernel); a step with more GPU work than that is unchanged, and the
    simulator's decode line (a floor term) agrees with the step model."""
    eff = Efficiency(0.5, 0.8, 1.0, 0.0, 0.0, 1.0, eager_layer_overhead_us=300.0)
    graphs, eager = llama8b(eff), llama8b(eff, enforce_eager=True)
    assert eager.eager_floor_ms() == pytest.approx(1.0 + 32 * 0.3)
    small = graphs.breakdown(0, 1, 0)
    assert small.total_ms < 10.6
    assert eager.breakdown(0, 1, 0).total_ms == pytest.approx(10.6)
    big = graphs.breakdown(8192, 0, 0)
    assert big.total_ms > 10.6
    assert eager.breakdown(8192, 0, 0).total_ms == pytest.approx(big.total_ms)
    line = eager.decode_line(1)
    assert max(line.c0, line.m0, line.floor) + line.fixed == pytest.approx(
        eager.breakdown(0, 1, 0).total_ms
    )
    assert graphs.decode_line(1).floor == -math.inf


def test_tensor_parallel_all_reduce_is_two_per_layer_with_latency_and_ring_bandwidth():
    eff = Efficiency(1.0, 1.0, 0.0, 0.0, allreduce_latency_us=10.0, link_fraction=0.5)
    m = llama8b(eff, tensor_parallel_size=4)
    tokens = 1000
    msg = tokens * 4096 * 2
    ring = 2 * 3 / 4 * msg / (450e9 * 0.5)
    expected = 2 * 32 * (10e-6 + ring) * 1e3
    assert m.breakdown(tokens, 0, 0).communication_ms == pytest.approx(expected, rel=1e-9)
    # Compute and weight reads split four ways.
    assert m.breakdown(0, 1, 0).memory_ms == pytest.approx(
        llama8b(eff).breakdown(0, 1, 0).memory_ms / 4
    )


def test_moe_decode_reads_the_experts_the_batch_touches():
    shape = ModelShape(
        name="moe",
        num_layers=2,
        hidden_size=1024,
        dense_params=1e8,
        attn_flops_per_pair=0.0,
        dense_weight_bytes=2e8,
        kv_bytes_per_token=0.0,
        num_experts=64,
        experts_per_token=4,
        expert_params=1e7,
        expert_weight_bytes=2e7,
        moe_layers=2,
    )
    assert shape.expected_experts_touched(1) == pytest.approx(4)
    assert shape.expected_experts_touched(16) == pytest.approx(64 * (1 - (1 - 4 / 64) ** 16))
    assert shape.expected_experts_touched(10_000) == pytest.approx(64)
    m = StepModel(shape, H100, IDEAL)
    b1 = m.breakdown(0, 1, 0)
    assert b1.bytes == pytest.approx(2e8 + 2 * 4 * 2e7)
    # Compute follows the active parameters only: 2 x (dense + 2 layers x 4 experts x 1e7) per token.
    b8 = m.breakdown(0, 8, 0)
    assert b8.flops == pytest.approx(2 * (1e8 + 2 * 4 * 1e7) * 8)


def test_prefill_ms_chunks_long_prompts_at_the_batch_token_budget():
    m = llama8b(max_num_batched_tokens=2048)
    alone = m.prefill_ms(6000)
    chunks = [2048, 2048, 1904]
    done = 0
    expected = 0.0
    for c in chunks:
        expected += m.step_ms(
            c, 0, done, prefill_pairs=c * (done + c / 2), sampled=1 if c == 1904 else 0
        )
        done += c
    assert alone == pytest.approx(expected)


@pytest.mark.parametrize("eager", [False, True])
def test_decode_line_matches_the_full_step_model(eager):
    eff = Efficiency(0.5, 0.8, 1.5, 0.01, 12.0, 0.7, eager_layer_overhead_us=700.0)
    m = llama8b(eff, tensor_parallel_size=2, enforce_eager=eager)
    c0, c1, m0, m1, k, floor, _, _ = m.decode_line(48)
    for kv in (0, 10_000, 2_000_000):  # the eager floor binds at the first, not the last
        line = max(c0 + c1 * kv, m0 + m1 * kv, floor) + k
        assert line == pytest.approx(m.step_ms(0, 48, kv))


def sliding(m: StepModel, window: int, share: float) -> StepModel:
    return replace(m, shape=replace(m.shape, sliding_window=window, sliding_share=share))


def test_sliding_window_layers_stop_reading_past_the_window():
    """Half the layers see 128 tokens: a batch whose contexts are all past the window reads
    half the KV a full-attention model would, plus the windows; below it, the same."""
    eff = Efficiency(0.5, 0.8, 0.0, 0.0, 0.0, 1.0)
    full = llama8b(eff)
    swa = sliding(full, 128, 0.5)
    assert swa.breakdown(0, 8, 8 * 100).bytes == full.breakdown(0, 8, 8 * 100).bytes
    weights = full.breakdown(0, 8, 0).bytes
    kv_full = full.breakdown(0, 8, 8 * 32_000).bytes - weights
    kv_swa = swa.breakdown(0, 8, 8 * 32_000).bytes - weights
    assert kv_swa == pytest.approx(kv_full * (0.5 + 0.5 * 128 / 32_000))
    # a 32k prompt scores each query against at most 128 keys in the windowed half
    pairs = 32_000 * 32_000 / 2
    f_full = full.breakdown(32_000, 0, 0, prefill_pairs=pairs).flops
    f_swa = swa.breakdown(32_000, 0, 0, prefill_pairs=pairs).flops
    attn = full.shape.attn_flops_per_pair
    assert f_full - f_swa == pytest.approx(attn * 0.5 * (pairs - 32_000 * 128))


@pytest.mark.parametrize("kv", [0, 48 * 100, 48 * 128, 48 * 5_000, 2_000_000])
def test_decode_line_matches_the_step_model_with_sliding_windows(kv):
    eff = Efficiency(0.5, 0.8, 1.5, 0.01, 12.0, 0.7)
    m = sliding(llama8b(eff, tensor_parallel_size=2), 128, 0.5)
    line = m.decode_line(48)
    a = line.attended_tokens(kv)
    assert max(line.c0 + line.c1 * a, line.m0 + line.m1 * a, line.floor) + line.fixed == (
        pytest.approx(m.step_ms(0, 48, kv))
    )


# --------------------------------------------------------------------------- from the catalogs


@pytest.fixture(scope="module")
def l8():
    return StepModel.from_deployment(
        Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100-sxm-80gb")
    )


def test_catalog_llama8b_weights_and_kv_match_the_hand_figures(l8):
    s = l8.shape
    assert s.dense_weight_bytes == pytest.approx((LLAMA8B_PARAMS - EMBED) * 2, rel=0.005)
    assert s.kv_bytes_per_token == 131_072
    assert s.num_experts == 0
    assert l8.hardware.bandwidth_gb_per_s == 3350
    assert l8.kv_capacity_tokens > 100_000
    # vLLM's OpenAI-server defaults on an 80 GB H100.
    assert (l8.max_num_seqs, l8.max_num_batched_tokens) == (1024, 8192)


def test_a100_gets_vllms_smaller_default_batch():
    m = StepModel.from_deployment(
        Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="a100-sxm-80gb")
    )
    assert (m.max_num_seqs, m.max_num_batched_tokens) == (256, 2048)


def test_fp8_kv_cache_halves_kv_bytes_and_fp8_weights_use_fp8_gemms():
    base = StepModel.from_deployment(
        Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100")
    )
    kv8 = StepModel.from_deployment(
        Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100", kv_cache_dtype="fp8")
    )
    assert kv8.shape.kv_bytes_per_token == base.shape.kv_bytes_per_token / 2
    w8 = StepModel.from_deployment(
        Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100", quantization="fp8")
    )
    assert w8.hardware.peak_tflops == 1979
    # One byte per body weight; the LM head stays bf16 (vLLM does not quantize it).
    expected = (LLAMA8B_PARAMS - 2 * EMBED) * 1 + EMBED * 2
    assert w8.shape.dense_weight_bytes == pytest.approx(expected, rel=0.01)
    # No FP8 units on A100: FP8 weights still halve the bytes but GEMMs run at the BF16 rate.
    a100 = StepModel.from_deployment(
        Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="a100", quantization="fp8")
    )
    assert a100.hardware.peak_tflops == 312


def test_tensor_parallel_over_pcie_is_slower_than_over_nvlink():
    def comm(gpu: str, tokens: int) -> float:
        m = StepModel.from_deployment(
            Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu=gpu, tensor_parallel_size=2)
        )
        return m.breakdown(tokens, 0, 0).communication_ms

    for tokens in (1, 64, 4096):
        assert comm("h100-pcie-80gb", tokens) > comm("h100-sxm-80gb", tokens)


def test_moe_catalog_model_reads_fewer_bytes_at_batch_one_than_its_total():
    m = StepModel.from_deployment(Deployment(model="Qwen/Qwen3-30B-A3B", gpu="h100"))
    s = m.shape
    assert s.num_experts == 128 and s.experts_per_token == 8
    assert s.active_params == pytest.approx(3.0e9, rel=0.1)
    b1 = m.breakdown(0, 1, 0)
    total_bytes = s.dense_weight_bytes + s.moe_layers * s.num_experts * s.expert_weight_bytes
    assert b1.bytes < 0.2 * total_bytes
    assert m.breakdown(0, 512, 0).bytes == pytest.approx(total_bytes, rel=0.01)


def test_unknown_gpu_or_memory_only_gpu_is_an_input_error():
    with pytest.raises(InputError) as e:
        StepModel.from_deployment(Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h900"))
    assert e.value.field == "gpu"
    with pytest.raises(InputError) as e:
        StepModel.from_deployment(
            Deployment(model="meta-llama/Llama-3.1-8B-Instruct", gpu_memory_gib=80)
        )
    assert e.value.field == "gpu"


def test_deployment_that_does_not_fit_is_an_input_error():
    with pytest.raises(InputError) as e:
        StepModel.from_deployment(Deployment(model="meta-llama/Llama-3.1-70B-Instruct", gpu="h100"))
    assert e.value.field == "model"
    assert "does not fit" in e.value.message


def test_bound_names_the_largest_term():
    m = llama8b(Efficiency(0.5, 0.8, 1.5, 0.0, 0.0, 1.0))
    assert m.breakdown(8192, 0, 0).bound == "compute"
    assert m.breakdown(0, 8, 8000).bound == "memory-bandwidth"
    tiny = StepModel(
        dense_shape(
            "tiny",
            2e7,
            num_layers=4,
            hidden_size=256,
            num_heads=4,
            head_dim=64,
            num_kv_heads=4,
            vocab_size=1000,
        ),
        H100,
        Efficiency(0.5, 0.8, 1.5, 0.0, 0.0, 1.0),
    )
    assert tiny.breakdown(0, 1, 0).bound == "overhead"
    pcie = Hardware("pcie", 989.5, 3350, "pcie", 8.0)
    slow_link = StepModel(
        dense_shape(
            "small",
            1e9,
            num_layers=16,
            hidden_size=2048,
            num_heads=16,
            head_dim=128,
            num_kv_heads=8,
            vocab_size=32000,
        ),
        pcie,
        Efficiency(0.5, 0.8, 0.1, 0.0, 40.0, 0.5),
        tensor_parallel_size=8,
    )
    assert slow_link.breakdown(0, 1, 0).bound == "communication"
    assert math.isfinite(slow_link.step_ms(0, 1, 0))


def test_step_model_is_shared_by_requests_with_the_same_deployment() -> None:
    """predict/budget requests differing only in workload reuse one step model (MCP sessions)."""
    from inferwise.calculators.predict import PredictRequest

    dep = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100"}
    a = StepModel.from_deployment(PredictRequest(**dep, input_tokens=100))
    b = StepModel.from_deployment(PredictRequest(**dep, input_tokens=2000, concurrency=4))
    c = StepModel.from_deployment(PredictRequest(**dep, tensor_parallel_size=2))
    assert a is b
    assert c is not a and c.tensor_parallel_size == 2


def test_tensor_parallel_beyond_the_node_crosses_the_network():
    """TP 16 on 8-GPU H100 nodes: each all-reduce pays the network's latency, rings inside
    each node over NVLink and sends each GPU's 1/8 shard over its NIC (40 GB/s); the
    deployment says so. GB200's NVLink domain holds 72 GPUs, so TP 16 stays on NVLink there."""
    from dataclasses import replace as dc_replace

    from inferwise.calculators.roofline import SCALE_OUT_FRACTION, SCALE_OUT_LATENCY_US

    eff = Efficiency(1.0, 1.0, 0.0, 0.0, allreduce_latency_us=10.0, link_fraction=0.5)
    tokens = 1000
    msg = tokens * 4096 * 2
    two_nodes = llama8b(eff, tensor_parallel_size=16)
    inside = 2 * 7 / 8 * msg / (450e9 * 0.5)
    between = 2 * 1 / 2 * (msg / 8) / (50e9 * SCALE_OUT_FRACTION)
    expected = 2 * 32 * ((10.0 + SCALE_OUT_LATENCY_US) * 1e-6 + inside + between) * 1e3
    assert two_nodes.breakdown(tokens, 0, 0).communication_ms == pytest.approx(expected, rel=1e-9)
    one_domain = dc_replace(two_nodes, hardware=dc_replace(H100, scale_up_gpus=16))
    assert one_domain.breakdown(tokens, 0, 0).communication_ms < expected
    # decode (small messages): the network's latency is most of the difference
    d2, d1 = two_nodes.breakdown(0, 1, 100), one_domain.breakdown(0, 1, 100)
    assert d2.communication_ms - d1.communication_ms == pytest.approx(
        2 * 32 * SCALE_OUT_LATENCY_US * 1e-3, rel=0.2
    )

    dsr1 = {"model": "deepseek-ai/DeepSeek-R1", "tensor_parallel_size": 16, "max_model_len": 8192}
    h100 = StepModel.from_deployment(Deployment(gpu="h100-sxm-80gb", **dsr1))
    assert any("spans 2 nodes of 8" in n for n in h100.notes)
    gb200 = StepModel.from_deployment(Deployment(gpu="gb200", **dsr1))
    assert not any("nodes of" in n for n in gb200.notes)


def test_a_pipeline_stage_boundary_between_nodes_goes_over_the_network():
    from inferwise.calculators.roofline import SCALE_OUT_FRACTION, SCALE_OUT_LATENCY_US

    eff = Efficiency(1.0, 1.0, 0.0, 0.0, allreduce_latency_us=10.0, link_fraction=0.5)
    msg = 1000 * 4096 * 2
    tp8 = llama8b(eff, tensor_parallel_size=8).breakdown(1000, 0, 0).communication_ms
    across = llama8b(eff, tensor_parallel_size=8, pipeline_parallel_size=2)
    hop = ((10.0 + SCALE_OUT_LATENCY_US) * 1e-6 + msg / (50e9 * SCALE_OUT_FRACTION)) * 1e3
    assert across.breakdown(1000, 0, 0).communication_ms == pytest.approx(tp8 + hop, rel=1e-9)
    within = llama8b(eff, tensor_parallel_size=4, pipeline_parallel_size=2)
    tp4 = llama8b(eff, tensor_parallel_size=4).breakdown(1000, 0, 0).communication_ms
    assert within.breakdown(1000, 0, 0).communication_ms == pytest.approx(
        tp4 + (10e-6 + msg / (450e9 * 0.5)) * 1e3, rel=1e-9
    )


def test_an_mla_layer_adds_its_own_floor_to_the_step():
    """mla_layer_overhead_us is charged once per MLA layer per step, whatever the batch, and
    only to models whose attention is latent (DeepSeek-R1: all 61 layers); a grouped-query
    model's step is untouched by it."""
    from dataclasses import replace

    r1 = StepModel.from_deployment(
        Deployment(model="deepseek-ai/DeepSeek-R1", gpu="h200-sxm-141gb", tensor_parallel_size=8)
    )
    assert r1.shape.mla_layers == r1.shape.num_layers == 61
    base = replace(r1.efficiency, mla_layer_overhead_us=0.0)
    floor = replace(r1.efficiency, mla_layer_overhead_us=50.0)
    for batch in (1, 64):
        extra = r1.with_efficiency(floor).decode_ms(batch, 2000) - r1.with_efficiency(
            base
        ).decode_ms(batch, 2000)
        assert extra == pytest.approx(61 * 50e-3, rel=1e-9)
    llama = llama8b(replace(IDEAL, mla_layer_overhead_us=50.0))
    assert llama.shape.mla_layers == 0
    assert llama.decode_ms(1, 2000) == pytest.approx(llama8b().decode_ms(1, 2000), rel=1e-12)


def test_gpt_oss_windows_half_its_layers_and_vllm_frees_them_from_the_hybrid_manager():
    """gpt-oss alternates 128-token sliding-window and full attention layers: every engine's
    kernels read the window only; vLLM's hybrid KV manager (0.10+) also frees the blocks that
    leave it, which the simulator's capacity counts (not assumed for the other engines)."""
    new = StepModel.from_deployment(
        Deployment(model="openai/gpt-oss-20b", gpu="h100-sxm-80gb", engine_version="0.11.0")
    )
    assert (new.shape.sliding_window, new.shape.sliding_share) == (128, 0.5)
    assert new.kv_window_share == 0.5 and not new.kv_reported_per_max_len
    latest = StepModel.from_deployment(
        Deployment(model="openai/gpt-oss-20b", gpu="h100", engine_version="0.21.0")
    )
    assert latest.kv_window_share == 0.5 and latest.kv_reported_per_max_len
    assert any("128-token window" in n for n in new.notes)
    sglang = StepModel.from_deployment(
        Deployment(model="openai/gpt-oss-20b", gpu="h100-sxm-80gb", engine="sglang")
    )
    assert sglang.shape.sliding_window == 128 and sglang.kv_window_share == 0.0


def test_attention_runs_at_the_16_bit_rate_when_the_gemms_run_fp8():
    """FP8 weights double the GEMM rate, not attention's: engines run FlashAttention-style
    kernels on BF16 queries and keys, so a long prompt's attention time stays the BF16 one."""
    bf16 = llama8b()
    fp8 = replace(bf16, hardware=replace(H100, peak_tflops=2 * 989.5, attention_tflops=989.5))
    tokens, pairs = 8192, 8192 * 8192 / 2.0

    def split(m: StepModel) -> tuple[float, float]:
        gemm = m.breakdown(tokens, 0, 0, prefill_pairs=0.0).compute_ms
        return gemm, m.breakdown(tokens, 0, 0, pairs).compute_ms - gemm

    (gemm16, attn16), (gemm8, attn8) = split(bf16), split(fp8)
    assert gemm8 == pytest.approx(gemm16 / 2)
    assert attn8 == pytest.approx(attn16)
    expected_attn_ms = bf16.shape.attn_flops_per_pair * pairs / 989.5e12 * 1e3
    assert attn16 == pytest.approx(expected_attn_ms)


@pytest.mark.parametrize(
    ("weights", "activations", "dtype"),
    [
        (
            {"num_bits": 8, "type": "float", "strategy": "channel"},
            {"num_bits": 8, "type": "float"},
            "fp8",
        ),
        ({"num_bits": 8, "type": "float", "strategy": "channel"}, None, "bf16"),
        (
            {"num_bits": 8, "type": "int", "strategy": "channel"},
            {"num_bits": 8, "type": "int"},
            "int8",
        ),
        ({"num_bits": 8, "type": "int", "strategy": "channel"}, None, "bf16"),
        ({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}, None, "bf16"),
    ],
)
def test_compressed_tensors_gemm_dtype_follows_the_activations_not_the_weights(
    weights: dict, activations: dict | None, dtype: str
) -> None:
    """A compressed-tensors checkpoint runs low-precision GEMMs only where it quantizes the
    activations too (W8A8): FP8 or INT8 weights with 16-bit activations (W8A16) are
    dequantized by vLLM's Marlin kernels for a BF16 GEMM, so they keep the BF16 rate while
    reading a byte per weight. The description says which (it used to decide it)."""
    from inferwise.calculators.catalog import get_gpu
    from inferwise.calculators.quantization import scheme_from_config
    from inferwise.calculators.roofline import compute_dtype

    group: dict = {"targets": ["Linear"], "weights": weights}
    if activations:
        group["input_activations"] = activations
    cfg = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    scheme = scheme_from_config(cfg)
    assert compute_dtype(scheme, get_gpu("h100"))[0] == dtype
    bits = {"fp8": 8, "int8": 8}.get(dtype, 16)
    assert f"W{weights['num_bits']}A{bits}" in scheme.description


def test_nvfp4_runs_fp4_gemms_on_blackwell_and_16_bit_ones_where_there_are_no_fp4_units(tmp_path):
    """ModelOpt NVFP4 quantizes weights and activations (W4A4): vLLM runs CUTLASS FP4 GEMMs
    on Blackwell, at twice its FP8 rate; on Hopper it dequantizes the weights (Marlin) and
    runs 16-bit GEMMs. A compressed-tensors NVFP4 checkpoint without FP4 activations
    (W4A16) runs 16-bit GEMMs everywhere. Both read half a byte (plus scales) per weight."""
    import json

    from inferwise.calculators.catalog import get_gpu, load_model
    from inferwise.calculators.quantization import scheme_from_config
    from inferwise.calculators.roofline import compute_dtype

    config = dict(load_model("Qwen/Qwen3-32B").config)
    config["quantization_config"] = {
        "quant_method": "modelopt",
        "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    b200 = StepModel.from_deployment(Deployment(model=str(tmp_path), gpu="b200"))
    assert b200.hardware.peak_tflops == 9000  # B200 dense FP4
    assert b200.hardware.attention_tflops == 2250  # attention stays at the BF16 rate
    h100 = StepModel.from_deployment(Deployment(model=str(tmp_path), gpu="h100"))
    assert h100.hardware.peak_tflops == 989.5
    bf16 = StepModel.from_deployment(Deployment(model="Qwen/Qwen3-32B", gpu="b200"))
    assert b200.shape.dense_weight_bytes < 0.35 * bf16.shape.dense_weight_bytes
    prompt = bf16.breakdown(8192, 0, 0).compute_ms / b200.breakdown(8192, 0, 0).compute_ms
    assert 2.5 < prompt < 4.0  # GEMMs 4x faster, attention not

    def w4(acts: dict | None) -> str:
        group = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}
        if acts:
            group["input_activations"] = acts
        cfg = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
        return compute_dtype(scheme_from_config(cfg), get_gpu("b200"))[0]

    assert w4({"num_bits": 4, "type": "float"}) == "fp4"
    assert w4(None) == "bf16"
    # the catalog's NVFP4 checkpoint (hf_quant_config.json resolved to modelopt_fp4 as vLLM does)
    catalog = StepModel.from_deployment(Deployment(model="nvidia/Qwen3-32B-NVFP4", gpu="b200"))
    assert catalog.hardware.peak_tflops == 9000
    assert catalog.shape.dense_weight_bytes == pytest.approx(b200.shape.dense_weight_bytes)
