"""KV cache bytes per token and vLLM's block/group rules, against hand-computed values."""

from __future__ import annotations

import pytest

from inferwise.calculators import engine_policy as ep
from inferwise.calculators.architecture import from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.errors import InputError
from inferwise.calculators.kv_cache import kv_bytes_per_token

GiB = 1 << 30


def arch_of(model_id: str):
    return from_config(load_model(model_id).config)


def test_llama31_8b_bf16_kv_is_128_kib_per_token():
    kv = kv_bytes_per_token(arch_of("meta-llama/Llama-3.1-8B-Instruct"), "auto")
    # 2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
    assert kv.per_gpu == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv.per_layer == {"full": 4096}


def test_fp8_kv_halves_bytes():
    arch = arch_of("meta-llama/Llama-3.1-8B-Instruct")
    assert kv_bytes_per_token(arch, "fp8").per_gpu * 2 == kv_bytes_per_token(arch, "auto").per_gpu


def test_tensor_parallel_splits_kv_heads_then_replicates_them():
    arch = arch_of("meta-llama/Llama-3.1-70B-Instruct")  # 8 KV heads
    per_tp = {tp: kv_bytes_per_token(arch, "auto", tp).per_gpu for tp in (1, 2, 4, 8, 16)}
    assert per_tp[1] == 2 * 80 * 8 * 128 * 2
    assert per_tp[2] == per_tp[1] // 2 and per_tp[8] == per_tp[1] // 8
    # 16 ranks, 8 heads: each rank still keeps one full head
    assert per_tp[16] == per_tp[8]
    assert kv_bytes_per_token(arch, "auto", 16).total == per_tp[16] * 16


def test_mla_latent_is_not_split_by_tensor_parallelism():
    arch = arch_of("deepseek-ai/DeepSeek-V3")
    one = kv_bytes_per_token(arch, "auto", 1)
    eight = kv_bytes_per_token(arch, "auto", 8)
    assert one.per_gpu == 61 * (512 + 64) * 2 == 70_272
    assert eight.per_gpu == one.per_gpu


def test_pipeline_parallel_splits_layers_and_the_largest_stage_decides():
    arch = arch_of("meta-llama/Llama-3.1-8B-Instruct")
    kv = kv_bytes_per_token(
        arch, "auto", 1, 3
    )  # 32 layers -> 11, 11, 10 (remainder before the last)
    assert kv.per_gpu == 11 * 4096
    assert [sum(s.values()) for s in kv.layers_per_stage] == [11, 11, 10]


def test_unknown_kv_dtype_names_the_flag():
    with pytest.raises(InputError) as err:
        kv_bytes_per_token(arch_of("Qwen/Qwen3-8B"), "int3")
    assert err.value.field == "kv_cache_dtype"


def test_uniform_model_blocks_and_tokens_follow_kv_cache_utils():
    arch = arch_of("meta-llama/Llama-3.1-8B-Instruct")
    rules = ep.vllm_rules("0.11.0")
    kv = kv_bytes_per_token(arch, "auto")
    layout = ep.vllm_kv_layout(arch, rules, kv.layers_per_stage, 4096, 16)
    cap = ep.kv_capacity(layout, rules, [10 * GiB], 32768, 2048)
    # num_blocks = available // page_size // layers
    assert cap.num_blocks == 10 * GiB // (16 * 4096) // 32 == 5120
    assert cap.kv_cache_tokens == 5120 * 16
    assert cap.max_concurrency == pytest.approx(5120 / (32768 / 16))


def test_gpt_oss_hybrid_groups_and_window_bounded_requests():
    arch = arch_of("openai/gpt-oss-20b")  # 12 sliding (window 128) + 12 full layers
    rules = ep.vllm_rules("0.11.0")
    kv = kv_bytes_per_token(arch, "auto")
    layout = ep.vllm_kv_layout(arch, rules, kv.layers_per_stage, kv.per_layer["full"], 16)
    assert layout.groups == ("full", "sliding") and layout.group_size_per_stage == (12,)
    # full: every token; sliding: min(128 - 1 + 8192, L) tokens + 1 block
    assert ep.blocks_per_request(layout, 131072, 8192) == 8192 + (-(-8319 // 16) + 1)
    cap = ep.kv_capacity(layout, rules, [20 * GiB], 131072, 8192)
    assert cap.num_blocks == 20 * GiB // (16 * 2048) // 12
    assert cap.kv_cache_tokens == cap.num_blocks // 2 * 16  # before 0.21: blocks // groups


def test_kv_token_report_follows_concurrency_from_0_21():
    arch = arch_of("openai/gpt-oss-20b")
    old, new = ep.vllm_rules("0.19.0"), ep.vllm_rules("0.24.0")
    kv = kv_bytes_per_token(arch, "auto")
    lay_old = ep.vllm_kv_layout(arch, old, kv.layers_per_stage, 2048, 16)
    lay_new = ep.vllm_kv_layout(arch, new, kv.layers_per_stage, 2048, 16)
    a = ep.kv_capacity(lay_old, old, [20 * GiB], 131072, 8192)
    b = ep.kv_capacity(lay_new, new, [20 * GiB], 131072, 8192)
    assert a.num_blocks == b.num_blocks
    assert b.kv_cache_tokens == int(b.max_concurrency * 131072)
    assert b.kv_cache_tokens > a.kv_cache_tokens  # windows no longer counted as full context


def test_gemma3_groups_five_sliding_per_full_layer():
    arch = arch_of("google/gemma-3-12b-it")  # 40 sliding + 8 full
    rules = ep.vllm_rules("0.11.0")
    kv = kv_bytes_per_token(arch, "auto")
    layout = ep.vllm_kv_layout(arch, rules, kv.layers_per_stage, kv.per_layer["full"], 16)
    assert layout.groups.count("full") == 1 and layout.groups.count("sliding") == 5
    assert layout.group_size_per_stage == (8,)


def test_before_the_hybrid_manager_sliding_layers_cache_everything():
    arch = arch_of("google/gemma-2-9b-it")
    rules = ep.vllm_rules("0.9.0")
    kv = kv_bytes_per_token(arch, "auto")
    layout = ep.vllm_kv_layout(arch, rules, kv.layers_per_stage, kv.per_layer["full"], 16)
    assert layout.groups == ("full",) and layout.group_size_per_stage == (arch.num_layers,)


def test_mla_block_size_follows_the_attention_kernel():
    arch = arch_of("deepseek-ai/DeepSeek-V3")
    assert ep.vllm_default_block_size(arch, "h200-sxm-141gb")[0] == 64
    assert ep.vllm_default_block_size(arch, "b200")[0] == 128
    assert ep.vllm_default_block_size(arch_of("Qwen/Qwen3-8B"), "h100-sxm-80gb")[0] == 16


def test_engine_version_rules_and_nearest_known_release():
    assert not ep.vllm_rules("0.6.4").v1
    assert (
        ep.vllm_rules("0.10.1").hybrid_kv_manager and not ep.vllm_rules("0.9.2").hybrid_kv_manager
    )
    assert (
        ep.vllm_rules("0.21.0").cuda_graphs_in_budget
        and not ep.vllm_rules("0.20.1").cuda_graphs_in_budget
    )
    r = ep.vllm_rules("0.15.3")
    assert r.rules_from == "0.11.0" and any("0.11.0" in n for n in r.notes)
    with pytest.raises(InputError) as err:
        ep.vllm_rules("latest-ish")
    assert err.value.field == "engine_version"


def test_sglang_pool_is_free_memory_after_weights_minus_the_static_margin():
    tokens, rest = ep.sglang_max_total_tokens(80 * GiB, 16 * GiB, 0.88, 131072)
    expected_rest = 80 * GiB - 16 * GiB - ep.SGLANG_CONTEXT_OVERHEAD_GIB * GiB - 80 * GiB * 0.12
    assert rest == pytest.approx(expected_rest)
    assert tokens == int(expected_rest // 131072)
    assert ep.sglang_default_mem_fraction(8) < ep.sglang_default_mem_fraction(1)
