"""A GGUF checkpoint's metadata and tensor table, read without its weights.

llama.cpp serves GGUF files, and everything its memory fit needs is in the file's
header: the hyper-parameters (``{arch}.block_count``, head counts per layer, the
sliding window) and every tensor's name, ggml type and element count, so the weight
bytes are measured, not derived from a config. The header is read with the ``gguf``
package (llama.cpp's own reader). A local file is memory-mapped (only the header
pages are touched); a file on the Hugging Face Hub is read with HTTP range requests
of the header alone, grown until the tensor table is complete and bounded by
:data:`MAX_HEADER_BYTES`: no weight byte is downloaded.

Model specs: a path to a ``.gguf`` file (the first part of a split file names the
rest), or ``REPO:FILE.gguf`` / ``REPO:QUANT`` (llama-server's ``-hf`` spelling: the
repository's one GGUF file whose name carries the quant tag, e.g. ``Q4_K_M``).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .files import expand_path

MAX_HEADER_BYTES = 128 << 20
"""Largest GGUF header read from the Hub (metadata + tensor table). Tokenizer arrays
dominate it: a 256k-token vocabulary with merges is ~10-20 MB; no real header nears this."""
FIRST_READ_BYTES = 4 << 20
MAX_SPLITS = 256
SMALL_ARRAY = 4096
"""Metadata arrays up to this length are kept (per-layer head counts); longer ones
(tokenizer vocabularies) keep only their length."""
HUB_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*):(?P<tag>[\w.+-]+)$")
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


@dataclass(frozen=True)
class GgufTensor:
    name: str
    ggml_type: str
    """ggml's name of the storage type: F16, BF16, Q8_0, Q4_K, MXFP4..."""
    n_elements: int
    n_bytes: int

    @property
    def layer(self) -> int | None:
        """The decoder layer (``blk.N.``) the tensor belongs to; None for the rest."""
        if self.name.startswith("blk."):
            head = self.name.split(".", 2)[1]
            return int(head) if head.isdigit() else None
        return None


@dataclass(frozen=True)
class GgufModel:
    """What one GGUF checkpoint (all its split parts) says about itself."""

    source: str
    """The local path or the Hub URL of the (first) file."""
    architecture: str
    metadata: dict[str, Any]
    tensors: tuple[GgufTensor, ...]
    files: tuple[str, ...]
    revision: str | None = None

    def hparam(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}`` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def total_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def total_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def bytes_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.ggml_type] = out.get(t.ggml_type, 0) + t.n_bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @property
    def file_type(self) -> str:
        """The quantization the file calls itself (``general.file_type``), e.g. Q4_K_M."""
        import gguf

        value = self.metadata.get("general.file_type")
        try:
            return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
        except (TypeError, ValueError):
            return max(self.bytes_by_type().items(), key=lambda kv: kv[1])[0]

    @property
    def vocab_size(self) -> int | None:
        explicit = self.hparam("vocab_size")
        if explicit:
            return int(explicit)
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return int(tokens) if isinstance(tokens, int) else None


def is_gguf_spec(spec: str) -> bool:
    """A path to a .gguf file, or a Hub ``REPO:TAG`` spec."""
    text = spec.strip()
    return text.lower().endswith(".gguf") or bool(HUB_SPEC.match(text))


def load_gguf(spec: str, revision: str | None = None) -> GgufModel:
    """Read the GGUF checkpoint ``spec`` names (a local path first, then the Hub)."""
    text = spec.strip()
    path = Path(expand_path(text))
    if text.lower().endswith(".gguf") and (path.exists() or not HUB_SPEC.match(text)):
        return _load_local(path)
    match = HUB_SPEC.match(text)
    if match is None:
        raise InputError(
            "model",
            f"'{_clip(text)}' is neither a local .gguf file nor a Hub spec REPO:FILE.gguf / REPO:QUANT",
        )
    from . import gguf_hub

    return gguf_hub.load(match["repo"], match["tag"], revision)


# --------------------------------------------------------------------------- local files


def _load_local(path: Path) -> GgufModel:
    if not path.is_file():
        raise InputError("model", f"no GGUF file at {path}")
    parts = split_parts(path.name, lambda name: (path.parent / name).is_file())
    headers = [read_header(path.parent / name) for name in parts]
    return assemble(str(path), headers, tuple(str(path.parent / n) for n in parts))


def split_parts(name: str, exists: Any) -> list[str]:
    """The files of a split checkpoint (``-00001-of-00003.gguf``) in order; ``[name]``
    for a single file. A missing part is an error naming it."""
    m = SPLIT_NAME.match(name)
    if m is None:
        return [name]
    count = int(m["n"])
    if not 1 <= count <= MAX_SPLITS:
        raise InputError("model", f"split GGUF '{name}' claims {count} parts")
    names = [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    missing = [n for n in names if not exists(n)]
    if missing:
        raise InputError("model", f"split GGUF part '{missing[0]}' not found beside '{name}'")
    return names


@dataclass(frozen=True)
class Header:
    """One file's metadata and tensor table, and where its tensor data starts."""

    metadata: dict[str, Any]
    tensors: tuple[GgufTensor, ...]
    data_offset: int


def read_header(path: Path | str) -> Header:
    """Parse one GGUF file's header with the gguf package (memory-mapped: the weights'
    pages are never read)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (ValueError, KeyError, IndexError, OSError, TypeError) as exc:
        raise InputError(
            "model", f"'{Path(path).name}' is not a readable GGUF file: {exc}"
        ) from None
    metadata = {
        name: _value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")
    }
    tensors = tuple(
        GgufTensor(t.name, t.tensor_type.name, int(t.n_elements), int(t.n_bytes))
        for t in reader.tensors
    )
    return Header(metadata, tensors, int(reader.data_offset))


def _value(field: Any) -> Any:
    """A metadata value: scalars and short arrays as Python values, long arrays as
    their length (tokenizer vocabularies)."""
    import gguf

    is_array = bool(field.types) and field.types[0] == gguf.GGUFValueType.ARRAY
    if is_array and len(field.data) > SMALL_ARRAY:
        return len(field.data)
    try:
        return field.contents()
    except (ValueError, UnicodeDecodeError, IndexError):
        return None


def assemble(
    source: str, headers: list[Header], files: tuple[str, ...], revision: str | None = None
) -> GgufModel:
    """One model from its parts' headers (the first part holds the metadata)."""
    metadata = headers[0].metadata
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InputError("model", f"'{Path(source).name}' states no general.architecture")
    tensors = tuple(t for h in headers for t in h.tensors)
    if not tensors:
        raise InputError("model", f"'{Path(source).name}' holds no tensors")
    return GgufModel(source, arch, metadata, tensors, files, revision)


def sparse_copy(prefix: bytes, total_size: int) -> Path:
    """A temporary file of ``total_size`` bytes holding ``prefix`` and a hole after it,
    so GGUFReader can map a file whose weights were never fetched. Caller deletes it."""
    fd, name = tempfile.mkstemp(suffix=".gguf", prefix="inferwise-header-")
    with os.fdopen(fd, "wb") as f:
        f.write(prefix)
        f.truncate(max(total_size, len(prefix)))
    return Path(name)


def _clip(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
