"""The calibration diagnose and plan predict with, and diagnose's explain section.

``--calibration NAME`` loads a stored one. Without it, ``plan --run`` fits one
from the run itself when the workload names the deployment (model and GPU, or
custom hardware) and the run holds enough values: the plan's what-if
predictions then start from what this deployment measured. ``diagnose``
keeps the published factors unless told otherwise, because its evidence is the
gap between the published expectation and the measurement; it shows what the
run alone fits in its explain section instead.
"""

from __future__ import annotations

from typing import Any


def _deployment(wl: Any) -> dict[str, Any] | None:
    from inferwise.knowledge.sizing import deployment_kwargs

    fields = deployment_kwargs(wl)
    if not fields.get("model") or not (fields.get("gpu") or fields.get("gpu_memory_gib")):
        return None
    from inferwise.calculators.deployment import Deployment

    return {k: v for k, v in fields.items() if k in Deployment.model_fields}


def active_calibration(
    name: str | None, run: str | None, wl: Any, db: str | None
) -> tuple[Any, list[str]]:
    """(AppliedCalibration or None, what to tell the user about it)."""
    from inferwise.calculators.errors import InputError

    if name:
        from inferwise.probes.calibrations import load_applied

        applied = load_applied(name, db)
        return applied, [
            f"predictions use calibration {name!r} ({', '.join(applied.fitted)} fitted)"
        ]
    dep = _deployment(wl) if run else None
    if dep is None:
        return None, []
    from inferwise.calculators.deployment import Deployment
    from inferwise.probes.calibrations import fit_points, point_from_run
    from inferwise.probes.store import RunStore

    try:
        with RunStore(db, create=db is None) as store:
            point = point_from_run(store, run)  # type: ignore[arg-type]
        cal = fit_points(Deployment(**dep), [point], f"run-{point.source.removeprefix('run:')}")
    except InputError as exc:
        return None, [
            f"the run is not enough to calibrate the predictions ({exc}); published factors used"
        ]
    return cal.applied(), [
        f"predictions calibrated from run {point.source.removeprefix('run:')} "
        f"({', '.join(cal.fitted)} fitted on its one load; the others published)"
    ]


def explain_section(
    run: str | None, wl: Any, calibration: str | None, db: str | None, notes: list[str]
) -> Any:
    """diagnose --run's explain section, when the workload names the deployment."""
    if not run:
        return None
    dep = _deployment(wl)
    if dep is None and not calibration:
        notes.append(
            "no explain section: the workload names no deployment (model and gpu); "
            "`inferwise explain RUN --gpu GPU` gives it"
        )
        return None
    from inferwise.calculators.errors import InputError
    from inferwise.knowledge.explain import ExplainRequest, explain_run

    keys = set(ExplainRequest.model_fields) - {"run_id", "calibration", "db"}
    fields = {k: v for k, v in (dep or {}).items() if k in keys}
    try:
        return explain_run(ExplainRequest(run_id=run, calibration=calibration, db=db, **fields))
    except InputError as exc:
        notes.append(f"no explain section: {exc}")
        return None
