"""How much more (or less) a drafter is accepted on code or math than on open chat.

The default acceptance lengths in ``data/spec_decode.toml`` are chat measurements
(MT-Bench). Code and math are usually easier to guess, but how much depends on the
target and its drafter: the published same-drafter tables in
``data/spec_task_acceptance.toml`` put code/chat between 0.92 (gpt-oss-20b, a
reasoning model) and 1.53 (Qwen3-235B). So the task factor is the median of those
pairs' ratios, and the spread goes into the acceptance source so nobody mistakes it
for a measurement of their own deployment.

A pair is two rows of one source, target, drafter and K that differ only in task.
Tree-drafting rows are left out (their acceptance is not a chain's).
"""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from .errors import InputError

SpecTask = Literal["chat", "code", "math"]
DATA_FILE = Path(__file__).parent / "data" / "spec_task_acceptance.toml"


@dataclass(frozen=True)
class TaskFactor:
    """Acceptance length on ``task`` / on chat, over the published same-drafter pairs."""

    task: str
    ratio: float
    low: float
    high: float
    pairs: int
    sources: int

    def describe(self) -> str:
        return (
            f"x{self.ratio:.2f} for {self.task} (median {self.task}/chat acceptance-length ratio "
            f"of {self.pairs} published same-drafter pairs from {self.sources} sources, range "
            f"{self.low:.2f}-{self.high:.2f}: your drafter may differ, measure it)"
        )


@lru_cache(maxsize=1)
def _rows() -> tuple[dict, ...]:
    with DATA_FILE.open("rb") as fh:
        rows = tomllib.load(fh)["row"]
    return tuple(r for r in rows if r.get("acceptance_length") and not r.get("tree"))


@lru_cache(maxsize=8)
def task_factor(task: str) -> TaskFactor:
    """The factor for ``task`` against chat; 1 for chat itself."""
    if task == "chat":
        return TaskFactor("chat", 1.0, 1.0, 1.0, 0, 0)
    by_key: dict[tuple, dict[str, float]] = {}
    for r in _rows():
        key = (r["source"], r["model"], r["drafter"], r.get("k"))
        by_key.setdefault(key, {})[r["task"]] = float(r["acceptance_length"])
    pairs = [
        (key[0], t[task] / t["chat"]) for key, t in by_key.items() if "chat" in t and task in t
    ]
    if not pairs:
        raise InputError(
            "spec_task", f"no published {task}/chat acceptance pairs", "chat, code or math"
        )
    ratios = [r for _, r in pairs]
    return TaskFactor(
        task=task,
        ratio=statistics.median(ratios),
        low=min(ratios),
        high=max(ratios),
        pairs=len(pairs),
        sources=len({s for s, _ in pairs}),
    )
