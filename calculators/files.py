"""Reading the files and JSON a user names, with limits, so a bad path is an input error.

Every door takes paths (a model's config.json, a workload file, a dataset)
and JSON text (inline workloads, `@file` arguments). Read naively, a path can
hang the process (a FIFO), exhaust its memory (`/dev/zero`, a 50 MB file over
MCP) or end in an exception nobody maps (a 10,000-character name, a binary
file, a 5,000-digit integer, JSON nested 100,000 deep). This module is the one
place that reads them: it checks the type and size before reading and turns
every failure into an :class:`InputError` naming the field.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from .errors import InputError

MiB = 1 << 20
MAX_JSON_DEPTH = 64
"""Deeper nesting than any real config or workload (they stay under 8)."""
MAX_NUMBER_DIGITS = 40
"""Longer integer literals are not a count of anything; Python would refuse past 4,300."""


def expand_path(spec: str | os.PathLike[str]) -> Path:
    """``~`` and ``~user`` expanded; the path as written when there is no such user (pathlib
    raises RuntimeError then), so it is reported as a path that does not exist."""
    try:
        return Path(spec).expanduser()
    except RuntimeError:
        return Path(spec)


def stat_path(spec: str | os.PathLike[str]) -> os.stat_result | None:
    """The file's status, or None when there is no such path (or it cannot be a path:
    too long, a NUL byte, a component that is not a folder)."""
    try:
        return os.stat(expand_path(spec))
    except (OSError, ValueError):
        return None


def path_exists(spec: str | os.PathLike[str]) -> bool:
    return stat_path(spec) is not None


def read_text(path: str | os.PathLike[str], field: str, max_bytes: int, what: str = "file") -> str:
    """The UTF-8 text of a regular file of at most `max_bytes` bytes.

    A device, FIFO, socket or folder is refused before it is opened (reading
    one can block for ever or never end); the size is checked by stat and again
    while reading (``/proc`` files report a size of 0)."""
    p = expand_path(path)
    st = stat_path(p)
    if st is None:
        raise InputError(field, f"no such {what}: {_short(p)}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{_short(p)} is not a regular file (a folder, device or pipe)")
    if st.st_size > max_bytes:
        raise InputError(field, f"{_short(p)} is {st.st_size / MiB:.1f} MiB; {_limit(max_bytes)}")
    try:
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(field, f"cannot read {_short(p)}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(field, f"{_short(p)} is larger than {_limit(max_bytes)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            field, f"{_short(p)} is not UTF-8 text (byte {exc.start}): is it a binary file?"
        ) from None


def loads_json(text: str, field: str, where: str = "input") -> Any:
    """Parse JSON text strictly: no NaN/Infinity literals, no integer literals longer than
    40 digits, nesting at most 64 deep. Every failure is an InputError naming `field`."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise InputError(
            field, f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise InputError(
            field, f"{where} is nested too deeply (at most {MAX_JSON_DEPTH})"
        ) from None
    except ValueError as exc:  # from the two hooks below
        raise InputError(field, f"{where}: {exc}") from None
    check_depth(value, field, where)
    return value


def check_depth(value: Any, field: str, where: str = "input") -> None:
    """Refuse containers nested deeper than MAX_JSON_DEPTH (iteratively: no recursion to
    exhaust), and non-finite numbers anywhere in them."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            if isinstance(node, float) and not math.isfinite(node):
                raise InputError(field, f"{where} holds a non-finite number ({node})")
            continue
        if depth > MAX_JSON_DEPTH:
            raise InputError(field, f"{where} is nested too deeply (at most {MAX_JSON_DEPTH})")
        stack.extend((child, depth + 1) for child in children)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits is not a plausible value")
    return int(text)


def _short(p: Path) -> str:
    text = str(p)
    return text if len(text) <= 120 else text[:60] + "..." + text[-40:]


def _limit(max_bytes: int) -> str:
    return f"the limit is {max_bytes / MiB:g} MiB"
