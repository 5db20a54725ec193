"""Calibrations: fitted from stored runs and benchmark files, kept in the run store.

``inferwise calibrate`` gathers measured load points (stored probe runs, vLLM /
guidellm / AIPerf result files), fits the deployment's factors
(:mod:`inferwise.calculators.user_calibration`) and stores the result with its
provenance in the ``calibrations`` table of the run database, next to the runs
it came from. ``predict --calibration NAME`` (and the other calculators) load
it by name here, at the door, and pass its factors into the calculator: the
calculators never read the store.

Nothing is stored unless the whole fit succeeded: a bad file, a run of another
model, or too few values raise before the table is touched.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferwise.calculators.bench_files import MeasuredPoint
from inferwise.calculators.deployment import Deployment
from inferwise.calculators.errors import InputError
from inferwise.calculators.user_calibration import (
    AppliedCalibration,
    CalibratedFactors,
    PointResidual,
    ResidualSpread,
    load_range,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_SOURCES = 64
_DB_DESC = "Run database file (default: $INFERWISE_DB or ~/.local/share/inferwise/runs.db)."


def check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError(
            "a calibration name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return v


class CalibrateRequest(Deployment):
    """The deployment to calibrate and the measurements to calibrate it on."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="Name to store the calibration under (replaces one of that name)."
    )
    run: list[str] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        description="Stored probe run ids (prefixes, latest) measured on this deployment.",
    )
    from_file: list[str] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        description="Benchmark result files: vLLM bench serve --save-result JSON, guidellm JSON report, AIPerf profile_export_aiperf.json.",
    )
    db: str | None = Field(default=None, description=_DB_DESC)

    _name = field_validator("name")(classmethod(lambda cls, v: check_name(v)))


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str
    tool: str
    load: str
    num_requests: int


class StoredCalibration(BaseModel):
    """A calibration as stored: what was fitted, on what, and how well."""

    model_config = ConfigDict(extra="forbid")

    name: str
    created_at: str
    deployment: dict[str, Any]
    factors: CalibratedFactors
    published: CalibratedFactors
    fitted: list[str]
    held: dict[str, str]
    points: list[PointResidual]
    residual_spread: ResidualSpread
    rms_log_error_published: float
    rms_log_error_calibrated: float
    provenance: list[Provenance]
    warnings: list[str]

    def applied(self) -> AppliedCalibration:
        return AppliedCalibration(
            name=self.name,
            model=str(self.deployment.get("model")),
            gpu=self.deployment.get("gpu"),
            engine=str(self.deployment.get("engine") or "vllm"),
            sources=[p.source for p in self.provenance],
            fitted=self.fitted,
            factors=self.factors,
            residual_spread=self.residual_spread,
            concurrency_range=load_range([p.concurrency for p in self.points]),
            rate_range_per_s=load_range([p.request_rate_per_s for p in self.points]),
            created_at=self.created_at,
        )


class CalibrateResult(StoredCalibration):
    db: str


# --------------------------------------------------------------------------- the table


def _table(store: Any) -> Any:
    table = store.db["calibrations"]
    if not table.exists():
        table.create({"name": str, "created_at": str, "body": str}, pk="name", if_not_exists=True)
    return table


def save_calibration(store: Any, cal: StoredCalibration) -> None:
    with store._lock:
        _table(store).upsert(
            {"name": cal.name, "created_at": cal.created_at, "body": cal.model_dump_json()},
            pk="name",
        )
        store._conn.commit()


def get_calibration(store: Any, name: str) -> StoredCalibration:
    with store._lock:
        table = _table(store)
        rows = list(table.rows_where("name = ?", [name]))
        names = [r["name"] for r in table.rows_where(order_by="created_at desc", limit=8)]
    if not rows:
        raise InputError(
            "calibration",
            f"no calibration named {name!r}; stored: {', '.join(names) or 'none'}",
            "a name from `inferwise calibrations list`",
        )
    return StoredCalibration.model_validate_json(rows[0]["body"])


def load_applied(name: str, db: str | None = None) -> AppliedCalibration:
    """A stored calibration by name, as a calculator uses it (the doors call this)."""
    from inferwise.probes.store import RunStore, default_db_path

    path = db or str(default_db_path())
    if db is None and not default_db_path().exists():
        raise InputError("calibration", f"no calibration named {name!r}: no run database at {path}")
    with RunStore(path, create=False) as store:
        return get_calibration(store, name).applied()


# --------------------------------------------------------------------------- measurements


def point_from_run(store: Any, run_id: str) -> MeasuredPoint:
    """A stored run as one measured load point (its config and summary)."""
    from inferwise.probes.summary import summarize

    run = store.get_run(store.resolve(run_id))
    summary = run.summary or summarize(store.requests(run.run_id))
    cfg = run.config
    done = summary.completed
    if done < 1:
        raise InputError("run", f"run {run.run_id} has no completed request")
    inp = (
        summary.total_input_tokens / done if summary.total_input_tokens else cfg.get("input_tokens")
    )
    out = summary.total_output_tokens / done if summary.total_output_tokens else None
    if not inp or not out:
        raise InputError("run", f"run {run.run_id} recorded no token counts")
    return MeasuredPoint(
        source=f"run:{run.run_id}",
        tool=cfg.get("tool") or "inferwise-probe",
        model=cfg.get("model"),
        concurrency=cfg.get("concurrency"),
        request_rate=cfg.get("request_rate") if cfg.get("concurrency") is None else None,
        num_requests=done,
        input_tokens_mean=float(inp),
        output_tokens_mean=float(out),
        ttft_ms=summary.ttft_ms.mean,
        ttft_ms_p50=summary.ttft_ms.p50,
        itl_ms=summary.itl_ms.mean,
        tpot_ms=summary.tpot_ms.mean,
        e2e_ms=summary.e2e_ms.mean,
        output_tokens_per_s=summary.output_token_throughput,
        requests_per_s=summary.request_throughput,
        duration_s=summary.window_s,
        failed=summary.failed,
    )


def gather_points(req: CalibrateRequest, store: Any) -> list[MeasuredPoint]:
    """Every point of the request's runs and files, each checked against the model."""
    from inferwise.calculators.bench_files import read_bench_file
    from inferwise.calculators.user_calibration import check_model_matches

    points: list[MeasuredPoint] = []
    for run_id in req.run:
        p = point_from_run(store, run_id)
        check_model_matches(p, req.model, "run")
        points.append(p)
    for path in req.from_file:
        for p in read_bench_file(path):
            check_model_matches(p, req.model, "from_file")
            points.append(p)
    if not points:
        raise InputError(
            "run", "no measurements given", "--run RUN_ID ... and/or --from-file FILE ..."
        )
    return points


# --------------------------------------------------------------------------- operations


def fit_points(dep: Deployment, points: list[MeasuredPoint], name: str) -> StoredCalibration:
    """Fit the deployment on the points; the stored form (not yet stored)."""
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import fit_deployment

    dep = Deployment(**{k: getattr(dep, k) for k in Deployment.model_fields})
    start = StepModel.from_deployment(dep).efficiency
    fit = fit_deployment(lambda eff: StepModel.from_deployment(dep, eff), start, points)
    return StoredCalibration(
        name=name,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        deployment=dep.model_dump(mode="json", exclude_defaults=True),
        provenance=[
            Provenance(source=p.source, tool=p.tool, load=p.load_label, num_requests=p.num_requests)
            for p in points
        ],
        **fit.model_dump(),
    )


def calibrate(req: CalibrateRequest) -> CalibrateResult:
    """Fit the deployment's factors on the measurements and store the calibration."""
    from inferwise.probes.store import RunStore

    with RunStore(req.db) as store:
        points = gather_points(req, store)
        cal = fit_points(req, points, req.name)
        save_calibration(store, cal)
        db = str(store.path)
    return CalibrateResult(db=db, **cal.model_dump())


class CalibrationsListRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db: str | None = Field(default=None, description=_DB_DESC)


class CalibrationRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    created_at: str
    model: str
    gpu: str | None
    fitted: list[str]
    sources: int
    rms_log_error_calibrated: float


class CalibrationsListResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calibrations: list[CalibrationRow]


class CalibrationNameRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Calibration name.", json_schema_extra={"cli_positional": True})
    db: str | None = Field(default=None, description=_DB_DESC)


class DeleteResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deleted: str


def list_calibrations(req: CalibrationsListRequest) -> CalibrationsListResult:
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store, store._lock:
        bodies = [r["body"] for r in _table(store).rows_where(order_by="created_at desc")]
    rows = []
    for body in bodies:
        cal = StoredCalibration.model_validate(json.loads(body))
        rows.append(
            CalibrationRow(
                name=cal.name,
                created_at=cal.created_at,
                model=str(cal.deployment.get("model")),
                gpu=cal.deployment.get("gpu"),
                fitted=cal.fitted,
                sources=len(cal.provenance),
                rms_log_error_calibrated=cal.rms_log_error_calibrated,
            )
        )
    return CalibrationsListResult(calibrations=rows)


def show_calibration(req: CalibrationNameRequest) -> StoredCalibration:
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=False) as store:
        return get_calibration(store, req.name)


def delete_calibration(req: CalibrationNameRequest) -> DeleteResult:
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=False) as store:
        get_calibration(store, req.name)
        with store._lock:
            _table(store).delete(req.name)
            store._conn.commit()
    return DeleteResult(deleted=req.name)


# --------------------------------------------------------------------------- the doors' wrappers


def predict_calibrated(req: Any) -> Any:
    """predict with the named calibration loaded from the store (the registry's entry)."""
    from inferwise.calculators.predict import predict_performance

    applied = load_applied(req.calibration) if req.calibration else None
    return predict_performance(req, applied)


def budget_calibrated(req: Any) -> Any:
    """budget with the named calibration loaded from the store (the registry's entry)."""
    from inferwise.calculators.budget import decompose_budget

    applied = load_applied(req.calibration) if req.calibration else None
    return decompose_budget(req, calibration=applied)
