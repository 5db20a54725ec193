"""The workload file: strict schema, JSON/TOML/inline loading, and input errors users can act on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferwise.calculators.errors import InputError
from inferwise.knowledge.vocabulary import HYPOTHESES, SYMPTOMS
from inferwise.knowledge.workload import Workload, get_path, load_workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "workloads").glob("*"))


def _err(spec: str) -> InputError:
    with pytest.raises(InputError) as info:
        load_workload(spec)
    return info.value


def test_examples_cover_the_five_products_and_validate():
    names = {p.stem for p in EXAMPLES}
    assert {
        "support-chat",
        "rag-long-documents",
        "code-assistant",
        "agentic-flow",
        "offline-batch-summarisation",
    } <= names
    for path in EXAMPLES:
        wl = load_workload(str(path))
        assert wl.name == path.stem
        assert wl.traffic is not None and wl.traffic.arrival_rate_rps is not None
        assert wl.product is not None and wl.product.quality_floor


def test_json_file_toml_file_and_inline_json_give_the_same_model(tmp_path):
    data = {
        "traffic": {"arrival_rate_rps": 5, "input_tokens": {"p50": 800, "p95": 3000}},
        "slo": {"ttft_ms": {"p95": 500}},
        "symptoms": ["ttft_high"],
    }
    js = tmp_path / "w.json"
    js.write_text(json.dumps(data))
    tm = tmp_path / "w.toml"
    tm.write_text(
        "symptoms = ['ttft_high']\n[traffic]\narrival_rate_rps = 5\n"
        "input_tokens = { p50 = 800, p95 = 3000 }\n[slo]\nttft_ms = { p95 = 500 }\n"
    )
    a, b, c = load_workload(str(js)), load_workload(str(tm)), load_workload(json.dumps(data))
    assert a == b == c
    assert get_path(a, "traffic.input_tokens.p95") == 3000
    assert get_path(a, "observations.ttft_ms") is None


def test_empty_workload_is_valid_everything_optional():
    assert load_workload("{}") == Workload()


@pytest.mark.parametrize(
    ("spec", "field", "accepted_contains"),
    [
        (
            '{"traffic": {"arival_rate_rps": 3}}',
            "workload.traffic.arival_rate_rps",
            "arrival_rate_rps",
        ),
        (
            '{"observations": {"ttft_ms": {"p95": 1, "p96": 2}}}',
            "workload.observations.ttft_ms.p96",
            "p95",
        ),
        ('{"sloo": {}}', "workload.sloo", "slo"),
        ('{"symptoms": ["ttft_high", "ttft_slow"]}', "workload.symptoms.1", "ttft_high"),
        ('{"suspected_causes": ["queuing"]}', "workload.suspected_causes.0", "queueing"),
        ('{"deployment": {"engine": "vlm"}}', "workload.deployment.engine", "vllm"),
        ('{"traffic": {"mode": "batch"}}', "workload.traffic.mode", "offline"),
    ],
)
def test_typos_and_unknown_ids_name_the_dotted_path_and_the_accepted_values(
    spec, field, accepted_contains
):
    err = _err(spec)
    assert err.field == field
    assert err.accepted and accepted_contains in err.accepted


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ('{"traffic": {"arrival_rate_rps": -1}}', "workload.traffic.arrival_rate_rps"),
        ('{"traffic": {"peak_to_mean": 0.5}}', "workload.traffic.peak_to_mean"),
        ('{"observations": {"gpu_util": 45}}', "workload.observations.gpu_util"),
        ('{"slo": {"ttft_ms": {"p95": "fast"}}}', "workload.slo.ttft_ms.p95"),
        ('{"slo": {"ttft_ms": 800}}', "workload.slo.ttft_ms"),
        ('{"deployment": {"tensor_parallel_size": 0}}', "workload.deployment.tensor_parallel_size"),
        ('{"symptoms": "ttft_high"}', "workload.symptoms"),
    ],
)
def test_wrong_types_and_out_of_range_values_name_the_field(spec, field):
    assert _err(spec).field == field


def test_every_vocabulary_id_is_accepted():
    wl = load_workload(
        json.dumps({"symptoms": list(SYMPTOMS), "suspected_causes": list(HYPOTHESES)})
    )
    assert wl.symptoms == list(SYMPTOMS)


def test_malformed_unreadable_and_non_object_files(tmp_path):
    bad_json = tmp_path / "w.json"
    bad_json.write_text('{"traffic": {')
    assert "not valid JSON" in _err(str(bad_json)).message
    bad_toml = tmp_path / "w.toml"
    bad_toml.write_text("traffic = [")
    assert "not valid TOML" in _err(str(bad_toml)).message
    assert "no such file" in _err(str(tmp_path / "missing.json")).message
    assert _err(str(tmp_path)).field == "workload"  # a folder is not a file
    assert "JSON object" in _err("[1, 2]").message
    assert "not valid JSON" in _err("{oops").message
    binary = tmp_path / "w.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert _err(str(binary)).field == "workload"


@pytest.mark.parametrize(
    "argv",
    [
        ["diagnose", "--workload", '{"traffic": {"arival_rate_rps": 3}}'],
        ["plan", "--workload", '{"traffic": {"arrival_rate_rps": -3}}'],
        ["plan", "--workload", "/definitely/not/here.json"],
        ["diagnose", "--workload", '{"symptoms": ["slow"]}'],
        ["plan", "--workload", "{}", "--hypothesis", "slowness"],
        ["diagnose"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    from inferwise.server import cli

    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert out == ""


def test_cli_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    bad = tmp_path / "w.json"
    bad.write_text('{"deployment": {"enigne": "vllm"}}')
    proc = subprocess.run(
        [sys.executable, "-m", "inferwise.server", "plan", "--workload", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "workload.deployment.enigne" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"traffic": {"input_tokens": {"p50": 5000, "p95": 10}}}, "traffic.input_tokens"),
        ({"observations": {"ttft_ms": {"p50": 900, "p99": 3}}}, "observations.ttft_ms"),
        ({"deployment": {"replicas": 0}}, "deployment.replicas"),
    ],
)
def test_a_measured_distribution_cannot_decrease_and_a_deployment_serves(workload, field):
    """Observed percentiles that fall (p95 below p50) or a deployment of zero replicas cannot
    describe a running system: refused naming the field, not diagnosed."""
    with pytest.raises(InputError) as e:
        load_workload(json.dumps(workload))
    assert field in str(e.value)


def test_targets_may_be_redundant():
    """A p50 target above the p95 one is implied by it, not contradictory."""
    wl = load_workload(json.dumps({"slo": {"ttft_ms": {"p50": 900, "p95": 100}}}))
    assert wl.slo is not None and wl.slo.ttft_ms is not None and wl.slo.ttft_ms.p95 == 100
