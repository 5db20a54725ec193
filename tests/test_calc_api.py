"""The in-process calculator API a search calls: same answers as the calculators, memoised,
copies that callers may change, and a local config that changes is read again."""

from __future__ import annotations

import json
import os

from inferwise.calculators import api
from inferwise.calculators.budget import BudgetRequest, decompose_budget
from inferwise.calculators.catalog import load_model
from inferwise.calculators.fit import FitRequest, estimate_fit
from inferwise.calculators.predict import PredictRequest, predict_performance

MODEL = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100"}


def test_memoised_answers_equal_the_calculators_and_are_copies() -> None:
    api.clear_memos()
    req = FitRequest(**MODEL, max_model_len=8192)
    first, second = api.fit(req), api.fit(req)
    assert first == second == estimate_fit(req)
    assert api._FIT.hits == 1 and api._FIT.misses == 1
    first.warnings.append("changed by a caller")
    assert "changed by a caller" not in api.fit(req).warnings
    p = PredictRequest(**MODEL, concurrency=4, num_requests=60)
    assert api.predict(p) == predict_performance(p)
    b = BudgetRequest(**MODEL, request_rate=2, slo_e2e_ms={"p95": 9000}, num_requests=60)
    assert api.budget(b) == decompose_budget(b)


def test_suggestions_are_part_of_the_key() -> None:
    api.clear_memos()
    req = FitRequest(**MODEL)
    assert api.fit(req, with_suggestions=False).suggestions == []
    assert api.fit(req).suggestions  # not the suggestion-less answer from the memo


def test_an_edited_local_config_is_read_again(tmp_path) -> None:
    api.clear_memos()
    config = dict(load_model(MODEL["model"]).config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    req = FitRequest(model=str(path), gpu="h100", max_model_len=8192)
    before = api.fit(req, with_suggestions=False)
    path.write_text(json.dumps({**config, "num_hidden_layers": 16}))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    after = api.fit(req, with_suggestions=False)
    assert after.kv_bytes_per_token == before.kv_bytes_per_token // 2
