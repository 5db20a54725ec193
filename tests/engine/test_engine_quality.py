"""Graders against the real llama.cpp test model: its random weights produce random text, so
the graders must fail gracefully (completed requests, graded, not correct), and greedy outputs
must repeat exactly between two runs on the same prompts."""

from __future__ import annotations

import json

import pytest

from inferwise.probes.llamacpp import LlamaServer

pytestmark = pytest.mark.engine

ROWS = [
    {"id": "num", "prompt": "What is 6 times 7?", "expected": 42, "grader": "numeric"},
    {"id": "json", "prompt": "Reply with a JSON object.", "grader": "json_schema",
     "schema": {"type": "object", "required": ["answer"]}},
    {"id": "re", "prompt": "Give an order code.", "expected": r"^ORD-\d{4}$", "grader": "regex"},
    {"id": "mc", "question": "Largest planet?", "choices": ["Mars", "Jupiter", "Venus", "Earth"],
     "answer": 1},
]  # fmt: skip


def test_graders_fail_gracefully_on_random_text_and_greedy_outputs_repeat(
    llama_server: LlamaServer, probe_engine, tmp_path
) -> None:
    from inferwise.probes.consistency import ConsistencyRequest, consistency

    ds = tmp_path / "eval.jsonl"
    ds.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    runs = [
        probe_engine(llama_server, dataset=str(ds), requests=4, output_tokens=16, store_text=True)
        for _ in range(2)
    ]
    for result, records in runs:
        assert result.status == "complete" and not result.errors
        q = result.summary.quality
        assert q is not None and q.graded == 4 and 0 <= q.correct <= 4
        by_id = {r.prompt_id: r for r in records}
        # random tokens are not a JSON object with an "answer" key, nor an ORD-dddd code
        assert by_id["json"].correct is False and by_id["re"].correct is False
        assert all(r.output_sha256 and r.correct is not None for r in records)
    check = consistency(
        ConsistencyRequest(run_ids=[runs[0][0].run_id, runs[1][0].run_id], db=str(probe_engine.db))
    )
    assert check.pairs == 4 and check.identical_share == 1.0, check.divergences
