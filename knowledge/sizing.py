"""The calculators, called on a workload's deployment, with graceful failure.

Diagnosis and planning *combine* measurement with computation: a measured
ITL means little until it is set against the decode step the hardware allows.
But a workload may name a model the catalog lacks, a GPU we have no datasheet
for, or leave the token lengths open. Then the calculator cannot answer, and
the reasoning must say so (an assumption or note) and go on with what it has,
never substituting an invented number. Every function here therefore returns
``(result or None, notes)``.

The calculators are imported inside the functions: this module is reached
from registry input models and must stay light.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from inferwise.knowledge.workload import Workload

if TYPE_CHECKING:
    from inferwise.calculators.budget import BudgetResult
    from inferwise.calculators.fit import FitResult
    from inferwise.calculators.predict import PredictResult

R = TypeVar("R")


@dataclass(frozen=True)
class CalcFailure:
    """Why a calculator could not answer: the input it refused (``model``, ``gpu``, ...;
    None for a failure of the job itself) and its message."""

    field: str | None
    message: str


@dataclass
class CalcOutcome(Generic[R]):
    """What one calculator said (its typed result), or why it could not say anything."""

    name: str
    result: R | None = None
    notes: list[str] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    failure: CalcFailure | None = None


_MEMO: ContextVar[dict[tuple[str, str], CalcOutcome[Any]] | None] = ContextVar(
    "inferwise_calc_memo", default=None
)


CALIBRATION: ContextVar[Any] = ContextVar("inferwise_calibration", default=None)
"""The AppliedCalibration diagnose/plan were given (or fitted from their run): predict and
budget calls inside the call use its factors."""


@contextmanager
def calibration_scope(applied: Any) -> Iterator[None]:
    """Within a diagnose or plan call, predictions use this calibration (None: published)."""
    token = CALIBRATION.set(applied)
    try:
        yield
    finally:
        CALIBRATION.reset(token)


def _with_calibration(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[[Any], Any]:
    """The calculator bound to the active calibration; its name joins the request (and
    the memo key), so calibrated and published answers are never mixed up."""
    applied = CALIBRATION.get()
    if applied is None:
        return fn
    kwargs["calibration"] = applied.name
    return lambda req: fn(req, calibration=applied)


@contextmanager
def calculation_scope() -> Iterator[None]:
    """Within one diagnose or plan call, answer a repeated calculator request from memory.

    The analysis of the stated deployment and the greenfield candidates often ask the same
    question (same model, GPU, TP, lengths); the calculators are deterministic, so the second
    answer is the first one. The memory lives only for the call: a model given as a path to a
    config.json may change between calls. Results are shared, not copied: nothing downstream
    changes a calculator's result."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def gpu_info(gpu_name: str | None) -> tuple[Any | None, str | None]:
    """The catalog GPU, or a note saying why there is none."""
    if not gpu_name:
        return None, None
    from inferwise.calculators.catalog import get_gpu
    from inferwise.calculators.errors import InputError

    try:
        return get_gpu(gpu_name), None
    except InputError as exc:
        return (
            None,
            f"GPU '{gpu_name}' is not in the catalog ({exc.message}); interconnect, memory and bandwidth facts are unknown.",
        )


def model_source_url(model: str | None) -> str | None:
    if not model:
        return None
    from inferwise.calculators.catalog import load_model
    from inferwise.calculators.errors import InputError

    try:
        return load_model(model).source_url
    except (InputError, OSError, ValueError):
        return None


def _deployment_keys() -> tuple[str, ...]:
    """The workload's deployment fields the calculators take, read off both models (one
    definition: a field added to either is passed on without a second list to keep).
    The engine is handled apart: only the engines with memory rules are passed."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.knowledge.workload import WorkloadDeployment

    return tuple(
        k
        for k in WorkloadDeployment.model_fields
        if k in Deployment.model_fields and k not in ("engine", "engine_version")
    )


CALCULATOR_ENGINES = {"vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "trtllm"}
"""A workload's deployment.engine -> the calculators' --engine, for the engines they model."""


def deployment_kwargs(workload: Workload, **override: Any) -> dict[str, Any]:
    """Calculator deployment fields from the workload's deployment (only what it states)."""
    dep = workload.deployment
    out: dict[str, Any] = {}
    if dep is not None:
        for key in _deployment_keys():
            value = getattr(dep, key)
            if value is not None:
                out[key] = value
        if dep.engine in CALCULATOR_ENGINES:
            out["engine"] = CALCULATOR_ENGINES[dep.engine]
        if dep.engine_version:
            out["engine_version"] = dep.engine_version
    out.update({k: v for k, v in override.items() if v is not None})
    return out


def _call(
    name: str, request_cls: Any, fn: Callable[[Any], R], kwargs: dict[str, Any]
) -> CalcOutcome[R]:
    """Build the request from the fields the calculator knows, call it, and catch what it
    reports as unanswerable. Fields the calculator does not take are dropped silently only
    because they are optional refinements (e.g. engine_version)."""
    import json

    args = {k: v for k, v in kwargs.items() if k in request_cls.model_fields}
    memo = _MEMO.get()
    key = (name, json.dumps(args, sort_keys=True, default=str))
    if memo is not None and key in memo:
        done = memo[key]
        return dataclasses.replace(done, notes=list(done.notes), request=dict(done.request))
    outcome: CalcOutcome[R] = CalcOutcome(name=name, request=args)
    _compute(outcome, request_cls, fn, args)
    if memo is not None:
        memo[key] = dataclasses.replace(outcome, notes=list(outcome.notes))
    return outcome


def _compute(
    outcome: CalcOutcome[Any], cls: Any, fn: Callable[[Any], Any], args: dict[str, Any]
) -> None:
    """Validate, call, and record the answer or why there is none (into ``outcome``)."""
    from pydantic import ValidationError

    from inferwise.calculators.errors import InferwiseError, InputError

    name = outcome.name
    try:
        outcome.result = fn(cls.model_validate(args))
    except InferwiseError as exc:
        field_name = exc.field if isinstance(exc, InputError) else None
        outcome.failure = CalcFailure(field_name, str(exc))
        outcome.notes.append(f"`inferwise {name}` could not answer: {exc}")
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc", ())
        where = ".".join(str(p) for p in loc)
        outcome.failure = CalcFailure(str(loc[0]) if loc else None, str(first.get("msg")))
        outcome.notes.append(f"`inferwise {name}` could not answer: {where}: {first.get('msg')}")
    except Exception as exc:  # noqa: BLE001 - a calculator bug must not sink the whole plan
        outcome.failure = CalcFailure(None, f"{type(exc).__name__}: {exc}")
        outcome.notes.append(
            f"`inferwise {name}` failed unexpectedly ({type(exc).__name__}: {exc}); its numbers are missing."
        )


def can_size(workload: Workload) -> str | None:
    """None when the deployment names enough to call the calculators, else what is missing."""
    dep = workload.deployment
    missing = [k for k in ("model", "gpu") if dep is None or getattr(dep, k) is None]
    return f"deployment.{' and deployment.'.join(missing)}" if missing else None


def run_fit(
    workload: Workload, context_tokens: int | None, concurrency: int | None, **override: Any
) -> CalcOutcome[FitResult]:
    kwargs = deployment_kwargs(workload, **override)
    if context_tokens:
        kwargs["context_tokens"] = int(context_tokens)
    if concurrency:
        kwargs["concurrency"] = max(1, int(concurrency))
    from inferwise.calculators.fit import FitRequest, estimate_fit

    return _call("fit", FitRequest, estimate_fit, kwargs)


def run_predict(
    workload: Workload,
    input_tokens: float,
    output_tokens: float,
    concurrency: float | None = None,
    request_rate: float | None = None,
    **override: Any,
) -> CalcOutcome[PredictResult]:
    kwargs = deployment_kwargs(workload, **override)
    kwargs["input_tokens"] = max(1, int(round(input_tokens)))
    kwargs["output_tokens"] = max(1, int(round(output_tokens)))
    if concurrency is not None:
        kwargs["concurrency"] = max(1, int(round(concurrency)))
    elif request_rate is not None:
        kwargs["request_rate"] = request_rate
    from inferwise.calculators.predict import PredictRequest, predict_performance

    return _call("predict", PredictRequest, _with_calibration(predict_performance, kwargs), kwargs)


def run_budget(
    workload: Workload,
    input_tokens: float,
    output_tokens: float,
    idle: bool = False,
    **override: Any,
) -> CalcOutcome[BudgetResult]:
    """The latency budget for the workload's SLOs at its mean rate and peak factor; with
    ``idle``, at a trickle of load instead (which targets a lightly loaded replica misses)."""
    kwargs = deployment_kwargs(workload, **override)
    kwargs["input_tokens"] = max(1, int(round(input_tokens)))
    kwargs["output_tokens"] = max(1, int(round(output_tokens)))
    t = workload.traffic
    if idle:
        kwargs["request_rate"] = 0.01
    if t is not None:
        if t.arrival_rate_rps and not idle:
            kwargs["request_rate"] = t.arrival_rate_rps
        if t.peak_to_mean and not idle:
            kwargs["peak_to_mean"] = t.peak_to_mean
        for name, dist in (
            ("input_tokens_p95", t.input_tokens),
            ("output_tokens_p95", t.output_tokens),
        ):
            if dist is not None and dist.p95 is not None and dist.p95 >= kwargs[name[:-4]]:
                kwargs[name] = int(dist.p95)
    if workload.product is not None and workload.product.streaming is not None:
        kwargs["streaming"] = workload.product.streaming
    slo = workload.slo
    if slo is not None:
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            pct = getattr(slo, metric)
            if pct is not None:
                values = {
                    k: getattr(pct, k)
                    for k in ("p50", "p90", "p95", "p99")
                    if getattr(pct, k) is not None
                }
                if values:
                    kwargs[f"slo_{metric}"] = values
    from inferwise.calculators.budget import BudgetRequest, decompose_budget

    return _call("budget", BudgetRequest, _with_calibration(decompose_budget, kwargs), kwargs)
