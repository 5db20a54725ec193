"""The catalog files themselves: every entry parses, carries the fields the
calculators read, cites a source, and is internally consistent. These checks
catch transcription slips (a sparse figure left unhalved, a head count that
cannot divide the hidden size) before a calculator turns them into a wrong
answer."""

from __future__ import annotations

import json
import tomllib

import pytest

from inferwise.calculators.catalog import (
    DTYPE_KEYS,
    GPU_FILE,
    INTERCONNECTS,
    MODELS_DIR,
    list_gpus,
    list_models,
)

GPUS = list_gpus()
MODELS = list_models()


def test_gpu_file_is_valid_toml_with_unique_ids() -> None:
    with GPU_FILE.open("rb") as fh:
        table = tomllib.load(fh)
    assert len(table) == len(GPUS)
    assert all(gpu_id == gpu_id.lower() for gpu_id in table)


def test_every_alias_names_one_gpu() -> None:
    seen: dict[str, str] = {}
    for gpu in GPUS:
        for name in (gpu.id, gpu.name, *gpu.aliases):
            key = " ".join(name.lower().replace("-", " ").replace("_", " ").split())
            assert seen.setdefault(key, gpu.id) == gpu.id, f"{name!r} used twice"


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.id)
def test_gpu_row_is_complete_and_sane(gpu) -> None:
    assert gpu.vendor in ("nvidia", "amd")
    assert gpu.interconnect in INTERCONNECTS
    assert gpu.source_url.startswith("https://")
    assert gpu.pcie_gen in (3, 4, 5, 6)
    # Vendors print "80GB" for 80 GiB of HBM (A100: 81,920 MiB) and for 80 x 10^9
    # bytes alike; what the runtime reports lies between 85 % of the decimal
    # reading and the binary one (ECC and firmware reservations).
    decimal_gib = gpu.memory_gb_vendor * 1e9 / 2**30
    assert 0.85 * decimal_gib <= gpu.memory_total_gib <= gpu.memory_gb_vendor + 0.01, gpu.id
    assert 100 <= gpu.memory_bandwidth_gb_per_s <= 10_000
    assert 8 <= gpu.interconnect_bandwidth_gb_per_s <= 1_000
    assert set(gpu.dense_tflops) <= set(DTYPE_KEYS), gpu.dense_tflops
    assert "bf16" in gpu.dense_tflops or "fp16" in gpu.dense_tflops
    assert all(v > 0 for v in gpu.dense_tflops.values())


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.id)
def test_gpu_dense_rates_are_ordered(gpu) -> None:
    """Lower precision is never slower on the same tensor cores; a violation
    usually means one figure was copied as sparse and another as dense."""
    t = gpu.dense_tflops
    half = t.get("bf16", t.get("fp16"))
    if "fp8" in t:
        assert t["fp8"] >= half, gpu.id
    if "fp4" in t:
        assert t["fp4"] >= t.get("fp8", half), gpu.id
    if "int8" in t:
        assert t["int8"] >= half, gpu.id
    if "fp32" in t:
        assert t["fp32"] <= half, gpu.id
    if "bf16" in t and "fp16" in t:
        assert t["bf16"] == pytest.approx(t["fp16"], rel=0.01), gpu.id


# --------------------------------------------------------------------------- models


def _text(config: dict) -> dict:
    """Multimodal configs keep the language model under ``text_config`` (InternVL: ``llm_config``)."""
    return config.get("text_config", config.get("llm_config", config))


def test_catalog_has_the_models_the_issue_names() -> None:
    ids = {m.hf_id for m in MODELS}
    assert len(ids) == len(MODELS)
    for must in (
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.1-70B-Instruct",
        "Qwen/Qwen3-30B-A3B",
        "deepseek-ai/DeepSeek-V3",
        "openai/gpt-oss-120b",
    ):
        assert must in ids


@pytest.mark.parametrize("path", sorted(MODELS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_model_file_shape(path) -> None:
    entry = json.loads(path.read_text(encoding="utf-8"))
    assert set(entry) >= {"hf_id", "source_url", "checkpoint_bytes", "notes", "config"}
    assert path.stem == entry["hf_id"].replace("/", "--")
    assert entry["source_url"] == f"https://huggingface.co/{entry['hf_id']}/blob/main/config.json"
    assert entry["notes"], "say where the config was copied from"
    cb = entry["checkpoint_bytes"]
    assert cb is None or (isinstance(cb, int) and cb > 0)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.hf_id)
def test_model_config_has_what_calculators_read(model) -> None:
    config = model.config
    assert config.get("model_type")
    assert config.get("architectures")
    text = _text(config)
    # Sparse multimodal configs (Gemma 3) leave some of these to class defaults.
    if text is config:
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            assert isinstance(text.get(key), int) and text[key] > 0, key
    else:
        from inferwise.calculators.architecture import SUPPORTED_MODEL_TYPES, from_config

        if config["model_type"] == "llama4":
            # the vision tower is not modelled: refused, naming the text-only override
            from inferwise.calculators.errors import InputError

            with pytest.raises(InputError, match="model_type=llama4_text"):
                from_config(config)
            arch = from_config(config, {"model_type": "llama4_text"})
            assert arch.hidden_size > 0 and arch.num_layers > 0
        elif config["model_type"] in SUPPORTED_MODEL_TYPES:
            # sparse text configs (Gemma 3, LLaVA-NeXT) are completed from class defaults
            arch = from_config(config)
            assert arch.hidden_size > 0 and arch.num_layers > 0
        else:
            assert isinstance(text.get("hidden_size"), int)
            assert isinstance(text.get("num_hidden_layers"), int)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.hf_id)
def test_model_heads_are_consistent(model) -> None:
    text = _text(model.config)
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads", heads)
    hidden = text.get("hidden_size")
    if heads is None:
        return  # sparse config, class defaults apply
    assert kv_heads and heads % kv_heads == 0, "KV heads must divide query heads"
    if text.get("head_dim") is None and text.get("kv_lora_rank") is None:
        assert hidden % heads == 0, "no head_dim: heads must divide hidden_size"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.hf_id)
def test_moe_fields_are_consistent(model) -> None:
    text = _text(model.config)
    experts = (
        text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts")
    )
    per_tok = text.get("num_experts_per_tok") or text.get("experts_per_token")
    if experts:
        assert per_tok and 0 < per_tok <= experts
    mla = text.get("kv_lora_rank")
    if mla:
        assert text.get("qk_rope_head_dim") and text.get("v_head_dim")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.hf_id)
def test_layer_types_match_layer_count(model) -> None:
    text = _text(model.config)
    if "layer_types" in text:
        assert len(text["layer_types"]) == text["num_hidden_layers"]


def test_memory_totals_match_the_readings_they_cite() -> None:
    """Where a row cites its runtime reading in a comment ("nvidia-smi: 81559
    MiB", "... 205822885888 bytes"), the stored GiB must be that reading."""
    import re

    checked = 0
    for line in GPU_FILE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"memory_total_gib = ([\d.]+)\s*#\s*(.*)", line)
        if not m:
            continue
        value, comment = float(m.group(1)), m.group(2)
        mib = re.search(r"(\d+) MiB", comment)
        raw = re.search(r"(\d{9,}) bytes", comment)
        if mib:
            assert value == pytest.approx(int(mib.group(1)) / 1024, abs=0.001), line
            checked += 1
        elif raw:
            assert value == pytest.approx(int(raw.group(1)) / 2**30, abs=0.001), line
            checked += 1
        else:
            assert "see notes" in comment or "not read" in comment, line
    assert checked >= 20


def _dense_params(cfg: dict) -> int:
    """Parameters of a Llama-style decoder (llama, mistral, qwen2) from its config."""
    h, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    qkv_bias = (heads + 2 * kv) * hd if cfg["model_type"] == "qwen2" else 0
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + qkv_bias + 3 * h * inter + 2 * h
    embed = cfg["vocab_size"] * h
    lm_head = 0 if cfg.get("tie_word_embeddings", False) else embed
    return embed + lm_head + layers * per_layer + h


@pytest.mark.parametrize(
    "model",
    [
        m
        for m in MODELS
        if m.checkpoint_bytes
        and m.config.get("model_type") in ("llama", "mistral", "qwen2")
        and "quantization_config" not in m.config
    ],
    ids=lambda m: m.hf_id,
)
def test_checkpoint_bytes_agree_with_the_config(model) -> None:
    """A bf16 checkpoint holds 2 bytes per parameter: a checkpoint_bytes figure
    attributed to the wrong model would miss by far more than 0.1 %."""
    assert model.config["torch_dtype"] == "bfloat16"
    assert model.checkpoint_bytes == pytest.approx(2 * _dense_params(model.config), rel=1e-3)
