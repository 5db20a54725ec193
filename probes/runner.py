"""`inferwise probe`: a bounded, measured load against an OpenAI-compatible endpoint.

The flow of one run: check the inputs and their safety bounds, pass the
target through the policy (:mod:`.policy`), calibrate synthetic prompt
lengths against the server's own token counts, send warm-up requests, then
the measured load (:mod:`.loadgen`), committing each finished request to the
run store at once. Ctrl-C or SIGTERM cancels what is in flight and closes the
run as `interrupted`; every finished request stays. A sweep repeats the run
for each concurrency or rate, one stored run per point.

This module defines the probe's input and output models and the top-level
flow, so at import time it loads only the stdlib, pydantic and other light
project modules; the work of one run lives in :mod:`.session`, the client in
:mod:`.client`, the load shapes in :mod:`.loadgen`, worker processes in
:mod:`.workers`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import platform
import re
import time
from collections.abc import Awaitable, Callable
from secrets import token_hex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferwise.calculators.bounds import MAX_BURSTINESS, MAX_SEED, MIN_BURSTINESS, check_rate
from inferwise.calculators.errors import InputError, OperationalError
from inferwise.probes.cluster_models import ClusterInfo, parse_cluster
from inferwise.probes.loadgen import load_words, trace_words
from inferwise.probes.records import ErrorClassCount, RequestRecord, error_counts
from inferwise.probes.summary import ClientHealth, ProbeSummary, check_slo

Progress = Callable[[float, float | None, str], Awaitable[None]]

DEFAULT_REQUESTS = 100
MAX_PROMPT_TOKENS = 1 << 20
"""Longest synthetic prompt: a 1M-token context window (the client holds ~20 bytes a token)."""
MAX_OUTPUT_TOKENS = 1 << 18
MAX_PROMPT_TOKENS_IN_FLIGHT = 1 << 24
"""16.7M tokens, about 340 MB of client memory: e.g. 512 streams of 32k-token prompts."""


class ProbeRequest(BaseModel):
    """What to probe and how hard. Times in seconds unless the name says ms."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        description="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000 or https://host/v1.",
        max_length=2048,
        json_schema_extra={"cli_positional": True},
    )
    model: str | None = Field(
        None,
        max_length=512,
        description="Model name to request; default: the first id the server lists at /v1/models.",
    )
    endpoint: Literal["chat", "completions"] = Field(
        "chat", description="API: /v1/chat/completions or /v1/completions."
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        description="Closed loop: requests kept in flight at once (default 1 when no request_rate).",
    )
    request_rate: float | None = Field(
        None,
        description="Open loop: mean arrivals per second on a Poisson schedule; inf = all at once.",
    )
    burstiness: float = Field(
        1.0,
        ge=MIN_BURSTINESS,
        le=MAX_BURSTINESS,
        description="Gamma shape of inter-arrival times: 1 = Poisson, <1 burstier, >1 smoother.",
    )
    requests: int | None = Field(
        None,
        ge=1,
        description=f"Measured requests per run (default {DEFAULT_REQUESTS} unless duration_s is given).",
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        description="Stop sending after this many seconds of measurement.",
        json_schema_extra={"cli_aliases": ["--duration"]},
    )
    warmup_requests: int = Field(
        0, ge=0, description="Requests sent first and left out of the metrics."
    )
    input_tokens: int = Field(
        256,
        ge=1,
        le=MAX_PROMPT_TOKENS,
        description="Mean prompt length in tokens (synthetic prompts).",
    )
    output_tokens: int = Field(
        128,
        ge=1,
        le=MAX_OUTPUT_TOKENS,
        description="Mean output length in tokens (max_tokens per request).",
    )
    input_distribution: Literal["fixed", "uniform", "normal", "lognormal"] = Field(
        "fixed", description="Distribution of prompt lengths around input_tokens."
    )
    output_distribution: Literal["fixed", "uniform", "normal", "lognormal"] = Field(
        "fixed", description="Distribution of output lengths around output_tokens."
    )
    input_spread: float = Field(
        0.25,
        ge=0,
        le=5,
        description="Spread of prompt lengths: coefficient of variation (uniform: +-spread*mean).",
    )
    output_spread: float = Field(
        0.25, ge=0, le=5, description="Spread of output lengths, as input_spread."
    )
    shared_prefix_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of every prompt that is identical across requests (measures prefix caching).",
    )
    ignore_eos: bool = Field(
        True,
        description="Ask the server to generate exactly max_tokens (ignore_eos/min_tokens; vLLM, SGLang, llama.cpp). Turn off for APIs that reject unknown fields.",
    )
    dataset: str | None = Field(
        None,
        description="JSONL file of prompts (prompt, messages or question) and/or lengths (input_tokens, output_tokens) per line; "
        "rows may carry expected + grader (exact, contains, regex, numeric, json_schema, choice).",
    )
    trace: str | None = Field(
        None,
        description="Replay this request trace file (its arrivals, lengths, shared prefixes). "
        "Formats: Mooncake JSONL, BurstGPT CSV, Azure LLM inference CSV, JSONL with timestamp "
        "(s) and input_tokens/output_tokens.",
    )
    trace_format: Literal["mooncake", "burstgpt", "azure", "jsonl"] | None = Field(
        None, description="Format of the trace file; default: guessed from its first line."
    )
    trace_time_scale: float = Field(
        1.0,
        ge=0.001,
        le=1000,
        description="Replay speed: inter-arrival times are divided by it (2 = twice the rate).",
    )
    trace_start: float | None = Field(
        None, ge=0, description="Window start, seconds after the trace's first request."
    )
    trace_duration: float | None = Field(
        None, gt=0, description="Window length in seconds of trace time."
    )
    slo: dict[str, float] | None = Field(
        None,
        description="Per-request SLO targets in ms for goodput, e.g. ttft_ms=500 itl_ms=50 e2e_ms=10000 (keys: ttft_ms, itl_ms, tpot_ms, e2e_ms).",
    )
    sweep: list[float] | None = Field(
        None,
        max_length=64,
        description="Run once per value: concurrencies (closed loop) or request rates (with request_rate).",
    )
    label: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Free-form labels stored with the run, e.g. engine=vllm gpu=h100.",
    )
    db: str | None = Field(
        None, description="Run database file (default: $INFERWISE_DB or the user's data dir)."
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="Name of the environment variable holding the API key (the key itself is never taken as an argument).",
    )
    stream: bool = Field(
        True, description="Stream responses (without streaming TTFT equals end-to-end latency)."
    )
    store_text: bool = Field(
        False, description="Store prompts and outputs with the run (off by default)."
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=600, description="Connection timeout.")
    read_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="Longest wait for the first response byte."
    )
    stall_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Longest silence inside a started stream before it counts as stalled.",
    )
    total_timeout_s: float = Field(
        600.0, gt=0, le=7200, description="Longest time for one request."
    )
    honor_retry_after: bool = Field(
        False, description="On HTTP 429 wait for Retry-After (up to 60 s, 3 times) and retry."
    )
    allow_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts or CIDRs allowed besides loopback (CLI only; MCP uses the operator's allowlist).",
    )
    max_requests: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Safety cap on requests per call, warm-up and every sweep point included; raise it explicitly to send more.",
    )
    max_duration_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Safety cap on the wall-clock time of the whole call (set-up, every sweep point, requests in flight are cancelled at it).",
    )
    max_concurrency: int = Field(
        512, ge=1, le=100_000, description="Safety cap on streams in flight."
    )
    max_prompt_tokens_in_flight: int = Field(
        MAX_PROMPT_TOKENS_IN_FLIGHT,
        ge=1,
        le=1 << 30,
        description="Safety cap on prompt tokens held by requests in flight at once (client memory: ~20 bytes a token).",
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seed for prompt and output lengths and arrival times (same seed, same load). "
        "Prompt text is fresh per run, so a rerun does not find its prompts in the prefix cache.",
    )
    calibrate: bool = Field(
        True,
        description="Fit synthetic prompt lengths to the server's prompt_tokens before the run.",
    )
    metrics_interval_s: float = Field(
        1.0, ge=0, le=3600, description="Scrape the server's /metrics this often (0 = never)."
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Client processes sharing the measured load (each its own event loop); raise it when the summary says the client was saturated.",
    )
    preconnect: bool = Field(
        True,
        description="Open the connections before the clock starts, so TCP/TLS set-up is not counted in TTFT (clients keep connections alive).",
    )
    cluster: str | None = Field(
        None,
        max_length=300,
        description="Spread the load over Dask workers: scheduler tcp://HOST:PORT or tls://HOST:PORT, or local:N. "
        "With local:N, N workers start on this machine; a scheduler passes the same policy as the URL. Needs inferwise[distributed].",
    )
    cluster_tls_ca: str | None = Field(
        None, description="CA file for a tls:// scheduler (default: $INFERWISE_DASK_TLS_CA)."
    )
    cluster_tls_cert: str | None = Field(
        None, description="Client certificate for a tls:// scheduler ($INFERWISE_DASK_TLS_CERT)."
    )
    cluster_tls_key: str | None = Field(
        None, description="Client key for a tls:// scheduler ($INFERWISE_DASK_TLS_KEY)."
    )

    @field_validator("slo")
    @classmethod
    def _slo_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return check_slo(v)

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, v: float | None) -> float | None:
        return check_rate(v, allow_inf=True)

    @field_validator("model")
    @classmethod
    def _model_named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():  # leave it out to take the server's first model
            raise ValueError(
                "must not be empty or blank; leave it out for the server's first model"
            )
        return v

    @field_validator("label")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            if not k or len(k) > 100 or len(x) > 500:
                raise ValueError("label keys must be 1-100 characters and values at most 500")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be the NAME of an environment variable, not a key")
        return v

    @model_validator(mode="after")
    def _shape(self) -> ProbeRequest:
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give concurrency or request_rate, not both")
        check_trace_request(self)
        return self


def check_trace_request(req: ProbeRequest) -> None:
    """A trace is the whole load: it takes no rate, concurrency, sweep or dataset, and the
    window flags mean nothing without it."""
    if req.trace is None:
        given = [f for f in ("trace_format", "trace_start", "trace_duration") if getattr(req, f)]
        if given or req.trace_time_scale != 1.0:
            raise ValueError(f"{(given or ['trace_time_scale'])[0]} needs a trace")
        return
    clash = [f for f in ("concurrency", "request_rate", "sweep", "dataset") if getattr(req, f)]
    if clash:
        raise ValueError(
            f"a trace sets the load and the lengths: give trace or {clash[0]}, not both "
            "(replay faster or slower with trace_time_scale)"
        )


class Calibration(BaseModel):
    """How synthetic prompt lengths were matched to the server's tokenizer."""

    model_config = ConfigDict(extra="forbid")

    calibrated: bool = False
    overhead_tokens: float = 0.0
    tokens_per_word: float = 1.0
    mean_input_tokens_error_pct: float | None = Field(
        None,
        description="Mean of (server prompt_tokens - target) / target over measured requests, in percent.",
    )
    note: str | None = None


class SweepPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = None
    request_rate: float | None = None
    run_id: str
    status: str
    summary: ProbeSummary


class ProbeResult(BaseModel):
    """A probe run (the last point of a sweep at top level; every point under `sweep`)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    status: Literal["complete", "interrupted", "failed"]
    url: str
    model: str
    endpoint: str
    load: str = Field(description="The load shape in words, e.g. 'closed loop, concurrency 8'.")
    concurrency: int | None = None
    request_rate: float | None = None
    stream: bool = True
    summary: ProbeSummary
    errors: list[ErrorClassCount] = Field(default_factory=list)
    sweep: list[SweepPoint] = Field(default_factory=list)
    client_health: ClientHealth = Field(default_factory=ClientHealth)
    calibration: Calibration = Field(default_factory=Calibration)
    server_metrics: dict[str, float] = Field(
        default_factory=dict, description="Last scraped engine metrics (normalised names)."
    )
    notes: list[str] = Field(default_factory=list)
    trace: dict[str, Any] | None = Field(
        None, description="The replayed trace: name, sha256, format, window, time scale."
    )
    cluster: ClusterInfo | None = Field(
        None, description="The Dask scheduler and workers that carried the load (--cluster)."
    )
    db_path: str
    all_failed: bool = Field(False, description="Every request failed: the CLI exits 1.")


# ---------------------------------------------------------------------------


def _check_bounds(req: ProbeRequest) -> tuple[int | None, float | None]:
    """The per-point request count and duration, after checking the whole call against
    the caps: every sweep point repeats its warm-up and its measured requests."""
    points = len(req.sweep) if req.sweep else 1
    requests = req.requests
    if requests is None and req.duration_s is None:
        requests = max(1, min(DEFAULT_REQUESTS, req.max_requests // points - req.warmup_requests))
    per_point = (requests or 0) + req.warmup_requests
    if per_point * points > req.max_requests:
        sweep = f" x {points} sweep points" if points > 1 else ""
        raise InputError(
            "requests",
            f"{requests or 0} (+{req.warmup_requests} warm-up){sweep} = {per_point * points} "
            f"requests exceeds the cap of {req.max_requests} per call",
            "fewer requests or sweep points, or raise the cap with --max-requests",
        )
    if req.duration_s is not None and req.duration_s * points > req.max_duration_s:
        sweep = f" x {points} sweep points" if points > 1 else ""
        raise InputError(
            "duration_s",
            f"{req.duration_s:g} s{sweep} exceeds the cap of {req.max_duration_s:g} s per call",
            "raise it with --max-duration-s",
        )
    _check_sweep(req)  # first: the checks below read the load points
    for c, _ in _load_points(req):
        if c is not None and c > req.max_concurrency:
            raise InputError(
                "sweep" if req.sweep else "concurrency",
                f"{c:.6g} exceeds the cap of {req.max_concurrency} streams",
                "raise it with --max-concurrency",
            )
    _check_prompt_memory(req)
    _check_cluster(req)
    return requests, req.duration_s


def _check_sweep(req: ProbeRequest) -> None:
    """Every sweep value is a load: a positive rate (inf: all at once), or a whole number
    of streams (NaN, inf or 1e300 streams would reach int() or the caps' messages)."""
    for v in req.sweep or []:
        if not (v > 0):
            raise InputError("sweep", f"values must be positive, got {v:g}")
        if req.request_rate is not None:
            try:
                check_rate(v, allow_inf=True)
            except ValueError as exc:
                raise InputError("sweep", f"a rate {exc}") from None
        elif not math.isfinite(v) or v != int(v):
            raise InputError(
                "sweep", f"concurrency must be a whole number, got {v:g}", "1, 2, 4, ..."
            )


def _check_cluster(req: ProbeRequest) -> None:
    """--cluster's address and TLS files are checked before anything is contacted."""
    tls = (req.cluster_tls_ca, req.cluster_tls_cert, req.cluster_tls_key)
    if req.cluster is None:
        if any(tls):
            raise InputError("cluster_tls_ca", "TLS files need --cluster tls://SCHEDULER:PORT")
        return
    from inferwise.probes.cluster import import_distributed

    import_distributed()  # without the extra: exit 2 saying what to install
    if req.workers > 1:
        raise InputError(
            "workers",
            "--workers applies to a run from this machine; with --cluster each Dask worker runs a client",
            "leave --workers at 1 and add Dask workers",
        )
    parse_cluster(req.cluster, *tls)


def _check_prompt_memory(req: ProbeRequest) -> None:
    """Prompts in flight cost client memory: bound the tokens that many streams of the
    mean prompt hold (one draw is capped at ten spreads above the mean)."""
    if req.dataset:
        return  # dataset prompts are held whole already, bounded by the file size cap
    streams = max(c or 1 for c, _ in _load_points(req))
    if streams * req.input_tokens > req.max_prompt_tokens_in_flight:
        raise InputError(
            "input_tokens",
            f"{streams} streams of {req.input_tokens:,}-token prompts would hold "
            f"{streams * req.input_tokens:,} prompt tokens in flight; the cap is "
            f"{req.max_prompt_tokens_in_flight:,}",
            "shorter prompts, fewer streams (--concurrency, --max-concurrency), "
            "or raise --max-prompt-tokens-in-flight",
        )


def _in_flight_for_memory(req: ProbeRequest) -> tuple[ProbeRequest, str | None]:
    """An open loop may hold up to max_concurrency streams; with long prompts fewer fit
    the prompt-memory cap, so the run's stream cap is lowered (sends then queue, and the
    lateness shows as schedule delay) and a note says so."""
    if req.request_rate is None or req.dataset:
        return req, None
    fits = max(1, req.max_prompt_tokens_in_flight // req.input_tokens)
    if fits >= req.max_concurrency:
        return req, None
    note = (
        f"streams in flight capped at {fits} (not {req.max_concurrency}): {req.input_tokens:,}-token "
        f"prompts, at most {req.max_prompt_tokens_in_flight:,} prompt tokens in flight"
    )
    return req.model_copy(update={"max_concurrency": fits}), note


def _load_points(req: ProbeRequest) -> list[tuple[int | None, float | None]]:
    """(concurrency, request rate) of each run: the one asked for, or one per sweep value.
    Exactly one of the pair is set: concurrency for a closed loop, the rate for an open one."""
    if req.request_rate is not None:
        return [(None, float(v)) for v in (req.sweep or [req.request_rate])]
    return [(int(v), None) for v in (req.sweep or [req.concurrency or 1])]


def display_url(url: str) -> str:
    """The URL without user:password, for output and storage."""
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(url)
    netloc = p.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if p.port:
        netloc += f":{p.port}"
    return urlunsplit((p.scheme, netloc, p.path, "", ""))


async def run_probe(
    req: ProbeRequest, progress: Progress | None = None, policy: Any = None
) -> ProbeResult:
    """Run the probe (or each point of a sweep) and return the measured summary.

    `policy` (a TargetPolicy) replaces the one built from the environment and
    `allow_hosts`: the MCP server passes its strict, operator-configured policy."""
    from inferwise.probes.session import handle_signals

    trace = None
    if req.trace is not None:
        from inferwise.probes.trace_replay import load_probe_trace, with_trace

        trace = load_probe_trace(req)
        req = with_trace(req, trace)
    requests, duration_s = _check_bounds(req)
    req, memory_note = _in_flight_for_memory(req)
    call_deadline = time.monotonic() + req.max_duration_s
    if policy is None:
        from inferwise.probes.policy import TargetPolicy

        policy = TargetPolicy.from_environment(req.allow_hosts)
    ctx, dataset = await _context(req, policy, trace)
    notes: list[str] = [memory_note] if memory_note else []
    stop = asyncio.Event()
    try:
        if req.cluster:
            ctx.cluster = await _open_cluster(req, policy)
        with handle_signals(stop):
            calibration, server = await _set_up(ctx, dataset, notes, call_deadline)
            meta = _run_meta(calibration, ctx.pool.target.host)
            if server:
                meta["server"] = server
            sweep = _Sweep(notes=notes)
            await sweep.run(ctx, requests, duration_s, meta, progress, stop, call_deadline)
    finally:
        ctx.pool.close()
        ctx.store.close()
        if ctx.cluster is not None:
            await ctx.cluster.close()
    if not sweep.points:
        raise OperationalError("interrupted before the first request was sent; nothing stored")
    if ctx.workload_errors:
        errs = ctx.workload_errors
        calibration.mean_input_tokens_error_pct = round(100 * sum(errs) / len(errs), 2)
    return _result(ctx, sweep, calibration)


async def _open_cluster(req: ProbeRequest, policy: Any) -> Any:
    from inferwise.probes.cluster import ClusterConnection

    target = parse_cluster(
        req.cluster or "", req.cluster_tls_ca, req.cluster_tls_cert, req.cluster_tls_key
    )
    return await ClusterConnection.open(target, policy)


async def _context(
    req: ProbeRequest, policy: Any, trace: Any = None
) -> tuple[Any, list[Any] | None]:
    """What every request of the call shares: the approved target and its connection pool,
    the key, the workload, the store. The target passes the policy here (one checked lookup)."""
    from inferwise.probes.client import Pool, Target, Timeouts
    from inferwise.probes.policy import TargetPolicy
    from inferwise.probes.prompts import Workload, load_dataset
    from inferwise.probes.session import ProbeContext
    from inferwise.probes.store import RunStore

    if policy is None:
        policy = TargetPolicy.from_environment(req.allow_hosts)
    addrs = await asyncio.to_thread(policy.check, req.url)
    api_key = os.environ.get(req.api_key_env) or None
    target = Target.from_url(req.url, connect_host=addrs[0])
    dataset = load_dataset(req.dataset) if req.dataset else None
    timeouts = Timeouts(
        req.connect_timeout_s, req.read_timeout_s, req.stall_timeout_s, req.total_timeout_s
    )
    ctx = ProbeContext(
        req,
        Pool(target),
        api_key,
        [api_key] if api_key else [],
        timeouts,
        Workload.of_probe(req, dataset, trace),
        req.model or "",
        RunStore(req.db),
        trace=trace,
    )
    return ctx, dataset


@dataclasses.dataclass
class _Sweep:
    """The load points of one call, run in order, and what they left."""

    notes: list[str]
    points: list[SweepPoint] = dataclasses.field(default_factory=list)
    records: list[RequestRecord] = dataclasses.field(default_factory=list)
    server_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    cluster: ClusterInfo | None = None

    async def run(
        self,
        ctx: Any,
        requests: int | None,
        duration_s: float | None,
        meta: dict[str, Any],
        progress: Progress | None,
        stop: asyncio.Event,
        deadline: float,
    ) -> None:
        from inferwise.probes.session import LoadPoint, run_point

        req = ctx.req
        loads = _load_points(req)
        labels = {"model": ctx.model, "endpoint": req.endpoint, **req.label}
        sweep_id = token_hex(3)  # a label that groups the runs of one sweep
        for conc, rate in loads:
            if stop.is_set() or time.monotonic() >= deadline:
                break
            prefix = ""
            if req.sweep:
                where = f"c={conc}] " if rate is None else f"{rate:g} req/s] "
                prefix = f"[{len(self.points) + 1}/{len(loads)} " + where
            result = await run_point(
                ctx,
                LoadPoint(conc, rate, requests, duration_s),
                labels=_point_labels(labels, req, conc, rate, sweep_id),
                meta=meta,
                progress=progress,
                stop=stop,
                hard_deadline=deadline,
                progress_prefix=prefix,
            )
            self.records += result.records
            self.server_metrics = result.server_metrics or self.server_metrics
            self.cluster = result.cluster or self.cluster
            self.notes += result.notes
            self.points.append(
                SweepPoint(
                    concurrency=conc,
                    request_rate=rate,
                    run_id=result.run_id,
                    status=result.status,
                    summary=result.summary,
                )
            )


def _result(ctx: Any, sweep: _Sweep, calibration: Calibration) -> ProbeResult:
    """The call's answer: the last point at top level, every point under `sweep`."""
    req, notes, records = ctx.req, sweep.notes, sweep.records
    last = sweep.points[-1]
    short = _short_outputs(records, ctx.workload)
    if short:
        notes.append(short)
    for note in _client_health_notes(sweep.points):
        if note not in notes:
            notes.append(note)
    completed = sum(1 for r in records if r.ok and not r.warmup)
    measured = sum(1 for r in records if not r.warmup)
    status: Literal["complete", "interrupted", "failed"] = "complete"
    if any(s.status == "interrupted" for s in sweep.points):
        status = "interrupted"
    elif completed == 0:
        status = "failed"
    return ProbeResult(
        run_id=last.run_id,
        status=status,
        url=display_url(req.url),
        model=ctx.model,
        endpoint=req.endpoint,
        load=trace_words(ctx.trace.describe())
        if ctx.trace
        else load_words(last.concurrency, last.request_rate, req.burstiness),
        concurrency=last.concurrency,
        request_rate=last.request_rate,
        stream=req.stream,
        summary=last.summary,
        errors=error_counts(records),
        sweep=sweep.points if req.sweep else [],
        client_health=last.summary.client_health,
        calibration=calibration,
        server_metrics=sweep.server_metrics,
        notes=notes,
        trace=ctx.trace.describe() if ctx.trace else None,
        cluster=sweep.cluster,
        db_path=str(ctx.store.path),
        all_failed=measured > 0 and completed == 0,
    )


async def _set_up(
    ctx: Any, dataset: list[Any] | None, notes: list[str], deadline: float
) -> tuple[Calibration, dict[str, Any]]:
    """Discovery, negotiation, calibration and the server's own facts, within the call's
    time cap: a server that drips its replies must not hold the call past it."""
    from inferwise.probes.session import server_properties

    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            calibration = await _prepare(ctx, dataset, notes)
            return calibration, await server_properties(ctx)
    except TimeoutError:
        raise OperationalError(
            f"the server did not answer the set-up requests within the call's cap "
            f"(max_duration_s {ctx.req.max_duration_s:g} s); nothing was measured"
        ) from None


async def _prepare(ctx: Any, dataset: list[Any] | None, notes: list[str]) -> Calibration:
    """Before the first measured request: name the model, learn which extra request fields
    the server accepts, fit synthetic prompt lengths to its tokenizer. Adds what the user
    should know to `notes`."""
    from inferwise.probes.session import calibrate, discover_model, negotiate

    req = ctx.req
    if not ctx.model:
        found, why = await discover_model(ctx)
        ctx.model = found or "default"
        if why:
            notes.append(why)
    if ctx.trace is not None:  # before any request the load sends
        from inferwise.probes.trace_replay import check_server_context

        note = await check_server_context(ctx, ctx.trace)
        if note:
            notes.append(note)
    notes += await negotiate(ctx)
    calibration = Calibration(note="prompts from the dataset; no calibration needed")
    if dataset is None or any(r.prompt is None for r in dataset):
        calibration = (
            await calibrate(ctx) if req.calibrate else Calibration(note="calibration turned off")
        )
    if not req.stream:
        notes.append("streaming off: TTFT equals end-to-end latency and ITL is not measured")
    return calibration


def _run_meta(calibration: Calibration, target_host: str) -> dict[str, Any]:
    """What a stored run says about the client that measured it."""
    return {
        "client": "inferwise-probe",
        "tool_version": _version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "calibration": calibration.model_dump(),
        "target_host": target_host,
    }


def _point_labels(
    labels: dict[str, str], req: ProbeRequest, conc: int | None, rate: float | None, sweep_id: str
) -> dict[str, str]:
    """A run's labels; a sweep's runs also name the swept variable, its value and the sweep."""
    if not req.sweep:
        return dict(labels)
    return {
        **labels,
        "sweep": "concurrency" if rate is None else "request_rate",
        "sweep_value": f"{conc if rate is None else rate:g}",
        "sweep_id": sweep_id,
    }


def _client_health_notes(sweep: list[SweepPoint]) -> list[str]:
    """Each run's client-health notes, prefixed with the point they belong to in a sweep."""
    out: list[str] = []
    for s in sweep:
        where = ""
        if len(sweep) > 1:
            where = (
                f"at {s.request_rate:g} req/s: "
                if s.request_rate is not None
                else f"at concurrency {s.concurrency}: "
            )
        out += [where + n for n in s.summary.client_health.notes]
    return out


def _short_outputs(records: list[RequestRecord], workload: Any) -> str | None:
    """Say so when the server stopped generating before max_tokens (it ignored
    ignore_eos, or rejected it): decode time per request is then shorter than asked."""
    asked = got = 0
    for r in records:
        if r.ok and not r.warmup and r.output_tokens is not None and r.grader is None:
            want = workload.item(r.index).max_tokens
            if want:
                asked += want
                got += r.output_tokens
    if asked and got < 0.9 * asked:
        return (
            f"outputs were {100 * got / asked:.0f} % of the max_tokens asked: the server stopped "
            "early (end of sequence), so each request decoded fewer tokens than the load intended"
        )
    return None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("inferwise")
    except Exception:
        return "unknown"
