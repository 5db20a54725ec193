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
                {"question": "Sky?", "choices": {"text": ["red", "blue"], "label": ["A", "B"]},
                 "answerKey": "B"},
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
