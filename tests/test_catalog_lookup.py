"""Look-ups users rely on: GPU names as nvidia-smi prints them, model ids in
any case, local model folders, and errors that name the closest entries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inferwise.calculators.catalog import GPU, ModelSource, get_gpu, list_gpus, load_model
from inferwise.calculators.errors import InputError

# --------------------------------------------------------------------------- GPUs


@pytest.mark.parametrize(
    ("name", "gpu_id"),
    [
        ("h100", "h100-sxm-80gb"),
        ("H100", "h100-sxm-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
        ("a100", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA L40S", "l40s"),
        ("AMD Instinct MI300X", "mi300x"),
        ("  h100_sxm_80gb ", "h100-sxm-80gb"),
    ],
)
def test_gpu_names_resolve(name: str, gpu_id: str) -> None:
    assert get_gpu(name).id == gpu_id


@pytest.mark.parametrize(
    ("name", "gpu_id"),
    [
        ("H200", "h200-sxm-141gb"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("NVIDIA H100 NVL", "h100-nvl-94gb"),
        ("NVIDIA B200", "b200"),
        ("mi325x", "mi325x"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GH200 480GB", "gh200-96gb"),
        ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),
        ("NVIDIA L40", "l40"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("AMD Instinct MI300X VF", "mi300x"),
        ("AMD Instinct MI250X", "mi250x"),
    ],
)
def test_more_gpu_names_resolve(name: str, gpu_id: str) -> None:
    assert get_gpu(name).id == gpu_id


def test_unknown_gpu_names_closest_and_lists_ids() -> None:
    with pytest.raises(InputError) as info:
        get_gpu("h10")
    err = info.value
    assert err.field == "gpu"
    assert "unknown GPU 'h10'" in err.message
    assert "closest:" in err.message and "h100" in err.message
    assert err.accepted is not None and "h100-sxm-80gb" in err.accepted


def test_get_gpu_returns_catalog_object() -> None:
    gpu = get_gpu("h100")
    assert isinstance(gpu, GPU)
    assert gpu in list_gpus()


# --------------------------------------------------------------------------- models


def test_model_by_hf_id_any_case() -> None:
    m = load_model("META-LLAMA/llama-3.1-8b-instruct")
    assert isinstance(m, ModelSource)
    assert m.hf_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert m.origin == "catalog"
    assert m.config["num_key_value_heads"] == 8


def test_model_by_name_after_slash_when_unambiguous() -> None:
    assert load_model("Qwen3-8B").hf_id == "Qwen/Qwen3-8B"


def test_model_url_form_resolves() -> None:
    assert load_model("https://huggingface.co/Qwen/Qwen3-8B").hf_id == "Qwen/Qwen3-8B"


def test_unknown_model_names_closest() -> None:
    with pytest.raises(InputError) as info:
        load_model("Qwen/Qwen3-9B")
    err = info.value
    assert err.field == "model"
    assert "unknown model 'Qwen/Qwen3-9B'" in err.message
    assert "Qwen/Qwen3-8B" in err.message
    assert "config.json" in err.message


def test_missing_path_is_named() -> None:
    with pytest.raises(InputError) as info:
        load_model("./no/such/model/config.json")
    assert "no such file" in info.value.message


LLAMA_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
}


def test_load_from_config_json_path(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_LIKE))
    m = load_model(str(path))
    assert m.origin == "path"
    assert m.config == LLAMA_LIKE
    assert m.checkpoint_bytes is None


def test_load_from_folder_reads_index_total_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    index = {"metadata": {"total_size": 123456789}, "weight_map": {"lm_head.weight": "a"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"x" * 10)
    m = load_model(str(tmp_path))
    assert m.origin == "path"
    assert m.checkpoint_bytes == 123456789
    assert "total_size" in m.notes


def test_load_from_folder_sums_safetensors_without_index(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    (tmp_path / "a.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 23)
    assert load_model(str(tmp_path)).checkpoint_bytes == 123


def test_folder_reads_hf_quant_config_as_vllm_does(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(quant))
    m = load_model(str(tmp_path))
    assert m.hf_quant_config == quant
    assert m.config["quantization_config"]["quant_method"] == "modelopt"
    assert m.config["quantization_config"]["quantization"] == quant["quantization"]


def test_nvfp4_modelopt_resolves_to_modelopt_fp4(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(quant))
    assert load_model(str(tmp_path)).config["quantization_config"]["quant_method"] == (
        "modelopt_fp4"
    )


def test_existing_quantization_config_wins_over_hf_quant_config(tmp_path: Path) -> None:
    own = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_LIKE, "quantization_config": own}))
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(quant))
    assert load_model(str(tmp_path)).config["quantization_config"] == own


def test_catalog_modelopt_checkpoint_carries_its_quantization() -> None:
    m = load_model("nvidia/Llama-3.1-70B-Instruct-FP8")
    assert m.config["quantization_config"]["quant_method"] == "modelopt"
    assert m.config["quantization_config"]["quantization"]["exclude_modules"] == ["lm_head"]


def test_folder_without_config_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_model(str(tmp_path))
    assert "no config.json" in info.value.message


def test_malformed_json_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",, }')
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert info.value.field == "model"
    assert str(path) in info.value.message
    assert "not valid JSON" in info.value.message
    assert "line 1" in info.value.message


def test_malformed_index_names_the_index_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    (tmp_path / "model.safetensors.index.json").write_text("{broken")
    with pytest.raises(InputError) as info:
        load_model(str(tmp_path))
    assert "model.safetensors.index.json" in info.value.message


def test_json_that_is_not_a_config_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps([1, 2, 3]))
    with pytest.raises(InputError):
        load_model(str(path))
    path.write_text(json.dumps({"foo": 1}))
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert "model_type" in info.value.message


def test_pytorch_bin_index_total_size_is_used(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    index = {"metadata": {"total_size": 987654}, "weight_map": {}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    assert load_model(str(tmp_path)).checkpoint_bytes == 987654


def test_hf_cache_folder_resolves_to_newest_snapshot(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--tiny"
    old = repo / "snapshots" / "aaa"
    new = repo / "snapshots" / "bbb"
    for folder, layers in ((old, 1), (new, 3)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({**LLAMA_LIKE, "num_hidden_layers": layers}))
    os.utime(old, (1_000_000, 1_000_000))
    assert load_model(str(repo)).config["num_hidden_layers"] == 3


def test_unknown_hf_url_is_an_unknown_model_not_a_missing_file() -> None:
    with pytest.raises(InputError) as info:
        load_model("https://huggingface.co/Qwen/Qwen3-9B")
    assert "unknown model" in info.value.message


def test_callers_cannot_corrupt_the_catalog() -> None:
    first = load_model("Qwen/Qwen3-8B")
    first.config["num_hidden_layers"] = 1
    assert load_model("Qwen/Qwen3-8B").config["num_hidden_layers"] != 1
