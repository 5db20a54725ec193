"""What the MCP server offers besides tools: resources (knowledge, catalogs, runs) and prompts."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

INSTRUCTIONS = """\
inferwise answers LLM-serving questions with computed and measured numbers.
Workflow: characterise the workload (traffic, token lengths, SLOs, constraints), size candidate
deployments with estimate_memory_fit and predict_performance, split the SLO with
decompose_latency_budget, measure a baseline with probe_endpoint, find the bottleneck with
diagnose_bottleneck, and plan one-variable-at-a-time experiments with plan_experiments.
Units are in the field names (_ms, _gib = 2^30 bytes, _tokens, _per_s). Every result lists its
assumptions: say which numbers are measured, computed or assumed when you report them.
"""


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


@contextlib.contextmanager
def _unknown_id_as_resource_error() -> Iterator[None]:
    """A template resource read with an id we don't know is the reader's error: the SDK reports
    ResourceError to the client as it is, where anything else would become a generic failure."""
    from mcp.server.mcpserver.exceptions import ResourceError

    from inferwise.calculators.errors import InputError

    try:
        yield
    except InputError as exc:
        raise ResourceError(str(exc)) from None


def register_resources(server: Any) -> None:
    """Knowledge, catalogs, stored runs and rendered reports, each a resource family."""
    _knowledge_resources(server)
    _catalog_resources(server)
    _run_resources(server)


def _knowledge_resources(server: Any) -> None:
    @server.resource(
        "inferwise://knowledge",
        name="knowledge-index",
        title="Knowledge base index",
        description="Every knowledge document: id, title, tags. Read one with inferwise://knowledge/{doc_id}.",
        mime_type="application/json",
    )
    def knowledge_index() -> str:
        from inferwise.knowledge.kb import list_documents

        return _json([{"id": d.id, "title": d.title, "tags": d.tags} for d in list_documents()])

    @server.resource(
        "inferwise://knowledge/{doc_id}",
        name="knowledge-document",
        title="Knowledge document",
        description="One knowledge document as Markdown (ids from inferwise://knowledge or search_knowledge).",
        mime_type="text/markdown",
    )
    def knowledge_document(doc_id: str) -> str:
        from inferwise.knowledge.kb import get_document

        with _unknown_id_as_resource_error():
            doc = get_document(doc_id)
        return f"# {doc.title}\n\n{doc.body_markdown}"


def _catalog_resources(server: Any) -> None:
    @server.resource(
        "inferwise://catalog/gpus",
        name="gpu-catalog",
        title="GPU catalog",
        description="GPUs the calculators know: memory (vendor GB and runtime GiB), bandwidth, dense TFLOPS, interconnect, source.",
        mime_type="application/json",
    )
    def gpu_catalog() -> str:
        from dataclasses import asdict

        from inferwise.calculators.catalog import list_gpus

        return _json([asdict(g) for g in list_gpus()])

    @server.resource(
        "inferwise://catalog/models",
        name="model-catalog",
        title="Model catalog",
        description="Models the calculators know (Hugging Face ids) with their source; full configs via the fit tool.",
        mime_type="application/json",
    )
    def model_catalog() -> str:
        from inferwise.calculators.catalog import list_models

        return _json(
            [
                {
                    "hf_id": m.hf_id,
                    "model_type": m.config.get("model_type"),
                    "architectures": m.config.get("architectures"),
                    "source_url": m.source_url,
                }
                for m in list_models()
            ]
        )


def _run_resources(server: Any) -> None:
    @server.resource(
        "inferwise://runs",
        name="runs-index",
        title="Stored probe runs",
        description="Recent probe runs in the server's run store (ids, labels, status).",
        mime_type="application/json",
    )
    def runs_index() -> str:
        from inferwise.probes.runs import ListRunsRequest, list_runs

        return list_runs(ListRunsRequest()).model_dump_json(indent=2)

    @server.resource(
        "inferwise://runs/{run_id}",
        name="run",
        title="Stored probe run",
        description="One stored probe run: labels, load shape, summary, errors.",
        mime_type="application/json",
    )
    def run_detail(run_id: str) -> str:
        from inferwise.probes.runs import ShowRunRequest, show_run

        with _unknown_id_as_resource_error():
            return show_run(ShowRunRequest(run_id=run_id)).model_dump_json(indent=2)

    @server.resource(
        "inferwise://reports/{report_id}",
        name="report",
        title="Run report",
        description="A report render_report made in this server, as one self-contained HTML page.",
        mime_type="text/html",
    )
    def report_page(report_id: str) -> str:
        from inferwise.server.reports.mcp import page

        with _unknown_id_as_resource_error():
            return page(report_id)


def register_prompts(server: Any) -> None:
    @server.prompt(
        name="inference_review",
        title="Review an inference deployment",
        description="Walk through characterise -> size -> baseline -> locate bottleneck -> plan for a product.",
    )
    def inference_review(product: str, endpoint_url: str = "", workload_file: str = "") -> str:
        lines = [
            f"Review the LLM inference setup for this product: {product}",
            "",
            "Work in this order and use the inferwise tools for every number; say which numbers are "
            "measured, computed or assumed.",
            "1. Characterise the workload: traffic mode (online/offline), arrival rate and peak-to-mean, "
            "input/output token lengths (p50/p95), shared prompt prefix, SLOs (TTFT, ITL, e2e at p95/p99), "
            "constraints (GPUs, budget, data residency). Ask me for what is missing; do not invent it.",
            "2. Size candidate deployments with estimate_memory_fit (does it fit, KV cache tokens, max "
            "concurrency) and predict_performance (TTFT/ITL/throughput at the expected load).",
            "3. Split the end-to-end SLO with decompose_latency_budget and name the binding stage.",
        ]
        if endpoint_url:
            lines.append(
                f"4. Measure a baseline with probe_endpoint against {endpoint_url} at the expected "
                "concurrency, then compare later runs with compare_runs."
            )
        else:
            lines.append(
                "4. If an endpoint exists, measure a baseline with probe_endpoint; otherwise say which measurement is missing."
            )
        lines.append(
            "5. Rank bottleneck hypotheses with diagnose_bottleneck and say how to prove the leading one."
        )
        target = f" using the workload file {workload_file}" if workload_file else ""
        lines.append(
            f"6. Produce the plan with plan_experiments{target}: assumptions and missing measurements, "
            "targets vs baseline, leading hypothesis, staged one-variable experiments, acceptance criteria, facts to verify."
        )
        return "\n".join(lines)

    @server.prompt(
        name="size_deployment",
        title="Size a deployment",
        description="Find GPUs, parallelism and engine settings on which a model serves a given context and concurrency.",
    )
    def size_deployment(
        model: str, context_tokens: str = "8192", concurrency: str = "32", gpu: str = ""
    ) -> str:
        gpu_part = (
            f"on {gpu}"
            if gpu
            else "on the GPUs in the catalog (start with h100-sxm-80gb and h200-sxm-141gb)"
        )
        return (
            f"Size a deployment of {model} {gpu_part} for {concurrency} concurrent requests of "
            f"{context_tokens} tokens of context.\n"
            "1. Call estimate_memory_fit with context_tokens and concurrency; read fits, per_gpu memory, "
            "kv_cache_tokens and max_concurrency.\n"
            "2. If it does not fit, try the suggestions it returns one at a time (FP8 KV cache, larger "
            "tensor_parallel_size, quantized weights, shorter max_model_len) and say the cost of each.\n"
            "3. For the options that fit, call predict_performance at that concurrency and compare TTFT, "
            "ITL and output tokens per second per GPU.\n"
            "4. Recommend one option with its numbers and list what must be measured to confirm it."
        )
