"""`probe --trace` against the reference servers, `workload --from-trace`, and the trace
through predict, budget and plan."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import httpx
import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.runner import ProbeRequest, run_probe
from inferwise.probes.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"
sys.path.insert(0, str(ROOT))

from bench.refserver import RefServer  # noqa: E402
from bench.trace_replay import arrival_errors_ms, write_trace  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("INFERWISE_ALLOW_HOSTS", raising=False)


def probe(**kw):
    kw.setdefault("metrics_interval_s", 0)
    return asyncio.run(run_probe(ProbeRequest(**kw)))


def test_replay_keeps_the_trace_schedule_at_the_server_and_stores_its_name(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, requests=40, rate_per_s=25, seed=3)
    db = str(tmp_path / "r.db")
    with RefServer(ttft_lo_ms=2, ttft_hi_ms=5, itl_ms=1) as srv:
        res = probe(
            url=srv.base_url, model="ref-model", trace=str(trace), calibrate=False,
            store_text=True, db=db,
        )  # fmt: skip
        log = httpx.get(srv.base_url + "/_log", trust_env=False).json()
    assert res.summary.completed == 40, res.errors
    records = RunStore(db).requests(res.run_id)
    sched = sorted(r.scheduled_s for r in records)
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    want = [r["timestamp"] / 1000 for r in rows]
    # the trace's own gaps, from the run's start: no drift
    assert [s - sched[0] for s in sched] == pytest.approx([w - want[0] for w in want], abs=1e-9)
    errors = arrival_errors_ms(records, log)
    assert len(errors) == 40
    errors.sort()
    assert errors[len(errors) // 2] <= 10 and errors[-1] <= 60  # loose: a shared CI machine
    config = RunStore(db).get_run(res.run_id).config
    info = config["trace_replay"]
    assert info["name"] == "t.jsonl" and info["format"] == "mooncake" and info["requests"] == 40
    assert len(info["sha256"]) == 64 and info["time_scale"] == 1.0
    assert res.trace == info and res.load.startswith("trace replay t.jsonl (mooncake, 40 requests)")


def test_time_scale_window_and_request_cap(tmp_path) -> None:
    db = str(tmp_path / "r.db")
    with RefServer(ttft_lo_ms=1, ttft_hi_ms=1, itl_ms=1) as srv:
        res = probe(
            url=srv.base_url, model="ref-model", trace=str(DATA / "mooncake.jsonl"),
            trace_time_scale=2, trace_start=0.2, trace_duration=2, requests=3,
            warmup_requests=2, calibrate=False, db=db,
        )  # fmt: skip
    recs = RunStore(db).requests(res.run_id)
    warm = [r for r in recs if r.warmup]
    recs = sorted((r for r in recs if not r.warmup), key=lambda r: r.scheduled_s)
    assert len(warm) == 2 and res.summary.completed == 3
    assert [r.output_tokens for r in recs] == [10, 6, 16]  # rows 3-5 (the cap stops at 3)
    gaps = [b.scheduled_s - a.scheduled_s for a, b in zip(recs, recs[1:], strict=False)]
    assert gaps == pytest.approx([0.125, 0.35])  # (0.5-0.25)/2, (1.2-0.5)/2


def _prompts_of(trace: str, tmp_path: Path) -> list[str]:
    from inferwise.calculators.traces import load_trace
    from inferwise.probes.prompts import LengthSpec, Workload
    from inferwise.probes.trace_replay import TracePrompts

    t = load_trace(trace)
    w = Workload(input_len=LengthSpec(1), output_len=None, trace=TracePrompts(t, 0), salt=7)
    return [w.item(i).text.split() for i in range(len(t))]


def test_shared_hash_ids_are_exactly_shared_prompt_prefixes(tmp_path) -> None:
    p = _prompts_of(str(DATA / "mooncake.jsonl"), tmp_path)
    assert [len(x) for x in p] == [1100, 1300, 600, 1100, 300, 700]  # 1 token a word
    assert p[0][:1024] == p[1][:1024] and p[0][1024:1100] != p[1][1024:1100]  # [0,1,2] / [0,1,3]
    assert p[0][:512] == p[2][:512] and p[0][512:600] != p[2][512:600]  # [0,1] / [0,4]
    assert p[3] == p[0]  # the same hash ids and length: the same prompt
    assert p[4][:300] != p[0][:300]  # [5] shares nothing


def test_the_server_prefix_cache_sees_the_traces_reuse(tmp_path) -> None:
    from inferwise.probes.sim import SimServer

    unshared = tmp_path / "unshared.jsonl"
    rows = [json.loads(x) for x in (DATA / "mooncake.jsonl").read_text().splitlines()]
    ids = iter(range(100, 200))
    for r in rows:  # the same lengths and times, every block its own
        r["hash_ids"] = [next(ids) for _ in r["hash_ids"]]
    unshared.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hits = {}
    for name in ("mooncake.jsonl", "unshared"):
        path = str(DATA / name) if name != "unshared" else str(unshared)
        with SimServer(ttft_ms=2, itl_ms=1) as sim:
            res = probe(
                url=sim.base_url, trace=path, metrics_interval_s=0.1, db=str(tmp_path / "r.db")
            )
        m = res.server_metrics
        hits[name] = m["prefix_cache_hits"] / m["prefix_cache_queries"]
    assert hits["unshared"] < 0.05
    assert 0.45 < hits["mooncake.jsonl"] < 0.7  # 3336 of 5100 trace tokens (+ template tokens)


def test_a_bad_trace_sends_nothing(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 5, "input_tokens": 9, "output_tokens": 1}\n'
        '{"timestamp": 4, "input_tokens": 9, "output_tokens": 1}\n'
    )
    with RefServer() as srv:
        with pytest.raises(InputError, match="row 2: timestamp goes back in time"):
            probe(url=srv.base_url, model="ref-model", trace=str(bad), db=str(tmp_path / "r.db"))
        assert httpx.get(srv.base_url + "/_log", trust_env=False).json() == []


def test_requests_longer_than_the_servers_context_are_refused_before_the_load(tmp_path) -> None:
    from inferwise.probes.sim import SimServer

    with SimServer(ttft_ms=1, itl_ms=1, max_model_len=1200) as sim:
        with pytest.raises(InputError, match="row 2: input 1300 \\+ output 8 tokens"):
            probe(url=sim.base_url, trace=str(DATA / "mooncake.jsonl"), db=str(tmp_path / "r.db"))
        assert sim.send_log == {}  # no completion request reached it


def test_trace_and_a_rate_or_a_sweep_do_not_mix() -> None:
    for extra in ({"request_rate": 2.0}, {"concurrency": 4}, {"sweep": [1, 2]}):
        with pytest.raises(ValueError, match="a trace sets the load"):
            ProbeRequest(url="http://127.0.0.1:1", trace="x.jsonl", **extra)
    with pytest.raises(ValueError, match="trace_start needs a trace"):
        ProbeRequest(url="http://127.0.0.1:1", trace_start=3)


def test_worker_processes_replay_the_same_trace(tmp_path) -> None:
    db = str(tmp_path / "r.db")
    with RefServer(ttft_lo_ms=1, ttft_hi_ms=1, itl_ms=1) as srv:
        res = probe(
            url=srv.base_url, model="ref-model", trace=str(DATA / "mooncake.jsonl"),
            calibrate=False, workers=2, db=db,
        )  # fmt: skip
    assert res.summary.completed == 6, (res.errors, res.notes)
    recs = RunStore(db).requests(res.run_id)
    assert sorted(r.output_tokens for r in recs) == [6, 8, 9, 10, 12, 16]


# --------------------------------------------------------------------------- the other doors


def _cli(capsys, *args: str) -> tuple[int, str]:
    from inferwise.server import cli

    try:
        code = cli.main(list(args))
    except SystemExit as exc:  # argparse refuses a bad choice this way
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_workload_from_trace_writes_a_file_plan_replays(tmp_path, capsys) -> None:
    out = tmp_path / "w.json"
    code, err = _cli(
        capsys, "workload", "--from-trace", str(DATA / "mooncake.jsonl"), "-o", str(out)
    )
    assert code == 0, err
    doc = json.loads(out.read_text())
    traffic = doc["traffic"]
    assert traffic["arrival_rate_rps"] == 4.0 and traffic["peak_to_mean"] > 1
    assert traffic["shared_prefix_fraction"] == pytest.approx(3336 / 5100, abs=1e-4)
    assert traffic["input_tokens"]["max"] == 1300 and traffic["trace"]["format"] == "mooncake"
    assert len(traffic["trace"]["sha256"]) == 64
    from inferwise.knowledge.planning import PlanRequest, plan_experiments

    plan = plan_experiments(PlanRequest(workload=str(out)))
    baseline = next(s for s in plan.stages if s.title.startswith("Reproducible baseline"))
    probe_line = next(m for m in baseline.measure if m.startswith("inferwise probe"))
    assert f"--trace {DATA / 'mooncake.jsonl'}" in probe_line and "--request-rate" not in probe_line


def test_cli_bad_trace_input_exits_2_naming_the_row(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:01,5,1\n2024-05-10 00:00:00,5,1\n"
    )
    code, err = _cli(capsys, "workload", "--from-trace", str(bad))
    assert code == 2 and "row 3: timestamp goes back in time" in err
    code, err = _cli(capsys, "workload", "--from-trace", str(bad), "--trace-format", "sharegpt")
    assert code == 2 and "trace-format" in err
    code, err = _cli(capsys, "predict", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "h100",
                     "--trace", str(DATA / "mooncake.jsonl"), "--max-model-len", "1200")  # fmt: skip
    assert code == 2 and "row 2: input 1300 + output 8 tokens" in err


def test_predict_trace_simulates_its_bursts(tmp_path) -> None:
    from inferwise.calculators.predict import PredictRequest, predict_performance

    rng = random.Random(0)
    burst, smooth = [], []
    for i in range(400):  # the same mean rate (10 req/s): bursts of 40 at once, or Poisson
        burst.append({"timestamp": (i // 40) * 4.0, "input_tokens": 500, "output_tokens": 50})
    t = 0.0
    for _ in range(400):
        t += rng.expovariate(10)
        smooth.append({"timestamp": t, "input_tokens": 500, "output_tokens": 50})
    p99 = {}
    for name, rows in (("burst", burst), ("smooth", smooth)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        res = predict_performance(
            PredictRequest(model="Qwen/Qwen2.5-7B-Instruct", gpu="h100", trace=str(path))
        )
        assert res.load.mode == "trace" and res.load.num_requests == 400
        assert res.load.trace["name"] == f"{name}.jsonl"
        p99[name] = res.ttft_ms.p99
    assert p99["burst"] > 3 * p99["smooth"], p99


def test_budget_trace_is_bounded_and_says_so(tmp_path) -> None:
    from inferwise.calculators.budget import BudgetRequest, decompose_budget

    path = tmp_path / "long.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": i * 0.1, "input_tokens": 500, "output_tokens": 20}) + "\n"
            for i in range(1500)
        )
    )
    res = decompose_budget(
        BudgetRequest(
            model="Qwen/Qwen2.5-7B-Instruct", gpu="h100", trace=str(path), slo_e2e_ms={"p95": 5000}
        )
    )
    assert res.design_request_rate == pytest.approx(1000 / 99.9, rel=1e-3)
    assert any("the first 1,000 of 1,500" in a for a in res.assumptions)
    assert res.max_rate_under_slo and res.max_rate_under_slo > res.design_request_rate


def test_mcp_predict_and_budget_take_a_trace_and_its_listed_once_options(tmp_path, monkeypatch):
    from mcp.client import Client

    from inferwise.server import mcp_server

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    server = mcp_server.build_server()
    trace = str(DATA / "mooncake.jsonl")

    async def go():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            pred = await client.call_tool(
                "predict_performance",
                {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "h100", "trace": trace,
                 "trace_time_scale": 2},
            )  # fmt: skip
            bad = await client.call_tool(
                "decompose_latency_budget",
                {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "h100", "trace": trace,
                 "max_model_len": 1200, "slo_e2e_ms": {"p95": 5000}},
            )  # fmt: skip
            return tools, pred, bad

    tools, pred, bad = asyncio.run(go())
    for name in ("predict_performance", "decompose_latency_budget", "probe_endpoint"):
        props = tools[name].input_schema["properties"]
        assert "trace" in props and "trace_time_scale" not in props  # named in the description
        assert "trace_time_scale" in tools[name].description
    assert not pred.is_error, pred.content[0].text
    load = pred.structured_content["load"]
    assert load["mode"] == "trace" and load["request_rate"] == pytest.approx(8.0)  # 2x speed
    assert bad.is_error and "row 2: input 1300 + output 8 tokens" in bad.content[0].text


@pytest.mark.parametrize("flag", ["input_tokens", "output_tokens", "concurrency", "request_rate"])
def test_predict_refuses_lengths_or_a_load_next_to_a_trace(flag) -> None:
    """A trace carries its own arrivals and lengths: a length or load given beside it would be
    silently ignored, so it is refused naming the field."""
    from pydantic import ValidationError

    from inferwise.calculators.predict import PredictRequest

    with pytest.raises(ValidationError, match=f"give trace or {flag}"):
        PredictRequest(
            model="Qwen/Qwen2.5-7B-Instruct",
            gpu="h100",
            trace=str(DATA / "mooncake.jsonl"),
            **{flag: 7},
        )
