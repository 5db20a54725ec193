"""The pieces a plan is made of (its output models) and the small helpers every part uses.

Split from planning.py so that stages, sizing and acceptance each live in a module named for
what it holds. Stdlib + pydantic at module level.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal

from pydantic import BaseModel, Field

from inferwise.knowledge.evidence import Analysis
from inferwise.knowledge.workload import Workload


class MetricValue(BaseModel):
    metric: str = Field(description="e.g. ttft_ms.p95, itl_ms.p95, requests_per_s, availability.")
    value: float | None = None
    unit: str = ""
    source: Literal["slo", "stated", "measured", "computed", "missing"]
    note: str = ""


class Stage(BaseModel):
    title: str
    variable: str = Field(
        description="The one variable this stage changes ('none' for measurement stages)."
    )
    hypothesis: str | None = Field(default=None, description="Hypothesis id the stage tests.")
    playbook: str | None = None
    complexity: int | None = Field(
        default=None, description="Playbook complexity 1 (flag) .. 5 (architecture)."
    )
    change: str
    measure: list[str]
    decisive_metric: str = ""
    expected_tradeoffs: list[str]
    acceptance: list[str]
    rollback: str


class AcceptanceCriteria(BaseModel):
    quality: list[str]
    tail_latency: list[str]
    reliability: list[str]
    security: list[str]
    cost: list[str]


class FactToVerify(BaseModel):
    claim: str
    source_url: str


class Candidate(BaseModel):
    """One sized deployment option (computed, not measured)."""

    gpu: str
    tensor_parallel_size: int
    fits: bool | None = None
    max_concurrency: float | None = None
    kv_cache_tokens: int | None = None
    predicted_ttft_ms: float | None = None
    predicted_itl_ms: float | None = None
    max_rate_under_slo: float | None = None
    saturation_requests_per_s: float | None = Field(
        default=None, description="Throughput ceiling from `inferwise predict`, ignoring SLOs."
    )
    replicas_needed: int | None = None
    gpus_needed: int | None = None
    within_max_gpus: bool | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    usd_per_hour: float | None = Field(default=None, description="The fleet's cost (recommend).")
    meets_slo: bool | None = None
    serve_command: str | None = None
    notes: list[str] = Field(default_factory=list)


URL_PLACEHOLDER = "http://HOST:PORT"
ENGINE_DOCS = {
    "vllm": "https://docs.vllm.ai/en/latest/configuration/engine_args/",
    "sglang": "https://docs.sglang.io/docs/advanced_features/server_arguments",
    "tensorrt-llm": "https://nvidia.github.io/TensorRT-LLM/",
    "tgi": "https://huggingface.co/docs/text-generation-inference/index",
    "llama.cpp": "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
    "lmdeploy": "https://lmdeploy.readthedocs.io/en/latest/",
}
METRICS_DOCS = {
    "vllm": "https://docs.vllm.ai/en/latest/design/metrics/",
    "sglang": "https://docs.sglang.io/docs/advanced_features/observability",
}


# --------------------------------------------------------------------------- helpers


def fmt_value(x: float | None, unit: str = "") -> str:
    if x is None:
        return "?"
    text = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{text} {unit}".strip()


def engine_of(wl: Workload) -> str:
    return (wl.deployment.engine if wl.deployment and wl.deployment.engine else None) or "vllm"


def peak_rate(a: Analysis) -> float | None:
    return a.value("derived.peak_rate_rps")


def slo_items(wl: Workload) -> list[tuple[str, str, float]]:
    out = []
    if wl.slo is None:
        return out
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        pct = getattr(wl.slo, metric)
        if pct is None:
            continue
        for k in ("p50", "p90", "p95", "p99"):
            v = getattr(pct, k)
            if v is not None:
                out.append((metric, k, float(v)))
    return out


def probe_command(a: Analysis, url: str, label: str, rate: float | None = None) -> str:
    """The `inferwise probe` command that reproduces this workload's load shape."""
    wl = a.workload
    parts = ["inferwise probe", shlex.quote(url)]
    if wl.deployment and wl.deployment.model:
        parts.append(f"--model {shlex.quote(wl.deployment.model)}")
    elif a.run and a.run.config.get("model"):
        parts.append(f"--model {shlex.quote(str(a.run.config['model']))}")
    trace = wl.traffic.trace if wl.traffic else None
    if trace is not None:  # the workload's own trace: its arrivals, lengths and prefixes
        return " ".join([*parts, *_trace_flags(a, trace, rate), *_tail(a, label)])
    cfg = a.run.config if a.run else {}
    rate = rate if rate is not None else a.value("traffic.arrival_rate_rps")
    if rate is None and cfg.get("request_rate"):
        rate = float(cfg["request_rate"])  # reproduce the stored run's load shape
    conc = (
        a.value("traffic.concurrency")
        or (cfg.get("concurrency") if not cfg.get("request_rate") else None)
        or a.value("observations.concurrency")
    )
    if a.value("traffic.mode") == "offline" and label not in ("overload",):
        # offline work is measured saturated (closed loop), not at an arrival rate
        parts.append(f"--concurrency {int(conc or a.value('deployment.max_num_seqs') or 256)}")
    elif rate:
        parts.append(f"--request-rate {rate:g}")
    elif conc:
        parts.append(f"--concurrency {int(conc)}")
    else:
        parts.append("--sweep 1,4,16,64")
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    parts.append(f"--input-tokens {int(inp)}" if inp else "--input-tokens <p50 prompt tokens>")
    parts.append(f"--output-tokens {int(out)}" if out else "--output-tokens <p50 output tokens>")
    shared = a.value("traffic.shared_prefix_fraction")
    if shared:
        parts.append(f"--shared-prefix-fraction {shared:g}")
    burst = a.value("traffic.burstiness")
    if rate and burst and burst != 1 and a.value("traffic.mode") != "offline":
        parts.append(f"--burstiness {burst:g}")
    parts.append("--requests 500")
    return " ".join([*parts, *_tail(a, label)])


def _trace_flags(a: Analysis, trace: Any, rate: float | None) -> list[str]:
    """Replay the workload's trace; a stage that asks for another rate (overload) replays
    it faster by the ratio to the trace's mean rate."""
    import shlex

    flags = [f"--trace {shlex.quote(trace.path)}"]
    if trace.format:
        flags.append(f"--trace-format {trace.format}")
    mean = a.value("traffic.arrival_rate_rps")
    if rate is not None and mean:
        flags.append(f"--trace-time-scale {rate / mean:.3g}")
    return [*flags, "--requests 500"]


def _tail(a: Analysis, label: str) -> list[str]:
    """Warm-up, SLO targets for goodput and the stage label: every probe command ends so."""
    wl = a.workload
    agentic = bool(wl.traffic and wl.traffic.agentic_steps)
    slo = [
        f"--slo {m}={v:g}"
        for m, k, v in slo_items(wl)
        if k in ("p95", "p99") and not (agentic and m == "e2e_ms")  # e2e is per task there
    ][:3]
    return ["--warmup-requests 20", *slo, f"--label stage={label}"]
