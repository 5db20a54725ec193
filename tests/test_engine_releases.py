"""One test per engine release boundary of calculators/engine_policy.py.

Every expected figure is hand-computed from the rule as read in that
release's wheel (vLLM 0.27.1-0.33.0, SGLang 0.4.10-0.5.23); the SGLang
defaults are also checked against a real start-up log
(tests/data/sglang_logs.toml).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from inferwise.calculators import engine_policy as ep
from inferwise.calculators.architecture import from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.fit import FitRequest, estimate_fit

SGLANG_LOGS = Path(__file__).resolve().parent / "data" / "sglang_logs.toml"


def _arch(model: str):
    return from_config(load_model(model, fresh=False).config, {})


# --------------------------------------------------------------------------- vLLM


def test_default_is_the_newest_release_read():
    rules = ep.vllm_rules(None)
    assert rules.version == rules.rules_from == "0.33.0" == ep.VLLM_DEFAULT_VERSION
    assert not rules.notes
    for v in ("0.30.0", "0.31.0", "0.32.0"):
        r = ep.vllm_rules(v)
        assert r.rules_from == "0.29.0" and any("0.29.0" in n for n in r.notes)
    newer = ep.vllm_rules("0.34.0")
    assert newer.rules_from == "0.33.0" and "newer" in newer.notes[0]


def test_serve_batch_defaults_gain_a_160_gib_tier_in_028():
    """B200 (178 GiB torch total): 8192 tokens up to 0.27, 16384 from 0.28;
    H200 (139.8 GiB) stays at 8192; both 1024 sequences."""
    assert ep.vllm_default_batching(ep.vllm_rules("0.27.1"), 178.0, "b200", 8192)[:2] == (
        8192,
        1024,
    )
    assert ep.vllm_default_batching(ep.vllm_rules("0.28.0"), 178.0, "b200", 8192)[:2] == (
        16384,
        1024,
    )
    assert ep.vllm_default_batching(ep.vllm_rules("0.33.0"), 139.8, "h200", 8192)[:2] == (
        8192,
        1024,
    )
    assert ep.vllm_default_batching(ep.vllm_rules("0.33.0"), 79.2, "a100", 8192)[:2] == (2048, 256)


def test_gb10_stays_on_the_small_tier_from_033():
    """GB10 (DGX Spark) has >= 70 GiB but 0.33 keeps it at 2048 / 256."""
    assert ep.vllm_default_batching(ep.vllm_rules("0.32.0"), 119.0, "gb10", 8192)[:2] == (
        8192,
        1024,
    )
    assert ep.vllm_default_batching(ep.vllm_rules("0.33.0"), 119.0, "gb10", 8192)[:2] == (2048, 256)


def test_listed_moe_architectures_run_mrv2_in_0271_to_028():
    """DeepSeek-V2-Lite (DeepseekV2ForCausalLM, listed) is on MRV2 from 0.27.1;
    Qwen3-30B-A3B (Qwen3MoeForCausalLM, not listed) only from 0.29."""
    listed = _arch("deepseek-ai/DeepSeek-V2-Lite-Chat")
    other = _arch("Qwen/Qwen3-30B-A3B")
    assert not ep.vllm_uses_mrv2(ep.vllm_rules("0.25.1"), listed, False)
    assert ep.vllm_uses_mrv2(ep.vllm_rules("0.27.1"), listed, False)
    assert ep.vllm_uses_mrv2(ep.vllm_rules("0.28.0"), listed, False)
    assert not ep.vllm_uses_mrv2(ep.vllm_rules("0.28.0"), other, False)
    assert ep.vllm_uses_mrv2(ep.vllm_rules("0.29.0"), other, False)


def _fit(version: str, **extra):
    req = {"model": "Qwen/Qwen3-8B", "gpu": "h100-sxm-80gb", "engine_version": version}
    return estimate_fit(FitRequest.model_validate(req | extra), with_suggestions=False)


def test_mrv2_profiles_the_sampling_pipeline_from_033():
    """0.29-0.32: MRV2 profiles only model-dtype logits; 0.33 adds the warm-up
    pass with fp32 logits, top-k/top-p and logprobs, costed like V1's sampler:
    the peak is the final hidden states (8192 tokens x 4096 x 2 B) plus 1024
    sequences x 151,936 logits x 22 B = 3.25 GiB, above 0.32's."""
    old, new = _fit("0.32.0"), _fit("0.33.0")
    peak = 8192 * 4096 * 2 + 1024 * 151936 * ep.SAMPLER_BYTES_PER_LOGIT["v1_019"]
    assert new.per_gpu.activation_gib == pytest.approx(peak / (1 << 30), abs=0.002)
    assert new.per_gpu.activation_gib > old.per_gpu.activation_gib + 2
    assert new.kv_cache_tokens < old.kv_cache_tokens
    assert old.kv_cache_tokens_range is None  # nothing sampler-dependent profiled


def test_unsaid_sampler_gives_the_kv_range_between_pytorch_and_flashinfer():
    unsaid = _fit("0.33.0")
    pytorch = _fit("0.33.0", flashinfer_sampler=False)
    flashinfer = _fit("0.33.0", flashinfer_sampler=True)
    assert unsaid.kv_cache_tokens == pytorch.kv_cache_tokens
    assert unsaid.kv_cache_tokens_range == (pytorch.kv_cache_tokens, flashinfer.kv_cache_tokens)
    assert unsaid.max_concurrency_range == (pytorch.max_concurrency, flashinfer.max_concurrency)
    assert unsaid.kv_cache_gib_range == (
        pytorch.per_gpu.kv_cache_gib,
        flashinfer.per_gpu.kv_cache_gib,
    )
    assert flashinfer.kv_cache_tokens > pytorch.kv_cache_tokens
    assert "FlashInfer" in unsaid.range_because
    assert pytorch.kv_cache_tokens_range is None and flashinfer.kv_cache_tokens_range is None


# --------------------------------------------------------------------------- SGLang


H100_MIB = 81559  # nvidia-smi total of an H100 SXM
RTX4090_MIB = 24564


def _mfs(version: str, gpu_mib: float, tp: int = 1, mla: bool = False) -> float:
    return ep.sglang_defaults(ep.sglang_rules(version), gpu_mib, tp, 1, mla).mem_fraction_static


def test_sglang_before_0410_uses_the_tp_rule():
    assert _mfs("0.4.0", H100_MIB, tp=1) == 0.88
    assert _mfs("0.4.9", H100_MIB, tp=8) == 0.81


def test_sglang_0410_reserves_a_fixed_amount_per_memory_tier():
    """H100: 9.5 + 1/2 GiB at TP 1 -> (81559 - 10240) / 81559 = 0.874; RTX 4090:
    2.8 + 1/10 GiB -> (24564 - 2969.6) / 24564 = 0.879."""
    assert _mfs("0.4.10", H100_MIB) == 0.874
    assert _mfs("0.5.1", RTX4090_MIB) == 0.879
    assert (
        ep.sglang_defaults(ep.sglang_rules("0.5.1"), H100_MIB, 1, 1, False).chunked_prefill_size
        == 8192
    )


def test_sglang_053_computes_the_reserve_from_chunk_and_graph_sizes():
    """H100 TP 1: 512 + 1.5 x 8192 + 2 x 256 + 128 = 13,440 MiB -> 0.835;
    RTX 4090: 512 + 1.5 x 2048 + 2 x 16 + 128 = 3,744 MiB -> 0.848."""
    assert _mfs("0.5.3", H100_MIB) == 0.835
    assert _mfs("0.5.3", RTX4090_MIB) == 0.848


def test_sglang_055_raises_small_gpu_graph_batch_to_24():
    """RTX 4090: 2 x 24 instead of 2 x 16 MiB -> 3,760 MiB, 0.847."""
    d = ep.sglang_defaults(ep.sglang_rules("0.5.5"), RTX4090_MIB, 1, 1, False)
    assert (d.cuda_graph_max_bs, d.mem_fraction_static) == (24, 0.847)


def test_sglang_0510_reserves_prefill_cuda_graphs():
    """58 prefill graph sizes up to 8192 tokens x 8 MiB: 13,904 MiB on an
    H100 -> 0.830; MLA models reserve 1.5 GiB instead."""
    assert len(ep.prefill_graph_token_sizes(8192)) == 58
    assert _mfs("0.5.10", H100_MIB) == 0.830
    assert _mfs("0.5.10", H100_MIB, mla=True) == round((H100_MIB - 13440 - 1536) / H100_MIB, 3)


def test_sglang_0520_gives_small_gpus_4k_chunks_and_48_graphs():
    """RTX 4090: 512 + 1.5 x 4096 + 2 x 48 + 128 + 50 x 8 = 7,280 MiB -> 0.704."""
    d = ep.sglang_defaults(ep.sglang_rules("0.5.20"), RTX4090_MIB, 1, 1, False)
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, d.mem_fraction_static) == (4096, 48, 0.704)
    assert (
        ep.sglang_defaults(ep.sglang_rules("0.5.20"), RTX4090_MIB, 4, 1, False).cuda_graph_max_bs
        == 160
    )


def test_sglang_default_release_and_fit_use_the_gpu_memory():
    res = estimate_fit(
        FitRequest.model_validate(
            {"model": "Qwen/Qwen3-8B", "gpu": "h100-sxm-80gb", "engine": "sglang"}
        )
    )
    assert (res.engine_version, res.engine_rules_version) == ("0.5.23", "0.5.23")
    assert res.max_num_batched_tokens == 8192
    assert res.per_gpu.usable_gib == pytest.approx(res.per_gpu.total_gib * 0.830, abs=0.01)
    assert any("mem_fraction_static" in a for a in res.assumptions)


SGLANG_CASES = tomllib.loads(SGLANG_LOGS.read_text())["case"]


def _sglang_cases(check: str) -> list[dict]:
    return [c for c in SGLANG_CASES if check in c["checks"]]


def test_sglang_cases_carry_their_sources():
    assert len(SGLANG_CASES) >= 2
    for c in SGLANG_CASES:
        assert c["source"].startswith("https://") and c["split"] == "held-out", c["id"]


@pytest.mark.parametrize("case", _sglang_cases("default_mem_fraction"), ids=lambda c: c["id"])
def test_sglang_default_fraction_matches_the_logged_one(case):
    rules = ep.sglang_rules(case["sglang_version"])
    assert rules.prefill_graphs_reserved is case["prefill_graphs"]
    tp = case["flags"].get("tensor_parallel_size", 1)
    d = ep.sglang_defaults(rules, case["gpu_memory_mib"], tp, 1, False)
    assert d.mem_fraction_static == case["logged"]["mem_fraction_static"]


@pytest.mark.parametrize("case", _sglang_cases("kv_tokens"), ids=lambda c: c["id"])
def test_sglang_kv_pool_matches_the_allocated_tokens(case):
    """Fully modelled (weights, free memory, static fraction): within 10 %."""
    req = {"model": case["model"], "gpu": case["gpu"], "engine": "sglang"}
    req |= {"engine_version": case["sglang_version"], **case["flags"]}
    pred = estimate_fit(FitRequest.model_validate(req), with_suggestions=False).kv_cache_tokens
    logged = case["logged"]["kv_tokens"]
    assert abs(pred - logged) <= 0.10 * logged, (pred, logged)


def test_unsaid_mxfp4_moe_kernel_widens_the_range_to_marlins_padding():
    """gpt-oss-120b on an H100 (0.33): triton_kernels by default (intermediate
    padded to 64); Marlin pads 2880 to 2944 per expert, more weights, less KV.
    With the sampler and the kernel both pinned there is no range; with only
    the kernel open, the range runs from Marlin's figure to triton's."""
    base = {"model": "openai/gpt-oss-120b", "gpu": "h100-sxm-80gb", "engine_version": "0.33.0"}

    def fit(**extra):
        return estimate_fit(FitRequest.model_validate(base | extra), with_suggestions=False)

    triton = fit(flashinfer_sampler=False, mxfp4_moe_kernel="triton")
    marlin = fit(flashinfer_sampler=False, mxfp4_moe_kernel="marlin")
    open_kernel = fit(flashinfer_sampler=False)
    assert marlin.per_gpu.weights_gib > triton.per_gpu.weights_gib
    assert triton.kv_cache_tokens_range is None and marlin.kv_cache_tokens_range is None
    assert open_kernel.kv_cache_tokens == triton.kv_cache_tokens
    assert open_kernel.kv_cache_tokens_range == (marlin.kv_cache_tokens, triton.kv_cache_tokens)
    assert "MXFP4 MoE kernel" in open_kernel.range_because
    both_open = fit()
    low, high = both_open.kv_cache_tokens_range
    assert low == marlin.kv_cache_tokens and high > triton.kv_cache_tokens


def test_sglang_pool_holds_whole_pages():
    """max_total_num_tokens is rounded down to a multiple of page_size
    (python/sglang/srt/model_executor/pool_configurator.py)."""
    base = {"model": "Qwen/Qwen3-8B", "gpu": "h100-sxm-80gb", "engine": "sglang"}
    one = estimate_fit(FitRequest.model_validate(base))
    paged = estimate_fit(FitRequest.model_validate(base | {"block_size": 64}))
    assert one.block_size == 1 and paged.block_size == 64
    assert paged.kv_cache_tokens == one.kv_cache_tokens // 64 * 64


def test_vllm_install_facts_are_refused_for_llamacpp():
    from inferwise.calculators.errors import InputError

    req = {"model": "x.gguf", "gpu": "h100-sxm-80gb", "engine": "llama.cpp"}
    for field, value in (("mxfp4_moe_kernel", "marlin"), ("flashinfer_sampler", True)):
        with pytest.raises(InputError) as err:
            estimate_fit(FitRequest.model_validate(req | {field: value}))
        assert err.value.field == field


# --------------------------------------------------------------------------- V0 and MLA
# vLLM 0.7.x (V0) forces chunked prefill off for MLA models (vllm/config.py, PR 12642: "MLA is
# enabled; forcing chunked prefill and prefix caching to be disabled"); other models get it
# above 32K context. Without it V0 batches whole prompts and schedules them first.


def test_v0_turns_chunked_prefill_off_for_mla_and_schedules_prefill_first():
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel

    r1 = {"model": "deepseek-ai/DeepSeek-R1", "gpu": "h200-sxm-141gb", "tensor_parallel_size": 8}
    fit = estimate_fit(FitRequest(**r1, engine_version="0.7.4"), with_suggestions=False)
    assert fit.max_num_batched_tokens == fit.max_model_len == 163_840
    assert StepModel.from_deployment(Deployment(**r1, engine_version="0.7.4")).prefill_first
    assert not StepModel.from_deployment(Deployment(**r1, engine_version="0.11.0")).prefill_first
    assert StepModel.from_deployment(Deployment(**r1, engine="sglang")).prefill_first


def test_v0_keeps_chunked_prefill_above_32k_for_other_models():
    llama = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
    fit = estimate_fit(FitRequest(**llama, engine_version="0.7.3"), with_suggestions=False)
    assert fit.max_num_batched_tokens == 2048  # 131,072-token context: chunked
    short = estimate_fit(
        FitRequest(**llama, engine_version="0.7.3", max_model_len=16_384), with_suggestions=False
    )
    assert short.max_num_batched_tokens == 16_384  # whole prompts
    assert ep.v0_chunked_prefill(131_072, mla=False) and not ep.v0_chunked_prefill(131_072, True)
