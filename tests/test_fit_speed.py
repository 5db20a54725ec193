"""The fit's speed-ups change no answer: memo caches, shared catalog entries, the suggestions switch."""

from __future__ import annotations

import time

import pytest

from inferwise.calculators import catalog, engine_policy, params
from inferwise.calculators.architecture import from_config
from inferwise.calculators.fit import FitRequest, estimate_fit
from inferwise.calculators.quantization import resolve_quantization

CASES = [
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"},
    {
        "model": "Qwen/Qwen3-30B-A3B",
        "gpu": "a100-sxm-80gb",
        "tensor_parallel_size": 2,
        "concurrency": 16,
    },
    {"model": "openai/gpt-oss-20b", "gpu": "h100-sxm-80gb", "pipeline_parallel_size": 2},
    {
        "model": "google/gemma-3-27b-it",
        "gpu": "l40s",
        "kv_cache_dtype": "fp8",
        "context_tokens": 32768,
    },
    {"model": "deepseek-ai/DeepSeek-V2-Lite-Chat", "gpu": "h200", "engine_version": "0.10.0"},
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100", "engine": "sglang"},
]


def _clear() -> None:
    params.clear_caches()
    engine_policy.vllm_rules.cache_clear()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"].split("/")[-1])
def test_answers_do_not_depend_on_what_was_computed_before(case) -> None:
    _clear()
    cold = estimate_fit(FitRequest(**case)).model_dump()
    for other in CASES:  # fill the caches with other architectures and splits
        estimate_fit(FitRequest(**other))
    warm = estimate_fit(FitRequest(**case)).model_dump()
    assert warm == cold
    if case.get("engine") != "sglang":  # vLLM answers come with alternatives
        assert cold["suggestions"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"].split("/")[-1])
def test_without_suggestions_only_the_suggestions_are_missing(case) -> None:
    full = estimate_fit(FitRequest(**case)).model_dump()
    bare = estimate_fit(FitRequest(**case), with_suggestions=False).model_dump()
    assert bare["suggestions"] == []
    assert {**full, "suggestions": []} == bare


def test_each_caller_gets_its_own_weight_dicts() -> None:
    arch = from_config(catalog.load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    scheme = resolve_quantization(None, arch.quantization_config)
    first = params.weight_bytes(arch, scheme, 2, 2, 1)
    first.by_category["embedding"] = -1
    again = params.weight_bytes(arch, scheme, 2, 2, 1)
    assert again.by_category["embedding"] > 0
    assert again.total_bytes == first.total_bytes


def test_layouts_that_differ_get_different_weights() -> None:
    """The memo key holds every field the module list depends on."""
    config = catalog.load_model("meta-llama/Llama-3.1-8B-Instruct").config
    scheme = resolve_quantization(None, None)
    base = params.weight_bytes(from_config(config), scheme, 2)
    for key, value in (
        ("num_key_value_heads", 4),
        ("intermediate_size", 14000),
        ("tie_word_embeddings", True),
        ("attention_bias", True),
    ):
        changed = params.weight_bytes(from_config({**config, key: value}), scheme, 2)
        assert changed.total_bytes != base.total_bytes, key
    assert params.weight_bytes(from_config(dict(config)), scheme, 2).total_bytes == base.total_bytes


def test_shared_catalog_entries_are_the_cached_ones_and_copies_stay_private() -> None:
    shared = catalog.load_model("meta-llama/Llama-3.1-8B-Instruct", fresh=False)
    assert catalog.load_model("meta-llama/Llama-3.1-8B-Instruct", fresh=False) is shared
    copy = catalog.load_model("meta-llama/Llama-3.1-8B-Instruct")
    copy.config["num_hidden_layers"] = 1
    assert shared.config["num_hidden_layers"] == 32
    assert catalog.load_model("meta-llama/Llama-3.1-8B-Instruct").config["num_hidden_layers"] == 32


def test_a_fit_with_its_alternatives_stays_in_the_millisecond_range() -> None:
    """A loose guard (the bench measures properly): well under the 5 ms MCP budget
    even on a busy machine, where the unoptimised fit took 5-8 ms."""
    req = FitRequest(**CASES[1])
    estimate_fit(req)
    best = min(_timed(req) for _ in range(15))
    assert best < 4.0, f"{best:.2f} ms"


def _timed(req: FitRequest) -> float:
    t0 = time.perf_counter()
    estimate_fit(req)
    return (time.perf_counter() - t0) * 1000.0
