"""Hybrid Mamba / linear-attention models: parameters, per-sequence state, vLLM's
hybrid KV layout.

Configs: tests/data/hybrid_configs (sources in SOURCES.md). Reference numbers
from outside this code: published parameter totals, state sizes computed by
hand from vLLM's ``MambaStateShapeCalculator`` formulas, and one real vLLM
start-up log (vllm#26646).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwise.calculators import engine_policy as ep
from inferwise.calculators.architecture import from_config
from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit, estimate_fit_with_available
from inferwise.calculators.kv_cache import kv_bytes_per_token, ssm_state_bytes
from inferwise.calculators.params import count_parameters

CONFIGS = Path(__file__).parent / "data" / "hybrid_configs"
GiB = 1 << 30


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def arch(name: str, **overrides):
    return from_config(config(name), overrides)


def request(tmp_path: Path, name: str, **fields) -> FitRequest:
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config(name)))
    data = {"model": str(path), "engine": "vllm", **fields}
    if "gpu" not in data and "gpu_memory_gib" not in data:
        data["gpu_memory_gib"] = 80.0
    return FitRequest.model_validate(data)


# --------------------------------------------------------------------------- layer layout


def test_layer_kinds_follow_each_family_s_own_spelling():
    jamba = arch("jamba-1.5-mini")
    assert [i for i, k in enumerate(jamba.layer_kinds) if k == "full"] == [4, 12, 20, 28]
    assert jamba.moe is not None and jamba.moe.moe_layers == tuple(range(1, 32, 2))
    nemo = arch("nemotron-h-8b-base-8k")
    assert (nemo.layers_of_kind("mamba"), nemo.layers_of_kind("full")) == (24, 4)
    assert nemo.layers_of_kind("mlp") == 24 and len(nemo.ffn_layers or ()) == 24
    qnext = arch("qwen3-next-80b-a3b")
    assert qnext.layer_kinds[:4] == ("linear", "linear", "linear", "full")
    assert (qnext.layers_of_kind("linear"), qnext.layers_of_kind("full")) == (36, 12)


# --------------------------------------------------------------------------- parameters


def test_qwen3_next_parameter_count_is_the_published_exact_total():
    """79,674,391,296 parameters and 3,874,929,408 active (the Hub's safetensors total
    for Qwen3-Coder-Next, same layout; the MTP layer is not in it, nor here)."""
    counts = count_parameters(arch("qwen3-next-80b-a3b"))
    assert counts.total == 79_674_391_296
    assert counts.active_per_token == 3_874_929_408
    # Gated DeltaNet mixers of 36 layers, hand-computed from vLLM qwen3_next.py:
    # in_proj_qkvz 2048 x 12288, in_proj_ba 2048 x 64, conv 8192 x 4, A/dt 2 x 32,
    # norm 128, out_proj 4096 x 2048
    per_layer = 2048 * 12288 + 2048 * 64 + 8192 * 4 + 64 + 128 + 4096 * 2048
    assert counts.ssm == 36 * per_layer


def test_jamba_parameter_count_matches_the_published_51_6b_total_and_12b_active():
    """AI21: Jamba-v0.1 / 1.5 Mini 51.6B parameters, 12B active."""
    counts = count_parameters(arch("jamba-1.5-mini"))
    assert abs(counts.total - 51.6e9) / 51.6e9 < 0.005
    assert abs(counts.active_per_token - 12e9) / 12e9 < 0.02


def test_nemotron_h_8b_parameter_count_matches_the_published_8b():
    counts = count_parameters(arch("nemotron-h-8b-base-8k"))
    assert abs(counts.total - 8e9) / 8e9 < 0.02
    assert counts.total == counts.active_per_token
    # relu2 MLP: two matrices, not three
    assert counts.dense_mlp == 24 * 2 * 4096 * 21504


def test_granite_4_h_small_parameter_count_matches_the_published_32b_and_9b_active():
    counts = count_parameters(arch("granite-4.0-h-small"))
    assert abs(counts.total - 32e9) / 32e9 < 0.02
    assert abs(counts.active_per_token - 9e9) / 9e9 < 0.03


# --------------------------------------------------------------------------- state and KV


def test_qwen3_next_state_per_sequence_is_hand_computed():
    """Conv: (kernel 4 - 1) x (2 x 16 x 128 + 32 x 128) channels; recurrent: 32 value
    heads x 128 x 128; bf16; both halved at TP 2."""
    a = arch("qwen3-next-80b-a3b")
    tp1 = ssm_state_bytes(a, 1, 2)
    assert (tp1.conv_bytes, tp1.temporal_bytes) == (3 * 8192 * 2, 32 * 128 * 128 * 2)
    assert tp1.total_bytes == 1_097_728
    assert ssm_state_bytes(a, 2, 2).total_bytes == 1_097_728 // 2


def test_mamba_states_are_hand_computed():
    nemo = ssm_state_bytes(arch("nemotron-h-8b-base-8k"), 1, 2)
    # conv channels = 8192 + 2 groups-terms x 8 x 128; SSM = 128 heads x 64 x 128
    assert nemo.conv_bytes == 3 * (8192 + 2 * 8 * 128) * 2
    assert nemo.temporal_bytes == 128 * 64 * 128 * 2
    jamba = ssm_state_bytes(arch("jamba-1.5-mini"), 1, 2)
    assert (jamba.conv_bytes, jamba.temporal_bytes) == (3 * 8192 * 2, 8192 * 16 * 2)
    # one B/C group over TP 2 is replicated: 2 groups' worth of conv channels, halved
    granite = ssm_state_bytes(arch("granite-4.0-h-small"), 2, 2)
    assert granite.conv_bytes == 3 * ((8192 + 2 * 2 * 128) // 2) * 2
    assert granite.temporal_bytes == 64 * 64 * 128 * 2


def test_config_stated_ssm_dtype_sets_the_recurrent_state_dtype():
    a = arch("nemotron-h-8b-base-8k", mamba_ssm_cache_dtype="float32")
    state = ssm_state_bytes(a, 1, 2)
    assert state.temporal_bytes == 128 * 64 * 128 * 4
    assert any("mamba_ssm_cache_dtype" in n for n in a.notes)


def test_only_attention_layers_pay_kv_per_token():
    kvb = kv_bytes_per_token(arch("nemotron-h-8b-base-8k"), "auto")
    assert kvb.per_gpu == 4 * 2 * 8 * 128 * 2  # 4 attention layers, 8 KV heads of 128
    assert set(kvb.per_layer) == {"full"}
    assert kvb.state_bytes_per_layer == 3 * 10240 * 2 + 128 * 64 * 128 * 2


# --------------------------------------------------------------------------- vLLM layout


@pytest.mark.parametrize(
    ("name", "tp", "kv_dtype", "block"),
    [
        ("qwen3-next-80b-a3b", 1, "auto", 544),  # 1,097,728 B state / 2 KiB per token
        ("qwen3-next-80b-a3b", 2, "fp8", 1072),  # 548,864 / 512: exactly 67 x 16
        ("nemotron-h-8b-base-8k", 1, "auto", 528),  # 2,158,592 / 4 KiB -> 33 x 16
        ("jamba-1.5-mini", 1, "auto", 80),  # 311,296 / 4 KiB -> 5 x 16
    ],
)
def test_attention_block_size_is_raised_to_hold_one_state(tmp_path, name, tp, kv_dtype, block):
    req = request(
        tmp_path,
        name,
        tensor_parallel_size=tp,
        kv_cache_dtype=kv_dtype,
        max_model_len=8192,
        engine_version="0.11.0",
    )
    result = estimate_fit_with_available(req, 20 * GiB)
    assert result.block_size == block


def test_user_block_size_is_kept_only_when_it_holds_a_state():
    a = arch("qwen3-next-80b-a3b")
    assert ep.vllm_hybrid_block_size(a, 2048, 1_097_728, 1024, None)[0] == 1024
    assert ep.vllm_hybrid_block_size(a, 2048, 1_097_728, 16, None)[0] == 544
    # Blackwell + head size 256 (FlashInfer) aligns to 32
    assert ep.vllm_hybrid_block_size(a, 2048, 1_097_728, None, "b200")[0] == 544
    assert ep.vllm_hybrid_block_size(a, 2048, 1_000_000, None, "b200")[0] == 512


def test_qwen3_next_padding_matches_vllm_s_log_line(tmp_path):
    """vLLM logs 'Padding mamba page size by 1.49%' for Qwen3-Next at TP 1 in bf16:
    544 x 2048 = 1,114,112 B page for a 1,097,728 B state."""
    req = request(tmp_path, "qwen3-next-80b-a3b", max_model_len=8192, engine_version="0.11.0")
    result = estimate_fit_with_available(req, 20 * GiB)
    assert any("padded by 1.49%" in a for a in result.assumptions)


def test_qwen3_next_log_of_vllm_26646_is_reproduced_by_the_block_rules(tmp_path):
    """vllm#26646 (vLLM 0.11, Oct 2025, TP 2, --kv-cache-dtype fp8, max_model_len
    215,040): "GPU KV cache size: 90,048 tokens", "Maximum concurrency ... 1.66x".
    With block 1072, 4 groups (1 attention + 3 DeltaNet, 12 layers each) and 204
    blocks per request (201 + one state per DeltaNet group), 338 and 339 blocks give
    both logged numbers; a block size or group count off by one gives neither."""
    req = request(
        tmp_path,
        "qwen3-next-80b-a3b",
        tensor_parallel_size=2,
        kv_cache_dtype="fp8",
        max_model_len=215040,
        engine_version="0.11.0",
    )
    page_group_bytes = 1072 * 512 * 12
    for blocks in (338, 339):
        result = estimate_fit_with_available(req, blocks * page_group_bytes)
        assert result.kv_cache_blocks == blocks
        assert result.kv_cache_tokens == 90_048
        assert round(result.max_concurrency, 2) == 1.66


def test_concurrency_counts_one_state_block_per_mamba_group(tmp_path):
    """Nemotron-H-8B: 4 attention + 24 Mamba layers -> 1 + 6 groups of 4 layers; a
    request of 8192 tokens holds cdiv(8192, 528) = 16 attention blocks + 6 states."""
    req = request(tmp_path, "nemotron-h-8b-base-8k", max_model_len=8192, engine_version="0.11.0")
    page = 528 * 4096
    result = estimate_fit_with_available(req, 1000 * page * 4)
    assert result.kv_cache_blocks == 1000
    assert result.max_concurrency == round(1000 / (16 + 6), 4)
    # 0.11 logs num_blocks // num_groups x block_size
    assert result.kv_cache_tokens == 1000 // 7 * 528


def test_a_hybrid_fit_end_to_end_on_one_h100(tmp_path):
    req = request(tmp_path, "nemotron-h-8b-base-8k", gpu="h100", engine_version="0.11.0")
    result = estimate_fit(req)
    assert result.fits
    assert result.kv_bytes_per_token == 16_384
    assert 40 < result.per_gpu.kv_cache_gib < 70
    assert result.max_concurrency > 100  # 8K context: the state, not the KV, dominates


# --------------------------------------------------------------------------- fail closed


@pytest.mark.parametrize(
    ("name", "version", "needed"),
    [
        ("nemotron-h-8b-base-8k", "0.9.2", "0.10.0"),
        ("granite-4.0-h-small", "0.8.5", "0.10.0"),
        ("jamba-1.5-mini", "0.10.1", "0.10.2"),
        ("qwen3-next-80b-a3b", "0.10.1", "0.10.2"),
        ("jamba-1.5-mini", "0.6.4", "0.10.2"),
    ],
)
def test_releases_before_the_hybrid_allocator_fail_closed_naming_the_release(
    tmp_path, name, version, needed
):
    req = request(tmp_path, name, max_model_len=4096, engine_version=version)
    with pytest.raises(InputError) as err:
        estimate_fit(req)
    assert err.value.field == "engine_version" and needed in str(err.value)


def test_sglang_fails_closed_for_hybrids(tmp_path):
    req = request(tmp_path, "qwen3-next-80b-a3b", engine="sglang", max_model_len=4096)
    with pytest.raises(InputError, match="SGLang"):
        estimate_fit(req)


def test_nemotron_moe_layers_fail_closed():
    cfg = dict(config("nemotron-h-8b-base-8k"))
    cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"].replace("-", "E")
    with pytest.raises(InputError, match="MoE"):
        from_config(cfg)


def test_a_hybrid_config_without_attention_is_refused():
    cfg = dict(config("qwen3-next-80b-a3b"), layer_types=["linear_attention"] * 48)
    with pytest.raises(InputError, match="no attention layer"):
        from_config(cfg)


def test_tensor_parallelism_must_divide_the_state_space_heads(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(config("nemotron-h-8b-base-8k"), mamba_num_heads=100)))
    req = FitRequest(model=str(path), gpu_memory_gib=80, tensor_parallel_size=8)
    with pytest.raises(InputError, match="state-space heads"):
        estimate_fit(req)


def test_from_0_28_prefix_caching_holds_two_state_blocks_per_mamba_group(tmp_path):
    """vllm#50991 (0.28.0): prefix caching on by default for hybrids, mamba_cache_mode
    align: MambaSpec keeps 2 blocks per request (state + checkpoint); the block size
    is that of mode none. Before 0.28 (and with --mamba-cache-mode none) one."""
    page = 528 * 4096
    blocks = 1000

    def concurrency(version: str, **fields) -> tuple[float, int]:
        req = request(
            tmp_path,
            "nemotron-h-8b-base-8k",
            max_model_len=8192,
            engine_version=version,
            **fields,
        )
        result = estimate_fit_with_available(req, blocks * page * 4)
        return result.max_concurrency, result.block_size

    assert concurrency("0.27.1") == (round(blocks / (16 + 6), 4), 528)
    assert concurrency("0.28.0") == (round(blocks / (16 + 12), 4), 528)
    assert concurrency("0.29.0", mamba_cache_mode="none")[0] == round(blocks / (16 + 6), 4)
    assert concurrency("0.11.0", mamba_cache_mode="align")[0] == round(blocks / (16 + 12), 4)


def test_the_step_model_counts_mixer_weights_and_only_attention_pairs():
    """Decode reads the Mamba mixers like any dense weight; only the 4 attention layers
    of Nemotron-H-8B score token pairs (2 x 32 heads x 2 x 128 FLOPs per pair and layer)."""
    from inferwise.calculators.quantization import resolve_quantization
    from inferwise.calculators.roofline import shape_from_architecture

    a = arch("nemotron-h-8b-base-8k")
    counts = count_parameters(a)
    shape = shape_from_architecture(a, "nemotron", resolve_quantization(None, None), 2, 16384)
    assert shape.attn_flops_per_pair == 4 * 2.0 * 32 * 2 * 128
    assert shape.dense_params == counts.attention + counts.dense_mlp + counts.ssm + counts.lm_head


@pytest.mark.parametrize(("max_len", "low", "high"), [(512, 0.98, 1.03), (32768, 1.5, 1.95)])
def test_fp8_kv_gains_little_on_hybrids(tmp_path, max_len, low, high):
    """vllm#55196: on Mamba/GDN hybrids --kv-cache-dtype fp8 leaves the state pages in
    bf16 and all groups share one page, so it gains nothing at short context (1.00x)
    and less than 2x at 32K (1.84x there); attention-only models gain 2x."""

    def concurrency(kv: str) -> float:
        req = request(
            tmp_path,
            "qwen3-next-80b-a3b",
            kv_cache_dtype=kv,
            max_model_len=max_len,
            engine_version="0.11.0",
        )
        return estimate_fit_with_available(req, 40 * GiB).max_concurrency

    assert low <= concurrency("fp8") / concurrency("auto") <= high


def test_falcon_h1_fails_closed_saying_what_is_missing():
    with pytest.raises(InputError, match="side by side"):
        from_config({"model_type": "falcon_h1", "num_hidden_layers": 2})
