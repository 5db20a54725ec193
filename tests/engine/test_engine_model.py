"""The generated test model, read back with gguf's own reader.

Not marked ``engine``: it needs only the ``gguf`` package, not the binary, so
it runs in the fast suite and guards the properties the engine tests rely on
(same seed, same bytes; end-of-text unreachable).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferwise.probes.llamacpp import write_test_model

gguf = pytest.importorskip("gguf")


def _field(reader: object, key: str) -> object:
    f = reader.fields[key]  # type: ignore[attr-defined]
    return f.contents()


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_test_model(
        tmp_path / "a.gguf", seed=7, n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=1024
    )
    b = write_test_model(
        tmp_path / "b.gguf", seed=7, n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=1024
    )
    c = write_test_model(
        tmp_path / "c.gguf", seed=8, n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=1024
    )
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.path.read_bytes() != c.path.read_bytes()
    assert a.file_bytes == a.path.stat().st_size


def test_metadata_is_what_llama_cpp_reads(tmp_path: Path) -> None:
    info = write_test_model(
        tmp_path / "m.gguf",
        seed=1,
        n_layer=3,
        n_embd=128,
        n_head=8,
        n_head_kv=2,
        n_ff=256,
        n_vocab=1024,
    )
    r = gguf.GGUFReader(str(info.path))
    assert _field(r, "general.architecture") == "llama"
    assert _field(r, "llama.block_count") == 3
    assert _field(r, "llama.attention.head_count_kv") == 2
    assert _field(r, "tokenizer.ggml.model") == "llama"
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == info.n_vocab
    assert tokens[2] == "</s>" and _field(r, "tokenizer.ggml.eos_token_id") == 2
    assert "<0x0A>" in tokens  # byte fallback: the newline token llama.cpp looks up
    for marker in ("<|im_start|>", "<|im_end|>"):  # the chat template's markers are tokens
        assert marker in tokens and marker in _field(r, "tokenizer.chat_template")
    assert "add_generation_prompt" in _field(r, "tokenizer.chat_template")
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output.weight", "blk.2.ffn_down.weight"} <= names


def test_end_of_text_and_byte_tokens_cannot_win(tmp_path: Path) -> None:
    """The reserved channel: always +1 in the residual, never written, -1e4 on the banned rows."""
    info = write_test_model(
        tmp_path / "m.gguf", seed=3, n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=1024
    )
    r = gguf.GGUFReader(str(info.path))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in r.tensors}
    assert np.all(t["token_embd.weight"][:, 0] == 1.0)
    for i in range(info.n_layer):
        assert not t[f"blk.{i}.attn_output.weight"][0].any()
        assert not t[f"blk.{i}.ffn_down.weight"][0].any()
    out = t["output.weight"]
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    banned = sum(1 for ty in types if ty != gguf.TokenType.NORMAL)
    # every special and byte token comes before the words, and none of them can win
    assert all(ty == gguf.TokenType.NORMAL for ty in types[banned:])
    assert {"</s>", "<|im_end|>", "<0xFF>"} <= set(tokens[:banned])
    assert np.all(out[:banned, 0] <= -1e4 * 0.99)
    assert np.all(out[banned:, 0] == 0.0)


def test_bad_shapes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_embd"):
        write_test_model(tmp_path / "x.gguf", n_embd=100, n_head=8)
    with pytest.raises(ValueError, match="n_vocab"):
        write_test_model(tmp_path / "x.gguf", n_vocab=100)
