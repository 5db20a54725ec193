"""Predict and budget answer a workload that fits even when the model's default context does not."""

from __future__ import annotations

import json

import pytest

from inferwise.calculators.budget import BudgetRequest, decompose_budget
from inferwise.calculators.errors import InputError
from inferwise.calculators.predict import PredictRequest, predict_performance
from inferwise.server.cli import main

# Llama-3.1-8B's default window is 131,072 tokens; on one 24 GB L4 about 26k fit
SMALL = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "l4"}


def test_predict_assumes_the_longest_context_that_fits_and_says_so():
    r = predict_performance(PredictRequest(**SMALL, input_tokens=1200, output_tokens=200))
    note = r.assumptions[0]
    assert "assumed" in note and "--max-model-len" in note
    window = int(note.split("--max-model-len ")[1])
    assert 16_000 < window < 40_000 and window % 16 == 0
    # the whole KV cache is what is left beside the weights at that window
    assert window <= r.kv_cache_tokens < 40_000
    assert r.ttft_ms.p50 > 0 and r.itl_ms.p50 > 0


def test_an_explicit_window_is_never_changed():
    with pytest.raises(InputError) as e:
        predict_performance(
            PredictRequest(**SMALL, max_model_len=131_072, input_tokens=1200, output_tokens=200)
        )
    assert e.value.field == "model"


def test_a_workload_longer_than_what_fits_still_fails_with_the_numbers():
    with pytest.raises(InputError) as e:
        predict_performance(PredictRequest(**SMALL, input_tokens=60_000, output_tokens=200))
    assert e.value.field == "max_model_len" and "60,200" in e.value.message


def test_a_model_whose_default_fits_is_not_touched():
    r = predict_performance(
        PredictRequest(model=SMALL["model"], gpu="h100-sxm-80gb", input_tokens=1200)
    )
    assert not any("longest that fits" in a for a in r.assumptions)


def test_budget_assumes_it_too(capsys):
    r = decompose_budget(
        BudgetRequest(
            **SMALL,
            input_tokens=1200,
            output_tokens=200,
            request_rate=0.5,
            slo_e2e_ms={"p95": 60_000},
        )
    )
    assert "longest that fits" in r.assumptions[0]
    code = main(
        ["predict", "--model", SMALL["model"], "--gpu", "l4", "--input-tokens", "1200", "--json"]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert "longest that fits" in out["assumptions"][0]


# GPUStack's performance lab served gpt-oss-120b on one H100 with vLLM 0.11.0 at
# --max-model-len 32768 (docs/performance-lab/gpt-oss-120b/h100.md): it starts with
# FlashInfer's sampler installed, not with PyTorch's sort path, whose profiling peak the fit
# assumes when nothing says which.
GPT_OSS_H100 = {
    "model": "openai/gpt-oss-120b",
    "gpu": "h100-sxm-80gb",
    "max_model_len": 32_768,
    "engine_version": "0.11.0",
}


def test_a_deployment_that_fits_under_an_unsaid_install_fact_is_predicted_and_says_which():
    r = predict_performance(
        PredictRequest(**GPT_OSS_H100, input_tokens=4000, output_tokens=200, concurrency=4)
    )
    pinned = [a for a in r.assumptions if "install fact" in a]
    assert pinned and "flashinfer_sampler=True" in pinned[0]
    assert r.kv_cache_tokens >= 32_768 and r.ttft_ms.p50 > 0


def test_no_install_fact_rescues_a_deployment_that_cannot_fit():
    with pytest.raises(InputError) as e:
        predict_performance(
            PredictRequest(**{**GPT_OSS_H100, "gpu": "l40s"}, input_tokens=4000, output_tokens=200)
        )
    assert e.value.field == "model" and "does not fit" in e.value.message


def test_the_longest_fitting_context_is_found_under_an_unsaid_install_fact_too():
    """No max_model_len: gpt-oss-120b's 131k default does not fit one H100 under vLLM 0.11
    with any sampler, and with PyTorch's sampler no context fits at all; under FlashInfer's,
    about 126k tokens do. Predict assumes that window and the sampler, and says both."""
    fields = {k: v for k, v in GPT_OSS_H100.items() if k != "max_model_len"}
    r = predict_performance(
        PredictRequest(**fields, input_tokens=8000, output_tokens=500, concurrency=8)
    )
    notes = " ".join(r.assumptions)
    assert "the longest that fits" in notes and "flashinfer_sampler=True" in notes
    assert r.ttft_ms.p50 > 0


# Llama 4's checkpoints are multimodal; vLLM serves the language model alone with
# --hf-overrides '{"model_type": "llama4_text"}'. The fit's refusal names that flag, so
# predict and budget must take it too.
SCOUT = {
    "model": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "gpu": "h100-sxm-80gb",
    "tensor_parallel_size": 4,
    "max_model_len": 32_768,
}


def test_predict_refuses_a_vision_tower_it_cannot_count_and_names_the_flag_it_takes(capsys):
    with pytest.raises(InputError) as e:
        predict_performance(PredictRequest(**SCOUT, input_tokens=1000, output_tokens=200))
    assert "--hf-overrides model_type=llama4_text" in e.value.message
    code = main(
        ["predict", "--model", SCOUT["model"], "--gpu", "h100", "-tp", "4"]
        + ["--max-model-len", "32768", "--hf-overrides", "model_type=llama4_text", "--json"]
    )
    assert code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert any("language model only" in a for a in out["assumptions"])
    assert out["ttft_ms"]["p50"] > 0


def test_an_override_changes_the_model_predict_times():
    """An override is not only accepted: the step model is built from the overridden
    config (here a Llama-3.1-8B told it has half its layers decodes faster)."""
    base = {**SMALL, "gpu": "h100-sxm-80gb", "input_tokens": 1000, "output_tokens": 100}
    whole = predict_performance(PredictRequest(**base))
    half = predict_performance(PredictRequest(**base, hf_overrides={"num_hidden_layers": "16"}))
    assert half.itl_ms.p50 < 0.75 * whole.itl_ms.p50
    budget = decompose_budget(
        BudgetRequest(
            **SCOUT,
            hf_overrides={"model_type": "llama4_text"},
            input_tokens=1000,
            output_tokens=200,
            request_rate=0.5,
            slo_e2e_ms={"p95": 60_000},
        )
    )
    assert any("language model only" in a for a in budget.assumptions)


def test_overrides_from_json_clients_may_be_numbers_as_vllm_takes_them():
    """An MCP client or a workload file writes {"num_hidden_layers": 16}, the CLI
    num_hidden_layers=16: the same override, the same prediction."""
    base = {**SMALL, "gpu": "h100-sxm-80gb", "input_tokens": 1000, "output_tokens": 100}
    number = PredictRequest(**base, hf_overrides={"num_hidden_layers": 16})
    text = PredictRequest(**base, hf_overrides={"num_hidden_layers": "16"})
    assert number.hf_overrides == text.hf_overrides == {"num_hidden_layers": "16"}
    nested = PredictRequest(**base, hf_overrides={"rope_scaling": {"type": "linear", "factor": 2}})
    assert json.loads(nested.hf_overrides["rope_scaling"]) == {"type": "linear", "factor": 2}
    assert predict_performance(number).itl_ms.p50 == predict_performance(text).itl_ms.p50
