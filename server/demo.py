"""`inferwise demo`: the whole product in one command, with no GPU.

It starts the simulated engine (whose step times follow the roofline model of
the chosen deployment), then runs the four jobs against it in the order an
engineer would: fit, predict, probe (measured), plan (from the measurement).
Each result is printed with the same rendering the CLI uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(
        default="meta-llama/Llama-3.1-8B-Instruct",
        description="Model the simulated deployment serves.",
    )
    gpu: str = Field(default="h100-sxm-80gb", description="GPU of the simulated deployment.")
    concurrency: int = Field(default=8, ge=1, le=64, description="Concurrency of the probe.")
    requests: int = Field(default=32, ge=1, le=500, description="Requests the probe sends.")
    input_tokens: int = Field(default=1024, ge=1, le=32_000, description="Prompt length in tokens.")
    output_tokens: int = Field(default=128, ge=1, le=4096, description="Output length in tokens.")
    ttft_slo_ms: float = Field(
        default=500, gt=0, description="TTFT p95 target used for goodput and the plan."
    )
    itl_slo_ms: float = Field(
        default=50, gt=0, description="ITL p95 target used for goodput and the plan."
    )
    target: Literal["sim", "llama.cpp"] = Field(
        default="sim",
        description="What the probe measures: the simulated engine, or a real llama.cpp server with a "
        "random-weight test model on this CPU (needs the binary .ci/prepare-engine builds).",
    )
    db: str | None = Field(
        default=None, description="Run database (default: the user's run store)."
    )
    json_output: bool = Field(
        default=False, description="Print each step's JSON instead of Markdown."
    )


def _show(title: str, template: str, result: BaseModel, as_json: bool) -> None:
    from inferwise.server.render import render

    sys.stdout.write(f"\n## {title}\n\n")
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(render(template, result))
    sys.stdout.flush()


def _workload(cfg: DemoConfig, measured_rps: float | None) -> dict[str, Any]:
    workload: dict[str, Any] = {
        "name": "demo-chat",
        "product": {"streaming": True, "modality": "text"},
        "traffic": {
            "mode": "online",
            "concurrency": cfg.concurrency,
            "input_tokens": {"p50": cfg.input_tokens},
            "output_tokens": {"p50": cfg.output_tokens},
        },
        "slo": {"ttft_ms": {"p95": cfg.ttft_slo_ms}, "itl_ms": {"p95": cfg.itl_slo_ms}},
        "deployment": {
            "model": cfg.model,
            "engine": "vllm",
            "gpu": cfg.gpu,
            "tensor_parallel_size": 1,
        },
    }
    if measured_rps:
        # the rate the probe sustained: what the product would offer at this concurrency
        workload["traffic"]["arrival_rate_rps"] = round(measured_rps, 2)
    return workload


@contextlib.contextmanager
def _target(cfg: DemoConfig) -> Iterator[tuple[str, str]]:
    """The server the probe measures, started for the demo and stopped after it."""
    if cfg.target == "sim":
        from inferwise.probes.sim import SimConfig, SimServer

        sim_config = SimConfig(model=cfg.model, gpu=cfg.gpu, served_model_name=cfg.model, port=0)
        with SimServer(sim_config) as sim:
            yield sim.base_url, "simulated engine"
        return
    import tempfile
    from pathlib import Path

    from inferwise.probes.llamacpp import LlamaServer, find_llama_server, write_test_model

    binary = find_llama_server()
    if binary is None:
        raise InputError(
            "target",
            "no llama-server binary is cached; build it once with .ci/prepare-engine (minutes)",
            "sim",
        )
    with tempfile.TemporaryDirectory() as tmp:
        model = write_test_model(Path(tmp) / "test-llama.gguf", seed=0)
        with LlamaServer(model_path=model.path, binary=binary, n_parallel=4) as server:
            yield server.base_url, "llama.cpp engine (random-weight test model, CPU)"


def run_demo(cfg: DemoConfig) -> int:
    from inferwise.calculators.fit import FitRequest, estimate_fit
    from inferwise.calculators.predict import PredictRequest, predict_performance
    from inferwise.knowledge.planning import PlanRequest, plan_experiments
    from inferwise.probes.runner import ProbeRequest, run_probe

    deployment = {"model": cfg.model, "gpu": cfg.gpu}
    sys.stdout.write(
        f"# inferwise demo\n\n{cfg.model} on one {cfg.gpu}, served by the simulated engine "
        "(step times from the roofline model; no GPU needed).\n"
    )
    _show(
        "1. fit: will it fit, and how much KV cache is left?",
        "fit.md.j2",
        estimate_fit(
            FitRequest(
                **deployment,
                context_tokens=cfg.input_tokens + cfg.output_tokens,
                concurrency=cfg.concurrency,
            )
        ),
        cfg.json_output,
    )
    _show(
        "2. predict: what latency should this load see?",
        "predict.md.j2",
        predict_performance(
            PredictRequest(
                **deployment,
                input_tokens=cfg.input_tokens,
                output_tokens=cfg.output_tokens,
                concurrency=cfg.concurrency,
            )
        ),
        cfg.json_output,
    )
    with _target(cfg) as (base_url, what):
        sys.stderr.write(f"{what} listening on {base_url}\n")
        probe = asyncio.run(
            run_probe(
                ProbeRequest(
                    url=base_url,
                    model=cfg.model if cfg.target == "sim" else None,
                    concurrency=cfg.concurrency,
                    requests=cfg.requests,
                    warmup_requests=min(2, cfg.requests),
                    input_tokens=cfg.input_tokens,
                    output_tokens=cfg.output_tokens,
                    slo={"ttft_ms": cfg.ttft_slo_ms, "itl_ms": cfg.itl_slo_ms},
                    label={
                        "demo": "true",
                        "engine": what,
                        **({"gpu": cfg.gpu} if cfg.target == "sim" else {}),
                    },
                    db=cfg.db,
                    metrics_interval_s=0.5,
                )
            )
        )
    _show(
        f"3. probe: measured against the {what} (run {probe.run_id})",
        "probe.md.j2",
        probe,
        cfg.json_output,
    )
    plan = plan_experiments(
        PlanRequest(
            workload=json.dumps(_workload(cfg, probe.summary.request_throughput)),
            run=probe.run_id,
            db=cfg.db,
        )
    )
    _show("4. plan: what to measure and change next", "plan.md.j2", plan, cfg.json_output)
    sys.stdout.write(
        f'\nNext: `inferwise runs show {probe.run_id}`, `inferwise kb search "prefix caching"`, '
        "or connect an assistant with `inferwise mcp`.\n"
    )
    return 0
