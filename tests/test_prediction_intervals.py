"""Every predicted metric carries a p10-p90 range earned on held-out published measurements."""

from __future__ import annotations

import hashlib

import pytest

from inferwise.calculators.calibration import EFFICIENCY_FILE
from inferwise.calculators.intervals import (
    MIN_SOURCES,
    NO_DATA_RATIOS,
    context_band,
    interval_table,
    load_band,
    ratio_interval,
)
from inferwise.calculators.predict import PredictRequest, predict_performance

L8 = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}


def test_the_stored_table_was_made_with_the_factors_in_use():
    """Changing data/efficiency.toml without re-running bench/prediction_intervals.py
    would leave intervals that describe another model."""
    table = interval_table()
    current = hashlib.sha256(EFFICIENCY_FILE.read_bytes()).hexdigest()[:16]
    assert table["meta"]["factors_sha256"] == current, "re-run bench/prediction_intervals.py"
    for key, cell in table["regime"].items():
        assert 0 < cell["ratio_p10"] <= cell["ratio_p90"], key
        assert cell["values"] >= 1 and cell["sources"] >= 1, key


def test_predict_brackets_each_metric_and_names_its_basis():
    r = predict_performance(
        PredictRequest(**L8, input_tokens=1000, output_tokens=200, concurrency=32)
    )
    iv = r.intervals
    assert iv is not None and "held-out" in iv.basis and "efficiency.toml" in iv.basis
    for value, band in (
        (r.ttft_ms.p50, iv.ttft_ms),
        (r.itl_ms.p50, iv.itl_ms),
        (r.e2e_ms.p50, iv.e2e_ms),
        (r.output_tokens_per_s, iv.output_tokens_per_s),
    ):
        assert band.low == pytest.approx(value * band.ratio_p10)
        assert band.high == pytest.approx(value * band.ratio_p90)
        assert band.values == 0 or band.values >= 9  # a regime needs 9 values for an 80 % bound


def test_a_regime_without_enough_data_falls_back_and_says_so():
    table = {
        "regime": {
            "ttft|dense": {"ratio_p10": 0.8, "ratio_p90": 1.3, "values": 20, "sources": 4},
            "ttft|vllm|c1|ctx<=2k|dense": {
                "ratio_p10": 0.99,
                "ratio_p90": 1.01,
                "values": 5,
                "sources": 1,
            },
        }
    }
    lo, hi, key, n = ratio_interval("ttft", "vllm", "c1", "ctx<=2k", table)
    assert (lo, hi, key, n) == (0.8, 1.3, "ttft|dense", 20)  # 5 values of one source earn nothing
    lo, hi, key, n = ratio_interval("itl", "vllm", "c1", "ctx<=2k", table)
    assert (lo, hi) == NO_DATA_RATIOS and key == "no data" and n == 0


def test_a_regime_cell_needs_as_many_sources_as_a_conformal_bound_needs_values():
    """A new deployment misses with its own source's conditions: a regime narrower than the
    metric-wide one is used only when it rests on MIN_SOURCES published sources, however
    many values those few sources hold."""
    wide = {"ratio_p10": 0.5, "ratio_p90": 2.0, "values": 300, "sources": 20}
    narrow = {"ratio_p10": 0.9, "ratio_p90": 1.1, "values": 200, "sources": MIN_SOURCES - 1}
    table = {"regime": {"ttft|dense": wide, "ttft|vllm|dense": narrow}}
    assert ratio_interval("ttft", "vllm", "c1", "ctx<=2k", table)[:3] == (0.5, 2.0, "ttft|dense")
    narrow["sources"] = MIN_SOURCES
    assert ratio_interval("ttft", "vllm", "c1", "ctx<=2k", table)[:3] == (
        0.9,
        1.1,
        "ttft|vllm|dense",
    )


def test_regime_bands():
    assert load_band(1, None) == "c1" and load_band(16, None) == "c2-16"
    assert load_band(None, float("inf")) == "c17+" and load_band(None, 2.0) == "rate"
    assert context_band(1500, 500) == "ctx<=2k" and context_band(20_000, 2000) == "ctx>8k"


def test_a_dense_model_never_borrows_moe_misses():
    moe = {"ratio_p10": 3.0, "ratio_p90": 40.0, "values": 50, "sources": 3}
    table = {"regime": {"ttft|vllm|moe": moe, "ttft|moe": moe}}
    assert ratio_interval("ttft", "vllm", "c2-16", "ctx2k-8k", table, arch="moe")[:2] == (3.0, 40.0)
    lo, hi, key, _ = ratio_interval("ttft", "vllm", "c2-16", "ctx2k-8k", table, arch="dense")
    assert (lo, hi, key) == (*NO_DATA_RATIOS, "no data")


def test_budget_brackets_its_predicted_latencies_too():
    from inferwise.calculators.budget import BudgetRequest, decompose_budget

    r = decompose_budget(
        BudgetRequest(
            **L8, input_tokens=1000, output_tokens=200, request_rate=2, slo_e2e_ms={"p95": 20_000}
        )
    )
    iv = r.intervals
    assert iv is not None and iv.output_tokens_per_s is None
    assert iv.ttft_ms.low == pytest.approx(r.ttft_ms.p50 * iv.ttft_ms.ratio_p10)
    assert iv.e2e_ms.high == pytest.approx(r.e2e_ms.p50 * iv.e2e_ms.ratio_p90)


def test_bounds_weigh_every_source_once_and_widen_with_their_spread():
    """One source of 90 values that all agree does not set a regime's range: a new source
    lands as far off as the sources differ from each other (a random-effects prediction
    interval on log measured / predicted)."""
    from bench.prediction_intervals import Residual, prediction_bounds

    def values(source: str, ratios: list[float]) -> list[Residual]:
        return [
            Residual("m", "ttft_ms.mean", source, "held_out", "ttft", "vllm", "c1", "ctx<=2k",
                     "dense", r, 1.0)
            for r in ratios
        ]  # fmt: skip

    big = values("big", [1.0] * 90)
    others = [values(f"s{i}", [r, r * 1.05]) for i, r in enumerate((0.5, 0.8, 1.3, 2.0))]
    lo, hi = prediction_bounds(big + [v for o in others for v in o])
    assert lo < 0.6 and hi > 1.7  # the big source alone would give (1.0, 1.0)
    few = prediction_bounds(big[:5] + [v for o in others for v in o])
    assert few == pytest.approx((lo, hi))  # a source votes once, however many values it holds
    single = values("one", [0.9, 1.0, 1.2])
    assert prediction_bounds(single) == (0.9, 1.2)  # no between-source spread to measure
