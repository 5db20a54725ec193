"""The MCP door: every tool, resource and prompt through a real client, in-memory, stdio and HTTP."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import sys
import threading
import time

import httpx
import jsonschema
import pytest

from inferwise.server import mcp_server
from inferwise.server.registry import BY_TOOL

# made per test session: no token-looking literal in the source
TOKEN = secrets.token_urlsafe(18)

FIT = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
WORKLOAD = {
    "name": "support-chat",
    "traffic": {
        "mode": "online",
        "arrival_rate_rps": 5,
        "input_tokens": {"p50": 1500, "p95": 4000},
        "output_tokens": {"p50": 250, "p95": 600},
    },
    "slo": {"ttft_ms": {"p95": 800}, "itl_ms": {"p95": 50}},
    "deployment": {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "engine": "vllm",
        "gpu": "h100-sxm-80gb",
    },
    "observations": {
        "ttft_ms": {"p50": 2100, "p95": 6000},
        "itl_ms": {"p50": 28, "p95": 35},
        "queue_depth": 40,
        "concurrency": 64,
    },
    "symptoms": ["ttft_high", "itl_normal"],
}


# Llama 4's multimodal checkpoint: refused over its vision tower unless the text model is asked for
SCOUT = {
    "model": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "gpu": "h100",
    "tensor_parallel_size": 4,
    "max_model_len": 32768,
    "input_tokens": 1000,
    "output_tokens": 200,
    "concurrency": 8,
}


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("INFERWISE_MCP_ALLOW_HOSTS", "127.0.0.1")
    return mcp_server.build_server()


async def _call(server, name, args, mode="auto"):
    from mcp.client import Client

    async with Client(server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        return tools[name], await client.call_tool(name, args)


def test_every_design_tool_is_listed_with_schemas_and_annotations(server) -> None:
    from mcp.client import Client

    async def go():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in run(go())}
    assert set(tools) == {
        "estimate_memory_fit",
        "predict_performance",
        "decompose_latency_budget",
        "probe_endpoint",
        "diagnose_bottleneck",
        "plan_experiments",
        "search_knowledge",
        "list_runs",
        "compare_runs",
        "recommend_deployment",
        "render_report",
        "calibrate_deployment",
    }
    for tool in tools.values():
        assert tool.output_schema, tool.name
        assert tool.description and len(tool.description) > 80, tool.name
        assert tool.annotations is not None and tool.annotations.title
        props = tool.input_schema["properties"]
        # flat parameters named like the CLI flags; never the store path or key variable
        assert "db" not in props and "api_key_env" not in props
    assert "tensor_parallel_size" in tools["estimate_memory_fit"].input_schema["properties"]
    assert tools["estimate_memory_fit"].annotations.read_only_hint is True
    assert tools["probe_endpoint"].annotations.open_world_hint is True
    assert tools["probe_endpoint"].annotations.read_only_hint is False


@pytest.mark.parametrize(
    "name,args",
    [
        ("estimate_memory_fit", FIT),
        (
            "predict_performance",
            {**FIT, "input_tokens": 1000, "output_tokens": 200, "concurrency": 8},
        ),
        ("predict_performance", {**SCOUT, "hf_overrides": {"model_type": "llama4_text"}}),
        ("search_knowledge", {"query": "prefix caching hit rate"}),
        ("diagnose_bottleneck", {"workload": json.dumps(WORKLOAD)}),
        ("plan_experiments", {"workload": json.dumps(WORKLOAD)}),
        ("list_runs", {}),
    ],
)
def test_valid_calls_return_structured_content_matching_the_schema(server, name, args) -> None:
    tool, result = run(_call(server, name, args))
    assert not result.is_error, result.content[0].text
    jsonschema.validate(result.structured_content, tool.output_schema)
    BY_TOOL[name].output_model.model_validate(result.structured_content)
    assert result.content[0].type == "text" and len(result.content[0].text) > 20


@pytest.mark.parametrize(
    "name,args,needle",
    [
        ("estimate_memory_fit", {"model": "no-such/model", "gpu": "h100"}, "model"),
        ("estimate_memory_fit", {**FIT, "gpu": "h900"}, "gpu"),
        ("estimate_memory_fit", {**FIT, "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ("estimate_memory_fit", {"model": FIT["model"]}, "gpu"),
        ("predict_performance", {**FIT, "input_tokens": -5, "output_tokens": 10}, "input_tokens"),
        # calculators word their hints for the CLI; over MCP a flag that is one of the tool's
        # arguments is named as the argument
        ("predict_performance", SCOUT, "pass hf_overrides model_type=llama4_text"),
        (
            "decompose_latency_budget",
            {**FIT, "request_rate": 1},
            "accepted: slo_e2e_ms p95=15000, slo_ttft_ms p95=800",
        ),
        ("estimate_memory_fit", {**FIT, "hf_overrides": {"num_hidden_layers": 10**9}}, "layers"),
        (
            "plan_experiments",
            {"workload": '{"traffic": {"arrival_rate_rps": -1}}'},
            "arrival_rate_rps",
        ),
        ("plan_experiments", {"workload": '{"symptoms": ["sad"]}'}, "symptoms"),
        ("compare_runs", {"run_ids": ["nope-1", "nope-2"]}, "run"),
    ],
)
def test_bad_input_is_a_tool_error_naming_the_argument(server, name, args, needle) -> None:
    _, result = run(_call(server, name, args))
    assert result.is_error
    assert needle in result.content[0].text


def test_probe_tool_refuses_targets_outside_the_operators_allowlist(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("INFERWISE_MCP_ALLOW_HOSTS", "")
    server = mcp_server.build_server()
    _, result = run(
        _call(server, "probe_endpoint", {"url": "http://127.0.0.1:9", "model": "m", "requests": 1})
    )
    assert result.is_error and "url" in result.content[0].text
    _, result = run(
        _call(
            server,
            "probe_endpoint",
            {"url": "http://169.254.169.254/v1", "model": "m", "requests": 1},
        )
    )
    assert result.is_error


def test_probe_tool_measures_the_simulated_engine_reports_progress_and_stores_the_run(
    server,
) -> None:
    from mcp.client import Client

    from inferwise.probes.sim import SimConfig, SimServer

    progress: list[float] = []

    async def go(url):
        async with Client(server) as client:
            result = await client.call_tool(
                "probe_endpoint",
                {"url": url, "model": "sim", "requests": 6, "concurrency": 2, "output_tokens": 8},
                progress_callback=lambda p, total, msg: progress.append(p),
            )
            runs = await client.call_tool("list_runs", {})
            return result, runs

    with SimServer(SimConfig(ttft_ms=20, itl_ms=5)) as sim:
        result, runs = run(go(sim.base_url))
    assert not result.is_error, result.content[0].text
    summary = result.structured_content["summary"]
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert result.structured_content["run_id"] in json.dumps(runs.structured_content)
    assert progress, "no progress notifications"


def test_resources_and_prompts(server) -> None:
    from mcp.client import Client

    async def go():
        async with Client(server) as client:
            listed = {str(r.uri) for r in (await client.list_resources()).resources}
            templates = {
                t.uri_template for t in (await client.list_resource_templates()).resource_templates
            }
            index = json.loads(
                (await client.read_resource("inferwise://knowledge")).contents[0].text
            )
            doc = (
                (await client.read_resource(f"inferwise://knowledge/{index[0]['id']}"))
                .contents[0]
                .text
            )
            gpus = json.loads(
                (await client.read_resource("inferwise://catalog/gpus")).contents[0].text
            )
            models = json.loads(
                (await client.read_resource("inferwise://catalog/models")).contents[0].text
            )
            prompts = {p.name for p in (await client.list_prompts()).prompts}
            review = await client.get_prompt("inference_review", {"product": "support chat"})
            size = await client.get_prompt("size_deployment", {"model": "Qwen/Qwen3-8B"})
            return listed, templates, index, doc, gpus, models, prompts, review, size

    listed, templates, index, doc, gpus, models, prompts, review, size = run(go())
    assert {
        "inferwise://knowledge",
        "inferwise://catalog/gpus",
        "inferwise://catalog/models",
        "inferwise://runs",
    } <= listed
    assert {"inferwise://knowledge/{doc_id}", "inferwise://runs/{run_id}"} <= templates
    assert len(index) >= 20 and doc.startswith("# ")
    assert any(g["id"] == "h100-sxm-80gb" for g in gpus)
    assert any(m["hf_id"] == "meta-llama/Llama-3.1-8B-Instruct" for m in models)
    assert {"inference_review", "size_deployment"} <= prompts
    assert "estimate_memory_fit" in review.messages[0].content.text
    assert "Qwen/Qwen3-8B" in size.messages[0].content.text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_smoke(mode, tmp_path) -> None:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "inferwise.server", "mcp"],
        env={"INFERWISE_DB": str(tmp_path / "r.db")},
    )

    async def go():
        async with Client(params, mode=mode) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("estimate_memory_fit", FIT)
            bad = await client.call_tool("estimate_memory_fit", {**FIT, "tensor_parallel_size": 0})
            return names, result, bad

    names, result, bad = run(go())
    assert "estimate_memory_fit" in names
    assert not result.is_error and "kv_cache_tokens" in result.structured_content
    assert bad.is_error and "tensor_parallel_size" in bad.content[0].text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(tmp_path, monkeypatch):
    import uvicorn

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("TEST_MCP_TOKEN", TOKEN)
    port = _free_port()
    config = mcp_server.MCPConfig(transport="http", port=port, token_env="TEST_MCP_TOKEN")
    app = mcp_server.http_app(config)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    uv.should_exit = True
    thread.join(timeout=5)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_smoke_with_token(http_server, mode) -> None:
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    async def go():
        import httpx2

        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            transport = streamable_http_client(http_server, http_client=http)
            async with Client(transport, mode=mode) as client:
                return await client.call_tool("estimate_memory_fit", FIT)

    result = run(go())
    assert not result.is_error and result.structured_content["kv_cache_tokens"] > 0


def test_http_refuses_foreign_host_and_missing_token(http_server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    no_token = httpx.post(http_server, json=body, headers=headers, timeout=10)
    assert no_token.status_code == 401
    auth = {**headers, "Authorization": f"Bearer {TOKEN}"}
    foreign = httpx.post(
        http_server, json=body, headers={**auth, "Host": "evil.example:80"}, timeout=10
    )
    assert foreign.status_code in (403, 421)


def test_non_local_bind_needs_allowed_host() -> None:
    from inferwise.calculators.errors import InputError

    with pytest.raises(InputError, match="allowed-host"):
        mcp_server.http_app(mcp_server.MCPConfig(transport="http", host="0.0.0.0"))
    security = mcp_server.transport_security(
        mcp_server.MCPConfig(transport="http", host="0.0.0.0", allowed_host=["box.lan:8765"])
    )
    assert security.enable_dns_rebinding_protection and "box.lan:8765" in security.allowed_hosts


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_cancelled_probe_keeps_the_finished_requests_as_interrupted(server, tmp_path, mode) -> None:
    from mcp.client import Client

    from inferwise.probes.sim import SimConfig, SimServer
    from inferwise.probes.store import RunStore

    async def go(url):
        started = asyncio.Event()

        async def on_progress(done, total, message):
            if done >= 2:
                started.set()

        async with Client(server, mode=mode) as client:
            call = asyncio.create_task(
                client.call_tool(
                    "probe_endpoint",
                    {
                        "url": url,
                        "model": "m",
                        "requests": 200,
                        "concurrency": 2,
                        "output_tokens": 50,
                    },
                    progress_callback=on_progress,
                )
            )
            await asyncio.wait_for(started.wait(), 30)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.5)  # the server's cleanup runs in its finally blocks

    with SimServer(SimConfig(ttft_ms=20, itl_ms=5)) as sim:
        run(go(sim.base_url))
    with RunStore(tmp_path / "runs.db") as store:
        (stored,) = store.list_runs()
        assert stored.status == "interrupted"
        assert 2 <= len(store.requests(stored.run_id)) < 200


def test_unknown_resource_ids_are_errors_that_name_the_closest_match(server) -> None:
    from mcp.client import Client
    from mcp.shared.exceptions import MCPError

    async def read_error(uri) -> str:
        try:
            async with Client(server) as client:
                await client.read_resource(uri)
        except MCPError as exc:
            return str(exc)
        except BaseExceptionGroup as group:  # the in-process client nests it in task groups
            found = group.subgroup(MCPError)
            assert found is not None, repr(group)
            while isinstance(found, BaseExceptionGroup):
                found = found.exceptions[0]
            return str(found)
        raise AssertionError(f"{uri} was read")

    assert "closest: speculative-decoding" in run(read_error("inferwise://knowledge/spec-decoding"))
    assert "unknown run" in run(read_error("inferwise://runs/no-such-run"))


def test_the_tool_listing_stays_cheap_for_an_assistant(server) -> None:
    """tools/list is paid by every session before the first question: at most 40,000
    characters for all tools (issue 17), with the contract fields still described."""
    import json

    from mcp.client import Client

    from inferwise.server.mcp_schema import KEY_OUTPUT_FIELDS

    async def go():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    tools = run(go())
    listing = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    assert len(json.dumps(listing)) <= 40_000
    for tool in listing:
        out = tool["outputSchema"]
        assert out["additionalProperties"] is True  # the full result still conforms
        assert set(out["properties"]) == set(KEY_OUTPUT_FIELDS[tool["name"]]), tool["name"]
    fit = next(t for t in listing if t["name"] == "estimate_memory_fit")
    props = fit["inputSchema"]["properties"]
    assert props["tensor_parallel_size"]["description"].startswith("Tensor-parallel degree")
    assert props["max_model_len"]["type"] == ["integer", "null"]
    assert all("title" not in p for p in props.values())
    predict = next(t for t in listing if t["name"] == "predict_performance")
    assert "description" not in predict["inputSchema"]["properties"]["gpu"]
    assert "estimate_memory_fit" in predict["description"]


@pytest.mark.parametrize(
    "name,args,field",
    [
        ("diagnose_bottleneck", {"workload": "/etc/hostname"}, "workload"),
        ("plan_experiments", {"workload": "~/.bashrc"}, "workload"),
        ("predict_performance", {**FIT, "trace": "/etc/hostname"}, "trace"),
        ("probe_endpoint", {"url": "http://127.0.0.1:9", "trace": "/nonexistent/x.jsonl"}, "trace"),
        (
            "calibrate_deployment",
            {**FIT, "name": "c1", "from_file": ["../../../etc/passwd"]},
            "from_file",
        ),
        ("estimate_memory_fit", {"model": "/etc", "gpu": "h100"}, "model"),
    ],
)
def test_file_arguments_outside_the_servers_folder_are_refused_unopened(
    server, tmp_path, monkeypatch, name, args, field
) -> None:
    """A caller may name files only inside the folder the operator allows (or the server's
    start folder): /etc/hostname is refused with the same words whether or not it exists, so
    no file outside is opened or probed for existence."""
    monkeypatch.setenv("INFERWISE_MCP_FILES_DIR", str(tmp_path))
    _, result = run(_call(server, name, args))
    assert result.is_error
    text = result.content[0].text
    assert f"argument '{field}'" in text and "outside the folder this server reads" in text


def test_file_arguments_inside_the_folder_and_inline_workloads_still_work(
    server, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("INFERWISE_MCP_FILES_DIR", str(tmp_path))
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"name": "x", "deployment": {"model": FIT["model"]}}))
    for args in ({"workload": str(wl)}, {"workload": wl.read_text()}):
        _, result = run(_call(server, "plan_experiments", args))
        assert not result.is_error, result.content[0].text


def test_no_local_cluster_and_no_prompt_memory_cap_from_a_tool_call(server) -> None:
    """A local Dask cluster would start processes on the server, and the prompt-memory cap is
    the operator's (INFERWISE_MCP_MAX_PROMPT_TOKENS_IN_FLIGHT), like the other caps."""
    from mcp.client import Client

    async def go():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            local = await client.call_tool(
                "probe_endpoint", {"url": "http://127.0.0.1:9", "cluster": "local:8"}
            )
            return tools, local

    tools, local = run(go())
    assert "max_prompt_tokens_in_flight" not in tools["probe_endpoint"].input_schema["properties"]
    assert local.is_error and "argument 'cluster'" in local.content[0].text
