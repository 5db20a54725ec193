"""The one registry of operations that both front doors are generated from.

Each operation is declared once: its CLI name, its MCP tool name, a pydantic
input model, a pydantic output model, the function and a jinja2 template.
Models and functions are referenced as "module:attribute" strings so that
listing the operations (``inferwise --help``, MCP ``tools/list`` metadata)
imports nothing heavy; the modules are imported when an operation is used.

Conventions every operation follows:

* the function takes one argument, an instance of the input model, and
  returns an instance of the output model; it may be ``async``;
* an async function may accept a keyword ``progress``: an async callable
  ``progress(done, total, message)`` that the front door wires to the CLI's
  stderr or MCP's ``report_progress``;
* user-fixable problems raise ``inferwise.calculators.errors.InputError``
  naming the input field; failures of the job itself raise ``OperationalError``.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


def _resolve(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


@dataclass(frozen=True)
class Operation:
    name: str
    """CLI command, words separated by spaces for groups (``"runs list"``)."""
    summary: str
    """One line for ``--help`` listings."""
    input_ref: str
    output_ref: str
    func_ref: str
    template: str
    """File name under ``server/templates/``."""
    tool_name: str | None = None
    """MCP tool name; ``None`` for CLI-only operations."""
    title: str | None = None
    description: str = ""
    """Written for an LLM caller: when to use it, key inputs, units."""
    read_only: bool = True
    open_world: bool = False
    exit_nonzero_field: str | None = None
    """Output attribute that, when truthy, makes the CLI exit 1 (operational failure)."""
    extra: dict[str, Any] = field(default_factory=dict)
    mcp_ref: str | None = None
    """The function the MCP door calls instead of ``func_ref`` when the reply carries more
    than text: it returns the result and extra content blocks (images, resource links)."""
    compute_budget_s: float = 8.0
    """Compute budget of one call (calculators.deadline): a search runs thousands of
    calculations and gets more than one calculation does."""

    @cached_property
    def input_model(self) -> Any:
        return _resolve(self.input_ref)

    @cached_property
    def output_model(self) -> Any:
        return _resolve(self.output_ref)

    @cached_property
    def func(self) -> Any:
        return _resolve(self.func_ref)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)


_C = "inferwise.calculators"
_P = "inferwise.probes"
_K = "inferwise.knowledge"

OPERATIONS: list[Operation] = [
    Operation(
        name="fit",
        summary="Will the model fit on these GPUs? Weights, KV cache, overhead and headroom per GPU.",
        input_ref=f"{_C}.fit:FitRequest",
        output_ref=f"{_C}.fit:FitResult",
        func_ref=f"{_C}.fit:estimate_fit",
        template="fit.md.j2",
        tool_name="estimate_memory_fit",
        title="Estimate GPU memory fit",
        description=(
            "Use this before choosing GPUs or engine settings for a model. Given a model (Hugging Face "
            "id from the catalog), a GPU type and count, and engine settings (vLLM-style flags), it "
            "computes per-GPU memory: weights, activation peak, non-torch and CUDA-graph memory, KV "
            "cache and headroom, the KV cache size in tokens and the maximum concurrency at the "
            "context length, as the engine itself would report them. Memory in GiB (2^30 bytes)."
        ),
        # the memory fit does not depend on when the scheduler takes requests in
        extra={"report": "fit_report", "mcp_hidden": ("scheduler_recv_interval",)},
    ),
    Operation(
        name="predict",
        summary="Predict TTFT, ITL, TPOT, end-to-end latency and throughput of a deployment at a load.",
        input_ref=f"{_C}.predict:PredictRequest",
        output_ref=f"{_C}.predict:PredictResult",
        func_ref=f"{_P}.calibrations:predict_calibrated",
        template="predict.md.j2",
        tool_name="predict_performance",
        title="Predict serving performance",
        description=(
            "Use this to estimate latency and throughput of a deployment before measuring it: "
            "per-step roofline + continuous-batching simulation. Inputs: the deployment, "
            "input_tokens and output_tokens per request, and concurrency or request_rate "
            "(requests/s; inf = all at once). Times in ms, throughput per second."
        ),
        extra={"report": "predict_report"},
    ),
    Operation(
        name="budget",
        summary="Split an end-to-end SLO into queue/network/pre/prefill/decode/post budgets; find the binding stage.",
        input_ref=f"{_C}.budget:BudgetRequest",
        output_ref=f"{_C}.budget:BudgetResult",
        func_ref=f"{_P}.calibrations:budget_calibrated",
        template="budget.md.j2",
        tool_name="decompose_latency_budget",
        title="Decompose a latency budget",
        description=(
            "Use this when a product has latency targets (SLOs) and you need to know which stage of a "
            "request will break them and how much load one replica can carry under them. Inputs: SLO "
            "targets in ms per percentile (e2e, ttft, itl), workload token lengths, arrival rate, "
            "network and processing costs, and the deployment. Returns per-stage budget vs "
            "prediction, the binding stage and the maximum rate under the SLO."
        ),
    ),
    Operation(
        name="recommend",
        summary="Design the deployment: search GPU, parallelism, precision and batch limits; price the fleet that meets the SLO.",
        input_ref=f"{_K}.recommending:RecommendRequest",
        output_ref=f"{_C}.recommend.result:RecommendResult",
        func_ref=f"{_K}.recommending:recommend_deployment",
        template="recommend.md.j2",
        tool_name="recommend_deployment",
        title="Recommend a deployment",
        description=(
            "Use this when the question is what to deploy: given the model(s), traffic (mean rate, "
            "peak_to_mean), prompt/output lengths, SLO targets (ms by percentile), availability and "
            "constraints (GPU types, max_gpus, budget, prices), it searches GPU type x tensor/"
            "pipeline parallelism x weights (bf16/fp8/int4) x KV dtype x batch limits, simulates "
            "the survivors and returns the cheapest fleets that meet every target: replicas, "
            "spares, $/hour, $ per million tokens and per successful request, the vllm serve line "
            "and the probe that verifies it."
        ),
        extra={"report": "recommend_report"},
        compute_budget_s=120.0,
    ),
    Operation(
        name="probe",
        summary="Drive an OpenAI-compatible streaming endpoint with a bounded load; measure TTFT/ITL/goodput.",
        input_ref=f"{_P}.runner:ProbeRequest",
        output_ref=f"{_P}.runner:ProbeResult",
        func_ref=f"{_P}.runner:run_probe",
        template="probe.md.j2",
        tool_name="probe_endpoint",
        title="Probe a live endpoint",
        description=(
            "Use this to measure a real OpenAI-compatible endpoint instead of predicting it. Sends a "
            "bounded number of streaming requests at a fixed concurrency or Poisson rate and returns "
            "per-request TTFT, ITL, TPOT and end-to-end distributions (ms), throughput and goodput. "
            "Only targets the server operator allowlisted are accepted. The run is stored; its "
            "run_id can be passed to diagnose_bottleneck, plan_experiments and compare_runs."
        ),
        read_only=False,
        open_world=True,
        exit_nonzero_field="all_failed",
        # client processes are a local resource: the operator decides, not the calling model
        extra={"mcp_hidden": ("workers",)},
    ),
    Operation(
        name="diagnose",
        summary="Rank bottleneck hypotheses from a workload file and/or a stored probe run.",
        input_ref=f"{_K}.diagnosis:DiagnoseRequest",
        output_ref=f"{_K}.diagnosis:DiagnoseResult",
        func_ref=f"{_K}.diagnosis:diagnose",
        template="diagnose.md.j2",
        tool_name="diagnose_bottleneck",
        title="Diagnose the bottleneck",
        description=(
            "Use this when a deployment is slower or more expensive than wanted and you need the most "
            "likely cause. Give a workload (observations, symptoms, deployment) and/or the run_id of "
            "a stored probe run. Returns ranked hypotheses, each with its evidence, counter-evidence "
            "and exactly how to prove it before changing anything."
        ),
    ),
    Operation(
        name="plan",
        summary="Experiment plan: assumptions, missing measurements, targets, hypotheses, stages, acceptance.",
        input_ref=f"{_K}.planning:PlanRequest",
        output_ref=f"{_K}.planning:PlanResult",
        func_ref=f"{_K}.planning:plan_experiments",
        template="plan.md.j2",
        tool_name="plan_experiments",
        title="Plan inference experiments",
        description=(
            "Use this to turn a product's requirements into a measured plan. Give a workload "
            "description (traffic, SLOs, constraints, deployment, observations; anything may be "
            "missing) and optionally a probe run_id. Returns workload assumptions and missing "
            "measurements, target and baseline metrics, the leading bottleneck hypothesis and how to "
            "prove it, a staged one-variable-at-a-time plan, acceptance criteria and facts to verify."
        ),
    ),
    Operation(
        name="calibrate",
        summary="Fit the deployment's factors to measured runs or benchmark files; store the calibration.",
        input_ref=f"{_P}.calibrations:CalibrateRequest",
        output_ref=f"{_P}.calibrations:CalibrateResult",
        func_ref=f"{_P}.calibrations:calibrate",
        template="calibrate.md.j2",
        tool_name="calibrate_deployment",
        title="Calibrate a deployment",
        description=(
            "Use this when the deployment was measured (run ids; vLLM bench serve, guidellm or "
            "AIPerf JSON files): fits its efficiency and overhead factors, stores them under name "
            "for calibration=name in predict_performance."
        ),
        read_only=False,
        compute_budget_s=60.0,
    ),
    Operation(
        name="calibrations list",
        summary="List stored calibrations.",
        input_ref=f"{_P}.calibrations:CalibrationsListRequest",
        output_ref=f"{_P}.calibrations:CalibrationsListResult",
        func_ref=f"{_P}.calibrations:list_calibrations",
        template="calibrations_list.md.j2",
    ),
    Operation(
        name="calibrations show",
        summary="Show one stored calibration: factors, residuals, provenance.",
        input_ref=f"{_P}.calibrations:CalibrationNameRequest",
        output_ref=f"{_P}.calibrations:StoredCalibration",
        func_ref=f"{_P}.calibrations:show_calibration",
        template="calibrate.md.j2",
    ),
    Operation(
        name="calibrations delete",
        summary="Delete one stored calibration.",
        input_ref=f"{_P}.calibrations:CalibrationNameRequest",
        output_ref=f"{_P}.calibrations:DeleteResult",
        func_ref=f"{_P}.calibrations:delete_calibration",
        template="calibrations_delete.md.j2",
        read_only=False,
    ),
    Operation(
        name="explain",
        summary="A run's measurement beside the prediction for exactly its conditions; the gap's causes.",
        input_ref=f"{_K}.explain:ExplainRequest",
        output_ref=f"{_K}.explain:ExplainResult",
        func_ref=f"{_K}.explain:explain_run",
        template="explain.md.j2",
    ),
    Operation(
        name="kb search",
        summary="Search the knowledge base.",
        input_ref=f"{_K}.kb:SearchRequest",
        output_ref=f"{_K}.kb:SearchResult",
        func_ref=f"{_K}.kb:search",
        template="kb_search.md.j2",
        tool_name="search_knowledge",
        title="Search inference knowledge",
        description=(
            "Use this to look up inference-engineering knowledge: metrics definitions, symptom to "
            "cause tables, optimisation playbooks (batching, quantization, speculative decoding, "
            "prefix caching, parallelism, routing), engine selection and production readiness. "
            "Returns the best-matching documents with snippets and their ids."
        ),
    ),
    Operation(
        name="kb show",
        summary="Show one knowledge document by id.",
        input_ref=f"{_K}.kb:ShowRequest",
        output_ref=f"{_K}.kb:Document",
        func_ref=f"{_K}.kb:show",
        template="kb_show.md.j2",
    ),
    Operation(
        name="runs list",
        summary="List stored probe runs.",
        input_ref=f"{_P}.runs:ListRunsRequest",
        output_ref=f"{_P}.runs:ListRunsResult",
        func_ref=f"{_P}.runs:list_runs",
        template="runs_list.md.j2",
        tool_name="list_runs",
        title="List stored probe runs",
        description=(
            "Use this to find earlier probe runs (ids, labels, load shape, status and headline "
            "metrics) before comparing them or planning from them."
        ),
    ),
    Operation(
        name="runs show",
        summary="Show one stored run: labels, load, summary, errors.",
        input_ref=f"{_P}.runs:ShowRunRequest",
        output_ref=f"{_P}.runs:RunDetail",
        func_ref=f"{_P}.runs:show_run",
        template="runs_show.md.j2",
    ),
    Operation(
        name="runs compare",
        summary="Compare stored runs metric by metric, with a noise test.",
        input_ref=f"{_P}.runs:CompareRunsRequest",
        output_ref=f"{_P}.runs:CompareRunsResult",
        func_ref="inferwise.knowledge.quality_gate:compare_runs",
        template="runs_compare.md.j2",
        tool_name="compare_runs",
        title="Compare probe runs",
        description=(
            "Use this after changing one variable to see whether it helped: compares a baseline run "
            "with one or more candidate runs, metric by metric (TTFT, ITL, TPOT, E2E percentiles, "
            "throughput, goodput, graded accuracy), and says whether each change is beyond noise."
        ),
    ),
    Operation(
        name="runs consistency",
        summary="Share of identical greedy outputs between two runs, and where they first differ.",
        input_ref=f"{_P}.consistency:ConsistencyRequest",
        output_ref=f"{_P}.consistency:ConsistencyResult",
        func_ref=f"{_P}.consistency:consistency",
        template="runs_consistency.md.j2",
    ),
    Operation(
        name="runs export",
        summary="Export a run's per-request rows as JSONL or CSV.",
        input_ref=f"{_P}.runs:ExportRunRequest",
        output_ref=f"{_P}.runs:ExportRunResult",
        func_ref=f"{_P}.runs:export_run",
        template="runs_export.md.j2",
    ),
    Operation(
        name="workload",
        summary="Fit a workload file to a request trace: rates, peak, burstiness, lengths, prefix reuse, day profile.",
        input_ref=f"{_K}.trace_workload:WorkloadFromTraceRequest",
        output_ref=f"{_K}.trace_workload:WorkloadFromTraceResult",
        func_ref=f"{_K}.trace_workload:workload_from_trace",
        template="workload.md.j2",
    ),
    Operation(
        name="runs import",
        summary="Store vLLM bench serve / guidellm / AIPerf result files as runs (one per load level).",
        input_ref=f"{_P}.bench_import:ImportRunsRequest",
        output_ref=f"{_P}.bench_import:ImportRunsResult",
        func_ref=f"{_P}.bench_import:import_runs",
        template="runs_import.md.j2",
        read_only=False,
    ),
    Operation(
        name="report",
        summary="Write a self-contained HTML report of stored runs: distributions, timeline, sweep curves, comparison.",
        input_ref="inferwise.server.reports.command:ReportRequest",
        output_ref="inferwise.server.reports.command:ReportResult",
        func_ref="inferwise.server.reports.command:run_report",
        template="report.md.j2",
        tool_name="render_report",
        title="Render a run report",
        description=(
            "Charts of stored probe runs: TTFT/ITL/E2E distributions with SLO lines, the "
            "per-request timeline, engine metrics over time, sweep curves with the knee, "
            "several runs overlaid with runs-compare verdicts. Returns the figures as PNG images "
            "and a link to the whole page (inferwise://reports/{report_id}). Input: run_ids "
            "(ids, unique prefixes or latest; the first is the baseline)."
        ),
        mcp_ref="inferwise.server.reports.mcp:render_for_mcp",
        extra={"mcp_hidden": ("output", "png")},
        # figures for a few thousand requests render in seconds on a slow machine
        compute_budget_s=120.0,
    ),
]

BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}
BY_TOOL: dict[str, Operation] = {op.tool_name: op for op in OPERATIONS if op.tool_name}
