"""Evidence rules as data: ``knowledge/rules/*.toml`` evaluated against a table of facts.

Why data and not code: the symptom table of the seeds, and what an engineer
reads from a metric, are knowledge that reviewers should be able to read and
extend without following control flow. A rule says *when* (clauses over
named facts), *what it means* (weights for hypothesis ids; negative = counter-
evidence) and *why* (an evidence sentence quoting the facts it used).

Clause grammar (one string per clause, all must hold):

* ``fact``                 the fact exists and is truthy
* ``not fact``             the fact is absent or falsy
* ``fact is set`` / ``fact is missing``
* ``fact OP value``        OP in ``< <= > >= == !=``; value is a number,
  ``true``/``false``, a quoted string, or another fact's name.

A clause naming a fact that is absent is false (except ``not`` / ``is
missing``): a rule never fires on a value nobody measured.

Evidence text may quote facts: ``{observations.gpu_util:pct}`` (percent),
``{fact:.1f}`` (a Python format spec), ``{fact}`` (plain).

Stdlib only.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from inferwise.knowledge.vocabulary import HYPOTHESES

SOURCES = ("measured", "stated", "derived", "computed", "catalog", "assumed")
"""Where a fact came from: measured (observations, a probe run), stated (the workload file),
derived (arithmetic on those), computed (the calculators), catalog (GPU/model catalogs),
assumed (a default we chose, always listed in assumptions)."""


class RuleError(ValueError):
    """A rules file is malformed: a packaging bug; the message names file and rule."""


@dataclass(frozen=True)
class Fact:
    value: Any
    source: str
    note: str = ""


@dataclass(frozen=True)
class Rule:
    id: str
    when: tuple[str, ...]
    weights: dict[str, float]
    evidence: str
    source_file: str


@dataclass
class Finding:
    """One fired rule's contribution to one hypothesis."""

    rule_id: str
    weight: float
    text: str
    sources: tuple[str, ...] = field(default_factory=tuple)


_OPS = ("<=", ">=", "==", "!=", "<", ">")
_CLAUSE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(<=|>=|==|!=|<|>)\s*(.+?)\s*$")


def _literal(text: str) -> tuple[bool, Any]:
    """(is_literal, value) for the right-hand side of a comparison."""
    t = text.strip()
    if t in ("true", "false"):
        return True, t == "true"
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return True, t[1:-1]
    try:
        return True, float(t)
    except ValueError:
        return False, t


def check_clause(clause: str, where: str) -> None:
    """Reject a clause the evaluator would not understand (at load time, not at use)."""
    c = clause.strip()
    if c.startswith("not "):
        c = c[4:]
    if c.endswith((" is set", " is missing")):
        c = c.rsplit(" is ", 1)[0]
    if _CLAUSE.match(c) or re.fullmatch(r"[A-Za-z0-9_.]+", c):
        return
    raise RuleError(f"{where}: cannot parse clause {clause!r}")


def _clause_fact(clause: str) -> str:
    """The fact a clause tests (its left-hand side)."""
    c = clause.strip().removeprefix("not ").strip()
    for suffix in (" is set", " is missing"):
        c = c.removesuffix(suffix)
    m = _CLAUSE.match(c)
    return m.group(1) if m else c.strip()


def holds(clause: str, facts: dict[str, Fact]) -> bool:
    c = clause.strip()
    if c.startswith("not "):
        f = facts.get(c[4:].strip())
        return f is None or not f.value
    if c.endswith(" is set"):
        return c[: -len(" is set")].strip() in facts
    if c.endswith(" is missing"):
        return c[: -len(" is missing")].strip() not in facts
    m = _CLAUSE.match(c)
    if not m:
        f = facts.get(c)
        return f is not None and bool(f.value)
    name, op, rhs = m.groups()
    left = facts.get(name)
    if left is None:
        return False
    is_lit, right = _literal(rhs)
    if not is_lit:
        other = facts.get(right)
        if other is None:
            return False
        right = other.value
    return _compare(left.value, op, right)


def _compare(a: Any, op: str, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        if op == "==":
            return a == b
        if op == "!=":
            return a != b
        return False
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    if math.isnan(x) or math.isnan(y):
        return False
    return {
        "<": x < y,
        "<=": x <= y,
        ">": x > y,
        ">=": x >= y,
        "==": x == y,
        "!=": x != y,
    }[op]


_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)(?::([^}]*))?\}")


def format_value(value: Any, spec: str | None = None) -> str:
    if spec == "pct" and isinstance(value, (int, float)):
        return f"{value * 100:.0f} %"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render(template: str, facts: dict[str, Fact]) -> tuple[str, tuple[str, ...]]:
    """Fill placeholders from facts; also return the sources of the facts quoted."""
    sources: list[str] = []

    def sub(m: re.Match[str]) -> str:
        f = facts.get(m.group(1))
        if f is None:
            return "?"
        if f.source not in sources:
            sources.append(f.source)
        return format_value(f.value, m.group(2))

    return _PLACEHOLDER.sub(sub, template), tuple(sources)


def _parse_rule(raw: Any, source: str, index: int) -> Rule:
    where = f"rules/{source}: rule[{index}]"
    if not isinstance(raw, dict):
        raise RuleError(f"{where}: must be a table")
    allowed = {"id", "when", "weights", "evidence"}
    if set(raw) - allowed or not {"id", "when", "weights", "evidence"} <= set(raw):
        raise RuleError(f"{where}: needs exactly {sorted(allowed)}, got {sorted(raw)}")
    when = raw["when"]
    if not isinstance(when, list) or not when or not all(isinstance(c, str) for c in when):
        raise RuleError(f"{where} ({raw['id']}): when must be a non-empty list of strings")
    for clause in when:
        check_clause(clause, f"{where} ({raw['id']})")
    weights = raw["weights"]
    if not isinstance(weights, dict) or not weights:
        raise RuleError(f"{where} ({raw['id']}): weights must be a non-empty table")
    bad = [h for h in weights if h not in HYPOTHESES]
    if bad:
        raise RuleError(f"{where} ({raw['id']}): unknown hypothesis id(s) {bad}")
    return Rule(
        id=str(raw["id"]),
        when=tuple(when),
        weights={k: float(v) for k, v in weights.items()},
        evidence=str(raw["evidence"]),
        source_file=source,
    )


def _rules_folder() -> Any:
    return resources.files("inferwise.knowledge") / "rules"


@lru_cache(maxsize=1)
def load_rules() -> tuple[Rule, ...]:
    """Every evidence rule from the rules folder (files with ``[[rule]]`` tables)."""
    rules: list[Rule] = []
    for entry in sorted(_rules_folder().iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        data = tomllib.loads(entry.read_text(encoding="utf-8"))
        for i, raw in enumerate(data.get("rule", [])):
            rules.append(_parse_rule(raw, entry.name, i))
    ids = [r.id for r in rules]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RuleError(f"duplicate rule id(s): {dupes}")
    return tuple(rules)


@cache
def load_table(name: str) -> dict[str, Any]:
    """A whole TOML data file from the rules folder (hypothesis guides, measurement catalog)."""
    return tomllib.loads((_rules_folder() / name).read_text(encoding="utf-8"))


def evaluate(facts: dict[str, Fact]) -> dict[str, list[Finding]]:
    """Fire every rule whose clauses hold; group the findings by hypothesis id."""
    out: dict[str, list[Finding]] = {}
    for rule in load_rules():
        if all(holds(c, facts) for c in rule.when):
            text, quoted = render(rule.evidence, facts)
            sources = list(quoted)
            for name in (_clause_fact(c) for c in rule.when):
                f = facts.get(name)
                if f is not None and f.source not in sources:
                    sources.append(f.source)
            for hyp, weight in rule.weights.items():
                out.setdefault(hyp, []).append(Finding(rule.id, weight, text, tuple(sources)))
    return out
