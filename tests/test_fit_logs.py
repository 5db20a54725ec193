"""Regression against real vLLM start-up logs (tests/data/vllm_logs.toml).

Each case was copied from a public issue, PR or page; bench/fit_accuracy.py
prints the full error table. Tolerances here are the accuracy the tool
promises: weights within 2 %, KV tokens from vLLM's own "Available KV cache
memory" within 2 % (the figure is rounded to 0.01 GiB), the modelled
available KV memory within 10 % or 0.6 GiB, and the same fit verdict.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fit_accuracy", ROOT / "bench" / "fit_accuracy.py")
fit_accuracy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit_accuracy)

CASES = fit_accuracy.load_cases()
ROWS = {c["id"]: (c, fit_accuracy.replay(c)) for c in CASES}


def test_the_collection_covers_the_families_it_claims():
    kinds = {k for c in CASES for k in c.get("kind", [])}
    assert {"dense", "moe", "mla", "sliding-window", "tp", "v0"} <= kinds
    assert {"quantized-fp8", "quantized-int8", "quantized-mxfp4"} <= kinds
    for c in CASES:
        assert c["source"].startswith("https://"), c["id"]
        assert c["vllm_version"][0].isdigit(), c["id"]


@pytest.mark.parametrize(
    "case_id", [c["id"] for c in CASES if "weights_gib" in c.get("logged", {})]
)
def test_weights_match_model_loading_took(case_id):
    _, row = ROWS[case_id]
    pred, logged = row["weights_gib"]
    assert abs(pred - logged) / logged < 0.02, (pred, logged)


@pytest.mark.parametrize(
    "case_id",
    [
        c["id"]
        for c in CASES
        if "kv_tokens" in c.get("logged", {}) and c["logged"].get("available_kv_gib", 0) > 0
    ],
)
def test_kv_tokens_from_the_logged_memory(case_id):
    case, row = ROWS[case_id]
    pred, logged = row["kv_tokens_formula"]
    if case.get("formula_exact", True):
        assert abs(pred - logged) / logged < 0.02, (pred, logged)
    else:
        # vLLM took the minimum over ranks; rank 0's memory can only overstate it
        assert pred >= logged


@pytest.mark.parametrize(
    "case_id",
    [
        c["id"]
        for c in CASES
        if "max_concurrency" in c.get("logged", {}) and "kv_tokens_formula" in ROWS[c["id"]][1]
    ],
)
def test_max_concurrency_from_the_logged_memory(case_id):
    _, row = ROWS[case_id]
    pred, logged = row["max_concurrency_formula"]
    assert abs(pred - logged) <= max(0.02 * logged, 0.01), (pred, logged)


def test_mla_request_needs_what_vllm_said():
    _, row = ROWS["deepseek-v2-lite-mla-tp2"]
    pred, logged = row["needed_kv_gib"]
    assert abs(pred - logged) / logged < 0.02


@pytest.mark.parametrize(
    "case_id",
    [
        c["id"]
        for c in CASES
        if "available_kv_gib" in c.get("logged", {})
        and "available_kv_gib" in ROWS[c["id"]][1]
        and c.get("e2e_comparable", True)
    ],
)
def test_modelled_available_kv_memory(case_id):
    _, row = ROWS[case_id]
    pred, logged = row["available_kv_gib"]
    assert abs(pred - logged) <= max(0.10 * abs(logged), 0.6), (pred, logged)


@pytest.mark.parametrize(
    "case_id", [c["id"] for c in CASES if "activation_gib" in c.get("logged", {})]
)
def test_modelled_activation_peak(case_id):
    _, row = ROWS[case_id]
    pred, logged = row["activation_gib"]
    assert abs(pred - logged) <= max(0.15 * logged, 0.1), (pred, logged)


@pytest.mark.parametrize(
    "case_id", [c["id"] for c in CASES if c.get("logged", {}).get("fits") is False]
)
def test_refused_start_ups_are_predicted_not_to_fit(case_id):
    _, row = ROWS[case_id]
    verdict = row.get("fits") or row.get("fits_formula")
    assert verdict is not None and verdict[0] is False
