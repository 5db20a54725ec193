"""Quality graders end to end: the simulated engine echoes known answers, the probe grades
them, the run store keeps pass/fail and hashes, goodput and runs compare use them."""

from __future__ import annotations

import asyncio
import json

import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.runner import ProbeRequest, run_probe
from inferwise.probes.sim import SimServer
from inferwise.probes.store import RunStore


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("INFERWISE_ALLOW_HOSTS", raising=False)


def probe(**kw):
    return asyncio.run(run_probe(ProbeRequest(**kw)))


def write_jsonl(path, rows) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


# Four rows the sim answers right, two it answers wrong, over every grader.
ROWS = [
    {"id": "q1", "prompt": "2+2? [[answer: so it is 4]]", "expected": "4", "grader": "numeric"},
    {"id": "q2", "prompt": "Capital? [[answer: Paris]]", "expected": "paris", "grader": "contains"},
    {"id": "q3", "prompt": "Say yes [[answer: yes]]", "expected": "yes", "grader": "exact"},
    {"id": "q4", "prompt": 'JSON [[answer: {"a": 1}]]', "grader": "json_schema",
     "schema": {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}},
    {"id": "q5", "prompt": "Code? [[answer: code 12]]", "expected": r"^code \d{3}$", "grader": "regex"},
    {"question": "Pick [[answer: The answer is (C)]]", "choices": ["w", "x", "y", "z"], "answer": 1},
]  # fmt: skip


def test_graders_pass_and_fail_end_to_end_and_the_store_keeps_verdicts(tmp_path) -> None:
    ds = write_jsonl(tmp_path / "eval.jsonl", ROWS)
    db = str(tmp_path / "r.db")
    with SimServer(ttft_ms=5, itl_ms=1, echo_answers=True) as sim:
        res = probe(url=sim.base_url, dataset=ds, requests=6, db=db, slo={"ttft_ms": 5000})
    q = res.summary.quality
    assert q is not None and (q.graded, q.correct) == (6, 4), res.errors
    assert q.accuracy == pytest.approx(4 / 6)
    assert 0 < q.ci95_low < 4 / 6 < q.ci95_high < 1
    assert q.by_grader["regex"] == [0, 1] and q.by_grader["choice"] == [0, 1]
    # goodput: every request met the latency target, only the four correct count
    assert res.summary.slo_attainment_pct == pytest.approx(100 * 4 / 6)
    recs = {r.prompt_id: r for r in RunStore(db).requests(res.run_id)}
    assert recs["q1"].correct and recs["q4"].correct and recs["q5"].correct is False
    assert all(r.output_sha256 and r.output_text is None for r in recs.values())
    assert recs["q2"].output_sha256 != recs["q3"].output_sha256


def test_store_text_keeps_the_answer_and_a_graded_reply_ends_where_the_model_ends_it(
    tmp_path,
) -> None:
    ds = write_jsonl(tmp_path / "eval.jsonl", ROWS[:1])
    db = str(tmp_path / "r.db")
    with SimServer(ttft_ms=5, itl_ms=1, echo_answers=True) as sim:
        res = probe(url=sim.base_url, dataset=ds, requests=2, db=db, store_text=True)
    recs = RunStore(db).requests(res.run_id)
    assert [r.output_text for r in recs] == ["so it is 4"] * 2
    assert all(r.output_tokens == 4 for r in recs)  # not padded to max_tokens by ignore_eos
    assert not any("max_tokens asked" in n for n in res.notes)


def test_public_eval_formats_imply_their_grader(tmp_path) -> None:
    from inferwise.probes.prompts import load_dataset

    rows = load_dataset(
        write_jsonl(
            tmp_path / "pub.jsonl",
            [
                {"question": "Tom has 3 [[answer: He has 1,234]]", "answer": "3+1=4\n#### 1,234"},
                {
                    "question": "Sky?",
                    "choices": {"text": ["red", "blue"], "label": ["A", "B"]},
                    "answerKey": "B",
                },
            ],  # fmt: skip
        )
    )
    assert rows[0].grader.name == "numeric" and rows[0].grader.expected == 1234
    assert rows[0].grader.grade("so the answer is 1,234.")
    assert rows[1].grader.name == "choice" and rows[1].grader.expected == "B"
    assert "A. red\nB. blue" in rows[1].prompt and rows[1].grader.grade("Answer: B")
    assert not rows[1].grader.grade("Answer: A")


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"prompt": "x", "expected": "1", "grader": "fuzzy"}, "line 2, field `grader`: unknown"),
        ({"prompt": "x", "expected": "(", "grader": "regex"}, "line 2, field `expected`: invalid"),
        ({"prompt": "x", "grader": "json_schema", "schema": {"type": 5}}, "field `schema`"),
        ({"prompt": "x", "grader": "exact"}, "line 2, field `expected`"),
        ({"prompt": "x", "expected": "four", "grader": "numeric"}, "holds no number"),
        ({"question": "q", "choices": ["a", "b"], "answer": 7}, "outside the 2 choices"),
        ({"prompt": "x", "expected": "y"}, "field `grader`"),
        ({"input_tokens": 9, "expected": "y", "grader": "exact"}, "needs its own text"),
    ],
)
def test_bad_grading_rows_stop_the_probe_before_anything_is_sent(tmp_path, row, needle) -> None:
    ds = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, row])
    with SimServer(ttft_ms=5, itl_ms=1) as sim:
        with pytest.raises(InputError) as err:
            probe(url=sim.base_url, dataset=ds, requests=2, db=str(tmp_path / "r.db"))
        assert sim.send_log == {}  # nothing sent
    assert err.value.field == "dataset" and needle in str(err.value)


def test_cli_exits_2_naming_the_row(tmp_path, capsys) -> None:
    from inferwise.server import cli

    ds = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "x", "expected": "(", "grader": "regex"}])
    assert cli.main(["probe", "http://127.0.0.1:9", "--dataset", ds]) == 2
    assert "line 1, field `expected`" in capsys.readouterr().err


@pytest.fixture
def three_runs(tmp_path):
    """Twelve numeric questions: two runs that echo the right answers (texts stored), one
    that answers with the sim's random words."""
    rows = [
        {"id": f"n{i}", "prompt": f"{i}*2? [[answer: it is {2 * i}]]", "expected": 2 * i,
         "grader": "numeric"}
        for i in range(12)
    ]  # fmt: skip
    ds = write_jsonl(tmp_path / "num.jsonl", rows)
    db = str(tmp_path / "r.db")
    ids = []
    for echo in (True, True, False):
        with SimServer(ttft_ms=5, itl_ms=1, echo_answers=echo) as sim:
            res = probe(
                url=sim.base_url, dataset=ds, requests=12, db=db, store_text=True, output_tokens=8
            )
        ids.append(res.run_id)
    return db, ids


def test_compare_reports_mcnemar_on_shared_prompts_and_calls_a_loss_below_the_floor_a_regression(
    three_runs, tmp_path
) -> None:
    from inferwise.knowledge.quality_gate import compare_runs
    from inferwise.probes.runs import CompareRunsRequest

    db, (good, again, bad) = three_runs
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"product": {"quality_floor": "arith accuracy >= 90%"}}))
    res = compare_runs(CompareRunsRequest(run_ids=[good, again, bad], db=db, workload=str(wl)))
    same, worse = res.candidates
    assert same.quality.accuracy_diff == 0 and same.quality.verdict == "within noise"
    assert not same.regression and same.quality.test == "mcnemar_exact"
    q = worse.quality
    assert (q.baseline_accuracy, q.candidate_accuracy, q.paired_prompts) == (1.0, 0.0, 12)
    assert q.test == "mcnemar_exact" and q.p_value == pytest.approx(2 / 2**12)
    assert q.verdict == "worse" and "quality.accuracy" in worse.worse
    assert q.quality_floor == pytest.approx(0.9) and worse.regression
    assert "below the floor" in worse.regression_reason


def test_compare_without_shared_prompts_uses_the_two_proportion_test() -> None:
    from inferwise.probes.quality import compare_quality, two_proportion_p
    from inferwise.probes.records import RequestRecord

    def recs(prefix, n_ok, n):
        return [
            RequestRecord(index=i, ok=True, start_s=0.0, prompt_id=f"{prefix}{i}", grader="exact",
                          correct=i < n_ok)
            for i in range(n)
        ]  # fmt: skip

    q = compare_quality(recs("a", 80, 100), recs("b", 60, 100), floor=0.7)
    assert q.test == "two_proportion_z" and q.paired_prompts == 0
    assert q.p_value == pytest.approx(two_proportion_p(80, 100, 60, 100))
    assert q.p_value == pytest.approx(0.00203, rel=0.01)  # pooled z = 3.086 for 0.80 vs 0.60
    assert q.verdict == "worse" and q.below_floor
    assert q.diff_ci95_low < -0.2 < q.diff_ci95_high < 0


def test_runs_consistency_counts_identical_outputs_and_finds_the_first_divergence(
    three_runs,
) -> None:
    from inferwise.probes.consistency import ConsistencyRequest, consistency

    db, (good, again, bad) = three_runs
    same = consistency(ConsistencyRequest(run_ids=[good, again], db=db))
    assert (same.pairs, same.identical, same.identical_share) == (12, 12, 1.0)
    assert same.paired_by == "prompt_id" and same.first_divergent_char_min is None
    diff = consistency(ConsistencyRequest(run_ids=[good, bad], db=db))
    assert diff.pairs == 12 and diff.identical == 0 and diff.compared_text == 12
    assert diff.first_divergent_char_min == 0  # "it is 0" vs the sim's words
    assert diff.divergences[0].reference_excerpt.startswith("it is")


def test_wilson_interval_matches_its_closed_form_at_zero_successes() -> None:
    from inferwise.probes.quality import Z95, wilson

    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(Z95**2 / (10 + Z95**2))  # 0.2775
    low, high = wilson(10, 10)
    assert high == pytest.approx(1.0) and low == pytest.approx(10 / (10 + Z95**2))


def test_plan_puts_the_baselines_measured_accuracy_and_the_floor_into_every_change_stage(
    three_runs,
) -> None:
    from inferwise.knowledge.planning import PlanRequest, plan_experiments

    db, (good, _, _) = three_runs
    workload = {
        "product": {"quality_floor": "arithmetic eval", "quality_floor_score": 0.95},
        "slo": {"ttft_ms": {"p95": 500}},
        "observations": {"ttft_ms": {"p95": 2000}, "itl_ms": {"p95": 20}},
        "symptoms": ["ttft_high", "itl_normal"],
    }
    plan = plan_experiments(PlanRequest(workload=workload, run=good, db=db))
    changes = [s for s in plan.stages if not s.variable.startswith("none (measurement")]
    assert changes and all(
        any("Graded accuracy" in x and "100.0%" in x and "95.0%" in x for x in s.acceptance)
        for s in changes
    ), [s.acceptance for s in changes]
    assert any(f"run {good}): 100.0%, 12/12" in x for x in plan.acceptance_criteria.quality)


def test_mcp_probe_grades_the_dataset_and_compare_runs_shows_quality(tmp_path, monkeypatch) -> None:
    from mcp.client import Client

    from inferwise.server import mcp_server

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("INFERWISE_MCP_ALLOW_HOSTS", "127.0.0.1")
    monkeypatch.setenv("INFERWISE_MCP_DATASET_DIR", str(tmp_path))  # the operator's eval folder
    write_jsonl(tmp_path / "eval.jsonl", ROWS)
    server = mcp_server.build_server()

    async def go(url):
        async with Client(server) as client:
            args = {"url": url, "dataset": "eval.jsonl", "requests": 6}
            a = await client.call_tool("probe_endpoint", args)
            b = await client.call_tool("probe_endpoint", args)
            ids = [a.structured_content["run_id"], b.structured_content["run_id"]]
            cmp = await client.call_tool("compare_runs", {"run_ids": ids, "quality_floor": 0.9})
            bad = await client.call_tool("probe_endpoint", {**args, "dataset": "../outside.jsonl"})
            return a, cmp, bad

    with SimServer(ttft_ms=5, itl_ms=1, echo_answers=True) as sim:
        a, cmp, bad = asyncio.run(go(sim.base_url))
    assert not a.is_error, a.content[0].text
    assert a.structured_content["summary"]["quality"]["correct"] == 4
    cand = cmp.structured_content["candidates"][0]
    assert cand["quality"]["test"] == "mcnemar_exact" and cand["regression"] is True
    assert "Graded accuracy" in cmp.content[0].text and "Regression" in cmp.content[0].text
    assert bad.is_error and "outside the operator's dataset folder" in bad.content[0].text


@pytest.mark.parametrize(
    ("row", "output", "passes"),
    [
        ({"expected": -3.5, "grader": "numeric"}, "x = 2, so x - 5.5 = -3.5", True),
        ({"expected": "#### 1,000", "grader": "numeric"}, "It costs $1,000.", True),
        ({"expected": 10, "grader": "numeric", "tolerance": 0.5}, "about 10.4 apples", True),
        ({"expected": 10, "grader": "numeric"}, "10 apples, then 12", False),  # the last number
        ({"expected": 10, "grader": "numeric"}, "no number here", False),
        ({"expected": "Paris", "grader": "exact"}, "  Paris\n", True),
        ({"expected": "Paris", "grader": "exact"}, "paris", False),
        ({"expected": "B", "grader": "choice"}, "B) Jupiter is the largest.", True),
        ({"expected": "B", "grader": "choice"}, "I think the answer is B.", True),
        ({"expected": "B", "grader": "choice"}, "Answer: (C), not B", False),
        ({"expected": "B", "grader": "choice"}, "no letter given", False),
        (
            {"grader": "json_schema", "schema": {"type": "object", "required": ["a"]}},
            'Here it is:\n```json\n{"a": 1}\n```',
            True,
        ),  # fmt: skip
        (
            {"grader": "json_schema", "schema": {"type": "object", "required": ["a"]}},
            '{"b": 1}',
            False,
        ),  # fmt: skip
        ({"grader": "json_schema", "schema": {"type": "object"}}, "not json", False),
    ],
)
def test_each_grader_reads_the_answer_the_way_its_docstring_says(row, output, passes) -> None:
    from inferwise.probes.graders import read_grading

    grader = read_grading({"prompt": "p", **row}, 1).grader
    assert grader is not None and grader.grade(output) is passes


def test_export_carries_the_verdict_and_hash(three_runs) -> None:
    from inferwise.probes.runs import ExportRunRequest, export_run

    db, (good, _, _) = three_runs
    out = export_run(ExportRunRequest(run_id=good, db=db))
    rows = [json.loads(x) for x in out.content.splitlines()]
    assert all(
        r["correct"] is True and r["grader"] == "numeric" and r["output_sha256"] for r in rows
    )
