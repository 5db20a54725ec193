"""The workload file: what a product needs from inference, and what was seen so far.

Diagnosis and planning read one of these (JSON or TOML; DESIGN.md, "Workload
file"). Every field is optional because a plan must work from whatever the
team knows today, and what is missing is *named* later as a missing
measurement, never filled in silently. The schema is strict on the other
side: an unknown key at any level is rejected, because a typo such as
``arival_rate_rps`` would otherwise be ignored and the advice would quietly
rest on less than the user wrote.

Units are in the names (``_ms``, ``_rps``, ``_s``, ``_tokens``); fractions are
0-1 (``gpu_util`` 0.45, not 45).

Stdlib + pydantic only: the registry's input models import this module.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from inferwise.calculators.bounds import MAX_PEAK_TO_MEAN
from inferwise.calculators.deployment import HfOverrides
from inferwise.calculators.errors import InputError
from inferwise.calculators.files import (
    MiB,
    check_depth,
    expand_path,
    loads_json,
    path_exists,
    read_text,
)
from inferwise.knowledge.vocabulary import HYPOTHESES, SERVING_ENGINES, SYMPTOMS

ENGINES = (*SERVING_ENGINES, "other")
ROUTERS = ("round_robin", "least_loaded", "prefix_aware", "session_sticky", "single_replica")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Percentiles(_Strict):
    """A distribution summarised by percentiles (and optionally mean/max), in the unit of the
    field that holds it (ms for latencies, tokens for lengths)."""

    p50: float | None = Field(default=None, ge=0)
    p90: float | None = Field(default=None, ge=0)
    p95: float | None = Field(default=None, ge=0)
    p99: float | None = Field(default=None, ge=0)
    mean: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, ge=0)

    def tail(self) -> tuple[str, float] | None:
        """The tail percentile to judge against a target: p95, else p99, p90, then p50."""
        for key in ("p95", "p99", "p90", "p50"):
            value = getattr(self, key)
            if value is not None:
                return key, value
        return None

    def typical(self) -> float | None:
        """The value to size with: p50, else mean, else the tail."""
        if self.p50 is not None:
            return self.p50
        if self.mean is not None:
            return self.mean
        t = self.tail()
        return t[1] if t else None


class Measured(Percentiles):
    """A measured distribution (lengths, observed latencies): its percentiles cannot decrease.
    Targets keep plain Percentiles: a p50 target above the p95 one is redundant, not wrong."""

    @model_validator(mode="after")
    def _ordered(self) -> Measured:
        seq = [
            (k, v)
            for k in ("p50", "p90", "p95", "p99", "max")
            if (v := getattr(self, k)) is not None
        ]
        for (a, x), (b, y) in zip(seq, seq[1:], strict=False):
            if y < x:
                raise ValueError(
                    f"{b} {y:g} is below {a} {x:g}; a distribution's percentiles cannot decrease"
                )
        return self


class CandidateModel(_Strict):
    """A model the product may use and its score on the product's own evaluation."""

    model: str = Field(min_length=1, max_length=4096, description="Hugging Face id or path.")
    quality: float | None = Field(
        default=None, description="The product evaluation's score (same scale as the floor)."
    )


class Product(_Strict):
    quality_floor: str | None = Field(
        default=None, description="The quality the product must keep (eval name and minimum score)."
    )
    quality_floor_score: float | None = Field(
        default=None,
        description="The evaluation's minimum score; candidate models below it are rejected.",
    )
    candidate_models: list[CandidateModel] | None = Field(
        default=None,
        max_length=8,
        description="Models to choose from, with their measured quality.",
    )
    streaming: bool | None = Field(default=None, description="Tokens are streamed to the user.")
    modality: Literal["text", "embeddings", "vision", "audio", "image", "video"] | None = None
    max_input_tokens: int | None = Field(default=None, ge=1)
    response_format: str | None = Field(
        default=None, description="e.g. text, json, tool_calls, code."
    )


class TraceRef(_Strict):
    """The request trace a workload was fitted to, or that its baseline replays."""

    path: str = Field(min_length=1, max_length=4096, description="Path of the trace file.")
    format: Literal["mooncake", "burstgpt", "azure", "jsonl"] | None = Field(
        default=None, description="Trace format; default: guessed from the file."
    )
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="The file's hash when fitted."
    )


class Traffic(_Strict):
    mode: Literal["online", "offline", "mixed"] | None = None
    arrival_rate_rps: float | None = Field(default=None, ge=0, description="Mean requests/s.")
    peak_to_mean: float | None = Field(
        default=None,
        ge=1,
        le=MAX_PEAK_TO_MEAN,
        description="Peak arrival rate divided by the mean.",
    )
    concurrency: int | None = Field(default=None, ge=0, description="Requests in flight.")
    input_tokens: Measured | None = None
    output_tokens: Measured | None = None
    shared_prefix_fraction: float | None = Field(
        default=None, ge=0, le=1, description="Share of prompt tokens that are a common prefix."
    )
    batch_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of the load that is offline work on the same deployment.",
    )
    agentic_steps: int | None = Field(
        default=None, ge=1, description="LLM and tool calls per task (agentic flows)."
    )
    hourly_rate_rps: list[Annotated[float, Field(ge=0, le=1e6)]] | None = Field(
        default=None,
        min_length=24,
        max_length=24,
        description="A day's profile: 24 mean arrival rates (requests/s), hour 0 first.",
    )
    burstiness: float | None = Field(
        default=None,
        ge=0.01,
        le=100,
        description="Gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier.",
    )
    trace: TraceRef | None = Field(
        default=None, description="A request trace of this traffic (path and format)."
    )


class Slo(_Strict):
    ttft_ms: Percentiles | None = None
    itl_ms: Percentiles | None = None
    tpot_ms: Percentiles | None = None
    e2e_ms: Percentiles | None = None
    availability: float | None = Field(default=None, gt=0, le=1, description="e.g. 0.999")
    error_rate: float | None = Field(
        default=None, ge=0, le=1, description="Maximum failed fraction."
    )


class Constraints(_Strict):
    gpus: list[str] | None = Field(default=None, description="GPU catalog ids that may be used.")
    max_gpus: int | None = Field(default=None, ge=1)
    budget_usd_per_hour: float | None = Field(default=None, ge=0)
    gpu_prices_usd_per_hour: dict[str, Annotated[float, Field(gt=0, le=10_000)]] | None = Field(
        default=None,
        description="Your prices, USD per GPU-hour by GPU id; override the shipped table.",
    )
    regions: list[str] | None = None
    data_residency: str | None = None
    license: str | None = None
    privacy: str | None = None


class WorkloadDeployment(_Strict):
    """The deployment as it runs (or is proposed); flag names follow vLLM's."""

    model: str | None = Field(default=None, description="Hugging Face id or path.")
    hf_overrides: HfOverrides | None = Field(
        default=None,
        description="config.json fields the engine overrides (vLLM --hf-overrides), e.g. "
        '{"model_type": "llama4_text"} to serve Llama 4\'s language model alone.',
    )
    engine: Literal[ENGINES] | None = None  # type: ignore[valid-type]
    engine_version: str | None = None
    gpu: str | None = Field(default=None, description="GPU catalog id, e.g. h100-sxm-80gb.")
    num_gpus: int | None = Field(default=None, ge=1)
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1)
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool | None = Field(
        default=None, description="CUDA graphs disabled (vLLM --enforce-eager)."
    )
    replicas: int | None = Field(
        default=None, ge=1, description="Serving replicas now (scale-to-zero: min_replicas)."
    )
    router: Literal[ROUTERS] | None = Field(  # type: ignore[valid-type]
        default=None, description="How requests are spread over replicas."
    )
    scale_to_zero: bool | None = None
    min_replicas: int | None = Field(default=None, ge=0, le=10_000)
    cold_start_s: float | None = Field(
        default=None, ge=0, le=86_400, description="Seconds from scale-up to a serving replica."
    )
    idle_timeout_s: float | None = Field(default=None, ge=0)


class Observations(_Strict):
    """What was measured on the running system (percentiles, fractions 0-1). Counts and
    rates (concurrency, queue_depth, requests_per_s) are for the whole deployment; the
    reasoning divides by deployment.replicas where it compares with one replica."""

    ttft_ms: Measured | None = None
    itl_ms: Measured | None = None
    tpot_ms: Measured | None = None
    e2e_ms: Measured | None = None
    output_tokens_per_s: float | None = Field(default=None, ge=0)
    requests_per_s: float | None = Field(default=None, ge=0)
    concurrency: float | None = Field(default=None, ge=0, description="Requests in flight.")
    queue_depth: float | None = Field(default=None, ge=0, description="Requests waiting.")
    gpu_util: float | None = Field(default=None, ge=0, le=1, description="Fraction 0-1.")
    cpu_util: float | None = Field(default=None, ge=0, le=1, description="Fraction 0-1.")
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1, description="Fraction 0-1.")
    preemptions_per_min: float | None = Field(default=None, ge=0)
    prefix_cache_hit_rate: float | None = Field(default=None, ge=0, le=1)
    error_rate: float | None = Field(default=None, ge=0, le=1)
    cold_start_s: float | None = Field(
        default=None, ge=0, description="Time from scale-up/first request to first token."
    )
    note: str | None = Field(default=None, description="Free text for people; not reasoned on.")


def _symptom_id(value: str) -> str:
    if value not in SYMPTOMS:
        raise ValueError(f"unknown symptom id {value!r}")
    return value


def _hypothesis_id(value: str) -> str:
    if value not in HYPOTHESES:
        raise ValueError(f"unknown hypothesis id {value!r}")
    return value


_ID_FIELDS: dict[str, dict[str, str]] = {"symptoms": SYMPTOMS, "suspected_causes": HYPOTHESES}
"""List fields whose items are vocabulary ids; errors on them list the accepted ids."""

SymptomId = Annotated[str, AfterValidator(_symptom_id)]
HypothesisId = Annotated[str, AfterValidator(_hypothesis_id)]


class Workload(_Strict):
    name: str | None = None
    product: Product | None = None
    traffic: Traffic | None = None
    slo: Slo | None = None
    constraints: Constraints | None = None
    deployment: WorkloadDeployment | None = None
    observations: Observations | None = None
    symptoms: list[SymptomId] | None = Field(default=None, description="Symptom ids (vocabulary).")
    suspected_causes: list[HypothesisId] | None = Field(
        default=None, description="Hypothesis ids the team already suspects (vocabulary)."
    )


# --------------------------------------------------------------------------- loading


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The sub-model that owns the field at `loc`, to list its accepted keys."""
    model: type[BaseModel] = Workload
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(str(part))
        if info is None:
            return None
        found = None
        for candidate in _types_in(info.annotation):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found = candidate
        if found is None:
            return None
        model = found
    return model


def _types_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    out: list[Any] = []
    for a in args:
        out.extend(_types_in(a))
    return out


def _input_error(exc: ValidationError, field_prefix: str) -> InputError:
    """One InputError naming the first bad field as a dotted path (pydantic's loc), its
    accepted values, and any further problems in the same message."""
    errors = exc.errors()
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    field = ".".join([field_prefix, *(str(p) for p in loc)])
    accepted: str | None = None
    if first.get("type") == "extra_forbidden":
        owner = _model_at(loc)
        accepted = ", ".join(owner.model_fields) if owner else None
    elif first.get("type") == "literal_error":
        accepted = str((first.get("ctx") or {}).get("expected", "")) or None
    elif loc and loc[0] in _ID_FIELDS:
        accepted = ", ".join(_ID_FIELDS[str(loc[0])])
    message = _clean(first)
    if first.get("type") == "literal_error":
        message = f"{first.get('input')!r} is not an accepted value"
    owner = _model_at(loc) if loc else None
    info = owner.model_fields.get(str(loc[-1])) if owner and loc else None
    described = info is not None and info.description and loc[0] not in _ID_FIELDS
    if described and first.get("type") != "extra_forbidden":
        message += f" ({info.description})"
    more = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {_clean(e)}" for e in errors[1:]]
    if more:
        message += "; also " + "; ".join(more)
    return InputError(field, message, accepted)


def _clean(err: Any) -> str:
    if err.get("type") == "extra_forbidden":
        return "unknown field (a typo?)"
    msg = str(err.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")


MAX_WORKLOAD_BYTES = 4 * MiB
"""A workload file is a page of JSON or TOML; megabytes of it are a mistake (or an attack)."""


def parse_workload(data: Any, field_prefix: str = "workload") -> Workload:
    """Validate decoded data; every problem becomes an InputError naming the dotted path."""
    if not isinstance(data, dict):
        raise InputError(
            field_prefix,
            f"a workload must be a JSON object / TOML table, got {type(data).__name__}",
            "an object with any of: " + ", ".join(Workload.model_fields),
        )
    check_depth(data, field_prefix, "the workload")
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        raise _input_error(exc, field_prefix) from None


def load_workload(spec: str, field_prefix: str = "workload") -> Workload:
    """A workload from a JSON or TOML file path, or from inline JSON text.

    One string serves both doors: the CLI passes a path, an MCP client often
    passes the JSON itself. Text starting with ``{`` is JSON; anything else is
    a path (``.toml`` is read as TOML, other suffixes as JSON, then TOML)."""
    text = spec.strip()
    if not text:
        raise InputError(field_prefix, "empty", "a path to a .json/.toml file or JSON text")
    if len(text) > MAX_WORKLOAD_BYTES:
        raise InputError(field_prefix, f"longer than {MAX_WORKLOAD_BYTES // MiB} MiB")
    if text.startswith(("{", "[")):
        return parse_workload(loads_json(text, field_prefix, "the workload"), field_prefix)
    path = expand_path(text)
    if not path_exists(path):
        raise InputError(
            field_prefix,
            f"no such file: {text if len(text) <= 120 else text[:117] + '...'}",
            "a path to a .json or .toml workload file, or the JSON text itself",
        )
    raw = read_text(path, field_prefix, MAX_WORKLOAD_BYTES, "workload file")
    if path.suffix.lower() == ".toml":
        return parse_workload(_toml(raw, path, field_prefix), field_prefix)
    try:
        data = loads_json(raw, field_prefix, str(path))
    except InputError:
        if path.suffix.lower() == ".json":
            raise
        data = _toml(raw, path, field_prefix)
    return parse_workload(data, field_prefix)


def _toml(raw: str, path: Path, field_prefix: str) -> Any:
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(field_prefix, f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise InputError(field_prefix, f"{path} is nested too deeply") from None
    check_depth(data, field_prefix, str(path))
    return data


def get_path(workload: Workload, dotted: str) -> Any:
    """The value at a dotted path (``observations.ttft_ms.p95``), or None when absent."""
    node: Any = workload
    for part in dotted.split("."):
        if node is None:
            return None
        node = getattr(node, part, None) if isinstance(node, BaseModel) else None
    return node
