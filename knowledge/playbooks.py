"""Optimisation playbooks as structured data, loaded from ``playbooks/*.toml``.

Diagnosis ranks hypotheses; planning turns the leading ones into staged
experiments. Both need the same facts about each optimisation: which
hypotheses it addresses, what it costs, which flag changes it, how to measure
it and how to undo it. Those facts live in one TOML file per playbook (easy to
review and extend without touching code) and are validated strictly when
loaded, so a typo in an id or a missing field fails at once with the file
name, not later as a silently empty plan.

Stdlib only at module level (tomllib, importlib.resources).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from inferwise.calculators.errors import InputError, OperationalError
from inferwise.knowledge.vocabulary import HYPOTHESES, OUTSIDE_ENGINE, SERVING_ENGINES

KNOB_TARGETS: frozenset[str] = frozenset({*SERVING_ENGINES, *OUTSIDE_ENGINE})
"""Values accepted for ``knobs[].engine``: an engine, or a layer outside it."""


class PlaybookError(OperationalError, ValueError):
    """A playbook file is malformed. This is a packaging bug, not user input,
    so the message names the file and the field to fix; as an OperationalError
    the front doors show it in one line (exit 1), not as a traceback."""


@dataclass(frozen=True)
class Effects:
    """Expected direction of each metric: "+" better/more, "-" worse/less,
    "0" unchanged, or a short text with a range (e.g. "-20..-40% at high load").

    For ttft/itl a "-" means *lower latency*; for memory "-" means *less memory
    used*; for quality "-" means *possible degradation*."""

    ttft: str
    itl: str
    throughput: str
    memory: str
    quality: str


@dataclass(frozen=True)
class Knob:
    """One engine setting that implements the playbook."""

    engine: str
    flag: str
    doc: str
    note: str = ""


@dataclass(frozen=True)
class Playbook:
    """One optimisation, mirroring a ``playbooks/<id>.toml`` file."""

    id: str
    title: str
    summary: str
    """The change in one sentence, usable as a plan stage's ``change``."""
    variable: str
    """The one variable this experiment changes (a workload/deployment field or flag)."""
    addresses: tuple[str, ...]
    preconditions: tuple[str, ...]
    effects: Effects
    risks: tuple[str, ...]
    interactions: tuple[str, ...]
    measure: tuple[str, ...]
    knobs: tuple[Knob, ...]
    acceptance: tuple[str, ...]
    rollback: str
    complexity: int
    """1 = a flag flip ... 5 = an architecture change; plans go least complex first."""
    doc: str
    """Id of the knowledge document that explains it (``inferwise kb show <doc>``)."""


_LIST_FIELDS = ("addresses", "preconditions", "risks", "interactions", "measure", "acceptance")
_STR_FIELDS = ("id", "title", "summary", "variable", "rollback", "doc")
_EFFECT_KEYS = tuple(f.name for f in fields(Effects))


def _str_list(raw: Any, where: str) -> tuple[str, ...]:
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(x, str) and x.strip() for x in raw)
    ):
        raise PlaybookError(f"{where}: expected a non-empty list of non-empty strings")
    return tuple(raw)


def _parse(data: dict[str, Any], source: str) -> Playbook:
    """Validate one decoded TOML table; every problem names `source` and the field."""
    expected = {f.name for f in fields(Playbook)}
    unknown = set(data) - expected
    if unknown:
        raise PlaybookError(
            f"{source}: unknown field(s) {sorted(unknown)}; allowed: {sorted(expected)}"
        )
    missing = expected - set(data)
    if missing:
        raise PlaybookError(f"{source}: missing field(s) {sorted(missing)}")

    for name in _STR_FIELDS:
        if not isinstance(data[name], str) or not data[name].strip():
            raise PlaybookError(f"{source}: {name} must be a non-empty string")
    if source.endswith(".toml") and not source.endswith(f"{data['id']}.toml"):
        raise PlaybookError(f"{source}: id {data['id']!r} must match the file name")

    lists = {name: _str_list(data[name], f"{source}: {name}") for name in _LIST_FIELDS}
    bad = [h for h in lists["addresses"] if h not in HYPOTHESES]
    if bad:
        raise PlaybookError(
            f"{source}: addresses: unknown hypothesis id(s) {bad}; known: {sorted(HYPOTHESES)}"
        )

    eff = data["effects"]
    if not isinstance(eff, dict) or set(eff) != set(_EFFECT_KEYS):
        raise PlaybookError(f"{source}: effects must have exactly the keys {list(_EFFECT_KEYS)}")
    if not all(isinstance(v, str) and v.strip() for v in eff.values()):
        raise PlaybookError(
            f"{source}: effects values must be non-empty strings ('+', '-', '0' or short text)"
        )

    knobs_raw = data["knobs"]
    if not isinstance(knobs_raw, list) or not knobs_raw:
        raise PlaybookError(f"{source}: knobs must be a non-empty array of tables")
    knobs = []
    for i, k in enumerate(knobs_raw):
        where = f"{source}: knobs[{i}]"
        if (
            not isinstance(k, dict)
            or not {"engine", "flag", "doc"} <= set(k)
            or set(k) - {"engine", "flag", "doc", "note"}
        ):
            raise PlaybookError(
                f"{where}: needs engine, flag, doc (and optional note), nothing else"
            )
        if k["engine"] not in KNOB_TARGETS:
            raise PlaybookError(
                f"{where}: unknown engine {k['engine']!r}; known: {sorted(KNOB_TARGETS)}"
            )
        if not str(k["doc"]).startswith("https://"):
            raise PlaybookError(f"{where}: doc must be an https:// URL")
        knobs.append(
            Knob(engine=k["engine"], flag=str(k["flag"]), doc=k["doc"], note=str(k.get("note", "")))
        )

    complexity = data["complexity"]
    if not isinstance(complexity, int) or isinstance(complexity, bool) or not 1 <= complexity <= 5:
        raise PlaybookError(f"{source}: complexity must be an integer 1..5")

    return Playbook(
        id=data["id"],
        title=data["title"],
        summary=data["summary"],
        variable=data["variable"],
        addresses=lists["addresses"],
        preconditions=lists["preconditions"],
        effects=Effects(**{k: eff[k] for k in _EFFECT_KEYS}),
        risks=lists["risks"],
        interactions=lists["interactions"],
        measure=lists["measure"],
        knobs=tuple(knobs),
        acceptance=lists["acceptance"],
        rollback=data["rollback"],
        complexity=complexity,
        doc=data["doc"],
    )


def parse_playbook(text: str, source: str = "<string>") -> Playbook:
    """Parse and validate one playbook from TOML text (used by the loader and tests)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlaybookError(f"{source}: invalid TOML: {exc}") from exc
    return _parse(data, source)


@lru_cache(maxsize=1)
def _load_all() -> tuple[Playbook, ...]:
    folder = resources.files("inferwise.knowledge") / "playbooks"
    loaded: list[Playbook] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            loaded.append(
                parse_playbook(entry.read_text(encoding="utf-8"), f"playbooks/{entry.name}")
            )
    ids = [p.id for p in loaded]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise PlaybookError(f"duplicate playbook id(s): {dupes}")
    return tuple(sorted(loaded, key=lambda p: (p.complexity, p.id)))


def load_playbooks() -> list[Playbook]:
    """Every playbook, validated, ordered by complexity then id. Parsed once per process."""
    return list(_load_all())


def get_playbook(playbook_id: str) -> Playbook:
    """One playbook by id; an unknown id is an InputError listing the known ones."""
    for p in _load_all():
        if p.id == playbook_id:
            return p
    raise InputError(
        "playbook", f"unknown playbook {playbook_id!r}", ", ".join(p.id for p in _load_all())
    )


def playbooks_for(hypothesis_id: str) -> list[Playbook]:
    """Playbooks that address `hypothesis_id`, least complex first (the order plans use)."""
    if hypothesis_id not in HYPOTHESES:
        raise InputError(
            "hypothesis", f"unknown hypothesis id {hypothesis_id!r}", ", ".join(HYPOTHESES)
        )
    return [p for p in _load_all() if hypothesis_id in p.addresses]
