"""From per-request records to the numbers a probe run is judged by.

The definitions follow vLLM's benchmark names so that figures compare:

* TTFT, E2E: per request (see :mod:`inferwise.probes.records`).
* ITL: per token; a chunk carrying k tokens after a gap g gives k gaps of g/k.
  Raw per-chunk gaps and tokens per chunk are reported beside it, because a
  server that batches tokens into chunks looks smooth per token and bursty to
  the eye.
* TPOT: (E2E - TTFT) / (output tokens - 1), per request.
* Throughputs are over the measurement window: from the first measured
  request's start to the last measured request's end (warm-up excluded).
* A request meets the SLO when every given target holds: ``ttft_ms`` and
  ``e2e_ms`` and ``tpot_ms`` on the request's own value, ``itl_ms`` on the
  request's P95 per-token ITL. Failed requests never meet it. Goodput is the
  number of requests meeting the SLO, and passing their grader when the prompt
  carried one (ungraded requests are judged on latency only), per second of the
  window; SLO attainment is their share of all measured requests, in percent.
* The first request (cold) is reported apart; when warm-up requests were sent
  it is a warm-up request, otherwise it is kept out of the warm distributions
  whenever other requests exist.

Only the stdlib and pydantic are imported here: the models are part of the
probe's output schema, which the MCP server loads at start-up.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.bounds import check_slo_ms
from inferwise.probes.quality import QualitySummary, passes_grader, quality_summary
from inferwise.probes.records import RequestRecord

SLO_KEYS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


def check_slo(v: dict[str, float] | None) -> dict[str, float] | None:
    """Per-request SLO targets (probe, runs show, runs compare): known keys, each a
    positive number of ms up to a day. An empty dict means none."""
    if not v:
        return None
    bad = sorted(set(v) - set(SLO_KEYS))
    if bad:
        raise ValueError(f"unknown SLO key(s) {', '.join(bad)}; accepted: {', '.join(SLO_KEYS)}")
    return {k: check_slo_ms(k, x) for k, x in v.items()}


# Client saturation thresholds: beyond these the client, not the server, is
# likely adding latency, so the summary says so instead of reporting clean numbers.
# From bench/probe_precision.py on 2 cores: runs within the precision targets
# (median TTFT error <= 5 ms) kept the loop-lag P99 under about 10 ms; starved
# runs that missed them showed 30-600 ms.
LOOP_LAG_P99_LIMIT_MS = 10.0
SCHEDULE_DELAY_P99_LIMIT_MS = 10.0


class Distribution(BaseModel):
    """Mean, spread and percentiles of one metric over the measured requests."""

    model_config = ConfigDict(extra="forbid")

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class ChunkStats(BaseModel):
    """How the server packed tokens into stream chunks."""

    model_config = ConfigDict(extra="forbid")

    chunks: int = Field(0, description="Token-bearing chunks received over all measured requests.")
    tokens_per_chunk_mean: float | None = None
    tokens_per_chunk_max: int | None = None
    chunk_gap_ms: Distribution = Field(
        default_factory=Distribution, description="Raw gaps between token-bearing chunks."
    )


class ColdRequest(BaseModel):
    """The run's first request, which pays connection set-up and cold caches."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    warmup: bool
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    error_class: str | None = None


class ClientHealth(BaseModel):
    """Whether the measuring client kept up; when it did not, latencies are inflated by the client."""

    model_config = ConfigDict(extra="forbid")

    saturated: bool = False
    loop_lag_ms: Distribution = Field(
        default_factory=Distribution,
        description="Event-loop lag: how late a periodic timer fired, in ms (sampled during the run).",
    )
    schedule_delay_ms: Distribution = Field(
        default_factory=Distribution,
        description="Per request: actual send minus scheduled send, in ms (open loop only).",
    )
    workers: int = Field(1, description="Client worker processes that shared the load.")
    notes: list[str] = Field(default_factory=list)


class ProbeSummary(BaseModel):
    """The headline numbers of a probe run (times in ms, throughputs per second)."""

    model_config = ConfigDict(extra="forbid")

    completed: int = 0
    failed: int = 0
    warmup_excluded: int = 0
    window_s: float | None = Field(None, description="Measurement window in seconds.")
    ttft_ms: Distribution = Field(default_factory=Distribution)
    itl_ms: Distribution = Field(default_factory=Distribution)
    tpot_ms: Distribution = Field(default_factory=Distribution)
    e2e_ms: Distribution = Field(default_factory=Distribution)
    request_throughput: float | None = Field(None, description="Completed requests per second.")
    input_token_throughput: float | None = Field(None, description="Prompt tokens per second.")
    output_token_throughput: float | None = Field(None, description="Generated tokens per second.")
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    slo: dict[str, float] | None = None
    goodput: float | None = Field(
        None,
        description="Requests per second meeting every SLO target and passing their grader "
        "(ungraded requests: latency only).",
    )
    slo_attainment_pct: float | None = Field(
        None,
        description="Share of measured requests meeting every SLO target (and their grader, if any).",
    )
    slo_attainment_by_metric_pct: dict[str, float] = Field(default_factory=dict)
    tokens_approximate: bool = Field(
        False,
        description="True when some token counts were counted from chunks, not read from usage.",
    )
    chunks: ChunkStats = Field(default_factory=ChunkStats)
    cold: ColdRequest | None = None
    errors: dict[str, int] = Field(
        default_factory=dict, description="Failed requests per error class."
    )
    client_health: ClientHealth = Field(default_factory=ClientHealth)
    quality: QualitySummary | None = Field(
        None, description="Graded accuracy (dataset rows with a grader); None when none was graded."
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted input."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def distribution(values: Iterable[float | None]) -> Distribution:
    xs = sorted(float(v) for v in values if v is not None and not math.isnan(v))
    if not xs:
        return Distribution()
    n = len(xs)
    mean = math.fsum(xs) / n
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / n)
    return Distribution(
        count=n,
        mean=mean,
        std=std,
        min=xs[0],
        p50=percentile(xs, 50),
        p90=percentile(xs, 90),
        p95=percentile(xs, 95),
        p99=percentile(xs, 99),
        max=xs[-1],
    )


def request_slo_values(record: RequestRecord) -> dict[str, float | None]:
    """The per-request value each SLO key is checked against."""
    itls = sorted(record.itl_ms())
    return {
        "ttft_ms": record.ttft_ms,
        "itl_ms": percentile(itls, 95) if itls else None,
        "tpot_ms": record.tpot_ms,
        "e2e_ms": record.e2e_ms,
    }


def meets(record: RequestRecord, slo: dict[str, float], key: str | None = None) -> bool:
    """Whether a request met the SLO (every key, or only `key`). Missing values pass
    only for ITL/TPOT on one-token replies, which have no gaps to judge."""
    if not record.ok:
        return False
    values = request_slo_values(record)
    keys = [key] if key else list(slo)
    for k in keys:
        v = values.get(k)
        if v is None:
            if k in ("itl_ms", "tpot_ms") and record.first_token_s is not None:
                continue
            return False
        if v > slo[k]:
            return False
    return True


def meets_goal(record: RequestRecord, slo: dict[str, float]) -> bool:
    """Goodput's test: every latency target met and, for a graded request, its grader
    passed (an ungraded request is judged on latency only)."""
    return meets(record, slo) and passes_grader(record)


def client_health(
    records: Sequence[RequestRecord],
    loop_lag_ms: Sequence[float] | None = None,
    workers: int = 1,
) -> ClientHealth:
    """Judge whether the client kept up. Loop lag P99 or schedule-delay P99 beyond the
    limits marks the client saturated: its timestamps then include its own queueing."""
    lag = distribution(loop_lag_ms or [])
    delay = distribution(r.schedule_delay_ms for r in records if not r.warmup)
    notes: list[str] = []
    if lag.p99 is not None and lag.p99 > LOOP_LAG_P99_LIMIT_MS:
        notes.append(
            f"client event loop lagged {lag.p99:.1f} ms at P99 (limit {LOOP_LAG_P99_LIMIT_MS:g} ms): "
            "measured latencies include client delay; lower the load or raise --workers"
        )
    if delay.p99 is not None and delay.p99 > SCHEDULE_DELAY_P99_LIMIT_MS:
        notes.append(
            f"requests left {delay.p99:.1f} ms after their scheduled time at P99 "
            f"(limit {SCHEDULE_DELAY_P99_LIMIT_MS:g} ms): the client could not keep the arrival schedule"
        )
    return ClientHealth(
        saturated=bool(notes),
        loop_lag_ms=lag,
        schedule_delay_ms=delay,
        workers=workers,
        notes=notes,
    )


@dataclass(frozen=True)
class RecordSplit:
    """A run's records as every figure takes them (the rules in the module docstring):
    `measured` leaves warm-up out, `warm` also the cold first request (unless it is the
    only one), `ok` and `ok_warm` keep the successful ones."""

    ordered: list[RequestRecord]
    cold: RequestRecord | None
    measured: list[RequestRecord]
    warm: list[RequestRecord]
    ok: list[RequestRecord]
    ok_warm: list[RequestRecord]


def split_records(records: Iterable[RequestRecord]) -> RecordSplit:
    ordered = sorted(records, key=lambda r: (r.start_s, r.index))
    cold = ordered[0] if ordered else None
    measured = [r for r in ordered if not r.warmup]
    warm = [r for r in measured if r is not cold] or measured
    return RecordSplit(
        ordered=ordered,
        cold=cold,
        measured=measured,
        warm=warm,
        ok=[r for r in measured if r.ok],
        ok_warm=[r for r in warm if r.ok],
    )


def measured_window(measured: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """(first start, last end) of the measured requests; None when it has no length."""
    starts = [r.start_s for r in measured]
    ends = [r.end_s for r in measured if r.end_s is not None]
    if starts and ends and max(ends) > min(starts):
        return min(starts), max(ends)
    return None


def summarize(
    records: list[RequestRecord],
    *,
    slo: dict[str, float] | None = None,
    window_s: float | None = None,
    loop_lag_ms: Sequence[float] | None = None,
    workers: int = 1,
) -> ProbeSummary:
    """Summarise a run's records. `window_s` overrides the measured window (e.g. a
    duration-bounded run); `loop_lag_ms` are the client's event-loop lag samples."""
    if slo:
        unknown = sorted(set(slo) - set(SLO_KEYS))
        if unknown:
            from inferwise.calculators.errors import InputError

            raise InputError("slo", f"unknown SLO key(s) {', '.join(unknown)}", ", ".join(SLO_KEYS))
    split = split_records(records)
    ordered, cold_rec, measured = split.ordered, split.cold, split.measured
    ok, ok_warm = split.ok, split.ok_warm
    failed = [r for r in measured if not r.ok]

    if window_s is None:
        window = measured_window(measured)
        window_s = window[1] - window[0] if window else None

    def rate(x: float) -> float | None:
        return x / window_s if window_s else None

    itls: list[float] = []
    gaps: list[float] = []
    chunk_tokens: list[int] = []
    for r in ok_warm:
        itls.extend(r.itl_ms())
        gaps.extend(r.chunk_gaps_ms())
    for r in ok:
        chunk_tokens.extend(r.chunk_tokens)
    in_tokens = sum(r.input_tokens or 0 for r in ok)
    out_tokens = sum(r.output_tokens or 0 for r in ok)

    goodput = attainment = None
    by_metric: dict[str, float] = {}
    if slo and measured:
        met = sum(1 for r in measured if meets_goal(r, slo))
        goodput = rate(met)
        attainment = 100.0 * met / len(measured)
        by_metric = {
            k: 100.0 * sum(1 for r in measured if meets(r, slo, k)) / len(measured) for k in slo
        }

    cold = None
    if cold_rec is not None:
        cold = ColdRequest(
            ok=cold_rec.ok,
            warmup=cold_rec.warmup,
            ttft_ms=cold_rec.ttft_ms,
            e2e_ms=cold_rec.e2e_ms,
            error_class=cold_rec.error_class,
        )

    return ProbeSummary(
        completed=len(ok),
        failed=len(failed),
        warmup_excluded=len(ordered) - len(measured),
        window_s=window_s,
        ttft_ms=distribution(r.ttft_ms for r in ok_warm),
        itl_ms=distribution(itls),
        tpot_ms=distribution(r.tpot_ms for r in ok_warm),
        e2e_ms=distribution(r.e2e_ms for r in ok_warm),
        request_throughput=rate(len(ok)),
        input_token_throughput=rate(in_tokens),
        output_token_throughput=rate(out_tokens),
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        slo=dict(slo) if slo else None,
        goodput=goodput,
        slo_attainment_pct=attainment,
        slo_attainment_by_metric_pct=by_metric,
        tokens_approximate=any(r.tokens_approximate for r in ok),
        chunks=ChunkStats(
            chunks=len(chunk_tokens),
            tokens_per_chunk_mean=(sum(chunk_tokens) / len(chunk_tokens)) if chunk_tokens else None,
            tokens_per_chunk_max=max(chunk_tokens) if chunk_tokens else None,
            chunk_gap_ms=distribution(gaps),
        ),
        cold=cold,
        errors=dict(Counter(r.error_class or "other" for r in failed)),
        client_health=client_health(ordered, loop_lag_ms, workers),
        quality=quality_summary(measured),
    )
