"""Values a user or an assistant passes in end up inside the command lines that plans and
recommendations print, which people copy into a shell. A URL must be a plain http(s) base URL
(no credentials, no shell characters); every other value is shell-quoted, so a model path
with a space or a ``;`` stays one argument."""

from __future__ import annotations

import json
import shlex

import pytest
from pydantic import ValidationError

from inferwise.calculators.catalog import MODELS_DIR
from inferwise.knowledge.planning import PlanRequest, plan_experiments
from inferwise.knowledge.recommending import RecommendRequest, recommend_deployment
from inferwise.probes.policy import command_url

WORKLOAD = {"name": "chat", "deployment": {"model": "meta-llama/Llama-3.1-8B-Instruct"}}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1; rm -rf ~",
        "http://127.0.0.1:8000/$(id)",
        "http://127.0.0.1:8000/`id`",
        "file:///etc/passwd",
        "127.0.0.1:8000",
        "http://127.0.0.1:99999",
    ],
)
def test_plan_refuses_a_url_that_is_not_a_plain_base_url(url):
    with pytest.raises(ValidationError) as e:
        PlanRequest(workload=json.dumps(WORKLOAD), url=url)
    assert e.value.errors()[0]["loc"] == ("url",)


def test_plan_prints_the_url_without_credentials_or_query():
    assert command_url("https://user:secret@api.example.com/v1?key=abc#x") == (
        "https://api.example.com/v1"
    )
    plan = plan_experiments(
        PlanRequest(workload=json.dumps(WORKLOAD), url="http://user:secret@127.0.0.1:8000/v1")
    )
    text = plan.model_dump_json()
    assert "secret" not in text
    assert "inferwise probe http://127.0.0.1:8000/v1 " in text


def test_plan_quotes_a_model_name_with_shell_characters():
    wl = {**WORKLOAD, "deployment": {"model": "my model;id"}}
    plan = plan_experiments(PlanRequest(workload=json.dumps(wl), url="http://127.0.0.1:8000"))
    probes = [m for s in plan.stages for m in s.measure if m.startswith("inferwise probe ")]
    assert probes
    for line in probes:
        argv = shlex.split(line.split("   (")[0])
        assert argv[argv.index("--model") + 1] == "my model;id"


def test_recommend_quotes_a_local_model_path(tmp_path):
    """A local checkpoint directory whose name holds a space and a ``;``: the serve and probe
    lines keep it as one argument."""
    src = json.loads((MODELS_DIR / "meta-llama--Llama-3.1-8B-Instruct.json").read_text())
    model_dir = tmp_path / "my model;id"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(src["config"]))
    out = recommend_deployment(
        RecommendRequest(
            model=[str(model_dir)],
            gpus=["h100-sxm-80gb"],
            request_rate=2.0,
            input_tokens=500,
            output_tokens=100,
            slo_ttft_ms={"p95": 2000},
        )
    )
    c = out.recommended
    assert shlex.split(c.serve_command)[2] == str(model_dir)
    argv = shlex.split(c.verify_command)
    assert argv[argv.index("--model") + 1] == str(model_dir)
