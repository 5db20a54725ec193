"""A stored calibration in the deployment search: which candidates it speaks for.

A calibration fits one deployment's efficiency and overhead factors: how that engine's
kernels run on that GPU. The search uses them for every candidate on the same GPU type
and engine, at any tensor parallelism, weight format or batch limit (the roofline carries
the shape, the factors the machine), and keeps the published factors on other GPUs. Each
candidate names the calibration its numbers rest on, so a cheaper fleet on an uncalibrated
GPU is never mistaken for a measured one.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError


def calibrated_gpu(applied: Any) -> str:
    """The catalog id of the GPU a calibration was measured on."""
    from ..catalog import get_gpu

    if applied.gpu is None:
        raise InputError(
            "calibration",
            f"{applied.name!r} was fitted on custom hardware; recommend searches catalog GPUs "
            "(calibrate on a catalog --gpu, or use it with predict and budget)",
        )
    return get_gpu(applied.gpu).id


def calibration_for(gpu_id: str, spec: Any) -> Any:
    """The calibration a candidate on ``gpu_id`` uses, or None (published factors)."""
    applied = spec.calibration
    if applied is None or applied.engine != spec.engine:
        return None
    return applied if calibrated_gpu(applied) == gpu_id else None


def check_covers(spec: Any, gpu_ids: list[str]) -> None:
    """A calibration that applies to no searched GPU (or another engine) is a mistake."""
    applied = spec.calibration
    if applied is None:
        return
    gpu = calibrated_gpu(applied)
    if applied.engine != spec.engine:
        raise InputError(
            "calibration",
            f"{applied.name!r} was measured on {applied.engine}, the search is for {spec.engine}",
        )
    if gpu not in gpu_ids:
        raise InputError(
            "calibration",
            f"{applied.name!r} was measured on {gpu}, which the search does not include "
            f"(searched: {', '.join(gpu_ids) or 'none'}); add it to --gpus or drop --calibration",
        )


def calibration_assumptions(spec: Any) -> list[str]:
    """What the answer says about the calibration it used."""
    applied = spec.calibration
    if applied is None:
        return []
    return [
        f"candidates on {calibrated_gpu(applied)} ({applied.engine}) use calibration "
        f"{applied.name!r} (factors {', '.join(applied.fitted)} fitted on "
        f"{len(applied.sources)} measurement(s) of {applied.model}); their other TP, weights "
        "and batch limits are predicted with those factors, other GPUs with the published ones"
    ]
