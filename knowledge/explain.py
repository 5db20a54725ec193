"""Explain a run: the prediction for exactly its deployment, load and lengths beside
what it measured, and the difference attributed to its causes, each with evidence.

Why: a measured number that differs from the model is either the model's fault
(factors the deployment does not reach: fix by calibrating) or the run's (it did
not measure what was asked: prompts found in the prefix cache, outputs that
stopped early, a client that could not keep up, a slow network). Telling them
apart needs the run's own records, not the headline numbers.

The attribution splits the mean end-to-end gap (measured - predicted) into
* ``decode``: (measured - predicted mean ITL) x (output tokens - 1);
* ``prefill`` and ``queueing``: the TTFT gap, split by the share of predicted
  TTFT that is queueing at this load (the engine's slots against the clients);
* ``network``: the measured time to the first response byte (headers arrive
  before any token is computed: what remains is the connection and the network);
* ``client``: the client's own lag when its health check says it saturated;
and lists the workload mismatches (prefix-cache hits from the scraped metrics,
outputs shorter than asked, a saturated client), which change what was measured
rather than how fast the engine is.
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Cause = Literal["queueing", "prefill", "decode", "client", "network", "workload_mismatch", "other"]


class ExplainRequest(BaseModel):
    """A stored run, and the deployment it ran on (flags, or a stored calibration's)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(
        description="Stored run id (unique prefix or latest).",
        min_length=1,
        json_schema_extra={"cli_positional": True},
    )
    model: str | None = Field(default=None, description="Model; default: the run's --model.")
    gpu: str | None = Field(default=None, description="Catalog GPU id.")
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=4096)
    memory_bandwidth_gbps: float | None = Field(default=None, gt=0, le=100_000)
    tflops: float | None = Field(default=None, gt=0, le=100_000)
    tensor_parallel_size: int = Field(default=1, ge=1, le=128)
    quantization: str | None = Field(default=None, max_length=100)
    max_num_seqs: int | None = Field(default=None, ge=1, le=1_000_000)
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    calibration: str | None = Field(
        default=None,
        max_length=64,
        description="Predict with this stored calibration (its deployment fills unset flags).",
    )
    db: str | None = Field(default=None, description="Run database file.")


class GapPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cause: Cause
    ms: float | None = Field(description="Share of the mean E2E gap in ms (null: not in ms).")
    evidence: list[str]


class ExplainResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    model: str
    gpu: str
    load: str
    input_tokens_mean: float
    output_tokens_mean: float
    measured: dict[str, float]
    predicted: dict[str, float]
    gap_pct: dict[str, float] = Field(description="(measured - predicted) / predicted, percent.")
    attribution: list[GapPart]
    calibrated_from_run: dict[str, float] | None = Field(
        default=None,
        description="The factors this run alone fits (what the deployment reaches), when it can.",
    )
    calibration: str | None = None
    notes: list[str]


METRICS = ("ttft_ms", "itl_ms", "e2e_ms", "output_tokens_per_s")


def _deployment(req: ExplainRequest, run_model: str | None, applied: Any) -> dict[str, Any]:
    from inferwise.calculators.errors import InputError

    fields: dict[str, Any] = {}
    if applied is not None:
        fields.update(applied.deployment)
    given = req.model_dump(exclude={"run_id", "calibration", "db"}, exclude_none=True)
    given = {k: v for k, v in given.items() if k in req.model_fields_set or k not in fields}
    fields.update(given)
    fields.setdefault("model", run_model)
    if not fields.get("model"):
        raise InputError("model", "the run does not record its model; give --model")
    if not fields.get("gpu") and not fields.get("gpu_memory_gib"):
        raise InputError(
            "gpu",
            "explain needs the deployment the run measured",
            "--gpu ID, or --gpu-memory-gib with --memory-bandwidth-gbps and --tflops, or --calibration NAME",
        )
    return fields


def _predict(dep: dict[str, Any], point: Any, applied: Any) -> Any:
    from inferwise.calculators.predict import PredictRequest, predict_performance

    load: dict[str, Any] = {}
    if point.concurrency is not None:
        load["concurrency"] = point.concurrency
    elif point.request_rate is not None:
        load["request_rate"] = point.request_rate
    # as many requests as the run had, every one counted (the run's own statistics cover its
    # opening wave too): predict reports a given count as the whole run
    n = min(4000, max(1, point.num_requests))
    req = PredictRequest(
        **dep,
        **load,
        input_tokens=max(1, round(point.input_tokens_mean)),
        output_tokens=max(1, round(point.output_tokens_mean)),
        num_requests=n,
    )
    return predict_performance(req, applied.applied() if applied is not None else None)


def _values(point: Any, pred: Any) -> tuple[dict[str, float], dict[str, float]]:
    measured = {
        "ttft_ms": point.ttft_ms,
        "itl_ms": point.itl_ms or point.tpot_ms,
        "e2e_ms": point.e2e_ms,
        "output_tokens_per_s": point.output_tokens_per_s,
    }
    predicted = {
        "ttft_ms": pred.ttft_ms.mean,
        "itl_ms": pred.itl_ms.mean if pred.itl_ms else None,
        "e2e_ms": pred.e2e_ms.mean,
        "output_tokens_per_s": pred.output_tokens_per_s,
        "queue_ms": pred.queue_ms.mean,
    }
    m = {k: round(float(v), 3) for k, v in measured.items() if v is not None}
    p = {k: round(float(v), 3) for k, v in predicted.items() if v is not None}
    return m, p


def _engine_parts(m: dict[str, float], p: dict[str, float], point: Any, pred: Any) -> list[GapPart]:
    parts: list[GapPart] = []
    if "itl_ms" in m and "itl_ms" in p:
        decode = (m["itl_ms"] - p["itl_ms"]) * max(0.0, point.output_tokens_mean - 1)
        parts.append(
            GapPart(
                cause="decode",
                ms=round(decode, 2),
                evidence=[
                    f"mean ITL measured {m['itl_ms']:.2f} ms vs predicted {p['itl_ms']:.2f} ms, "
                    f"over {point.output_tokens_mean - 1:.0f} gaps per request (mean decode batch "
                    f"{pred.step.decode_batch:.1f}, bound {pred.bound})"
                ],
            )
        )
    if "ttft_ms" in m:
        gap = m["ttft_ms"] - p["ttft_ms"]
        share = min(1.0, p.get("queue_ms", 0.0) / p["ttft_ms"]) if p["ttft_ms"] > 0 else 0.0
        conc = point.concurrency
        slots = pred.max_num_seqs
        parts.append(
            GapPart(
                cause="queueing",
                ms=round(gap * share, 2),
                evidence=[
                    f"{share:.0%} of the predicted TTFT ({p['ttft_ms']:.1f} ms) is queueing at this "
                    f"load ({point.load_label}, {slots} engine slots)"
                    + (
                        f": {conc - slots} client(s) always wait for a slot"
                        if conc and conc > slots
                        else ""
                    )
                ],
            )
        )
        parts.append(
            GapPart(
                cause="prefill",
                ms=round(gap * (1 - share), 2),
                evidence=[
                    f"mean TTFT measured {m['ttft_ms']:.1f} ms vs predicted {p['ttft_ms']:.1f} ms for "
                    f"{point.input_tokens_mean:.0f}-token prompts (prefill of one alone: "
                    f"{pred.step.prefill_ms:.1f} ms predicted" + _front_end_text(pred) + ")"
                ],
            )
        )
    return parts


def _front_end_text(pred: Any) -> str:
    """The engine front end's share of the predicted TTFT, where the factors carry one."""
    ms = float(pred.factors.get("request_overhead_ms", 0.0) or 0.0)
    return f", plus {ms:.0f} ms of the engine's per-request front end" if ms > 0 else ""


def _client_parts(records: list[Any], summary: Any) -> list[GapPart]:
    parts: list[GapPart] = []
    ttfb = [
        1e3 * (r.first_byte_s - r.start_s)
        for r in records
        if r.ok
        and not r.warmup
        and r.first_byte_s is not None
        and r.first_token_s is not None
        and r.first_byte_s < r.first_token_s
    ]
    if ttfb:
        parts.append(
            GapPart(
                cause="network",
                ms=round(statistics.median(ttfb), 2),
                evidence=[
                    f"median time to the first response byte {statistics.median(ttfb):.2f} ms over "
                    f"{len(ttfb)} requests (headers precede the first token: connection + network + "
                    "request handling, which the prediction leaves out)"
                ],
            )
        )
    health = summary.client_health if summary is not None else None
    if health is not None and health.saturated:
        lag = health.loop_lag_ms.p99
        parts.append(
            GapPart(
                cause="client",
                ms=round(float(lag), 2) if lag is not None else None,
                evidence=[
                    "the client saturated: event-loop lag p99 "
                    f"{lag if lag is not None else float('nan'):.1f} ms; measured latencies include the client's own delay",
                    *health.notes,
                ],
            )
        )
    return parts


def _mismatch_parts(point: Any, config: dict[str, Any], samples: list[Any]) -> list[GapPart]:
    parts: list[GapPart] = []
    asked = config.get("output_tokens")
    if asked and point.output_tokens_mean < 0.9 * float(asked):
        parts.append(
            GapPart(
                cause="workload_mismatch",
                ms=None,
                evidence=[
                    f"outputs stopped early: {point.output_tokens_mean:.1f} tokens on average of the "
                    f"{asked} asked (EOS or a stop string); E2E and throughput measure shorter "
                    "requests than planned (the prediction uses the measured length)"
                ],
            )
        )
    hits = _prefix_hit_rate(samples)
    if hits is not None and hits > 0.05:
        parts.append(
            GapPart(
                cause="workload_mismatch",
                ms=None,
                evidence=[
                    f"prefix cache hit rate {hits:.0%} in the scraped engine metrics: prompts were "
                    "partly cached, so TTFT is lower than a cold prefill (the prediction assumes none)"
                ],
            )
        )
    return parts


def _prefix_hit_rate(samples: list[Any]) -> float | None:
    """Hits / queries over the run from the engine's counters (vLLM prefix_cache_*)."""

    def delta(word: str) -> float | None:
        vals = [s.value for s in samples if "prefix_cache" in s.name and s.name.endswith(word)]
        return (max(vals) - min(vals)) if len(vals) >= 2 else None

    hits = delta("hits_total") or delta("hits")
    queries = delta("queries_total") or delta("queries")
    if hits is None or not queries:
        return None
    return hits / queries


def explain_run(req: ExplainRequest) -> ExplainResult:
    """The prediction for exactly the run's conditions beside its measurement, and the gap's causes."""
    from inferwise.probes.calibrations import get_calibration, point_from_run
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store:
        run_id = store.resolve(req.run_id)
        run = store.get_run(run_id)
        point = point_from_run(store, run_id)
        records = store.requests(run_id)
        samples = store.metric_samples(run_id)
        applied = get_calibration(store, req.calibration) if req.calibration else None
    dep = _deployment(req, run.config.get("model"), applied)
    pred = _predict(dep, point, applied)
    m, p = _values(point, pred)
    parts = _engine_parts(m, p, point, pred) + _client_parts(records, run.summary)
    parts += _mismatch_parts(point, run.config, samples)
    gap = {k: round(100 * (m[k] - p[k]) / p[k], 1) for k in METRICS if k in m and p.get(k)}
    notes, fitted = _fit_from_run(dep, point, applied)
    return ExplainResult(
        run_id=run_id,
        model=str(dep["model"]),
        gpu=pred.gpu,
        load=point.load_label,
        input_tokens_mean=round(point.input_tokens_mean, 1),
        output_tokens_mean=round(point.output_tokens_mean, 1),
        measured=m,
        predicted=p,
        gap_pct=gap,
        attribution=parts,
        calibrated_from_run=fitted,
        calibration=req.calibration,
        notes=notes + _gap_notes(m, p, parts),
    )


def _fit_from_run(dep: dict[str, Any], point: Any, applied: Any) -> tuple[list[str], Any]:
    """What this run alone says about the deployment's factors (skipped when a calibration
    is in use: the prediction already carries measured factors)."""
    if applied is not None:
        return [f"predicted with calibration {applied.name!r}"], None
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.errors import InputError
    from inferwise.probes.calibrations import fit_points

    try:
        cal = fit_points(Deployment(**dep), [point], f"run-{point.source}")
    except InputError as exc:
        return [f"the run alone cannot calibrate the deployment: {exc}"], None
    got = {k: cal.factors.efficiency[k] for k in cal.fitted if k in cal.factors.efficiency}
    if "request_overhead_ms" in cal.fitted:
        got["request_overhead_ms"] = cal.factors.request_overhead_ms
    return [
        "calibrated_from_run: factors this run alone fits ("
        + ", ".join(
            f"{k} {v:g} vs published {cal.published.efficiency.get(k, 0.0):g}"
            for k, v in got.items()
            if k in cal.published.efficiency
        )
        + "); `inferwise calibrate --run` with runs at more loads separates the rest"
    ], got


def _gap_notes(m: dict[str, float], p: dict[str, float], parts: list[GapPart]) -> list[str]:
    if "e2e_ms" not in m:
        return []
    gap = m["e2e_ms"] - p["e2e_ms"]
    counted = sum(
        x.ms for x in parts if x.ms is not None and x.cause in ("decode", "queueing", "prefill")
    )
    return [
        f"mean E2E measured {m['e2e_ms']:.1f} ms vs predicted {p['e2e_ms']:.1f} ms "
        f"(gap {gap:+.1f} ms; decode + prefill + queueing account for {counted:+.1f} ms, "
        "network and client overlap the TTFT part)"
    ]
