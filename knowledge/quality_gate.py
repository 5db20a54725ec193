"""The product's quality floor, as a number a graded run can be held to.

A workload states its floor as `product.quality_floor_score` (the eval's
minimum score) and/or in words as `product.quality_floor` ("GSM8K accuracy
>= 0.80"). Graded accuracy is a share (0-1); a score over 1 is read as a
percentage. `runs compare --workload` uses it to call a candidate that falls
below the floor a regression, whatever it gains in speed; `plan` puts it into
every optimisation stage's acceptance beside the baseline's measured accuracy.
"""

from __future__ import annotations

from typing import Any


def floor_of(workload: Any) -> float | None:
    """The product's minimum graded accuracy (0-1), or None when the workload states none."""
    from inferwise.probes.graders import last_number

    product = getattr(workload, "product", None)
    if product is None:
        return None
    score = product.quality_floor_score
    if score is None and product.quality_floor:
        score = last_number(product.quality_floor.replace("%", " "))
    if score is None or score < 0:
        return None
    return score / 100.0 if score > 1 else float(score)


def compare_runs(req: Any) -> Any:
    """`runs compare` with the floor taken from `--workload` when `--quality-floor` is not given."""
    from inferwise.calculators.errors import InputError
    from inferwise.knowledge.workload import load_workload
    from inferwise.probes.runs import compare_runs as compare

    if req.workload and req.quality_floor is None:
        floor = floor_of(load_workload(req.workload))
        if floor is None:
            raise InputError(
                "workload",
                "states no quality floor",
                "product.quality_floor_score (e.g. 0.8) or a number in product.quality_floor",
            )
        req = req.model_copy(update={"quality_floor": floor})
    return compare(req)


def baseline_quality(a: Any) -> Any:
    """The plan's run's graded quality summary, or None (no run, or nothing graded)."""
    run = getattr(a, "run", None)
    return run.summary.quality if run is not None and run.summary is not None else None


def stage_quality_line(a: Any) -> str:
    """The quality clause of every optimisation stage's acceptance: the baseline's
    measured graded accuracy and the product's floor, and the command that judges both."""
    floor = floor_of(a.workload)
    q = baseline_quality(a)
    floor_words = (
        f"at least the product floor {floor:.1%}"
        if floor is not None
        else "no floor stated (set product.quality_floor_score)"
    )
    if q is not None and q.accuracy is not None:
        base = (
            f"the baseline's measured {q.accuracy:.1%} ({q.correct}/{q.graded} graded, "
            f"Wilson 95% CI {q.ci95_low:.1%}-{q.ci95_high:.1%}, run {a.run.run_id})"
        )
        return (
            f"Graded accuracy on the same --dataset: {floor_words}, and not significantly below "
            f"{base}; `inferwise runs compare BASELINE_RUN NEW_RUN --workload FILE` tests it "
            "(McNemar on the same prompts) and calls a loss below the floor a regression."
        )
    return (
        f"Graded accuracy: {floor_words}; the baseline's accuracy is not measured yet: probe the "
        "baseline and each stage with the same graded --dataset (rows with expected + grader) "
        "and compare them with `inferwise runs compare BASELINE_RUN NEW_RUN --workload FILE`."
    )


def with_quality_gate(a: Any, stages: list[Any]) -> list[Any]:
    """Every stage that changes something gets the graded-accuracy acceptance line."""
    line = stage_quality_line(a)
    out = []
    for s in stages:
        if s.variable.startswith("none") and not s.variable.startswith("none (all"):
            out.append(s)
        else:
            out.append(s.model_copy(update={"acceptance": [*s.acceptance, line]}))
    return out


def baseline_quality_line(a: Any) -> str | None:
    """The acceptance criteria's statement of the measured baseline accuracy."""
    q = baseline_quality(a)
    if q is None or q.accuracy is None:
        return None
    floor = floor_of(a.workload)
    vs = (
        ""
        if floor is None
        else f"; the floor is {floor:.1%}"
        + (" (the baseline itself is below it)" if q.accuracy < floor else "")
    )
    return (
        f"Baseline graded accuracy (run {a.run.run_id}): {q.accuracy:.1%}, {q.correct}/{q.graded} "
        f"correct, Wilson 95% CI {q.ci95_low:.1%}-{q.ci95_high:.1%}{vs}."
    )
