"""Weights from a checkpoint's safetensors headers: read from a local folder (headers only),
sharded per tensor as vLLM does (TP splits, replicated K/V once TP passes the KV heads, PP
stages), in agreement with the config arithmetic for plain checkpoints, exact for packed
formats, and skipped where the engine changes the format at load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from inferwise.calculators import checkpoint_tensors as ct
from inferwise.calculators.catalog import load_model
from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit

GIB = 1 << 30


def dense_tensors(cfg: dict, dtype: str = "BF16", extra_layers: int = 0) -> dict[str, tuple]:
    """The tensors transformers saves for a Llama/Qwen2-style decoder."""
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    head = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv, ff = (
        cfg["num_attention_heads"] * head,
        cfg["num_key_value_heads"] * head,
        cfg["intermediate_size"],
    )
    bias = cfg.get("model_type") == "qwen2"
    out: dict[str, tuple] = {"model.embed_tokens.weight": (dtype, [cfg["vocab_size"], h])}
    for i in range(n + extra_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (dtype, [q, h]),
            p + "self_attn.k_proj.weight": (dtype, [kv, h]),
            p + "self_attn.v_proj.weight": (dtype, [kv, h]),
            p + "self_attn.o_proj.weight": (dtype, [h, q]),
            p + "mlp.gate_proj.weight": (dtype, [ff, h]),
            p + "mlp.up_proj.weight": (dtype, [ff, h]),
            p + "mlp.down_proj.weight": (dtype, [h, ff]),
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
        }
        if bias:
            out |= {
                p + "self_attn.q_proj.bias": ("BF16", [q]),
                p + "self_attn.k_proj.bias": ("BF16", [kv]),
                p + "self_attn.v_proj.bias": ("BF16", [kv]),
            }
    out["model.norm.weight"] = ("BF16", [h])
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = (dtype, [cfg["vocab_size"], h])
    return out


def write_checkpoint(folder: Path, cfg: dict, tensors: dict[str, tuple], shards: int = 3) -> Path:
    """config.json and safetensors files holding only their headers (the fit reads no more)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    items = list(tensors.items())
    per = math.ceil(len(items) / shards)
    for s in range(shards):
        header, offset = {}, 0
        for name, (dtype, shape) in items[s * per : (s + 1) * per]:
            size = int(math.prod(shape) * ct.DTYPE_BYTES[dtype])
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header).encode()
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        (folder / name).write_bytes(len(raw).to_bytes(8, "little") + raw)
    return folder


def fit(model: str, **kw):
    kw.setdefault("gpu", "h100")
    kw.setdefault("max_model_len", 8192)
    return estimate_fit(FitRequest(model=model, **kw))


def weights_quantity(result) -> str:
    return next(q for q in result.quantities if q.name == "weights_gib").detail


@pytest.mark.parametrize(
    ("model", "tp"),
    [
        ("Qwen/Qwen2.5-1.5B-Instruct", 1),  # tied embeddings, q/k/v biases
        ("Qwen/Qwen2.5-1.5B-Instruct", 2),
        ("Qwen/Qwen2.5-1.5B-Instruct", 4),  # 2 KV heads: K/V replicated over 4 ranks
        ("meta-llama/Llama-3.1-8B-Instruct", 8),
    ],
)
def test_headers_and_config_agree_per_gpu_for_a_plain_checkpoint(
    tmp_path: Path, model: str, tp: int
) -> None:
    cfg = dict(load_model(model).config)
    folder = write_checkpoint(tmp_path / "ckpt", cfg, dense_tensors(cfg))
    measured = fit(str(folder), tensor_parallel_size=tp)
    computed = fit(model, tensor_parallel_size=tp)
    assert weights_quantity(measured).startswith("measured from the checkpoint's headers")
    assert weights_quantity(computed).endswith("split per module as vLLM shards it")
    assert measured.per_gpu.weights_gib == pytest.approx(computed.per_gpu.weights_gib, rel=0.01)


def test_pipeline_stages_take_their_layers_and_the_ends(tmp_path: Path) -> None:
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    tensors = dense_tensors(cfg)
    table = ct.read_folder(write_checkpoint(tmp_path / "llama", cfg, tensors))
    from inferwise.calculators.architecture import from_config

    arch = from_config(cfg)
    stages = ct.per_stage_bytes(table, arch, 1, 2)
    assert sum(stages) == table.total_bytes
    embed = 2 * cfg["vocab_size"] * cfg["hidden_size"]
    assert stages[0] - stages[1] == pytest.approx(0, abs=embed * 0.01)  # embed vs head + norm
    assert ct.per_stage_bytes(table, arch, 2, 1)[0] < table.total_bytes / 2 + 1e6


def test_a_packed_fp8_checkpoint_is_measured_exactly(tmp_path: Path) -> None:
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    tensors = dense_tensors(cfg, dtype="F8_E4M3")
    tensors["model.embed_tokens.weight"] = ("BF16", tensors["model.embed_tokens.weight"][1])
    tensors["lm_head.weight"] = ("BF16", tensors["lm_head.weight"][1])
    for name in [n for n, (d, _) in tensors.items() if d == "F8_E4M3"]:
        tensors[name.replace(".weight", ".weight_scale")] = ("F32", [1])
    folder = write_checkpoint(tmp_path / "fp8", cfg, tensors)
    r = fit(str(folder))
    expected = sum(int(math.prod(s) * ct.DTYPE_BYTES[d]) for d, s in tensors.values())
    assert r.weights_bytes_total == expected
    assert r.per_gpu.weights_gib == pytest.approx(expected / GIB, abs=1e-3)
    assert "F8_E4M3" in weights_quantity(r)


def test_load_time_quantization_keeps_the_arithmetic(tmp_path: Path) -> None:
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    folder = write_checkpoint(tmp_path / "bf16", cfg, dense_tensors(cfg))
    r = fit(str(folder), quantization="fp8")
    assert not weights_quantity(r).startswith("measured")
    assert r.per_gpu.weights_gib < 9.0  # about half of the bf16 16 GB


def test_layers_past_the_config_are_not_loaded(tmp_path: Path) -> None:
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    with_mtp = write_checkpoint(tmp_path / "mtp", cfg, dense_tensors(cfg, extra_layers=1))
    plain = write_checkpoint(tmp_path / "plain", cfg, dense_tensors(cfg))
    assert fit(str(with_mtp)).per_gpu.weights_gib == fit(str(plain)).per_gpu.weights_gib
    assert fit(str(with_mtp)).checkpoint_bytes > fit(str(plain)).checkpoint_bytes


def test_a_broken_header_leaves_the_arithmetic_and_says_which_file(tmp_path: Path) -> None:
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    folder = write_checkpoint(tmp_path / "bad", cfg, dense_tensors(cfg), shards=1)
    shard = next(folder.glob("*.safetensors"))
    for content, says in (
        ((10**12).to_bytes(8, "little"), "over the limit"),
        ((5).to_bytes(8, "little") + b"{nope", "not JSON"),
        (b"xx", "too short"),
    ):
        shard.write_bytes(content)
        r = fit(str(folder))
        assert not weights_quantity(r).startswith("measured")
        assert any(shard.name in a and says in a for a in r.assumptions), r.assumptions
    with pytest.raises(InputError, match="dtype 'Q9'"):
        ct.tensor("w", "Q9", [1])


def test_an_incomplete_download_leaves_the_arithmetic_and_says_what_is_missing(
    tmp_path: Path,
) -> None:
    cfg = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
    tensors = dense_tensors(cfg)
    folder = write_checkpoint(tmp_path / "partial", cfg, tensors, shards=2)
    shards = sorted(folder.glob("*.safetensors"))
    index = {"metadata": {}, "weight_map": {name: shards[-1].name for name in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    shards[-1].unlink()  # the second shard never arrived
    r = fit(str(folder))
    assert not weights_quantity(r).startswith("measured")
    assert any(shards[-1].name in a and "is not in" in a for a in r.assumptions), r.assumptions
    # no index, half the layers: the config's layers are not all there
    (folder / "model.safetensors.index.json").unlink()
    r = fit(str(folder))
    assert not weights_quantity(r).startswith("measured")
    assert any("lack" in w and "layers" in w for w in r.warnings), r.warnings
