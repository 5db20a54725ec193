"""Experiment plans: the required response format, one variable per stage, greenfield sizing,
workload-specific acceptance, honest missing measurements, and the Markdown rendering."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

from inferwise.calculators.errors import InputError
from inferwise.knowledge.planning import PlanRequest, plan_experiments
from inferwise.knowledge.playbooks import get_playbook

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "workloads").glob("*"))
SUPPORT = ROOT / "examples" / "workloads" / "support-chat.json"
RAG = ROOT / "examples" / "workloads" / "rag-long-documents.toml"


def _plan(workload, **kw):
    spec = workload if isinstance(workload, str) else json.dumps(workload)
    return plan_experiments(PlanRequest(workload=spec, **kw))


@pytest.fixture(scope="module")
def plans():
    return {p.stem: _plan(str(p)) for p in EXAMPLES}


def test_every_example_yields_the_full_response_format(plans):
    for name, p in plans.items():
        assert p.assumptions is not None and p.targets and p.baseline, name
        assert len(p.stages) >= 3, name
        assert p.stages[-1].title == "Combined end-to-end validation", name
        crit = p.acceptance_criteria
        for key in ("quality", "tail_latency", "reliability", "security", "cost"):
            assert getattr(crit, key), (name, key)
        assert p.facts_to_verify and all(
            f.source_url.startswith("https://") for f in p.facts_to_verify
        )
        for s in p.stages:
            assert s.change and s.measure and s.expected_tradeoffs and s.acceptance and s.rollback


def test_stages_change_one_variable_each_least_complex_first(plans):
    for name, p in plans.items():
        changes = [s for s in p.stages if s.playbook]
        assert changes, name
        variables = [s.variable for s in changes]
        assert len(variables) == len(set(variables)), name
        complexities = [s.complexity for s in changes]
        assert complexities == sorted(complexities), name
        for s in changes:
            assert s.variable == get_playbook(s.playbook).variable
            flags = [k.flag for k in get_playbook(s.playbook).knobs]
            parts = [part.strip() for f in flags for part in f.split(";")]
            assert any(part in s.change for part in parts), (name, s.playbook)
            # exactly one setting is changed: one backticked flag in "Change only ...: `flag`"
            assert s.change.count("` (") == 1, (name, s.playbook, s.change)
            assert any(m.startswith("inferwise probe") for m in s.measure)
            assert s.decisive_metric


def test_diagnostic_plan_leads_with_the_diagnosed_hypothesis_and_proves_it_first():
    p = _plan(str(SUPPORT))
    assert p.mode == "diagnostic"
    assert p.leading_hypothesis == "queueing" == p.hypotheses[0].id
    baseline = p.stages[0]
    assert baseline.variable.startswith("none")
    assert sum("Proof of 'queueing'" in m for m in baseline.measure) == len(
        p.hypotheses[0].how_to_prove
    )
    assert p.stages[1].hypothesis == "queueing"


def test_targets_and_baseline_side_by_side_with_sources():
    p = _plan(str(SUPPORT))
    targets = {t.metric: t for t in p.targets}
    base = {b.metric: b for b in p.baseline}
    assert targets["ttft_ms.p95"].value == 800 and targets["ttft_ms.p95"].source == "slo"
    assert base["ttft_ms.p95"].value == 6000 and base["ttft_ms.p95"].source == "measured"
    assert targets["requests_per_s"].value == pytest.approx(60)  # 20 req/s x peak_to_mean 3
    assert set(targets) == set(base)


def test_acceptance_uses_the_workloads_own_numbers():
    p = _plan(str(SUPPORT))
    text = json.dumps(p.acceptance_criteria.model_dump())
    for needle in (
        "800 ms",
        "50 ms",
        "15,000 ms",
        "60 req/s",
        "0.999",
        "40 USD/h",
        "eu",
        "support-eval-v3",
        "8 GPUs",
        "90.0 req/s",
    ):
        assert needle in text, needle
    other = _plan({"slo": {"ttft_ms": {"p99": 250}}, "constraints": {"budget_usd_per_hour": 7}})
    other_text = json.dumps(other.acceptance_criteria.model_dump())
    assert "250 ms" in other_text and "7 USD/h" in other_text and "800 ms" not in other_text


def test_greenfield_starts_with_sizing_then_baseline(plans):
    p = plans["rag-long-documents"]
    assert p.mode == "greenfield"
    assert p.stages[0].title.startswith("Size candidate deployments")
    assert p.stages[1].title.startswith("Reproducible baseline")
    assert any(m.startswith("inferwise fit") for m in p.stages[0].measure)
    assert p.sizing, "the recommender's fleets for the candidate GPUs"
    assert {c.gpu for c in p.sizing} <= {"h100-sxm-80gb", "h200-sxm-141gb"}
    for c in p.sizing:  # priced fleets within constraints.max_gpus = 8, each with its command
        assert c.usd_per_hour and c.usd_per_hour > 0 and c.serve_command.startswith("vllm serve")
        assert c.gpus_needed and c.replicas_needed and c.gpus_needed % c.replicas_needed == 0
        assert c.within_max_gpus == (c.gpus_needed <= 8)
    assert any("computed" in a for a in p.assumptions)
    missing = {m.field for m in p.missing_measurements}
    assert {"observations.ttft_ms", "observations.itl_ms"} <= missing
    for b in p.baseline:
        assert b.source in ("computed", "missing")  # nothing measured is invented


def test_absent_fields_are_named_never_invented():
    p = _plan({"name": "bare", "deployment": {"model": "Qwen/Qwen3-8B", "gpu": "l40s"}})
    missing = {m.field: m for m in p.missing_measurements}
    for field in (
        "traffic.arrival_rate_rps",
        "traffic.input_tokens",
        "traffic.output_tokens",
        "slo.ttft_ms",
        "product.quality_floor",
    ):
        assert field in missing, field
        assert missing[field].how_to_measure and missing[field].why
    assert "inferwise probe" in missing["observations.ttft_ms"].how_to_measure
    assert not [b for b in p.baseline if b.value is not None]
    assert any("No latency SLO" in line for line in p.acceptance_criteria.tail_latency)
    probe = next(m for m in p.stages[1].measure if m.startswith("inferwise probe"))
    assert "<p50 prompt tokens>" in probe  # a placeholder, not a made-up length


def test_missing_measurements_follow_the_leading_hypotheses():
    p = _plan({"symptoms": ["itl_high", "ttft_normal"], "observations": {"itl_ms": {"p95": 90}}})
    fields = {m.field for m in p.missing_measurements}
    assert "observations.kv_cache_usage" in fields  # needed to confirm kv_cache_pressure
    m = next(m for m in p.missing_measurements if m.field == "observations.kv_cache_usage")
    assert "vllm:kv_cache_usage_perc" in m.how_to_measure


def test_hypothesis_can_be_forced_and_must_be_known():
    p = _plan(str(SUPPORT), hypothesis="prefix_cache_miss")
    assert p.leading_hypothesis == "prefix_cache_miss"
    assert any(s.hypothesis == "prefix_cache_miss" for s in p.stages[1:-1])
    with pytest.raises(InputError) as info:
        _plan(str(SUPPORT), hypothesis="slowness")
    assert info.value.field == "hypothesis" and "queueing" in info.value.accepted


def test_playbooks_already_in_place_are_not_proposed(plans):
    p = plans["support-chat"]  # enable_prefix_caching = true
    assert "prefix_caching" not in {s.playbook for s in p.stages}


def test_url_goes_into_probe_commands():
    p = _plan(str(SUPPORT), url="http://10.0.0.5:8000")
    assert any("inferwise probe http://10.0.0.5:8000 " in m for s in p.stages for m in s.measure)


def test_markdown_rendering_has_the_contract_order(plans):
    from inferwise.server.render import render

    for name, p in plans.items():
        md = render("plan.md.j2", p)
        heads = re.findall(r"^## (\d)\.", md, flags=re.M)
        assert heads == ["1", "2", "3", "4", "5", "6"], name
        assert "| metric | target | baseline |" in md
        assert "### Stage 1:" in md and "Combined end-to-end validation" in md


def test_cli_plan_json_and_markdown(capsys):
    from inferwise.server import cli

    assert cli.main(["plan", "--workload", str(SUPPORT), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "assumptions",
        "missing_measurements",
        "targets",
        "baseline",
        "hypotheses",
        "stages",
        "acceptance_criteria",
        "facts_to_verify",
    ):
        assert key in out
    assert set(out["acceptance_criteria"]) == {
        "quality",
        "tail_latency",
        "reliability",
        "security",
        "cost",
    }
    assert cli.main(["diagnose", "--workload", str(SUPPORT)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# Bottleneck diagnosis: support-chat")
    assert "### 1. `queueing`" in md


def test_workload_may_be_passed_as_an_object_as_mcp_clients_do():
    wl = json.loads(SUPPORT.read_text())
    as_object = plan_experiments(PlanRequest(workload=wl))
    as_text = _plan(str(SUPPORT))
    assert as_object.leading_hypothesis == as_text.leading_hypothesis
    with pytest.raises(InputError) as info:
        plan_experiments(PlanRequest(workload={"traffic": {"arrival_rate_rps": -2}}))
    assert info.value.field == "workload.traffic.arrival_rate_rps"


def test_a_stored_run_supplies_the_measured_baseline(tmp_path):
    from inferwise.probes.records import RequestRecord
    from inferwise.probes.store import RunStore
    from inferwise.probes.summary import summarize

    records = []
    for i in range(30):
        start = i * 0.1
        chunks = [start + 0.9 + 0.03 * k for k in range(40)]
        records.append(
            RequestRecord(
                index=i,
                ok=True,
                start_s=start,
                first_token_s=chunks[0],
                end_s=chunks[-1],
                input_tokens=800,
                output_tokens=40,
                chunk_times_s=chunks,
                chunk_tokens=[1] * 40,
            )
        )
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        run_id = store.create_run(config={"concurrency": 8})
        store.add_requests(run_id, records)
        store.finish_run(run_id, "complete", summarize(records))
    p = plan_experiments(
        PlanRequest(workload='{"slo": {"ttft_ms": {"p95": 500}}}', run=run_id, db=str(db))
    )
    assert p.mode == "diagnostic"
    base = {b.metric: b for b in p.baseline}
    assert base["ttft_ms.p95"].source == "measured"
    assert base["ttft_ms.p95"].value == pytest.approx(900, rel=0.05)
    assert run_id in base["ttft_ms.p95"].note
    # measured TTFT above the target makes the pre-first-token causes the leads
    assert p.leading_hypothesis in {"queueing", "long_prompts", "prefill_compute"}
    assert p.stages[0].hypothesis == p.leading_hypothesis


def test_commands_in_the_plan_are_valid_inferwise_invocations(plans):
    """Flags drift when calculators evolve: every command a plan prints must parse, and the
    sizing commands must run."""
    import shlex

    from inferwise.server import cli
    from inferwise.server.registry import BY_NAME

    p = plans["rag-long-documents"]
    sizing = [m for m in p.stages[0].measure if m.startswith("inferwise ")]
    assert {c.split()[1] for c in sizing} == {"fit", "predict", "budget"}
    for cmd in sizing[:3]:
        argv = shlex.split(cmd.replace("--tensor-parallel-size N", "--tensor-parallel-size 2"))[1:]
        assert cli.main([*argv, "--json"]) == 0, cmd
    probe = BY_NAME["probe"]
    for s in p.stages:
        for m in s.measure:
            if m.startswith("inferwise probe http"):
                argv = shlex.split(m.split("   (")[0])[2:]
                cli.parse_input("probe", probe.input_model, argv, probe.summary)


def test_without_any_hypothesis_the_plan_still_has_three_stages_around_a_load_sweep():
    p = _plan({"traffic": {"arrival_rate_rps": 4, "peak_to_mean": 2}})
    assert p.hypotheses == [] and p.leading_hypothesis is None
    titles = [s.title for s in p.stages]
    assert len(titles) >= 3 and "Load sweep to find the knee" in titles
    sweep = next(s for s in p.stages if s.title == "Load sweep to find the knee")
    assert "--sweep 4,8,12,16 --request-rate" in sweep.measure[0]  # 0.5x..2x the peak of 8


def test_rate_baseline_and_diagnosis_quote_one_capacity(plans):
    """support-chat: no rate meets its SLO on one replica. The baseline must say so and give the
    saturation rate, not print 0 req/s as a computed capacity; and the diagnosis must quote the
    same figure. Where the budget finds a rate (agentic-flow), both quote it x replicas."""
    for name in ("support-chat", "agentic-flow"):
        p = plans[name]
        facts = {f.name: f for f in p.facts}
        base = next(b for b in p.baseline if b.metric == "requests_per_s")
        cap = facts["derived.capacity_rps"].value
        quoted = f"{cap:.3g} req/s the replicas can serve"
        assert any(quoted in e for h in p.hypotheses for e in h.evidence), (name, quoted)
        if name == "support-chat":
            assert facts["budget.max_rate_under_slo"].value == 0
            assert base.value is None and base.source == "computed"
            assert "no rate meets the SLO" in base.note
            assert f"saturation at {cap:.3g} req/s" in base.note
        else:
            assert base.value == pytest.approx(cap, rel=1e-3) and base.value > 0
            assert "max rate under the SLO" in base.note


def test_missing_measurements_never_ask_for_what_the_workload_gives(plans):
    """A listed field must be absent from the file; and an offline job is not asked for
    interactive latency targets (TTFT/ITL) but for throughput."""
    from inferwise.knowledge.workload import get_path, load_workload

    for p in EXAMPLES:
        wl = load_workload(str(p))
        for m in plans[p.stem].missing_measurements:
            assert get_path(wl, m.field) is None, (p.stem, m.field)
    offline = [m.field for m in plans["offline-batch-summarisation"].missing_measurements]
    assert not {"slo.ttft_ms", "slo.itl_ms", "observations.itl_ms"} & set(offline), offline
    assert "observations.requests_per_s" in offline


def test_baseline_pins_exactly_what_the_workload_states(plans):
    """The engine version in the baseline comes from the file; where the file has none the
    plan asks to pin it instead of inventing one."""
    from inferwise.knowledge.workload import load_workload

    for p in EXAMPLES:
        dep = load_workload(str(p)).deployment
        change = plans[p.stem].stages[1 if plans[p.stem].mode == "greenfield" else 0].change
        assert change.startswith("Nothing. Pin "), (p.stem, change)
        if dep is not None and dep.engine and dep.engine_version:
            assert f"engine {dep.engine} {dep.engine_version}," in change, p.stem
        elif dep is not None and dep.engine:
            assert f"engine {dep.engine} (pin the version)" in change, (p.stem, change)
        if dep is not None and dep.model:
            assert f"model {dep.model}," in change


def test_offline_validation_has_no_overload_probe(plans):
    final = plans["offline-batch-summarisation"].stages[-1]
    assert not any("stage=overload" in m for m in final.measure)
    assert any("closed loop" in m for m in final.measure)
    assert any("stage=overload" in m for m in plans["support-chat"].stages[-1].measure)


def test_identical_calculator_questions_are_answered_once_per_call(monkeypatch):
    """A greenfield workload naming its GPU and TP: the analysis of the stated deployment and
    the sizing of the same candidate ask fit/predict/budget identical questions. Each is
    computed once, and the plan is the same as without the memory."""
    import inferwise.knowledge.sizing as sizing

    wl = {
        "traffic": {
            "arrival_rate_rps": 5,
            "input_tokens": {"p50": 2000},
            "output_tokens": {"p50": 200},
        },
        "slo": {"ttft_ms": {"p95": 1000}},
        "deployment": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpu": "h100",
            "tensor_parallel_size": 1,
        },
    }
    computed: list[str] = []
    asked: list[str] = []
    real_compute, real_call = sizing._compute, sizing._call

    def count_compute(outcome, *args, **kw):
        computed.append(outcome.name)
        return real_compute(outcome, *args, **kw)

    def count_call(name, *args, **kw):
        asked.append(name)
        return real_call(name, *args, **kw)

    monkeypatch.setattr(sizing, "_compute", count_compute)
    monkeypatch.setattr(sizing, "_call", count_call)
    # the fit-based sizing (a workload the recommender cannot search): the recommender's own
    # calculations are memoised in calculators.api and tested with it
    import inferwise.knowledge.plan_sizing as plan_sizing

    monkeypatch.setattr(plan_sizing, "_recommended", lambda a: [])
    with_memo = _plan(wl)
    assert len(asked) > len(computed) and sorted(set(computed)) == ["budget", "fit", "predict"]

    @contextlib.contextmanager
    def no_memo():
        yield

    monkeypatch.setattr(sizing, "calculation_scope", no_memo)
    without = _plan(wl)
    assert with_memo.model_dump() == without.model_dump()


def test_the_sizing_stage_recommends_a_candidate_within_max_gpus(plans):
    """The 'computed so far' pick must respect constraints.max_gpus (offline: L40S TP1 fits but
    needs 16 GPUs for the rate; an H100 candidate does it within 8)."""
    for name in ("offline-batch-summarisation", "rag-long-documents"):
        p = plans[name]
        line = next(x for x in p.stages[0].acceptance if x.startswith("Computed so far"))
        m = re.search(r"= (\d+) GPUs at the peak", line)
        assert m, line
        assert int(m.group(1)) <= 8, line
        assert not any("SLO not met at the design load" in n for c in p.sizing for n in c.notes)


def test_each_playbook_stage_changes_one_setting_that_is_its_variable():
    from inferwise.knowledge.plan_stages import knob_lines
    from inferwise.knowledge.playbooks import load_playbooks

    for engine in ("vllm", "sglang"):
        for pb in load_playbooks():
            knobs = knob_lines(pb, engine)
            assert len(knobs) == 1, (engine, pb.id)
            (k,) = knobs
            assert ";" not in k.flag, (engine, pb.id, k.flag)
            var = pb.variable
            if var.startswith("deployment."):
                flag = "--" + var.removeprefix("deployment.").split()[0].replace("_", "-")
                if any(flag in x.flag for x in pb.knobs if x.engine == engine):
                    assert flag in k.flag, (engine, pb.id, k.flag)
            if var.startswith(("application", "gateway", "router")):
                assert k.engine not in ("vllm", "sglang"), (engine, pb.id, k.flag)


def test_agentic_e2e_target_is_per_task_not_per_probe_call(plans):
    """agentic-flow: the E2E target covers a task of 8 calls. Probes (single calls) must not
    check it; the plan says so and gives the task budget command with the workload's target."""
    p = plans["agentic-flow"]
    for s in p.stages:
        for m in s.measure:
            if m.startswith("inferwise probe http"):
                assert "e2e_ms" not in m, m
    note = next(x for x in p.assumptions if x.startswith("Agentic flow"))
    assert "--agent-steps @task.json" in note and "--slo-e2e-ms p95=60000" in note
    assert "--model openai/gpt-oss-120b" in note
    assert any("per task of 8" in x for x in p.acceptance_criteria.tail_latency)


def test_sizing_never_turns_no_rate_meets_the_slo_into_a_replica_count():
    """Sibling of the 0 req/s baseline: a candidate where no rate meets the SLO has no replica
    count (more replicas cannot fix a per-request latency), shows 'none' in the table, and the
    sizing stage says no candidate meets the SLO rather than recommending one."""
    from inferwise.server.render import render

    wl = {
        "traffic": {
            "arrival_rate_rps": 10,
            "input_tokens": {"p50": 3000, "p95": 9000},
            "output_tokens": {"p50": 300},
        },
        # a 9,000-token prompt's prefill alone takes longer than 20 ms on 8 x H100 (~45 ms)
        "slo": {"ttft_ms": {"p95": 20}},
        "constraints": {"gpus": ["l40s", "h100-sxm-80gb"], "max_gpus": 8},
        "deployment": {"model": "meta-llama/Llama-3.1-8B-Instruct"},
    }
    p = _plan(wl)
    assert p.sizing and all(c.max_rate_under_slo == 0 for c in p.sizing if c.fits)
    for c in p.sizing:
        if c.fits:
            assert c.replicas_needed is None and c.gpus_needed is None
            assert any("no rate meets the SLO on one replica" in n for n in c.notes)
    assert any("no candidate meets the SLO" in x for x in p.stages[0].acceptance)
    md = render("plan.md.j2", p)
    assert "| none |" in md and "| 0.00 |" not in md


def _predicted_lines(scenario: str) -> dict[str, list[str]]:
    path = Path(__file__).parent / "scenarios" / scenario
    data = json.loads(path.read_text())
    plan = plan_experiments(PlanRequest(workload=data.get("workload", data)))
    return {
        st.playbook or st.title: [t for t in st.expected_tradeoffs if t.startswith("Predicted")]
        for st in plan.stages
    }


def test_lever_stages_say_what_predict_expects_them_to_buy():
    """Issue 15: a lever stage carries the predicted effect at the workload's own load."""
    restructure = _predicted_lines("11_prefix_cache_miss.json")["prompt_restructuring"]
    assert len(restructure) == 1 and "4% -> 70%" in restructure[0]
    assert "--prefix-cache-hit-rate 0.7" in restructure[0]
    disagg = _predicted_lines("03_prefill_interference.json")["pd_disaggregation"]
    assert len(disagg) == 1 and "--disaggregate 1:1" in disagg[0] and "ITL p95" in disagg[0]
