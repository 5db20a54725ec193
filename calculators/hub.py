"""A model's config from the Hugging Face Hub: the small JSON files, never the weights.

"Where do this model's facts come from" is the catalog's job, and for most models the
answer is the Hub: every serving tool reads ``config.json`` from it. This module asks
for that file (and, where the repository has them, ``hf_quant_config.json`` and
``model.safetensors.index.json``) through ``huggingface_hub``, so the user's own setup
holds: ``HF_ENDPOINT`` (a mirror), ``HF_HUB_CACHE`` / ``HF_HOME`` (the shared cache: a
second call reads the cached copy), ``HF_HUB_OFFLINE`` and ``HF_TOKEN``. They are read
on every call, not once at import, so a long-running MCP server follows its
environment. The token comes from the environment only (never a stored login, never an
argument), is sent to the endpoint alone, and is never printed or kept.

When the Hub cannot be reached (no network, offline mode) and nothing is cached, the
answer is ``None`` and the catalog decides; after a failed connection the Hub is not
asked again for a minute, so a search of thousands of calls does not wait thousands
of timeouts.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    from .checkpoint_tensors import TensorTable

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
OPTIONAL_FILES = ("hf_quant_config.json", "model.safetensors.index.json")
CONNECT_TIMEOUT_S = 5.0
RETRY_AFTER_FAILURE_S = 60.0
_unreachable_until = 0.0
_answers: dict[tuple[str, str, HubSettings], HubFiles | InputError] = {}
"""What the Hub said per repo, revision and settings: files, or the refusal. "Not
reachable" is not kept: after RETRY_AFTER_FAILURE_S the Hub is asked again."""
_misses: dict[tuple[str, str, HubSettings], float] = {}
"""Repos the local cache lacked while offline, until when that answer stands (the end of
the pause), so a search over a catalog model does not search the cache on every call."""


@dataclass(frozen=True)
class HubSettings:
    """The Hub the user's environment names, read at call time."""

    endpoint: str
    cache_dir: str
    offline: bool
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> HubSettings:
        home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes")
        return cls(
            endpoint=(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
            cache_dir=os.environ.get("HF_HUB_CACHE") or str(Path(home) / "hub"),
            offline=offline,
            token=os.environ.get("HF_TOKEN") or None,
        )

    def page(self, repo_id: str) -> str:
        """The repository's page, where a gated model's terms are accepted."""
        return f"{self.endpoint}/{repo_id}"


@dataclass(frozen=True)
class HubFiles:
    """The files read for one repository at one revision, in the Hub cache."""

    repo_id: str
    revision: str
    commit: str | None
    config: Path
    optional: dict[str, Path]
    source_url: str
    from_cache_only: bool
    tensors: TensorTable | None = None
    """Every tensor's dtype and shape, read from the checkpoint's safetensors headers (range
    requests of a few KB per shard), when the Hub was reached and the repo has them."""


def _quiet() -> None:
    """Before huggingface_hub is first imported (it reads its settings then): no telemetry
    and no agent detection, which would ask huggingface.co even when a mirror is named."""
    import sys

    if "huggingface_hub" not in sys.modules:
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # stderr is the user's


def is_repo_id(spec: str) -> bool:
    return bool(REPO_ID.match(spec))


def fetch(repo_id: str, revision: str | None = None) -> HubFiles | None:
    """The repo's config files at `revision` (default ``main``), from the cache or the Hub;
    None when the Hub cannot be reached and nothing is cached. A repository that does not
    exist, is gated without a token, or lacks a config.json is an InputError."""
    global _unreachable_until
    _quiet()
    settings = HubSettings.from_env()
    key = (repo_id, revision or "main", settings)
    known = _answers.get(key)
    if isinstance(known, InputError):
        raise known
    if known is not None:
        return known
    now = time.monotonic()
    offline = settings.offline or now < _unreachable_until
    if offline and _misses.get(key, 0.0) > now:
        return None  # still offline, and the local cache lacked it moments ago
    if not offline and not _reachable(repo_id, revision or "main", settings):
        _unreachable_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        offline = True
    try:
        files = _fetch(repo_id, revision or "main", settings, offline)
    except InputError as exc:
        _answers[key] = exc
        raise
    if files is not None:
        _answers[key] = files
    elif offline:
        # a search asks thousands of times; the cache is looked at again after the pause
        _misses[key] = now + RETRY_AFTER_FAILURE_S
    return files


def enabled() -> bool:
    """False when ``INFERWISE_HUB=off``: only local paths and the catalog answer."""
    return os.environ.get("INFERWISE_HUB", "").strip().lower() != "off"


def repo_id_of(spec: str) -> str:
    """The repository id in a model spec (a Hub URL is reduced to its id)."""
    spec = spec.strip()
    if spec.lower().startswith(("https://huggingface.co/", "http://huggingface.co/")):
        return spec.split("huggingface.co/", 1)[-1].strip("/")
    return spec


def may_reach_network(model: str | None, revision: str | None = None) -> bool:
    """Whether resolving `model` could ask the Hub now: a repository id whose answer this
    process does not hold, with the Hub neither turned off, offline, nor in its pause after a
    failed connection. The MCP server runs such a call on a worker thread instead of its
    event loop."""
    if not model or not enabled():
        return False
    settings = HubSettings.from_env()
    if settings.offline or time.monotonic() < _unreachable_until:
        return False  # only the local cache is read until the pause is over
    spec = repo_id_of(model)
    return is_repo_id(spec) and (spec, revision or "main", settings) not in _answers


def _reachable(repo_id: str, revision: str, settings: HubSettings) -> bool:
    """One HEAD request without retries: does the Hub answer at all? huggingface_hub
    retries a failed connection five times with back-off (23 s measured) before it looks
    in its cache; without a network that wait is pointless."""
    import logging

    from huggingface_hub import errors, get_hf_file_metadata, hf_hub_url

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry chatter
    url = hf_hub_url(repo_id, "config.json", revision=revision, endpoint=settings.endpoint)
    try:
        get_hf_file_metadata(url, token=settings.token or False, timeout=CONNECT_TIMEOUT_S)
    except (errors.HfHubHTTPError, errors.EntryNotFoundError):
        return True  # it answered; the download says what was wrong, typed
    except (*_transport_errors(), OSError, errors.OfflineModeIsEnabled):
        return False
    return True


def _fetch(repo_id: str, revision: str, settings: HubSettings, offline: bool) -> HubFiles | None:
    """The files from the cache (`offline`) or the Hub; the answer is kept by `fetch`."""
    global _unreachable_until
    from huggingface_hub import errors

    try:
        config = _download(repo_id, "config.json", revision, settings, offline)
    except errors.GatedRepoError:
        raise InputError(
            "model",
            f"'{repo_id}' is gated on the Hugging Face Hub: accept its terms at "
            f"{settings.page(repo_id)} and set HF_TOKEN to a token with access",
        ) from None
    except errors.RepositoryNotFoundError:
        raise InputError(
            "model",
            f"no model '{repo_id}' on the Hugging Face Hub ({settings.endpoint}); check the id "
            "(a private repository needs HF_TOKEN), or pass a path to a config.json",
        ) from None
    except errors.RevisionNotFoundError:
        raise InputError("revision", f"'{repo_id}' has no revision '{revision}'") from None
    except errors.RemoteEntryNotFoundError:
        raise InputError(
            "model",
            f"'{repo_id}' has no config.json on the Hub: is it a model repository in the "
            "Hugging Face format?",
        ) from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        return None
    except (OSError, errors.HfHubHTTPError, *_transport_errors()) as exc:  # network, TLS, 5xx
        _unreachable_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        if isinstance(exc, errors.HfHubHTTPError) and _status(exc) in (401, 403):
            raise InputError(
                "model", f"the Hub refused '{repo_id}' (HTTP {_status(exc)}); check HF_TOKEN"
            ) from None
        return _fetch(repo_id, revision, settings, True)
    optional = {}
    for name in OPTIONAL_FILES:
        try:
            optional[name] = _download(repo_id, name, revision, settings, offline)
        except (errors.EntryNotFoundError, errors.HfHubHTTPError, OSError):
            continue
    commit = _commit_of(config)
    headers = _cached_tensors(settings, repo_id, commit)
    if headers is None and not offline:
        headers = _header_tensors(repo_id, commit or revision, settings)
        _keep_tensors(settings, repo_id, commit, headers)
    return HubFiles(
        repo_id=repo_id,
        revision=revision,
        commit=commit,
        config=config,
        optional=optional,
        source_url=f"{settings.endpoint}/{repo_id}/blob/{commit or revision}/config.json",
        from_cache_only=offline,
        tensors=headers,
    )


def _header_tensors(repo_id: str, revision: str, s: HubSettings) -> TensorTable | None:
    """The checkpoint's tensor table from its safetensors headers; None for other formats
    or on any failure (the config arithmetic then stands alone). Only headers are read."""
    from huggingface_hub import HfApi

    from .checkpoint_tensors import TensorTable, tensor

    try:
        meta = HfApi(endpoint=s.endpoint).get_safetensors_metadata(
            repo_id, revision=revision, token=s.token or False, timeout=CONNECT_TIMEOUT_S
        )
        tensors = tuple(
            tensor(name, info.dtype, list(info.shape))
            for file_meta in meta.files_metadata.values()
            for name, info in file_meta.tensors.items()
        )
    except Exception:  # noqa: BLE001 - a refinement: no format, no network, odd headers
        return None
    return TensorTable(tensors, f"{repo_id}@{revision}") if tensors else None


def _tensor_cache(s: HubSettings, repo_id: str, commit: str | None) -> Path | None:
    """Where a commit's tensor table is kept, beside the Hub cache (commits never change)."""
    if not commit:
        return None
    name = repo_id.replace("/", "--") + f"--{commit}.json"
    return Path(s.cache_dir) / "inferwise-tensor-tables" / name


def _cached_tensors(s: HubSettings, repo_id: str, commit: str | None) -> TensorTable | None:
    from .checkpoint_tensors import CheckpointTensor, TensorTable

    path = _tensor_cache(s, repo_id, commit)
    if path is None or not path.is_file():
        return None
    try:
        rows = json.loads(path.read_text())
        tensors = tuple(
            CheckpointTensor(str(a), str(b), int(c), int(d), int(e)) for a, b, c, d, e in rows
        )
    except (OSError, ValueError, TypeError):
        return None  # a damaged cache entry: read the headers again
    return TensorTable(tensors, f"{repo_id}@{commit}") if tensors else None


def _keep_tensors(
    s: HubSettings, repo_id: str, commit: str | None, table: TensorTable | None
) -> None:
    path = _tensor_cache(s, repo_id, commit)
    if path is None or table is None:
        return
    rows = [[t.name, t.dtype, t.numel, t.n_bytes, t.ndim] for t in table.tensors]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: the headers are read again next time


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    """The network errors of the HTTP client huggingface_hub uses (httpx2 in 2.x, httpx
    before), so a dead network is told from an answer."""
    import importlib

    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _download(repo_id: str, name: str, revision: str, s: HubSettings, offline: bool) -> Path:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(
        repo_id,
        name,
        revision=revision,
        endpoint=s.endpoint,
        cache_dir=s.cache_dir,
        token=s.token or False,  # the environment's token or none: never a stored login
        local_files_only=offline,
        etag_timeout=CONNECT_TIMEOUT_S,
    )
    return Path(str(path))


def _commit_of(path: Path) -> str | None:
    """The commit a cached file belongs to: its snapshot folder is named by it."""
    parent = path.parent.name
    return parent if re.fullmatch(r"[0-9a-f]{40}", parent) else None


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def forget() -> None:
    """Drop what this process remembers of the Hub (tests switch endpoints)."""
    global _unreachable_until
    _unreachable_until = 0.0
    _answers.clear()
    _misses.clear()
