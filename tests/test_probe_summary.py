"""Metric definitions on hand-built records: ITL k-token rule, TPOT, goodput, SLO attainment."""

from __future__ import annotations

import numpy as np
import pytest

from inferwise.probes.records import RequestRecord
from inferwise.probes.summary import distribution, summarize


def rec(
    index: int, start: float, ttft: float, gaps: list[float], tokens: list[int] | None = None, **kw
):
    """A successful request: first token at start+ttft, then chunks after the given gaps (s)."""
    times = [start + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    tokens = tokens or [1] * len(times)
    return RequestRecord(
        index=index,
        ok=True,
        start_s=start,
        first_byte_s=start + ttft / 2,
        first_token_s=times[0],
        end_s=times[-1],
        input_tokens=100,
        output_tokens=sum(tokens),
        chunk_times_s=times,
        chunk_tokens=tokens,
        **kw,
    )


def test_itl_splits_a_k_token_chunk_into_k_gaps():
    r = rec(0, 0.0, 0.1, [0.03, 0.01], tokens=[1, 3, 1])
    assert r.itl_ms() == pytest.approx([10.0, 10.0, 10.0, 10.0])
    assert r.chunk_gaps_ms() == pytest.approx([30.0, 10.0])


def test_tpot_is_decode_time_over_tokens_after_the_first():
    r = rec(0, 0.0, 0.2, [0.05] * 9)  # 10 tokens, 9 gaps of 50 ms
    assert r.ttft_ms == pytest.approx(200.0)
    assert r.e2e_ms == pytest.approx(650.0)
    assert r.tpot_ms == pytest.approx((650.0 - 200.0) / 9)


def test_distribution_matches_numpy_percentiles():
    xs = list(np.random.default_rng(1).lognormal(3, 1, 501))
    d = distribution(xs)
    for q in (50, 90, 95, 99):
        assert getattr(d, f"p{q}") == pytest.approx(np.percentile(xs, q))
    assert d.mean == pytest.approx(np.mean(xs))
    assert d.std == pytest.approx(np.std(xs))


def test_goodput_and_attainment_count_failed_requests_as_misses():
    recs = [
        rec(0, 0.0, 0.1, [0.01] * 4),  # cold: ttft 100 ok
        rec(1, 1.0, 0.3, [0.01] * 4),  # ttft 300 > 200 -> miss
        rec(2, 2.0, 0.1, [0.09] * 4),  # itl 90 > 50 -> miss
        rec(3, 3.0, 0.1, [0.01] * 4),  # meets
        RequestRecord(index=4, ok=False, error_class="http_5xx", start_s=3.5, end_s=3.6),
    ]
    s = summarize(recs, slo={"ttft_ms": 200, "itl_ms": 50}, window_s=None)
    assert s.completed == 4 and s.failed == 1
    assert s.slo_attainment_pct == pytest.approx(40.0)
    window = 3.6  # the failed request ended last
    assert s.window_s == pytest.approx(window)
    assert s.goodput == pytest.approx(2 / window)
    assert s.slo_attainment_by_metric_pct["ttft_ms"] == pytest.approx(60.0)
    assert s.errors == {"http_5xx": 1}
    assert s.request_throughput == pytest.approx(4 / window)
    assert s.output_token_throughput == pytest.approx(20 / window)


def test_cold_request_is_reported_apart_and_warmups_excluded():
    recs = [
        rec(0, 0.0, 2.0, [0.01], warmup=True),
        rec(1, 3.0, 0.1, [0.01]),
        rec(2, 4.0, 0.1, [0.01]),
    ]
    s = summarize(recs, slo=None, window_s=10.0)
    assert s.cold is not None and s.cold.ttft_ms == pytest.approx(2000.0) and s.cold.warmup
    assert s.warmup_excluded == 1
    assert s.ttft_ms.count == 2 and s.ttft_ms.max == pytest.approx(100.0)
    assert s.request_throughput == pytest.approx(0.2)
    # without warm-up the cold first request stays out of the warm distribution
    s2 = summarize([rec(0, 0.0, 2.0, [0.01]), rec(1, 3.0, 0.1, [0.01])], slo=None, window_s=None)
    assert s2.ttft_ms.count == 1 and s2.completed == 2


def test_client_health_flags_saturation():
    recs = [rec(i, float(i), 0.1, [0.01], scheduled_s=float(i) - 0.05) for i in range(5)]
    s = summarize(recs, slo=None, window_s=None, loop_lag_ms=[0.2] * 50)
    assert s.client_health.saturated
    assert s.client_health.schedule_delay_ms.p50 == pytest.approx(50.0)
    ok = summarize(
        [rec(0, 0.0, 0.1, [0.01], scheduled_s=0.0)], slo=None, window_s=None, loop_lag_ms=[0.1]
    )
    assert not ok.client_health.saturated


def test_unknown_slo_key_is_an_input_error():
    from inferwise.calculators.errors import InputError

    with pytest.raises(InputError):
        summarize([rec(0, 0.0, 0.1, [0.01])], slo={"latency": 1.0}, window_s=None)


def test_error_classes_rank_by_count_and_keep_three_distinct_messages() -> None:
    from inferwise.probes.records import error_classes

    def failed(i: int, cls: str | None, msg: str | None) -> RequestRecord:
        return RequestRecord(index=i, ok=False, start_s=0.0, error_class=cls, error_message=msg)

    records = [
        failed(0, "http_429", "slow down"),
        failed(1, "stalled", "a"),
        failed(2, "stalled", "a"),
        failed(3, "stalled", "b"),
        failed(4, "stalled", "c"),
        failed(5, "stalled", "d"),
        failed(6, None, None),
        failed(7, "http_429", "slow down"),
        rec(8, 0.0, 0.1, [0.01]),
    ]
    assert error_classes(records) == [
        ("stalled", 5, ["a", "b", "c"]),
        ("http_429", 2, ["slow down"]),
        ("other", 1, []),
    ]
