"""Vision-language models: tower parameters, the language model's KV, and vLLM's
multimodal start-up profiling.

Configs are real config.json files (tests/data/vlm_configs.json names where each
copy was found); parameter totals are the published safetensors counts of the
Hugging Face model pages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwise.calculators import vision
from inferwise.calculators.architecture import from_config
from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit
from inferwise.calculators.kv_cache import kv_bytes_per_token
from inferwise.calculators.params import count_parameters

CONFIGS = json.loads((Path(__file__).parent / "data" / "vlm_configs.json").read_text())
GiB = 1 << 30


def config(model_id: str) -> dict:
    return CONFIGS[model_id]["config"]


@pytest.fixture
def qwen25_vl_7b(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config("Qwen/Qwen2.5-VL-7B-Instruct")))
    return str(path)


# --------------------------------------------------------------------------- parameters


def test_qwen25_vl_7b_counts_the_published_safetensors_total_exactly():
    """huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct: 8,292,166,656 parameters (BF16)."""
    arch = from_config(config("Qwen/Qwen2.5-VL-7B-Instruct"))
    counts = count_parameters(arch)
    assert counts.total == 8_292_166_656
    # the text model is Qwen2.5-7B's layout (q/k/v biases, untied 152,064 vocabulary)
    assert arch.attention_bias and not arch.o_bias and not arch.tie_word_embeddings
    assert counts.total - counts.vision == 7_615_616_512
    assert arch.torch_dtype == "bfloat16"  # the wrapper's, not the re-saved text_config's float32


def test_qwen3_vl_4b_counts_deepstack_mergers_and_position_embeddings():
    """huggingface.co/Qwen/Qwen3-VL-4B-Instruct: 4.44B parameters (4,437,815,808)."""
    arch = from_config(config("Qwen/Qwen3-VL-4B-Instruct"))
    counts = count_parameters(arch)
    assert counts.total == 4_437_815_808
    assert arch.qk_norm and arch.tie_word_embeddings and arch.head_dim == 128
    # three DeepStack mergers of (LayerNorm 4096 + 4096x4096 + 4096x2560, biased)
    deepstack = 3 * (2 * 4096 + 4096 * 4096 + 4096 + 4096 * 2560 + 2560)
    assert counts.vision == arch.vision.tower_params + arch.vision.projector_params
    assert arch.vision.projector_params > deepstack


def test_qwen3_vl_moe_30b_a3b_counts_the_published_total_exactly():
    """huggingface.co/Qwen/Qwen3-VL-30B-A3B-Instruct: 31,070,754,032 parameters; the
    text model is Qwen3-30B-A3B's layout (128 experts, 8 active, q/k norms)."""
    arch = from_config(config("Qwen/Qwen3-VL-30B-A3B-Instruct"))
    counts = count_parameters(arch)
    assert counts.total == 31_070_754_032
    assert arch.is_moe and arch.qk_norm and arch.moe.experts_per_token == 8
    assert counts.total - counts.vision == 30_532_122_624


def test_llava_next_mistral_7b_counts_the_published_total_exactly():
    """huggingface.co/llava-hf/llava-v1.6-mistral-7b-hf: 7,566,747,648 parameters. Its
    text_config is sparse (MistralConfig defaults fill it); CLIP ViT-L/14-336 with its
    class token, pre- and post-LayerNorm; projector plus the image_newline vector."""
    arch = from_config(config("llava-hf/llava-v1.6-mistral-7b-hf"))
    assert count_parameters(arch).total == 7_566_747_648
    assert arch.num_layers == 32 and arch.hidden_size == 4096 and arch.num_kv_heads == 8


def test_phi3_vision_counts_clip_and_the_hd_projection():
    """huggingface.co/microsoft/Phi-3-vision-128k-instruct: 4.15B parameters; the CLIP
    tower is not in config.json, img_processor.model_name names it."""
    arch = from_config(config("microsoft/Phi-3-vision-128k-instruct"))
    counts = count_parameters(arch)
    assert abs(counts.total - 4.15e9) / 4.15e9 < 0.001
    clip, *_ = vision.clip_layout(vision.CLIP_VIT_L_336)
    assert clip == 303_507_456  # CLIP ViT-L/14-336 vision model, hand-summed module by module
    with pytest.raises(InputError):
        from_config(
            {**config("microsoft/Phi-3-vision-128k-instruct"), "img_processor": {"model_name": "x"}}
        )


def test_internvl3_1b_counts_internvit_300m_and_the_untied_qwen2_head():
    """OpenGVLab/InternVL3-1B: InternViT-300M (class token, 1025 positions, LayerNorm
    blocks with layer scales, biased qkv) + mlp1 (LayerNorm 4096 -> 896 -> 896) + a
    Qwen2.5-0.5B layout with a separate 151,674 x 896 lm_head; 0.94B in all."""
    arch = from_config(config("OpenGVLab/InternVL3-1B"))
    counts = count_parameters(arch)
    v, i = 1024, 4096
    embed = 3 * 14 * 14 * v + v + v + 1025 * v
    block = 4 * v + (3 * v * v + 3 * v) + (v * v + v) + (v * i + i) + (i * v + v) + 2 * v
    assert arch.vision.tower_params == embed + 24 * block == 304_012_288
    assert arch.vision.projector_params == 2 * 4096 + 4096 * 896 + 896 + 896 * 896 + 896
    assert abs(counts.total - 0.938e9) / 0.938e9 < 0.001
    assert arch.attention_bias and not arch.tie_word_embeddings
    facts = dict(arch.vision.image_facts)
    assert vision.max_image_shape("internvl_chat", facts, {})[0] == 13 * 256  # 12 tiles + thumbnail


def test_qwen2_vl_mrope_model_keeps_ordinary_kv():
    """M-RoPE changes positions, not the cache: 28 layers x 4 KV heads x 128 x K,V x 2 bytes."""
    arch = from_config(config("Qwen/Qwen2.5-VL-7B-Instruct"))
    kvb = kv_bytes_per_token(arch, "auto", 1, 1, 2)
    assert kvb.per_gpu == 28 * 4 * 128 * 2 * 2
    assert set(arch.layer_kinds) == {"full"}


def test_vision_tower_is_sharded_by_tensor_parallelism():
    from inferwise.calculators.params import weight_bytes
    from inferwise.calculators.quantization import resolve_quantization

    arch = from_config(config("Qwen/Qwen2.5-VL-7B-Instruct"))
    none = resolve_quantization(None, None)
    one = weight_bytes(arch, none, 2, tensor_parallel_size=1).per_gpu_bytes
    two = weight_bytes(arch, none, 2, tensor_parallel_size=2).per_gpu_bytes
    vision_bytes = count_parameters(arch).vision * 2
    assert one - two > vision_bytes / 2 * 0.99  # the tower's half went to the other rank


# --------------------------------------------------------------------------- fail closed


def test_llama_32_vision_fails_closed_naming_the_cross_attention_cache():
    with pytest.raises(InputError) as err:
        from_config({"model_type": "mllama", "text_config": {}, "vision_config": {}})
    assert "cross-attention" in str(err.value) and "per image" in str(err.value)


def test_hf_native_internvl_fails_closed():
    with pytest.raises(InputError) as err:
        from_config({"model_type": "internvl", "text_config": {}, "vision_config": {}})
    assert "internvl_vision" in str(err.value)


def test_internvl_with_an_unread_language_model_fails_closed():
    cfg = {"model_type": "internvl_chat", "llm_config": {"model_type": "deepseek_v2"}}
    with pytest.raises(InputError) as err:
        from_config(cfg)
    assert "deepseek_v2" in str(err.value) and "internlm2" in str(err.value)


def test_missing_vision_field_is_named():
    cfg = json.loads(json.dumps(config("Qwen/Qwen2.5-VL-7B-Instruct")))
    del cfg["vision_config"]["depth"]
    with pytest.raises(InputError) as err:
        from_config(cfg)
    assert "vision_config.depth" in str(err.value)


# --------------------------------------------------------------------------- profiling rules


def test_encoder_budget_is_the_larger_of_batched_tokens_and_one_item():
    """compute_encoder_budget: max(max_num_batched_tokens, max tokens per item); V1
    profiles budget // tokens-per-item items, at least one."""
    assert vision.mm_profile_items(16384, 8192, 1024, 999, True) == (16384, 1)
    assert vision.mm_profile_items(256, 8192, 1024, 999, True) == (8192, 32)
    assert vision.mm_profile_items(256, 8192, 4, 2, True) == (8192, 8)  # max_num_seqs x limit
    assert vision.mm_profile_items(16384, 2048, 256, 1, False) == (16384, 1)
    # V0: min(max_num_seqs, batched // (limit x tokens)) sequences of `limit` items
    assert vision.mm_profile_items(576, 4096, 256, 1, False) == (4096, 7)
    assert vision.mm_profile_items(576, 4096, 2, 2, False) == (4096, 4)


def test_largest_qwen_image_follows_max_pixels():
    facts = dict(vision.image_facts("qwen2_5_vl", config("Qwen/Qwen2.5-VL-7B-Instruct")))
    tokens, patches, _ = vision.max_image_shape("qwen2_5_vl", facts, {})
    assert (tokens, patches) == (16384, 65536)  # the budget vLLM logs for Qwen2.5-VL
    small, _, _ = vision.max_image_shape("qwen2_5_vl", facts, {"max_pixels": 1003520})
    assert small == 1280
    with pytest.raises(InputError) as err:
        vision.max_image_shape("qwen2_5_vl", facts, {"num_crops": 4})
    assert err.value.field == "mm_processor_kwargs"


def test_llava_next_largest_image_is_2928_tokens_for_the_672_pinpoints():
    facts = dict(
        vision.image_facts(
            "llava_next",
            {
                "image_grid_pinpoints": [
                    [336, 672],
                    [672, 336],
                    [672, 672],
                    [1008, 336],
                    [336, 1008],
                ],
                "vision_config": {"image_size": 336, "patch_size": 14},
            },
        )
    )
    tokens, _, _ = vision.max_image_shape("llava_next", facts, {})
    assert tokens == 576 + 48 * 48 + 48


# --------------------------------------------------------------------------- the fit


def _fit(model: str, **kw):
    return estimate_fit(FitRequest(model=model, gpu="l4", max_model_len=16384, **kw))


def test_text_only_serving_skips_the_encoder_profile_and_says_so(qwen25_vl_7b):
    with_images = _fit(qwen25_vl_7b)
    text_only = _fit(qwen25_vl_7b, limit_mm_per_prompt={"image": 0, "video": 0})
    assert text_only.per_gpu.kv_cache_gib > with_images.per_gpu.kv_cache_gib + 1.0
    # vllm#22299 (0.10.1+): no tower is built, so its 676,550,144 bf16 parameters are not loaded
    dropped = with_images.per_gpu.weights_gib - text_only.per_gpu.weights_gib
    assert dropped == pytest.approx(676_550_144 * 2 / GiB, abs=0.002)
    assert text_only.parameters.total == with_images.parameters.total  # still the checkpoint's
    assert any("vision encoder profiling" in a and "16,384" in a for a in with_images.assumptions)
    assert any("text-only" in a for a in text_only.assumptions)
    assert not any("vision encoder profiling" in a for a in text_only.assumptions)
    assert any(q.name == "vision_encoder_profile_gib" for q in with_images.quantities)


def test_smaller_images_leave_more_kv_cache(qwen25_vl_7b):
    full = _fit(qwen25_vl_7b)
    capped = _fit(qwen25_vl_7b, mm_processor_kwargs={"max_pixels": 1003520})
    assert capped.per_gpu.kv_cache_gib > full.per_gpu.kv_cache_gib
    assert capped.per_gpu.activation_gib < full.per_gpu.activation_gib


def test_video_only_profiling_fails_closed(qwen25_vl_7b):
    with pytest.raises(InputError) as err:
        _fit(qwen25_vl_7b, limit_mm_per_prompt={"image": 0})
    assert err.value.field == "limit_mm_per_prompt"


def test_unknown_modality_is_refused(qwen25_vl_7b):
    with pytest.raises(InputError) as err:
        _fit(qwen25_vl_7b, limit_mm_per_prompt={"audio": 1})
    assert "audio" in str(err.value)


def test_encoder_peak_counts_the_widest_layer_moment():
    """Qwen2.5-VL's widest moment is the rotary attention: residual (1280) plus
    qkv, contiguous q/k/v, concatenated and rotated q/k and their float32
    temporaries (14 x 1280) per patch at 2 bytes, plus the pixels (1176 values,
    float32 and the bf16 copy). CLIP without rotary: its MLP (2 x 1024 + 2 x 4096)."""
    layout = vision.qwen2_5_vl_layout(config("Qwen/Qwen2.5-VL-7B-Instruct")["vision_config"], 3584)
    per_patch = 15 * 1280 * 2 + 1176 * 6
    assert vision.encoder_peak_bytes(layout, 65536, 2, 1) == 65536 * per_patch
    # tensor parallelism splits the head-sharded parts only
    assert vision.encoder_peak_bytes(layout, 65536, 2, 2) == 65536 * (
        (1280 + 7 * 1280) * 2 + 1176 * 6
    )
    _, h, inter, depth = vision.clip_layout(vision.CLIP_VIT_L_336)
    clip = vision.TowerLayout(0, 0, h, inter, depth, False, 3 * 14 * 14, 1)
    assert vision.encoder_peak_bytes(clip, 577, 2, 1) == 577 * ((2 * 1024 + 2 * 4096) * 2 + 588 * 6)


def test_gemma3_profiles_32_images_of_256_tokens():
    """Gemma 3: 256 tokens per image, so an 8192-token budget is 32 SigLIP images of
    896 px / 14 = 4096 patches each."""
    res = estimate_fit(FitRequest(model="google/gemma-3-12b-it", gpu="h100", max_model_len=8192))
    note = next(a for a in res.assumptions if "vision encoder profiling" in a)
    assert "32 dummy image(s) of 4,096 patches" in note


def test_gemma3_4b_reads_its_sparse_text_config():
    """google/gemma-3-4b-it states no num_attention_heads; Gemma3TextConfig's default (8)
    applies, as the catalog entry's notes say (4.30B parameters on the model card)."""
    res = estimate_fit(FitRequest(model="google/gemma-3-4b-it", gpu="l4", max_model_len=8192))
    assert abs(res.parameters.total - 4.30e9) / 4.30e9 < 0.01


def test_text_only_keeps_the_tower_before_0101_and_for_families_that_always_build_it(
    qwen25_vl_7b, tmp_path
):
    text_only = {"image": 0, "video": 0}
    old = _fit(qwen25_vl_7b, limit_mm_per_prompt=text_only, engine_version="0.10.0")
    new = _fit(qwen25_vl_7b, limit_mm_per_prompt=text_only, engine_version="0.10.1")
    assert old.per_gpu.weights_gib > new.per_gpu.weights_gib + 1.2
    assert any("predates" in a for a in old.assumptions)
    path = tmp_path / "internvl.json"
    path.write_text(json.dumps(config("OpenGVLab/InternVL3-1B")))
    images = _fit(str(path))
    none = _fit(str(path), limit_mm_per_prompt={"image": 0})  # InternVL takes images only
    assert none.per_gpu.weights_gib == images.per_gpu.weights_gib
    assert any("whatever the limits" in a for a in none.assumptions)
    assert not any("vision encoder profiling" in a for a in none.assumptions)
