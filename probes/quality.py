"""Graded quality of a run, and whether two runs differ in it.

A run's accuracy is the share of its completed, graded requests that passed
their grader, with a Wilson score interval (it stays inside [0, 1] and keeps
its coverage for small evals and accuracies near 0 or 1, where the normal
approximation does not). Two runs are compared with McNemar's exact test when
both graded the same prompts (the test then looks only at the prompts whose
verdict changed, which is far more sensitive than comparing two totals), and
with a two-proportion z-test otherwise. The interval of the difference is
Newcombe's hybrid score interval (method 10 of Newcombe 1998), built from the
two Wilson intervals.

Only the stdlib and pydantic: the models are part of the probe's output schema.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwise.probes.records import RequestRecord

Z95 = 1.959963984540054
"""The two-sided 95 % normal quantile."""


class QualitySummary(BaseModel):
    """Graded requests of a run: how many passed their grader."""

    model_config = ConfigDict(extra="forbid")

    graded: int = Field(description="Completed measured requests that carried a grader.")
    correct: int = Field(description="Of those, the ones whose output passed.")
    accuracy: float | None = Field(default=None, description="correct / graded (0-1).")
    ci95_low: float | None = Field(default=None, description="Wilson 95% interval, lower end.")
    ci95_high: float | None = None
    by_grader: dict[str, list[int]] = Field(
        default_factory=dict, description="Per grader: [correct, graded]."
    )
    ungraded: int = Field(
        0, description="Completed measured requests without a grader (goodput: latency only)."
    )


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (0, 1 for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def graded_records(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The measured, completed requests that were graded."""
    return [r for r in records if r.ok and not r.warmup and r.correct is not None]


def quality_summary(records: Sequence[RequestRecord]) -> QualitySummary | None:
    """The run's graded accuracy, or None when no request carried a grader."""
    graded = graded_records(records)
    if not graded:
        return None
    correct = sum(1 for r in graded if r.correct)
    low, high = wilson(correct, len(graded))
    by: dict[str, list[int]] = {}
    for r in graded:
        pair = by.setdefault(r.grader or "unknown", [0, 0])
        pair[0] += int(bool(r.correct))
        pair[1] += 1
    ungraded = sum(1 for r in records if r.ok and not r.warmup and r.correct is None)
    return QualitySummary(
        graded=len(graded),
        correct=correct,
        accuracy=correct / len(graded),
        ci95_low=low,
        ci95_high=high,
        by_grader=by,
        ungraded=ungraded,
    )


def passes_grader(record: RequestRecord) -> bool:
    """Goodput's quality half: a graded request must have passed; an ungraded one
    is judged on latency only."""
    return record.correct is not False


# --------------------------------------------------------------------------- two runs


def two_proportion_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of the pooled two-proportion z-test (1.0 when undefined)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0
    z = (k2 / n2 - k1 / n1) / se
    return math.erfc(abs(z) / math.sqrt(2))


def mcnemar_exact_p(only_base: int, only_cand: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs at 1/2."""
    n = only_base + only_cand
    if n == 0:
        return 1.0
    k = min(only_base, only_cand)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2 * tail)


def newcombe_diff_ci(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """95% interval of p2 - p1 (candidate - baseline), Newcombe's hybrid score method."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1)
    l2, u2 = wilson(k2, n2)
    d = p2 - p1
    return (
        d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2),
        d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2),
    )


def first_by_prompt(records: Iterable[RequestRecord]) -> dict[str, RequestRecord]:
    """Each prompt id's first graded request (a dataset shorter than the run repeats)."""
    out: dict[str, RequestRecord] = {}
    for r in sorted(graded_records(records), key=lambda r: r.index):
        if r.prompt_id is not None and r.prompt_id not in out:
            out[r.prompt_id] = r
    return out


QualityVerdict = Literal["better", "worse", "within noise", "not comparable"]


class QualityComparison(BaseModel):
    """Graded accuracy of a candidate against the baseline."""

    model_config = ConfigDict(extra="forbid")

    baseline_accuracy: float | None = None
    candidate_accuracy: float | None = None
    baseline_graded: int = 0
    candidate_graded: int = 0
    accuracy_diff: float | None = Field(default=None, description="candidate - baseline (0-1).")
    diff_ci95_low: float | None = None
    diff_ci95_high: float | None = None
    test: Literal["mcnemar_exact", "two_proportion_z"] | None = None
    paired_prompts: int = Field(0, description="Prompt ids graded in both runs (McNemar's pairs).")
    p_value: float | None = None
    verdict: QualityVerdict = "not comparable"
    quality_floor: float | None = Field(
        default=None, description="The product's minimum accuracy (0-1), from the workload."
    )
    below_floor: bool = Field(False, description="The candidate's accuracy is under the floor.")
    note: str | None = None


def compare_quality(
    base: Sequence[RequestRecord],
    cand: Sequence[RequestRecord],
    *,
    alpha: float = 0.05,
    floor: float | None = None,
) -> QualityComparison | None:
    """The accuracy difference and its test; None when neither run was graded."""
    b, c = quality_summary(base), quality_summary(cand)
    if b is None and c is None:
        return None
    out = QualityComparison(
        baseline_accuracy=b.accuracy if b else None,
        candidate_accuracy=c.accuracy if c else None,
        baseline_graded=b.graded if b else 0,
        candidate_graded=c.graded if c else 0,
        quality_floor=floor,
    )
    if c is not None and floor is not None and c.accuracy is not None:
        out.below_floor = c.accuracy < floor
    if b is None or c is None:
        out.note = "only one of the two runs was graded"
        return out
    out.accuracy_diff = c.correct / c.graded - b.correct / b.graded
    out.diff_ci95_low, out.diff_ci95_high = newcombe_diff_ci(
        b.correct, b.graded, c.correct, c.graded
    )
    _test(out, base, cand, (b, c))
    if out.p_value is not None and out.p_value < alpha and out.accuracy_diff != 0:
        out.verdict = "better" if out.accuracy_diff > 0 else "worse"
    else:
        out.verdict = "within noise"
    return out


def _test(
    out: QualityComparison,
    base: Sequence[RequestRecord],
    cand: Sequence[RequestRecord],
    summaries: tuple[QualitySummary, QualitySummary],
) -> None:
    """McNemar exact on the prompts both runs graded when they graded the same set;
    the two-proportion z-test otherwise."""
    bp, cp = first_by_prompt(base), first_by_prompt(cand)
    shared = set(bp) & set(cp)
    out.paired_prompts = len(shared)
    if shared and set(bp) == set(cp):
        only_b = sum(1 for k in shared if bp[k].correct and not cp[k].correct)
        only_c = sum(1 for k in shared if cp[k].correct and not bp[k].correct)
        out.test, out.p_value = "mcnemar_exact", mcnemar_exact_p(only_b, only_c)
        out.note = (
            f"{len(shared)} prompts graded in both runs (the first request of each): {only_b} "
            "passed only in the baseline, "
            f"{only_c} only in the candidate"
        )
        return
    b, c = summaries
    out.test = "two_proportion_z"
    out.p_value = two_proportion_p(b.correct, b.graded, c.correct, c.graded)
    if shared:
        out.note = f"the runs graded different prompt sets ({len(shared)} in common): unpaired test"
