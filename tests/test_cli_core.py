"""The CLI generator: flags come from the input model, errors are one line, exit codes follow DESIGN."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError, OperationalError
from inferwise.server import cli
from inferwise.server.registry import OPERATIONS, Operation


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    latency_ms: float = Field(ge=0)


class Demo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(json_schema_extra={"cli_positional": True}, description="target")
    tensor_parallel_size: int = Field(default=1, ge=1)
    rate: float | None = Field(default=None, gt=0)
    endpoint: Literal["chat", "completions"] = "chat"
    enforce_eager: bool = False
    sweep: list[float] | None = None
    label: dict[str, str] | None = None
    duration_s: float | None = Field(
        default=None, gt=0, json_schema_extra={"cli_aliases": ["--duration"]}
    )
    steps: list[Step] | None = None


class DemoOut(BaseModel):
    echo: dict
    failed: bool = False


def demo_func(req: Demo) -> DemoOut:
    if req.url == "explode":
        raise OperationalError("every request failed")
    if req.url == "bad":
        raise InputError(
            "tensor_parallel_size", "must divide 32 attention heads", "1, 2, 4, 8, 16, 32"
        )
    return DemoOut(echo=req.model_dump(mode="json"), failed=req.url == "fail")


def _parse(argv: list[str]) -> Demo:
    model, _ = cli.parse_input("demo", Demo, argv, "test")
    return model


def test_flags_follow_field_names_and_types() -> None:
    got = _parse(
        [
            "http://x",
            "--tensor-parallel-size",
            "4",
            "--rate",
            "inf",
            "--endpoint",
            "completions",
            "--enforce-eager",
            "--sweep",
            "1,2",
            "4",
            "--label",
            "gpu=h100",
            "--label",
            "engine=vllm",
            "--duration",
            "30",
        ]
    )
    assert got.url == "http://x"
    assert got.tensor_parallel_size == 4
    assert got.rate == float("inf")
    assert got.endpoint == "completions"
    assert got.enforce_eager is True
    assert got.sweep == [1.0, 2.0, 4.0]
    assert got.label == {"gpu": "h100", "engine": "vllm"}
    assert got.duration_s == 30


def test_structured_fields_take_json_or_a_file(tmp_path) -> None:
    got = _parse(["u", "--steps", '[{"name": "search", "latency_ms": 120}]'])
    assert got.steps == [Step(name="search", latency_ms=120)]
    f = tmp_path / "steps.toml"
    f.write_text('[[x]]\nname = "a"\nlatency_ms = 1\n')
    with pytest.raises(InputError, match="steps"):
        _parse(["u", "--steps", "{not json"])
    f2 = tmp_path / "steps.json"
    f2.write_text(json.dumps([{"name": "tool", "latency_ms": 5}]))
    assert _parse(["u", "--steps", f"@{f2}"]).steps[0].name == "tool"


def test_validation_errors_name_the_flag() -> None:
    with pytest.raises(InputError) as exc:
        _parse(["u", "--tensor-parallel-size", "0"])
    assert "--tensor-parallel-size" in str(exc.value)
    with pytest.raises(InputError) as exc:
        _parse(["u", "--steps", '[{"name": "a", "latency_ms": -1}]'])
    assert "--steps.0.latency_ms" in str(exc.value)


def test_nan_and_empty_lists_are_named_for_what_they_are() -> None:
    """'nan' for a number is not 'out of range', and a list flag given empty is not 'not
    given' (that would widen a search to everything)."""
    with pytest.raises(InputError, match="rate: NaN is not a number"):
        _parse(["u", "--rate", "nan"])
    with pytest.raises(InputError, match="sweep: given without a value"):
        _parse(["u", "--sweep", ",,"])
    assert _parse(["nan"]).url == "nan"  # text fields keep the word


def test_usage_errors_are_one_line(capsys) -> None:
    with pytest.raises(cli.UsageError) as exc:
        _parse(["u", "--endpoint", "grpc"])
    assert "\n" not in str(exc.value)
    assert "chat" in str(exc.value)


@pytest.fixture
def demo_op(monkeypatch):
    op = Operation(
        name="demo-op",
        summary="test op",
        input_ref=f"{__name__}:Demo",
        output_ref=f"{__name__}:DemoOut",
        func_ref=f"{__name__}:demo_func",
        template="__missing__.md.j2",
        exit_nonzero_field="failed",
    )
    monkeypatch.setattr(cli, "OPERATIONS", [*OPERATIONS, op])
    return op


def test_exit_codes(demo_op, capsys) -> None:
    assert cli.main(["demo-op", "ok", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["echo"]["url"] == "ok"
    assert cli.main(["demo-op", "fail", "--json"]) == 1
    capsys.readouterr()
    assert cli.main(["demo-op", "explode", "--json"]) == 1
    assert "every request failed" in capsys.readouterr().err
    assert cli.main(["demo-op", "bad", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tensor-parallel-size" in err and "accepted: 1, 2" in err
    assert cli.main(["demo-op", "ok", "--no-such-flag"]) == 2
    assert cli.main(["nonsense"]) == 2
    assert "accepted:" in capsys.readouterr().err


def test_top_level_help_lists_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "inferwise.server", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in [
        "fit",
        "predict",
        "budget",
        "probe",
        "plan",
        "diagnose",
        "kb search",
        "runs compare",
        "mcp",
        "sim",
        "demo",
    ]:
        assert f"  {name} " in out
