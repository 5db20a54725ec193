"""Small GGUF files with a real header and arbitrary hyper-parameters, for the llama.cpp fit.

The fit reads only the header (metadata and the tensor table), so the tensors here are
tiny zero arrays whose *declared* shapes are the test's; the bytes per tensor in the
table are what a file of that shape and ggml type holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def write_gguf(
    path: Path,
    arch: str,
    *,
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int | list[int] = 2,
    n_ff: int = 512,
    n_vocab: int = 1000,
    context: int = 8192,
    sliding_window: int | None = None,
    extra: dict[str, Any] | None = None,
    tensor_type: str = "Q8_0",
    tie_embeddings: bool = False,
    n_expert: int = 0,
    n_expert_used: int = 0,
) -> Path:
    """A GGUF header for ``arch`` with per-layer attention, MLP (or experts) and norms."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_head)
    if isinstance(n_head_kv, list):
        w.add_array(f"{arch}.attention.head_count_kv", n_head_kv)
    else:
        w.add_head_count_kv(n_head_kv)
    w.add_feed_forward_length(n_ff)
    w.add_context_length(context)
    w.add_uint32(f"{arch}.vocab_size", n_vocab)
    file_types = {"Q8_0": "MOSTLY_Q8_0", "Q4_K": "MOSTLY_Q4_K_M", "F16": "MOSTLY_F16"}
    w.add_file_type(gguf.LlamaFileType[file_types.get(tensor_type, "MOSTLY_Q8_0")])
    if sliding_window:
        w.add_sliding_window(sliding_window)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
    for key, value in (extra or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        else:
            w.add_uint32(key, value)
    head = n_embd // n_head
    kv_max = max(n_head_kv) if isinstance(n_head_kv, list) else n_head_kv
    qtype = gguf.GGMLQuantizationType[tensor_type]
    tensors: list[tuple[str, tuple[int, ...], Any]] = [
        ("token_embd.weight", (n_vocab, n_embd), qtype)
    ]
    for i in range(n_layer):
        b = f"blk.{i}"
        tensors += [
            (f"{b}.attn_norm.weight", (n_embd,), gguf.GGMLQuantizationType.F32),
            (f"{b}.attn_q.weight", (n_head * head, n_embd), qtype),
            (f"{b}.attn_k.weight", (kv_max * head, n_embd), qtype),
            (f"{b}.attn_v.weight", (kv_max * head, n_embd), qtype),
            (f"{b}.attn_output.weight", (n_embd, n_head * head), qtype),
            (f"{b}.ffn_norm.weight", (n_embd,), gguf.GGMLQuantizationType.F32),
        ]
        if n_expert:
            tensors += [
                (f"{b}.ffn_gate_inp.weight", (n_expert, n_embd), gguf.GGMLQuantizationType.F32),
                (f"{b}.ffn_gate_exps.weight", (n_expert, n_ff, n_embd), qtype),
                (f"{b}.ffn_up_exps.weight", (n_expert, n_ff, n_embd), qtype),
                (f"{b}.ffn_down_exps.weight", (n_expert, n_embd, n_ff), qtype),
            ]
        else:
            tensors += [
                (f"{b}.ffn_gate.weight", (n_ff, n_embd), qtype),
                (f"{b}.ffn_up.weight", (n_ff, n_embd), qtype),
                (f"{b}.ffn_down.weight", (n_embd, n_ff), qtype),
            ]
    tensors.append(("output_norm.weight", (n_embd,), gguf.GGMLQuantizationType.F32))
    if not tie_embeddings:
        tensors.append(("output.weight", (n_vocab, n_embd), qtype))
    sizes = []
    for name, shape, t in tensors:
        block, size = gguf.GGML_QUANT_SIZES[t]
        n_bytes = int(np.prod(shape)) * size // block
        sizes.append(n_bytes)
        if t == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), n_bytes)
        else:  # quantized: the writer takes the shape in bytes per row
            byte_shape = (*shape[:-1], shape[-1] * size // block)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), n_bytes, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    # The tensor data is a hole: the file has its real size, no bytes on disk.
    data = sum(-(-n // 32) * 32 for n in sizes)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size + 32 + data)
    return path


def tensor_bytes(shape: tuple[int, ...], type_name: str) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return int(np.prod(shape)) * size // block
