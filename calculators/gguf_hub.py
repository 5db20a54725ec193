"""GGUF headers from the Hugging Face Hub, by range requests of the header alone.

The repository's file list says which GGUF file a ``REPO:QUANT`` spec means; then
the file's first bytes are fetched (``Range: bytes=0-N``), parsed, and fetched again
with a larger N until the tensor table ends inside them, up to
:data:`~inferwise.calculators.gguf_file.MAX_HEADER_BYTES`. A server that ignores the
range is read as a stream and cut off at N, so a weight file is never downloaded.
Endpoint and token come from the environment as for config.json (``HF_ENDPOINT``,
``HF_TOKEN``); the token goes to the endpoint only and is never printed.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import InputError
from .gguf_file import (
    FIRST_READ_BYTES,
    MAX_HEADER_BYTES,
    GgufModel,
    Header,
    assemble,
    read_header,
    sparse_copy,
    split_parts,
)
from .hub import CONNECT_TIMEOUT_S, HubSettings, enabled

_memo: dict[tuple[str, str, str, HubSettings], GgufModel] = {}


def load(repo_id: str, tag: str, revision: str | None) -> GgufModel:
    """The GGUF checkpoint ``repo_id:tag`` at ``revision`` (default main)."""
    settings = HubSettings.from_env()
    if not enabled() or settings.offline:
        raise InputError(
            "model",
            f"'{repo_id}:{tag}' is a GGUF file on the Hub, and the Hub is switched off "
            "(HF_HUB_OFFLINE / INFERWISE_HUB=off); pass a local .gguf path instead",
        )
    key = (repo_id, tag, revision or "main", settings)
    if key not in _memo:
        _memo[key] = _load(repo_id, tag, revision or "main", settings)
    return _memo[key]


def _load(repo_id: str, tag: str, revision: str, s: HubSettings) -> GgufModel:
    files, commit = _repo_files(repo_id, revision, s)
    first = choose_file(repo_id, tag, files)
    parts = split_parts(Path(first).name, lambda name: _sibling(first, name) in files)
    names = [_sibling(first, name) for name in parts]
    headers = [_remote_header(repo_id, name, commit, s) for name in names]
    url = f"{s.endpoint}/{repo_id}/blob/{commit}/{first}"
    return assemble(url, headers, tuple(names), commit)


def _sibling(first: str, name: str) -> str:
    folder = str(Path(first).parent)
    return name if folder in ("", ".") else f"{folder}/{name}"


def choose_file(repo_id: str, tag: str, files: list[str]) -> str:
    """The GGUF file a tag names: the exact file, else the one file whose name carries
    the quant tag (split files: their first part). Ambiguity is an error listing them."""
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if tag.lower().endswith(".gguf"):
        exact = [f for f in ggufs if f == tag or Path(f).name == tag]
        if not exact:
            raise InputError("model", f"'{repo_id}' has no file '{tag}'", accepted=_listing(ggufs))
        return exact[0]
    pattern = re.compile(rf"(^|[^A-Za-z0-9]){re.escape(tag)}([^A-Za-z0-9]|$)", re.IGNORECASE)
    hits = [
        f
        for f in ggufs
        if pattern.search(Path(f).name) and not Path(f).name.lower().startswith("mmproj")
    ]
    firsts = [f for f in hits if "-of-" not in f or "-00001-of-" in f]
    if len(firsts) != 1:
        what = "no GGUF file" if not firsts else f"{len(firsts)} GGUF files"
        raise InputError(
            "model",
            f"'{repo_id}' has {what} matching '{tag}'; name the file (REPO:FILE.gguf)",
            accepted=_listing(ggufs),
        )
    return firsts[0]


def _listing(files: list[str]) -> str:
    shown = ", ".join(files[:12]) or "(no .gguf files)"
    return shown + (f", ... ({len(files)} files)" if len(files) > 12 else "")


def _repo_files(repo_id: str, revision: str, s: HubSettings) -> tuple[list[str], str]:
    """The repository's file names and the commit they belong to."""
    from huggingface_hub import HfApi, errors

    try:
        info = HfApi(endpoint=s.endpoint).model_info(
            repo_id, revision=revision, token=s.token or False, timeout=CONNECT_TIMEOUT_S
        )
    except errors.GatedRepoError:
        raise InputError(
            "model",
            f"'{repo_id}' is gated on the Hugging Face Hub: accept its terms at "
            f"{s.page(repo_id)} and set HF_TOKEN to a token with access",
        ) from None
    except errors.RepositoryNotFoundError:
        raise InputError(
            "model", f"no model '{repo_id}' on the Hugging Face Hub ({s.endpoint}); check the id"
        ) from None
    except errors.RevisionNotFoundError:
        raise InputError("revision", f"'{repo_id}' has no revision '{revision}'") from None
    except Exception as exc:  # noqa: BLE001 - network, TLS, 5xx: one clear line
        raise InputError(
            "model",
            f"the Hugging Face Hub ({s.endpoint}) could not be read for '{repo_id}' "
            f"({type(exc).__name__}); pass a local .gguf path",
        ) from None
    files = [sib.rfilename for sib in (info.siblings or [])]
    return files, info.sha or revision


def _remote_header(repo_id: str, filename: str, commit: str, s: HubSettings) -> Header:
    """Fetch growing prefixes of the file until its header parses inside one."""
    want = FIRST_READ_BYTES
    while True:
        prefix, total = _read_prefix(repo_id, filename, commit, s, want)
        header = _parse_prefix(prefix, total)
        if header is not None and header.data_offset <= len(prefix):
            return header
        if len(prefix) >= total or want >= MAX_HEADER_BYTES:
            raise InputError(
                "model",
                f"the header of '{filename}' did not parse within its first "
                f"{len(prefix) >> 20} MiB; is it a GGUF file?",
            )
        want = min(MAX_HEADER_BYTES, want * 4)


def _parse_prefix(prefix: bytes, total: int) -> Header | None:
    path = sparse_copy(prefix, total)
    try:
        return read_header(path)
    except InputError:
        return None  # the prefix ended inside the header
    finally:
        path.unlink(missing_ok=True)


def _read_prefix(
    repo_id: str, filename: str, commit: str, s: HubSettings, length: int
) -> tuple[bytes, int]:
    """The file's first ``length`` bytes and its total size."""
    import httpx
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=s.endpoint)
    headers = {"Range": f"bytes=0-{length - 1}"}
    if s.token:
        headers["Authorization"] = f"Bearer {s.token}"
    chunks: list[bytes] = []
    got = 0
    try:
        with httpx.stream(
            "GET", url, headers=headers, follow_redirects=True, timeout=CONNECT_TIMEOUT_S * 6
        ) as resp:
            if resp.status_code in (401, 403):
                raise InputError(
                    "model",
                    f"the Hub refused '{repo_id}/{filename}' (HTTP {resp.status_code}): a gated "
                    f"repository needs its terms accepted at {s.page(repo_id)} and HF_TOKEN set "
                    "to a token with access",
                )
            if resp.status_code not in (200, 206):
                raise InputError(
                    "model", f"the Hub answered HTTP {resp.status_code} for '{filename}'"
                )
            total = _total_size(resp.headers, length)
            for chunk in resp.iter_bytes():
                chunks.append(chunk)
                got += len(chunk)
                if got >= length:
                    break  # a server that ignored the range: stop reading here
    except httpx.HTTPError as exc:
        raise InputError(
            "model", f"reading the header of '{filename}' failed ({type(exc).__name__})"
        ) from None
    data = b"".join(chunks)[:length]
    return data, max(total, len(data))


def _total_size(headers: object, asked: int) -> int:
    content_range = getattr(headers, "get", lambda _k, _d=None: None)("content-range")
    if content_range and "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        if tail.isdigit():
            return int(tail)
    length = getattr(headers, "get", lambda _k, _d=None: None)("content-length")
    return int(length) if length and length.isdigit() else asked


def forget() -> None:
    _memo.clear()
