"""Regressions found by following the README as a new user (one test per bug fixed)."""

from __future__ import annotations

import pytest
from conftest import store_run, streamed_records

from inferwise.calculators.budget import BudgetRequest, decompose_budget


def test_max_rate_under_slo_never_exceeds_saturation():
    """A loose TTFT-only target is met up to the search's upper bound (1.05 x
    saturation) in a minute-long simulation; the answer must still not claim
    more than one replica sustains."""
    res = decompose_budget(
        BudgetRequest(
            model="meta-llama/Llama-3.1-8B-Instruct",
            gpu="h100-sxm-80gb",
            input_tokens=1500,
            output_tokens=250,
            request_rate=5,
            slo_ttft_ms={"p95": 800},
        )
    )
    assert res.max_rate_under_slo is not None and res.max_rate_under_slo > 0
    assert res.max_rate_under_slo <= res.saturation_request_rate


def test_compare_runs_unknown_id_names_the_run_ids_argument(tmp_path):
    """MCP callers pass `run_ids`; an error about `run_id` names an argument compare_runs lacks."""
    import pytest

    from inferwise.calculators.errors import InputError
    from inferwise.probes.records import RequestRecord
    from inferwise.probes.runs import CompareRunsRequest, compare_runs
    from inferwise.probes.store import RunStore

    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        run_id = store.create_run(labels={}, config={"concurrency": 1, "requests": 1}, meta={})
        store.add_requests(
            run_id,
            [RequestRecord(index=0, ok=True, start_s=0.0, first_token_s=0.1, end_s=0.2)],
        )
        store.finish_run(run_id, "complete")
    with pytest.raises(InputError) as err:
        compare_runs(CompareRunsRequest(run_ids=[run_id, "20990101-000000-dead"], db=str(db)))
    assert err.value.field == "run_ids"


def test_kb_show_of_a_playbook_id_names_the_document_that_holds_it():
    """Plans list playbook ids (`max_num_seqs_tuning`); `kb show` of one should lead to its document."""
    import pytest

    from inferwise.calculators.errors import InputError
    from inferwise.knowledge.kb import get_document, list_documents

    holder = next(d for d in list_documents() if get_document(d.id).playbooks)
    playbook = get_document(holder.id).playbooks[0]
    with pytest.raises(InputError, match=f"kb show {holder.id}"):
        get_document(playbook)


def _store_slow_ttft_run(db, **labels: str) -> str:
    """A stored probe run with TTFT ~1.2 s whose probe was given --slo ttft_ms=800."""
    records = streamed_records(
        30, spacing_s=2.0, ttft_s=1.2, tokens=20, itl_s=0.02, input_tokens=500, first_byte=True
    )
    config = {"concurrency": 1, "requests": 30, "slo": {"ttft_ms": 800.0}}
    return store_run(db, records, config=config, labels=labels, slo={"ttft_ms": 800.0})


def test_diagnose_and_plan_of_a_run_use_the_probes_slo(tmp_path):
    """`diagnose --run` / `plan --run` without a workload judged a run probed with --slo against
    generic thresholds ("no SLO given") and planned with "no targets stated"."""
    from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose
    from inferwise.knowledge.planning import PlanRequest, plan_experiments

    db = str(tmp_path / "runs.db")
    run_id = _store_slow_ttft_run(db)
    found = diagnose(DiagnoseRequest(run=run_id, db=db))
    ttft = next(s for s in found.symptoms if s.id == "ttft_high")
    assert "target 800" in ttft.basis
    planned = plan_experiments(PlanRequest(run=run_id, db=db))
    assert [(t.metric, t.value) for t in planned.targets if t.metric.startswith("ttft")] == [
        ("ttft_ms.p95", 800.0)
    ]


def test_a_run_of_another_model_than_the_workloads_is_noted(tmp_path):
    """The walkthrough pairs a workload (70B in production) with a probe run (8B on the sim):
    the run's numbers fill the workload's gaps, so the mix must be said."""
    from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose

    db = str(tmp_path / "runs.db")
    run_id = _store_slow_ttft_run(db, model="meta-llama/Llama-3.1-8B-Instruct")
    workload = {"deployment": {"model": "meta-llama/Llama-3.3-70B-Instruct", "gpu": "h100"}}
    found = diagnose(DiagnoseRequest(workload=workload, run=run_id, db=db))
    assert any("meta-llama/Llama-3.1-8B-Instruct" in n and "70B" in n for n in found.notes)
    same = {"deployment": {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100"}}
    found = diagnose(DiagnoseRequest(workload=same, run=run_id, db=db))
    assert not any("measured model" in n for n in found.notes)


def test_diagnose_facts_table_keeps_the_decimal_of_a_rate_above_ten(capsys):
    """The facts table printed 18.5 req/s as `18` (no decimals at or above 10) while the probe
    command beside it said 18.5."""
    from pathlib import Path

    from inferwise.server.cli import main

    workload = Path(__file__).parent.parent / "examples/workloads/offline-batch-summarisation.toml"
    assert main(["diagnose", "--workload", str(workload)]) == 0
    out = capsys.readouterr().out
    assert "| `derived.peak_rate_rps` | 18.5 |" in out


def test_predict_shows_the_same_kv_cache_tokens_as_fit_and_formatted_alike(capsys):
    """predict's engine-step table printed `453008` where fit prints `453,008`."""
    import json

    from inferwise.server.cli import main

    args = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100"]
    assert main(["fit", *args, "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)["kv_cache_tokens"]
    assert main(["predict", *args, "--concurrency", "4", "--num-requests", "40"]) == 0
    out = capsys.readouterr().out
    assert f"| KV cache (tokens) · peak use | {tokens:,} · " in out


def test_agentic_budget_says_which_rates_are_tasks_and_which_llm_calls(capsys):
    """With --agent-steps the design load is in LLM calls/s while the highest rate and the
    saturation are per task; all three were printed as "requests/s"."""
    from inferwise.server.cli import main

    steps = (
        '[{"name":"plan","input_tokens":1000,"output_tokens":100},'
        '{"name":"answer","input_tokens":2000,"output_tokens":200}]'
    )
    argv = ["budget", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100"]
    argv += ["--request-rate", "1", "--slo-e2e-ms", "p95=30000", "--agent-steps", steps]
    assert main([*argv, "--num-requests", "200"]) == 0
    out = capsys.readouterr().out
    assert "2 LLM calls/s = 1 tasks/s" in out
    assert "tasks/s per replica** (saturation at" in out
    assert "requests/s" not in out.split("### Agentic task")[0]


def test_sim_of_a_model_accepts_the_context_window_fit_and_predict_assume():
    """`inferwise sim --model ...` reported and enforced max_model_len 32768 while its KV cache,
    batch limits and step times follow the fit at the model's own window (131,072 for Llama
    3.1): the engine a probe measured was not the one fit/predict describe."""
    import httpx

    from inferwise.calculators.fit import FitRequest, estimate_fit
    from inferwise.probes.sim import SimServer

    cfg = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100-sxm-80gb")
    window = estimate_fit(FitRequest(**cfg), with_suggestions=False).max_model_len
    assert window > 32768
    with SimServer(**cfg) as sim:
        listed = httpx.get(sim.base_url + "/v1/models", timeout=10).json()["data"][0]
    assert listed["max_model_len"] == window
    with SimServer(**cfg, max_model_len=4096) as sim:  # an explicit flag still wins
        listed = httpx.get(sim.base_url + "/v1/models", timeout=10).json()["data"][0]
    assert listed["max_model_len"] == 4096


@pytest.mark.parametrize("lazy", [False, True])
def test_mcp_refuses_unknown_arguments_and_words_constraint_errors_in_one_line(lazy) -> None:
    """An MCP caller's misspelt `tp=2` ran silently with tensor_parallel_size 1 (the SDK's
    argument model drops unknown names); a constraint violation came back as pydantic's
    multi-line text with a documentation link."""
    import asyncio

    from mcp.client import Client

    from inferwise.server import mcp_server

    fit = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}

    async def calls():
        async with Client(mcp_server.build_server(lazy_tools=lazy)) as client:
            typo = await client.call_tool("estimate_memory_fit", {**fit, "tp": 2})
            over = await client.call_tool(
                "estimate_memory_fit", {**fit, "gpu_memory_utilization": 2}
            )
            good = await client.call_tool("estimate_memory_fit", {**fit, "tensor_parallel_size": 2})
            return typo, over, good

    typo, over, good = asyncio.run(calls())
    assert typo.is_error and "'tp'" in typo.content[0].text
    assert "tensor_parallel_size" in typo.content[0].text
    text = over.content[0].text
    assert over.is_error and "gpu_memory_utilization" in text
    assert "\n" not in text and "errors.pydantic.dev" not in text
    assert not good.is_error and good.structured_content["tensor_parallel_size"] == 2


def test_mcp_http_on_a_port_in_use_is_a_one_line_usage_error(capsys) -> None:
    """It printed "inferwise MCP (streamable HTTP) on ..." and then uvicorn's bind error, exit 3."""
    import socket

    from inferwise.server.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["mcp", "--transport", "http", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1" in err and "streamable HTTP) on" not in err
    assert len(err.strip().splitlines()) == 1
