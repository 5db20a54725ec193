"""Architecture parsing, parameter counts and weight bytes, per model family.

Reference numbers come from outside this code: parameter counts published on
the model cards / technical reports, and checkpoint sizes measured from the
safetensors index.
"""

from __future__ import annotations

import pytest

from inferwise.calculators.architecture import SUPPORTED_MODEL_TYPES, from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.errors import InputError
from inferwise.calculators.params import count_parameters, pp_layer_split, weight_bytes
from inferwise.calculators.quantization import resolve_quantization, scheme_from_config

GiB = 1 << 30


def arch_of(model_id: str):
    return from_config(load_model(model_id).config)


# --------------------------------------------------------------------------- dense


def test_llama31_8b_parameter_count_matches_the_published_exact_count():
    counts = count_parameters(arch_of("meta-llama/Llama-3.1-8B-Instruct"))
    assert counts.total == 8_030_261_248
    assert counts.active_per_token == counts.total
    # untied: embedding and lm_head are separate 128256 x 4096 matrices
    assert counts.embedding == counts.lm_head == 128_256 * 4096


def test_llama31_8b_weights_match_the_measured_checkpoint_within_0_1_percent():
    src = load_model("meta-llama/Llama-3.1-8B-Instruct")
    arch = from_config(src.config)
    wb = weight_bytes(arch, resolve_quantization(None, None), 2)
    assert src.checkpoint_bytes
    assert abs(wb.total_bytes - src.checkpoint_bytes) / src.checkpoint_bytes < 0.001


@pytest.mark.parametrize(
    ("model_id", "published_b"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", 70.55),
        ("Qwen/Qwen2.5-7B-Instruct", 7.62),
        ("Qwen/Qwen3-8B", 8.19),
        ("microsoft/phi-4", 14.66),
    ],
)
def test_dense_families_match_published_sizes(model_id, published_b):
    total = count_parameters(arch_of(model_id)).total
    assert abs(total / 1e9 - published_b) / published_b < 0.005


def test_qwen3_has_qk_norm_and_qwen2_has_qkv_bias():
    q3 = arch_of("Qwen/Qwen3-8B")
    q2 = arch_of("Qwen/Qwen2.5-7B-Instruct")
    assert q3.qk_norm and not q3.attention_bias
    assert q2.attention_bias and not q2.o_bias and not q2.qk_norm


def test_tied_embeddings_are_counted_once():
    arch = arch_of("meta-llama/Llama-3.2-1B-Instruct")
    assert arch.tie_word_embeddings
    counts = count_parameters(arch)
    assert counts.lm_head == 0
    assert abs(counts.total - 1.236e9) / 1.236e9 < 0.005


# --------------------------------------------------------------------------- MoE


def test_mixtral_counts_all_experts_and_two_active():
    counts = count_parameters(arch_of("mistralai/Mixtral-8x7B-v0.1"))
    assert counts.total == 46_702_792_704
    assert abs(counts.active_per_token - 12.9e9) / 12.9e9 < 0.01


def test_qwen3_moe_30b_a3b_total_and_active():
    arch = arch_of("Qwen/Qwen3-30B-A3B")
    assert arch.moe and arch.moe.num_experts == 128 and arch.moe.experts_per_token == 8
    counts = count_parameters(arch)
    assert abs(counts.total - 30.53e9) / 30.53e9 < 0.002
    assert abs(counts.active_per_token - 3.3e9) / 3.3e9 < 0.03
    assert counts.shared_experts == 0


def test_qwen2_moe_has_gated_shared_expert():
    arch = arch_of("Qwen/Qwen1.5-MoE-A2.7B-Chat")
    assert arch.moe.shared_expert_gate and arch.moe.shared_expert_intermediate_size > 0
    counts = count_parameters(arch)
    assert abs(counts.total - 14.3e9) / 14.3e9 < 0.01


def test_gpt_oss_counts_match_the_model_card_and_mxfp4_spares_attention():
    big = arch_of("openai/gpt-oss-120b")
    small = arch_of("openai/gpt-oss-20b")
    assert abs(count_parameters(big).total - 116.83e9) / 116.83e9 < 0.001
    assert abs(count_parameters(small).total - 20.91e9) / 20.91e9 < 0.001
    scheme = resolve_quantization(None, small.quantization_config)
    assert scheme.method == "mxfp4" and scheme.experts_only
    assert scheme.skips("model.layers.3.self_attn.q_proj")
    assert scheme.skips("lm_head")
    on_disk = weight_bytes(small, scheme, 2, runtime_layout=False).total_bytes
    # checkpoint of openai/gpt-oss-20b: 13.76 GB of safetensors
    assert abs(on_disk / 1e9 - 13.76) / 13.76 < 0.01


# --------------------------------------------------------------------------- MLA


def test_deepseek_v3_mla_and_moe_layout():
    arch = arch_of("deepseek-ai/DeepSeek-V3")
    assert arch.uses_mla and arch.mla.kv_lora_rank == 512 and arch.mla.qk_rope_head_dim == 64
    assert set(arch.layer_kinds) == {"mla"}
    assert len(arch.moe.moe_layers) == 61 - 3  # first_k_dense_replace = 3
    counts = count_parameters(arch)
    # 671B without the 14B multi-token-prediction module vLLM skips
    assert abs(counts.total - 671.0e9) / 671.0e9 < 0.002
    assert abs(counts.active_per_token - 37.5e9) / 37.5e9 < 0.01
    assert any("multi-token" in n for n in arch.notes)


def test_deepseek_v2_lite_projects_queries_without_lora():
    arch = arch_of("deepseek-ai/DeepSeek-V2-Lite-Chat")
    assert arch.mla.q_lora_rank is None
    assert abs(count_parameters(arch).total - 15.7e9) / 15.7e9 < 0.01


# --------------------------------------------------------------------------- sliding window, VLM


def test_gemma2_alternates_local_and_global_layers():
    arch = arch_of("google/gemma-2-9b-it")
    assert arch.layer_kinds[0] == "sliding" and arch.layer_kinds[1] == "full"
    assert arch.layer_kinds.count("sliding") == arch.layer_kinds.count("full")
    assert arch.sliding_window == 4096 and arch.norms_per_layer == 4


def test_gemma3_vlm_uses_class_defaults_and_counts_the_vision_tower():
    arch = arch_of("google/gemma-3-12b-it")
    # config.json omits head_dim and vocab_size; Gemma3TextConfig defaults apply
    assert arch.head_dim == 256 and arch.vocab_size == 262_208
    assert arch.layer_kinds.count("full") == 8 and arch.layer_kinds.count("sliding") == 40
    assert arch.vision is not None and arch.vision.model_type == "siglip_vision_model"
    counts = count_parameters(arch)
    assert 0.40e9 < counts.vision < 0.45e9  # SigLIP-So400m + projector
    assert abs(counts.total - 12.19e9) / 12.19e9 < 0.01


def test_gemma3_text_only_model():
    arch = arch_of("google/gemma-3-1b-it")
    assert arch.vision is None and "sliding" in arch.layer_kinds


# --------------------------------------------------------------------------- quantization


def test_gptq_int4_costs_scales_and_zeros():
    scheme = scheme_from_config({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True})
    assert scheme.bytes_per_param == pytest.approx(0.5 + (2 + 0.5) / 128)


def test_awq_checkpoint_weighs_about_a_quarter_of_bf16():
    src = load_model("PatronusAI/Llama-3.1-70B-Instruct-AWQ-INT4")
    arch = from_config(src.config)
    scheme = resolve_quantization(None, arch.quantization_config)
    assert scheme.method == "awq"
    wb = weight_bytes(arch, scheme, 2)
    # embeddings and lm_head stay in fp16: 2 x 128256 x 8192 x 2 bytes
    assert wb.by_category["embedding"] == 128_256 * 8192 * 2
    assert 36 * GiB < wb.total_bytes < 40 * GiB


def test_fp8_block_checkpoint_is_about_one_byte_per_weight():
    arch = arch_of("Qwen/Qwen3-32B-FP8")
    scheme = resolve_quantization(None, arch.quantization_config)
    assert scheme.bytes_per_param == pytest.approx(1 + 4 / (128 * 128))
    wb = weight_bytes(arch, scheme, 2)
    assert 31 * GiB < wb.total_bytes < 33 * GiB


def test_modules_to_not_convert_keep_their_dtype():
    scheme = scheme_from_config(
        {"quant_method": "fp8", "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}
    )
    assert scheme.skips("lm_head")
    assert scheme.skips("model.layers.0.mlp.gate")
    assert not scheme.skips("model.layers.1.mlp.gate")
    ct = scheme_from_config(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "strategy": "group",
                        "group_size": 128,
                    }
                }
            },
            "ignore": ["re:.*vision.*", "lm_head"],
        }
    )
    assert ct.skips("model.vision_tower.blocks.0") and not ct.skips("model.layers.0.mlp.down_proj")


def test_quantization_flag_must_match_a_quantized_checkpoint():
    arch = arch_of("Qwen/Qwen3-32B-FP8")
    with pytest.raises(InputError) as err:
        resolve_quantization("awq", arch.quantization_config)
    assert err.value.field == "quantization"
    with pytest.raises(InputError):
        resolve_quantization("gptq", None)  # needs a GPTQ checkpoint
    assert resolve_quantization("fp8", None).bytes_per_param == 1.0


# --------------------------------------------------------------------------- parallel splits


def test_pipeline_split_gives_the_remainder_to_the_stages_before_the_last():
    assert [len(r) for r in pp_layer_split(10, 4)] == [2, 3, 3, 2]
    assert [len(r) for r in pp_layer_split(80, 3)] == [27, 27, 26]
    assert sum(len(r) for r in pp_layer_split(61, 8)) == 61


def test_tensor_parallel_halves_sharded_weights_and_keeps_replicated_ones():
    arch = arch_of("meta-llama/Llama-3.1-70B-Instruct")
    none = resolve_quantization(None, None)
    w4 = weight_bytes(arch, none, 2, tensor_parallel_size=4).per_gpu_bytes
    w8 = weight_bytes(arch, none, 2, tensor_parallel_size=8).per_gpu_bytes
    assert 0.5 < w8 / w4 < 0.501


# --------------------------------------------------------------------------- fail closed


def test_unknown_architecture_fails_closed_naming_type_supported_list_and_override():
    with pytest.raises(InputError) as err:
        from_config({"model_type": "bloom", "hidden_size": 4096})
    msg = str(err.value)
    assert "'bloom' is not supported" in msg
    assert "llama" in msg and "--hf-overrides" in msg
    assert err.value.field == "model"
    assert "llama" in SUPPORTED_MODEL_TYPES


def test_missing_field_is_named():
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    del cfg["num_hidden_layers"]
    with pytest.raises(InputError) as err:
        from_config(cfg)
    assert "num_hidden_layers" in str(err.value)


def test_malformed_field_is_named():
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    cfg["num_key_value_heads"] = "eight"
    with pytest.raises(InputError) as err:
        from_config(cfg)
    assert "num_key_value_heads" in str(err.value)


def test_overrides_supply_missing_facts_and_declare_a_layout():
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    cfg["model_type"] = "my_llama_clone"
    del cfg["num_hidden_layers"]
    arch = from_config(cfg, {"model_type": "llama", "num_hidden_layers": "32"})
    assert arch.num_layers == 32 and arch.family == "llama"


def test_every_supported_family_has_its_own_reader() -> None:
    from inferwise.calculators.architecture import _FAMILIES, _READERS

    assert set(_FAMILIES.values()) == set(_READERS)
