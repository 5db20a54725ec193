"""A safetensors checkpoint's tensor table, and the weight bytes per GPU it implies.

A safetensors file starts with an 8-byte length and a JSON header naming every tensor's
dtype, shape and byte range, so the exact weight bytes of a checkpoint (packed int4,
FP8 with its scales, zero points, the layers a quantizer left alone) are known without
reading a weight. Where the table is known, the memory fit uses it instead of counting
parameters from config.json, and says so; the config arithmetic stays for what the table
cannot show (load-time quantization, kernel-specific repacking).

Sharding under vLLM's tensor parallelism follows the tensor's role, read from its name:
layer weights of two or more dimensions are split over the TP ranks (column or row
parallel alike); 1-D tensors (norms, most biases) and MoE routers are replicated; K/V
projections are replicated once TP exceeds the KV heads (each rank keeps at least one
head). Pipeline stages take their decoder layers by vLLM's ``get_pp_indices``; the
embedding goes to the first stage, the final norm and the LM head to the last.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    from .architecture import ModelArchitecture

MAX_HEADER_BYTES = 100_000_000
"""The safetensors format's own limit on a header (the Rust reader refuses larger)."""
MAX_SHARDS = 4096
DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1,
    "BOOL": 1, "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}  # fmt: skip
"""Bytes per element of the safetensors dtypes (the format's own names)."""
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
ROUTER = re.compile(r"\.(?:mlp|block_sparse_moe|feed_forward)\.(?:gate|router)\.weight$")
KV_PROJ = re.compile(r"\.(?:k_proj|v_proj)\.")
EMBED = re.compile(r"(?:embed_tokens|wte|word_embeddings|tok_embeddings)\.weight$")
HEAD = re.compile(r"(?:^|\.)lm_head\.")
NOT_DECODER = re.compile(r"vision|visual|multi_modal_projector|mm_projector|audio")
"""Encoder towers and projectors: on the first stage, not decoder layers."""


@dataclass(frozen=True)
class CheckpointTensor:
    name: str
    dtype: str
    numel: int
    n_bytes: int
    ndim: int

    @property
    def layer(self) -> int | None:
        """The decoder layer this tensor belongs to (None for encoders and the rest)."""
        if NOT_DECODER.search(self.name):
            return None
        m = LAYER.search(self.name)
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class TensorTable:
    """Every tensor of a checkpoint, as its headers state them."""

    tensors: tuple[CheckpointTensor, ...]
    source: str
    """Where the headers were read: the folder or the Hub repo and commit."""

    @property
    def total_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def without_encoders(self) -> TensorTable:
        """The language model's tensors only (a text-only serve of a multimodal model)."""
        kept = tuple(t for t in self.tensors if not NOT_DECODER.search(t.name))
        return TensorTable(kept, self.source)

    def parameters_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.numel
        return dict(sorted(out.items()))


def tensor(name: str, dtype: str, shape: list[int]) -> CheckpointTensor:
    """One tensor from a header entry; an unknown dtype or a bad shape is refused."""
    size = DTYPE_BYTES.get(str(dtype).upper())
    if size is None:
        raise InputError("model", f"safetensors dtype '{dtype}' of '{name}' is not known")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InputError("model", f"safetensors shape of '{name}' must list sizes")
    numel = 1
    for d in shape:
        numel *= d
    return CheckpointTensor(name, str(dtype).upper(), numel, int(numel * size), len(shape))


# --------------------------------------------------------------------------- local files


def read_folder(folder: Path) -> TensorTable | None:
    """The tensor table of a local folder's ``*.safetensors`` files (headers only); None
    when it holds none."""
    files = sorted(folder.glob("*.safetensors"))[:MAX_SHARDS]
    if not files:
        return None
    _check_index(folder, {f.name for f in files})
    tensors: list[CheckpointTensor] = []
    for path in files:
        tensors += read_file_header(path)
    return TensorTable(tuple(tensors), str(folder))


def _check_index(folder: Path, present: set[str]) -> None:
    """An interrupted download: a shard the index names is not in the folder."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        weight_map = json.loads(index.read_text()).get("weight_map", {})
    except (OSError, ValueError, AttributeError):
        return  # the index is the catalog's concern; the headers still count
    missing = (
        sorted({str(v) for v in weight_map.values()} - present)
        if isinstance(weight_map, dict)
        else []
    )
    if missing:
        raise InputError(
            "model",
            f"shard '{missing[0]}' named by model.safetensors.index.json is not in {folder.name}"
            + (f" ({len(missing)} missing)" if len(missing) > 1 else ""),
        )


def missing_layers(table: TensorTable, num_layers: int) -> list[int]:
    """Decoder layers the config has and the checkpoint's tensors lack."""
    have = {t.layer for t in table.tensors}
    return [i for i in range(num_layers) if i not in have]


def read_file_header(path: Path) -> list[CheckpointTensor]:
    """One safetensors file's tensors: its first 8 bytes give the header length."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InputError("model", f"{path.name} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise InputError("model", f"{path.name}: header of {length:,} bytes is over the limit")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError("model", f"{path.name}: the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise InputError("model", f"{path.name}: the safetensors header is not an object")
    return [
        tensor(name, entry.get("dtype", "?"), entry.get("shape"))
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict)
    ]


# --------------------------------------------------------------------------- per GPU


def per_stage_bytes(
    table: TensorTable, arch: ModelArchitecture, tensor_parallel_size: int, pp_size: int
) -> tuple[int, ...]:
    """Weight bytes on one GPU of each pipeline stage, as vLLM shards the tensors."""
    from .params import pp_layer_split

    tp = tensor_parallel_size
    stage_of = {}
    for s, layers in enumerate(pp_layer_split(arch.num_layers, pp_size)):
        for i in layers:
            stage_of[i] = s
    out = [0.0] * pp_size
    kv_copies = max(1, tp // max(1, arch.num_kv_heads)) if arch.mla is None else 1
    for t in table.tensors:
        share = _share(t, tp, kv_copies)
        for s in _stages(t, stage_of, pp_size, arch):
            out[s] += t.n_bytes * share
    return tuple(int(b) for b in out)


def _share(t: CheckpointTensor, tp: int, kv_copies: int) -> float:
    """The fraction of a tensor one TP rank holds."""
    if tp == 1 or t.ndim < 2 or ROUTER.search(t.name):
        return 1.0
    if KV_PROJ.search(t.name):
        return min(1.0, kv_copies / tp)
    return 1.0 / tp


def _stages(
    t: CheckpointTensor, stage_of: dict[int, int], pp: int, arch: ModelArchitecture
) -> tuple[int, ...]:
    layer = t.layer
    if layer is not None:
        # MTP / extra layers past num_layers are not loaded by a plain serve
        return (stage_of[layer],) if layer in stage_of else ()
    if EMBED.search(t.name):
        tied_last = arch.tie_word_embeddings and pp > 1
        return (0, pp - 1) if tied_last else (0,)
    if HEAD.search(t.name) or "norm" in t.name:
        return (pp - 1,)
    return (0,)
