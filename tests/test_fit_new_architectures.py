"""Falcon, Llama 4, DeepSeek-V3.2, GLM-4.5, MiniMax-M2 and Kimi-K2: layouts read from
real config.json files (tests/data/configs, sources in its README.md), parameter
counts against the published totals, KV bytes per token computed by hand from
vLLM's cache specs (vllm/v1/kv_cache_interface.py), and what is not modelled
failing closed.

Published figures: Falcon-40B's checkpoint index (metadata.total_size); the
model cards / reports for the others ("GLM-4.5-Air has 106B total, 12B active",
"MiniMax-M2: 230B total, 10B active", Kimi K2's "1T total, 32B activated" and the
Hub's 1026.5B for its checkpoint,
"Llama 4 Scout: 17B active, 109B total", "Maverick: 17B active, 400B total").
Where a report's active count leaves out the embedding and output matrices (GLM,
MiniMax), the test says so and compares like with like.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwise.calculators import engine_policy as ep
from inferwise.calculators.architecture import from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit
from inferwise.calculators.kv_cache import kv_bytes_per_token
from inferwise.calculators.params import count_parameters, weight_bytes
from inferwise.calculators.quantization import resolve_quantization

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def near(value: float, published: float, tolerance: float) -> bool:
    return abs(value - published) / published < tolerance


def embeddings(counts) -> int:
    return counts.embedding + counts.lm_head


# --------------------------------------------------------------------------- Falcon


def test_falcon_40b_matches_its_checkpoint_index_to_the_parameter():
    """metadata.total_size of the bf16 index is 83,671,941,120 bytes; the file also
    stores lm_head.weight, the tied copy of the embedding vLLM does not load twice."""
    arch = from_config(config("tiiuae--falcon-40b"))
    assert arch.family == "falcon" and arch.num_kv_heads == 8 and arch.head_dim == 64
    assert arch.norms_per_layer == 2 and arch.norm_bias and arch.tie_word_embeddings
    counts = count_parameters(arch)
    assert (counts.total + counts.embedding) * 2 == 83_671_941_120
    assert counts.lm_head == 0  # tied: counted once


def test_falcon_40b_kv_cache_is_eight_kv_heads_of_64():
    arch = from_config(config("tiiuae--falcon-40b"))
    # 2 (K, V) x 8 heads x 64 x 2 bytes x 60 layers
    assert kv_bytes_per_token(arch, "auto").per_gpu == 2 * 8 * 64 * 2 * 60
    # TP 8: one head per rank
    assert kv_bytes_per_token(arch, "auto", tensor_parallel_size=8).per_gpu == 2 * 64 * 2 * 60


def test_falcon_7b_is_multi_query_with_one_layernorm_and_the_printed_module_shapes():
    """kimborgen/falcon-llm prints falcon-7b: query_key_value 4544 -> 4672 (71 query heads
    + 1 K + 1 V of 64), dense 4544 -> 4544, dense_h_to_4h 4544 -> 18176, one
    input_layernorm, ln_f, word_embeddings 65024 x 4544, all without biases."""
    arch = from_config(config("tiiuae--falcon-7b"))
    assert arch.num_kv_heads == 1 and arch.norms_per_layer == 1 and arch.mlp_matrices == 2
    h = 4544
    per_layer = h * 4672 + h * h + 2 * h * 18176 + 2 * h
    assert count_parameters(arch).total == 32 * per_layer + 65024 * h + 2 * h
    assert kv_bytes_per_token(arch, "auto").per_gpu == 2 * 1 * 64 * 2 * 32
    assert any("2048 tokens" in n for n in arch.notes)  # the config names no context length


def test_falcon_spellings_agree():
    """The RefinedWeb spelling and transformers' falcon spelling of Falcon-40B are one layout."""
    old = config("tiiuae--falcon-40b")
    new = {
        "model_type": "falcon",
        "architectures": ["FalconForCausalLM"],
        "hidden_size": 8192,
        "num_attention_heads": 128,
        "num_hidden_layers": 60,
        "num_kv_heads": 8,
        "new_decoder_architecture": True,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    }
    assert count_parameters(from_config(old)) == count_parameters(from_config(new))


def test_falcon_40b_fits_two_h100s_with_the_whole_kv_budget():
    result = estimate_fit(
        FitRequest(
            model=str(CONFIGS / "tiiuae--falcon-40b.json"),
            gpu="h100-sxm-80gb",
            tensor_parallel_size=2,
            engine_version="0.11.0",
        )
    )
    assert result.fits
    assert 38.0 < result.per_gpu.weights_gib < 39.0  # 41.3e9 x 2 bytes / 2 GPUs
    assert result.kv_bytes_per_token == 2 * 4 * 64 * 2 * 60


# --------------------------------------------------------------------------- Llama 4


def test_llama4_scout_layers_chunked_moe_and_counts():
    arch = from_config(config("meta-llama--Llama-4-Scout-17B-16E.text_config"))
    # no_rope_layers is [] in the config: transformers' default, every 4th layer global
    assert arch.layer_kinds[:4] == ("chunked", "chunked", "chunked", "full")
    assert arch.layer_kinds.count("chunked") == 36 and arch.attention_chunk_size == 8192
    assert len(arch.moe.moe_layers) == 48 and arch.moe.num_shared_experts == 1
    counts = count_parameters(arch)
    assert near(counts.active_per_token, 17e9, 0.02)
    # 109B published includes the vision tower, which a text config does not have
    assert 0.985 < counts.total / 109e9 < 1.0


def test_llama4_maverick_interleaves_dense_and_moe_layers():
    cfg = config("meta-llama--Llama-4-Maverick-17B-128E")
    arch = from_config(cfg, {"model_type": "llama4_text"})
    assert arch.moe.moe_layers == tuple(range(1, 48, 2))
    assert arch.intermediate_size == 16384  # dense layers: intermediate_size_mlp
    counts = count_parameters(arch)
    assert near(counts.total, 400e9, 0.01)
    assert near(counts.active_per_token, 17e9, 0.02)
    assert any("vision tower" in n for n in arch.notes)


def test_llama4_multimodal_config_fails_closed_naming_the_vision_tower_and_the_text_option():
    with pytest.raises(InputError) as err:
        from_config(config("meta-llama--Llama-4-Maverick-17B-128E"))
    assert "llama4_vision_model" in str(err.value)
    assert "--hf-overrides model_type=llama4_text" in str(err.value)


def test_llama4_chunked_layers_cache_the_whole_context_by_default():
    """vLLM disables the hybrid KV manager for chunked local attention unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1: one group of 48 layers."""
    arch = from_config(config("meta-llama--Llama-4-Scout-17B-16E.text_config"))
    kvb = kv_bytes_per_token(arch, "auto", tensor_parallel_size=4)
    assert kvb.per_gpu == 48 * 2 * 2 * 128 * 2  # 2 KV heads per rank of 8 over TP 4
    rules = ep.vllm_rules("0.11.0")
    layout = ep.vllm_kv_layout(arch, rules, kvb.layers_per_stage, 2 * 2 * 128 * 2, 16)
    assert layout.groups == ("full",) and layout.group_size_per_stage == (48,)
    assert ep.CHUNKED_HYBRID_ENV in " ".join(layout.notes)
    assert ep.blocks_per_request(layout, 131072, 8192) == 131072 // 16


def test_llama4_chunked_groups_with_the_hybrid_manager_keep_one_chunk():
    """With the env var set: 12 full layers, 36 chunked ones -> group size 12, one full
    and three chunked groups; a chunked group holds min(chunk + batched, len) tokens
    (ChunkedLocalAttentionSpec, no extra block)."""
    arch = from_config(config("meta-llama--Llama-4-Scout-17B-16E.text_config"))
    kvb = kv_bytes_per_token(arch, "auto")
    rules = ep.vllm_rules("0.11.0")
    layout = ep.vllm_kv_layout(arch, rules, kvb.layers_per_stage, 4096, 16, chunked_hybrid=True)
    assert layout.groups == ("full", "chunked", "chunked", "chunked")
    assert layout.group_size_per_stage == (12,)
    full = 131072 // 16
    chunk = (8192 + 2048) // 16
    assert ep.blocks_per_request(layout, 131072, 2048) == full + 3 * chunk


def test_llama4_fit_with_the_hybrid_env_var_holds_more_tokens_at_long_context():
    def fit(hybrid: bool):
        return estimate_fit(
            FitRequest(
                model=str(CONFIGS / "meta-llama--Llama-4-Scout-17B-16E.text_config.json"),
                gpu="h100-sxm-80gb",
                tensor_parallel_size=4,
                max_model_len=262144,
                engine_version="0.11.0",
                chunked_local_attn_hybrid=hybrid,
            )
        )

    whole, chunked = fit(False), fit(True)
    assert any(ep.CHUNKED_HYBRID_ENV in a for a in whole.assumptions)
    # the same bytes; a request of 262,144 tokens needs a quarter of the full layers'
    # blocks plus one chunk in the others, so about 3.5x the concurrency
    assert whole.kv_bytes_per_token == chunked.kv_bytes_per_token
    assert 3.0 < chunked.max_concurrency / whole.max_concurrency < 4.0


# --------------------------------------------------------------------------- DeepSeek-V3.2


def _v32() -> dict:
    cfg = dict(load_model("deepseek-ai/DeepSeek-V3").config)
    cfg.update(
        model_type="deepseek_v32",
        architectures=["DeepseekV32ForCausalLM"],
        index_head_dim=128,
        index_n_heads=64,
        index_topk=2048,
    )
    return cfg


def test_deepseek_v32_adds_the_indexer_weights_to_v3():
    v3 = count_parameters(from_config(load_model("deepseek-ai/DeepSeek-V3").config))
    arch = from_config(_v32())
    assert arch.indexer is not None and arch.indexer.cache_bytes_per_token == 132
    v32 = count_parameters(arch)
    # per layer: wq_b 1536 -> 64 x 128, wk 7168 -> 128, k_norm (weight, bias), weights_proj 7168 -> 64
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert v32.total - v3.total == 61 * indexer
    assert near(v32.total, 671.9e9, 0.003)


def test_deepseek_v32_kv_bytes_are_the_latent_plus_the_indexer_key():
    arch = from_config(_v32())
    # bf16 latent: (512 + 64) x 2; indexer: 128 FP8 + one fp32 scale = 132
    assert kv_bytes_per_token(arch, "auto").per_gpu == 61 * (576 * 2 + 132)
    # fp8: vLLM's fp8_ds_mla entry of 656 bytes
    assert kv_bytes_per_token(arch, "fp8").per_gpu == 61 * (656 + 132)
    # not split by TP
    assert kv_bytes_per_token(arch, "fp8", tensor_parallel_size=8).per_gpu == 61 * 788


def test_deepseek_v32_block_size_is_64_even_on_blackwell():
    """vllm/platforms/cuda.py forces 64 for the sparse backend; V3 on a B200 gets 128."""
    v32 = from_config(_v32())
    v3 = from_config(load_model("deepseek-ai/DeepSeek-V3").config)
    assert ep.vllm_default_block_size(v32, "b200")[0] == 64
    assert ep.vllm_default_block_size(v3, "b200")[0] == 128


def test_deepseek_v32_fits_eight_h200s_in_fp8_with_the_indexer_in_the_kv_budget():
    with_indexer = estimate_fit(
        FitRequest(
            model="deepseek-ai/DeepSeek-V3",
            hf_overrides={
                "model_type": "deepseek_v32",
                "index_head_dim": "128",
                "index_n_heads": "64",
                "index_topk": "2048",
            },
            gpu="h200-sxm-141gb",
            tensor_parallel_size=8,
            kv_cache_dtype="fp8",
            max_model_len=65536,
        )
    )
    assert with_indexer.fits and with_indexer.block_size == 64
    assert with_indexer.kv_bytes_per_token == 61 * (656 + 132)
    assert any("indexer" in a for a in with_indexer.assumptions)


def test_deepseek_v32_without_indexer_fields_fails_closed():
    cfg = _v32()
    del cfg["index_head_dim"]
    with pytest.raises(InputError) as err:
        from_config(cfg)
    assert "index_head_dim" in str(err.value)


# --------------------------------------------------------------------------- GLM-4.5


def test_glm45_air_total_and_active():
    arch = from_config(config("zai-org--GLM-4.5-Air"))
    assert arch.family == "glm_moe" and arch.attention_bias and not arch.qk_norm
    assert arch.moe.moe_layers == tuple(range(1, 46))  # first_k_dense_replace = 1
    assert arch.moe.shared_expert_intermediate_size == 1408
    assert any("multi-token" in n for n in arch.notes)  # MTP layer not loaded
    counts = count_parameters(arch)
    assert near(counts.total, 106e9, 0.01)
    # the report's 12B active leaves out the embedding and output matrices
    assert near(counts.active_per_token - embeddings(counts), 12e9, 0.02)


def test_glm45_router_is_held_in_float32():
    """vLLM builds Glm4MoE.gate as nn.Linear(dtype=torch.float32), bias included."""
    arch = from_config(config("zai-org--GLM-4.5-Air"))
    wb = weight_bytes(arch, resolve_quantization(None, None), 2)
    assert wb.by_category["router"] == 45 * (4096 * 128 + 128) * 4


def test_glm45_kv_cache_is_gqa_with_full_head_dim():
    """Partial RoPE rotates half of each head; the cache still holds all 128 values."""
    arch = from_config(config("zai-org--GLM-4.5-Air"))
    assert kv_bytes_per_token(arch, "auto").per_gpu == 46 * 2 * 8 * 128 * 2


# --------------------------------------------------------------------------- MiniMax-M2


def test_minimax_m2_total_and_active():
    arch = from_config(config("MiniMaxAI--MiniMax-M2"))
    assert arch.qk_norm_full_width and arch.moe.router_correction_bias
    assert arch.moe.num_shared_experts == 0
    counts = count_parameters(arch)
    assert near(counts.total, 230e9, 0.01)
    assert near(counts.active_per_token - embeddings(counts), 10e9, 0.03)
    assert kv_bytes_per_token(arch, "auto").per_gpu == 62 * 2 * 8 * 128 * 2


def test_minimax_m2_routing_bias_follows_the_config():
    """vLLM adds e_score_correction_bias only where use_routing_bias (default off)."""
    cfg = config("MiniMaxAI--MiniMax-M2")
    with_bias = count_parameters(from_config(cfg)).router
    without = count_parameters(from_config(cfg, {"use_routing_bias": "false"})).router
    assert with_bias - without == 62 * 256


def test_minimax_m2_qk_norm_is_sharded_like_q_and_k():
    arch = from_config(config("MiniMaxAI--MiniMax-M2"))
    none = resolve_quantization(None, None)
    one = weight_bytes(arch, none, 2).by_category["norms"]
    # q_norm (48 x 128) and k_norm (8 x 128) per layer, plus two hidden-size RMSNorms
    assert one == 2 * (62 * (48 * 128 + 8 * 128 + 2 * 3072) + 3072)


# --------------------------------------------------------------------------- Kimi-K2


def test_kimi_k2_total_and_active_through_the_deepseek_reader():
    arch = from_config(config("moonshotai--Kimi-K2-Base"))
    assert arch.family == "deepseek" and arch.uses_mla
    assert len(arch.moe.moe_layers) == 60 and arch.moe.num_experts == 384
    counts = count_parameters(arch)
    # The Hub's count for moonshotai/Kimi-K2-Instruct's safetensors, 1026.5B
    # (https://drose.io/aitools/tools/kimi-k2-instruct, "Parameters: 1026.5B"), holds
    # the block-FP8 scale tensors too (about 0.06B); the model card rounds it to "1T"
    assert 0.9995 < counts.total / 1026.5e9 < 1.0
    assert near(counts.active_per_token, 32e9, 0.03)  # "32B activated"
    # MLA latent, 64 heads or not: (512 + 64) x 2 bytes x 61 layers
    assert kv_bytes_per_token(arch, "auto").per_gpu == 61 * 576 * 2


def test_llama4_chunked_layers_score_pairs_within_their_chunk():
    """The step model times Llama 4's chunked layers as half a chunk of keys per query (the
    mean once a context spans chunks): their prompt pairs count, long contexts stop growing
    their reads, and the KV capacity is left to the fit's own chunk rules."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel

    dep = Deployment(
        model=str(CONFIGS / "meta-llama--Llama-4-Scout-17B-16E.text_config.json"),
        gpu="h100-sxm-80gb",
        tensor_parallel_size=4,
        max_model_len=65536,
    )
    model = StepModel.from_deployment(dep)
    shape = model.shape
    assert shape.window_is_chunk and shape.sliding_window == 4096
    assert shape.sliding_share == pytest.approx(36 / 48)
    assert model.kv_window_share == 0.0
    # every attention layer scores prompt pairs (48 layers x 40 heads x 2 x 2 x 128 FLOPs)
    assert shape.attn_flops_per_pair == pytest.approx(48 * 40 * 2 * 2 * 128)
    # a short prompt is inside one chunk: nothing capped
    assert shape.window_capped(2000, 0, 0, 2000 * 2000 / 2) == (0, 2000 * 2000 / 2)
    # 32 sequences at 32k: the chunked 75 % read 4,096 tokens each, the global 25 % all
    kv, _ = shape.window_capped(0, 32, 32 * 32768, 0)
    assert kv == pytest.approx(32 * (0.25 * 32768 + 0.75 * 4096))
    assert any("chunks of 8,192 tokens" in n for n in model.notes)
