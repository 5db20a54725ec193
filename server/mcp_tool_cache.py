"""The MCP tool listing kept on disk, so a stdio server starts without building every tool.

A stdio server is launched once per client session and the client waits for
it. Building the nine tools means importing every operation's models and
letting the SDK derive an input and an output schema for each: about 130 ms,
a quarter of the SDK's own start-up, spent before the first answer even when
the session only ever calls one tool. The listing (names, descriptions,
schemas, annotations) is a pure function of the project's source and the
installed library versions, so it is kept under the user's cache directory
keyed by a fingerprint of both, the way Python keeps ``.pyc`` files: an
edit, an upgrade or a reinstall changes the key and the next start rebuilds
it. The tools themselves are still built from the registry, each when it is
first called.

``INFERWISE_CACHE_DIR`` chooses the directory (empty: no disk cache); by
default ``$XDG_CACHE_HOME/inferwise`` or ``~/.cache/inferwise``. Any failure
to read or write the cache only means the listing is built in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

_PACKAGES = ("calculators", "knowledge", "probes", "server")
"""Subpackages of ``inferwise`` whose files can change a tool's schema or text."""
_LIBRARIES = ("mcp", "mcp_types", "pydantic", "pydantic_core")
"""Libraries that generate or shape the schemas."""
_PREFIX = "mcp-tools-"


def cache_dir() -> Path | None:
    """Where the listing is kept; None when disk caching is turned off."""
    configured = os.environ.get("INFERWISE_CACHE_DIR")
    if configured is not None:
        return Path(configured).expanduser() if configured.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferwise"


def _stat_tree(root: str, out: list[str]) -> None:
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name == "__pycache__" or entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                _stat_tree(entry.path, out)
            elif not entry.name.endswith((".pyc", ".pyo")):
                st = entry.stat()
                out.append(f"{entry.path}\0{st.st_mtime_ns}\0{st.st_size}")


def fingerprint() -> str:
    """A digest of every file of the project's packages (path, mtime, size) and of
    the library and Python versions; a few hundred ``stat`` calls, about a millisecond."""
    import importlib

    # the operator's dataset folder shows probe_endpoint's `dataset` argument
    parts = [sys.version, f"dataset_dir={bool(os.environ.get('INFERWISE_MCP_DATASET_DIR'))}"]
    for name in _LIBRARIES:
        module = sys.modules.get(name) or importlib.import_module(name)
        path = getattr(module, "__file__", None) or ""
        version = str(getattr(module, "__version__", ""))
        stamp = os.stat(path).st_mtime_ns if path else 0
        parts.append(f"{name}\0{version}\0{path}\0{stamp}")
    files: list[str] = []
    for package in _PACKAGES:
        module = importlib.import_module(f"inferwise.{package}")
        for root in module.__path__:
            _stat_tree(root, files)
    parts += sorted(files)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def load(key: str) -> list[dict[str, Any]] | None:
    """The stored listing for this fingerprint, or None."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        data = json.loads((folder / f"{_PREFIX}{key[:24]}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("fingerprint") != key
        or not isinstance(data.get("tools"), list)
    ):
        return None
    return data["tools"]


def store(key: str, tools: list[dict[str, Any]]) -> None:
    """Write the listing atomically and drop listings of older fingerprints."""
    folder = cache_dir()
    if folder is None:
        return
    target = folder / f"{_PREFIX}{key[:24]}.json"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"fingerprint": key, "tools": tools}), encoding="utf-8")
        os.replace(tmp, target)
        for old in folder.glob(f"{_PREFIX}*.json"):
            if old != target:
                old.unlink(missing_ok=True)
    except OSError:
        return
