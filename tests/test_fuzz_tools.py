"""Fuzzing every tool of the registry: whatever the arguments, a result or a worded error,
in bounded time, and a result that matches its own output schema.

Each example starts from a valid call and replaces a few arguments with values from
:mod:`fuzzing` (extremes inside the bounds, values outside them, hostile strings and
deep JSON), so the calculators behind validation are reached, not only the validation.
The same examples go through the CLI, which must exit 0, 1 or 2 with no traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
from pathlib import Path

import jsonschema
import pytest
from fuzzing import for_field, model_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwise.server.mcp_server import _exposed_fields, make_tool_function
from inferwise.server.registry import BY_TOOL

LIMIT_S = 10.0
EXAMPLES = int(os.environ.get("INFERWISE_FUZZ_EXAMPLES", "100"))
"""Examples per tool; CI runs 100, a deeper local run sets more."""
BENCH_RESULTS = Path(__file__).parent / "data" / "bench_results"
DEPLOYMENT = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100"}
WORKLOAD = {
    "traffic": {"arrival_rate_rps": 2, "input_tokens": {"p50": 800}, "output_tokens": {"p50": 200}},
    "slo": {"ttft_ms": {"p95": 800}},
    "deployment": {**DEPLOYMENT, "engine": "vllm"},
}
VALID = {
    "estimate_memory_fit": DEPLOYMENT,
    "predict_performance": {**DEPLOYMENT, "concurrency": 4, "num_requests": 60},
    "decompose_latency_budget": {
        **DEPLOYMENT,
        "request_rate": 2,
        "slo_e2e_ms": {"p95": 8000},
        "num_requests": 60,
    },
    "diagnose_bottleneck": {"workload": json.dumps(WORKLOAD)},
    "plan_experiments": {"workload": json.dumps(WORKLOAD)},
    "search_knowledge": {"query": "prefix caching"},
    "list_runs": {},
    "compare_runs": {"run_ids": ["a", "b"]},
    "render_report": {"run_ids": ["latest"]},
    "calibrate_deployment": {
        **DEPLOYMENT,
        "name": "fuzz",
        "from_file": [str(BENCH_RESULTS / "vllm_c1.json"), str(BENCH_RESULTS / "vllm_c4.json")],
    },
    "recommend_deployment": {
        "model": ["meta-llama/Llama-3.2-1B-Instruct"],
        "gpus": ["l4"],
        "request_rate": 2,
        "input_tokens": 500,
        "output_tokens": 100,
        "slo_ttft_ms": {"p95": 1000},
        "top": 1,
    },
}
SLOW = {"recommend_deployment": (8, 130.0)}
"""Tools that search: (examples, seconds per call); their own compute budget is 120 s."""
TOOLS = [name for name in BY_TOOL if name in VALID]


def fuzz(examples: int):
    """Hypothesis settings for these tests: no deadline per example (the 10 s limit is
    checked per call), no example database. The default run draws the same examples every
    time (CI must not turn red on a new draw it never saw locally); a deeper run with
    INFERWISE_FUZZ_EXAMPLES set explores afresh."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize="INFERWISE_FUZZ_EXAMPLES" not in os.environ,
        suppress_health_check=list(HealthCheck),
    )


def test_every_tool_but_the_probe_is_fuzzed() -> None:
    assert set(BY_TOOL) - set(TOOLS) == {"probe_endpoint"}  # probed against hostile servers


def mutations(tool: str) -> st.SearchStrategy[dict]:
    fields = _exposed_fields(BY_TOOL[tool])
    names = sorted(fields)
    return st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries(
            {n: for_field(n, fields[n].annotation, fields[n].metadata) for n in chosen}
        )
    )


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


POOL = concurrent.futures.ThreadPoolExecutor(4)


def call_tool(tool: str, args: dict):
    """The tool's result or its ToolError, from a thread, within the tool's time limit."""
    from mcp.server.mcpserver.exceptions import ToolError

    fn = make_tool_function(BY_TOOL[tool])

    async def go():
        try:
            return await fn(**args)
        except ToolError as exc:
            return exc

    limit = SLOW.get(tool, (0, LIMIT_S))[1]
    return POOL.submit(asyncio.run, go()).result(timeout=limit)


@pytest.mark.parametrize("tool", TOOLS)
def test_fuzzed_arguments_give_a_result_or_a_worded_error_in_bounded_time(
    tool, tmp_path_factory, monkeypatch
) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path_factory.mktemp("db") / "runs.db"))
    schema = BY_TOOL[tool].output_model.model_json_schema(mode="serialization")

    @fuzz(SLOW[tool][0] if tool in SLOW else EXAMPLES)
    @given(mutations(tool))
    def check(mutation: dict) -> None:
        result = call_tool(tool, {**VALID[tool], **mutation})
        if isinstance(result, ToolError):
            text = str(result)
            assert text and "Traceback" not in text and "internal error" not in text, text
            return
        data = result.structured_content
        assert _finite(data), "a NaN or infinity in the output (null in JSON)"
        jsonschema.validate(json.loads(json.dumps(data)), schema)

    check()


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--request-rate", "5", "--burstiness", "1e-310"],
        ["budget", "--request-rate", "1e-320", "--slo-e2e-ms", "p95=1000"],
        ["budget", "--request-rate", "2", "--slo-itl-ms", "p95=1e308"],
        ["fit", "--gpu", ""],
        ["fit", "--hf-overrides", "max_position_embeddings=1e309"],
        ["fit", "--hf-overrides", "num_hidden_layers=1000000000"],
        ["fit", "--model", "/dev/zero"],
        ["fit", "--model", "x" * 10_000],
        [
            "budget",
            "--request-rate",
            "1",
            "--slo-e2e-ms",
            "p95=9000",
            "--agent-steps",
            json.dumps([{"name": "a", "input_tokens": 10**18, "output_tokens": 5}]),
        ],
        [
            "budget",
            "--request-rate",
            "1",
            "--slo-e2e-ms",
            "p95=9000",
            "--agent-steps",
            "[" * 5000 + "]" * 5000,
        ],
        ["runs", "compare", "a", "b", "--seed", "-10000000000000000000000000000"],
        ["plan", "--workload", '{"a": ' * 3000 + "1" + "}" * 3000],
    ],
)
def test_reported_pathological_cli_inputs_exit_2_at_once(argv, capsys) -> None:
    import time

    from inferwise.server.cli import main

    deployment = []
    if argv[0] in ("fit", "predict", "budget"):
        deployment = [f"--{k}={v}" for k, v in DEPLOYMENT.items() if f"--{k}" not in argv]
    t0 = time.monotonic()
    rc = main([*argv, *deployment])
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < LIMIT_S
    assert rc == 2, err
    assert err.count("\n") == 1 and "internal error" not in err and "Traceback" not in err


def test_a_fifo_as_model_is_refused_without_opening_it(tmp_path, capsys) -> None:
    import os

    from inferwise.server.cli import main

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert main(["fit", "--model", str(fifo), "--gpu", "h100"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_binary_nan_and_huge_integer_configs_are_input_errors(tmp_path, capsys) -> None:
    from inferwise.server.cli import main

    cases = {
        "binary.json": b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe",
        "nan.json": b'{"model_type": "llama", "hidden_size": NaN}',
        "digits.json": b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}",
        "deep.json": b'{"model_type": "llama", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert main(["fit", "--model", str(path), "--gpu", "h100"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("inferwise fit: --model:") and err.count("\n") == 1, err


def test_a_workload_file_over_the_size_cap_is_refused_before_parsing(tmp_path, capsys) -> None:
    from inferwise.server.cli import main

    big = tmp_path / "w.json"
    big.write_text('{"name": "' + "x" * (5 << 20) + '"}')
    assert main(["plan", "--workload", str(big)]) == 2
    assert "limit is 4 MiB" in capsys.readouterr().err


def to_argv(tool: str, args: dict) -> list[str]:
    """The CLI spelling of a tool call: one flag per argument, as a user would type it."""
    from inferwise.server.cli import _is_structured, _unwrap_optional, flag_name

    op = BY_TOOL[tool]
    argv = op.name.split()
    for name, value in args.items():
        info = op.input_model.model_fields[name]
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = [] if extra.get("cli_positional") else [flag_name(name)]
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag_name(name) if value else "--no-" + name.replace("_", "-"))
        elif _is_structured(_unwrap_optional(info.annotation)) or (
            isinstance(value, dict | list) and name == "workload"
        ):
            argv += [*flag, json.dumps(value)]
        elif isinstance(value, dict):
            argv += [*flag, *(f"{k}={v}" for k, v in value.items())] if value else []
        elif isinstance(value, list):
            argv += [*flag, *map(str, value)] if value else []
        else:
            argv += [*flag, str(value)]
    return argv


@pytest.mark.parametrize("tool", TOOLS)
def test_fuzzed_command_lines_exit_0_1_or_2_in_bounded_time(tool, tmp_path_factory, monkeypatch):
    import contextlib
    import io

    from inferwise.server.cli import main

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path_factory.mktemp("db") / "runs.db"))

    @fuzz(max(20, EXAMPLES // 3))
    @given(mutations(tool))
    def check(mutation: dict) -> None:
        argv = to_argv(tool, {**VALID[tool], **mutation})
        err = io.StringIO()

        def run() -> int:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                return main(argv)

        # a search tool's bound is its own (SLOW): `--gpus` left empty searches every GPU
        rc = POOL.submit(run).result(timeout=SLOW.get(tool, (0, LIMIT_S))[1])
        text = err.getvalue()
        assert rc in (0, 1, 2), (rc, text)
        assert "internal error" not in text and "Traceback" not in text, text
        if rc:
            assert text.strip().count("\n") == 0, text  # one line

    check()


@pytest.mark.parametrize("tool", ["diagnose_bottleneck", "plan_experiments"])
def test_fuzzed_workload_files_give_a_plan_or_a_worded_error(tool, tmp_path_factory, monkeypatch):
    """Workloads of the right shape with extreme values (1e308 targets, zero rates, huge
    token counts): the reasoning over them must stay finite and worded."""
    from mcp.server.mcpserver.exceptions import ToolError

    from inferwise.knowledge.workload import Workload

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path_factory.mktemp("db") / "runs.db"))
    schema = BY_TOOL[tool].output_model.model_json_schema(mode="serialization")

    @fuzz(EXAMPLES)
    @given(model_dict(Workload))
    def check(workload) -> None:
        workload.setdefault("deployment", WORKLOAD["deployment"])
        result = call_tool(tool, {"workload": json.dumps(workload)})
        if isinstance(result, ToolError):
            assert "internal error" not in str(result), str(result)
            return
        assert _finite(result.structured_content)
        jsonschema.validate(json.loads(json.dumps(result.structured_content)), schema)

    check()
