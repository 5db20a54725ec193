"""The Instruct and quantized catalog entries added from public copies.

Most of these configs were copied from third-party repositories, not from the
Hugging Face page itself, so the checks here guard against the two slips that
matter: copying the base model's file instead of the Instruct one (different
context length and end-of-turn token), and a transcription error in a shape
field (which would change every memory figure). The parameter totals are the
ones the model cards publish, so a wrong layer count or width cannot pass.
"""

from __future__ import annotations

import pytest

from inferwise.calculators.architecture import from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.params import count_parameters

SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts_per_tok",
    "head_dim",
)


@pytest.mark.parametrize(
    ("variant", "base", "differs"),
    [
        ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B", ()),
        ("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B", ()),
        ("Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B", ()),
        ("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", "Qwen/Qwen2.5-32B-Instruct", ()),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1", ()),
        # The 8x22B Instruct model ships Mistral's v3 tokenizer (32768 tokens).
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mistralai/Mixtral-8x22B-v0.1", ("vocab_size",)),
    ],
)
def test_variant_has_its_base_models_tensor_shapes(
    variant: str, base: str, differs: tuple[str, ...]
) -> None:
    """Instruct tuning and weight quantization keep every tensor shape (but a
    new tokenizer changes the vocabulary, and then the difference is real)."""
    v, b = load_model(variant).config, load_model(base).config
    for key in SHAPE_KEYS:
        if key in differs:
            assert v.get(key) != b.get(key), f"{variant} {key}"
        else:
            assert v.get(key) == b.get(key), f"{variant} {key}"


@pytest.mark.parametrize(
    "hf_id",
    [
        "Qwen/Qwen2.5-0.5B-Instruct",
        "Qwen/Qwen2.5-1.5B-Instruct",
        "Qwen/Qwen2.5-32B-Instruct",
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen2-72B-Instruct",
        "Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4",
    ],
)
def test_qwen_instruct_entries_are_the_instruct_files(hf_id: str) -> None:
    """Qwen's Instruct files end turns with <|im_end|> (151645) and declare
    32768 positions; the base files say 151643 and, for Qwen2.5, 131072. A
    copied base file would silently quadruple the default max_model_len."""
    config = load_model(hf_id).config
    assert config["eos_token_id"] == 151645
    assert config["max_position_embeddings"] == 32768
    assert config["use_sliding_window"] is False


@pytest.mark.parametrize(
    ("hf_id", "billions", "digits"),
    [
        # Qwen model cards: "Number of Parameters: 0.49B / 1.54B / 72.7B".
        ("Qwen/Qwen2.5-0.5B-Instruct", 0.49, 2),
        ("Qwen/Qwen2.5-1.5B-Instruct", 1.54, 2),
        ("Qwen/Qwen2.5-72B-Instruct", 72.7, 1),
        ("Qwen/Qwen2-72B-Instruct", 72.7, 1),
        # Mistral: Mixtral 8x7B has 46.7B parameters, 8x22B 141B.
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7, 1),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", 141, 0),
        # Model names: Mistral NeMo 12B, Ministral 8B, Phi-3-medium 14B, Granite 8B.
        ("mistralai/Mistral-Nemo-Instruct-2407", 12, 0),
        ("mistralai/Ministral-8B-Instruct-2410", 8, 0),
        ("microsoft/Phi-3-medium-4k-instruct", 14, 0),
        ("ibm-granite/granite-3.3-8b-instruct", 8, 0),
    ],
)
def test_parameter_total_matches_the_published_size(
    hf_id: str, billions: float, digits: int
) -> None:
    total = count_parameters(from_config(load_model(hf_id).config)).total
    assert round(total / 1e9, digits) == billions


def test_qwen25_72b_instruct_matches_the_counted_checkpoint() -> None:
    """The public inspection report the entry was copied from counts
    72,706,203,648 parameters in the safetensors files."""
    assert count_parameters(from_config(load_model("Qwen/Qwen2.5-72B-Instruct").config)).total == (
        72_706_203_648
    )


def test_mixtral_active_parameters_match_mistrals_figure() -> None:
    """Mistral: 12.9B of Mixtral 8x7B's parameters are used per token."""
    counts = count_parameters(
        from_config(load_model("mistralai/Mixtral-8x7B-Instruct-v0.1").config)
    )
    assert round(counts.active_per_token / 1e9, 1) == 12.9


def test_gptq_entry_keeps_its_quantization_config_verbatim() -> None:
    """vLLM picks the GPTQ kernel and the group scales from these fields."""
    q = load_model("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4").config["quantization_config"]
    assert (q["quant_method"], q["bits"], q["group_size"], q["sym"], q["desc_act"]) == (
        "gptq",
        4,
        128,
        True,
        False,
    )


@pytest.mark.parametrize(
    ("name", "hf_id"),
    [
        ("Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Nemo-Instruct-2407"),
        ("ministral-8b-instruct-2410", "mistralai/Ministral-8B-Instruct-2410"),
        ("granite-3.3-8b-instruct", "ibm-granite/granite-3.3-8b-instruct"),
        ("Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B-Instruct"),
    ],
)
def test_new_entries_resolve_by_their_short_name(name: str, hf_id: str) -> None:
    assert load_model(name).hf_id == hf_id
