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
