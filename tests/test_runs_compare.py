"""`runs compare` finds real shifts and calls same-distribution runs within noise."""

from __future__ import annotations

import random

import pytest

from inferwise.probes.records import RequestRecord
from inferwise.probes.runs import CompareRunsRequest, compare_runs
from inferwise.probes.store import RunStore


def synthetic_records(
    n: int,
    *,
    seed: int,
    ttft_ms: float = 200.0,
    itl_ms: float = 20.0,
    out_tokens: int = 20,
    concurrency: int = 8,
) -> list[RequestRecord]:
    """A closed-loop run whose TTFT and ITL are lognormal around the given medians."""
    rng = random.Random(seed)
    slots = [0.0] * concurrency
    records = []
    for i in range(n):
        k = min(range(concurrency), key=lambda j: slots[j])
        start = slots[k]
        ttft = ttft_ms * rng.lognormvariate(0, 0.25) / 1000
        times = [start + ttft]
        for _ in range(out_tokens - 1):
            times.append(times[-1] + itl_ms * rng.lognormvariate(0, 0.2) / 1000)
        end = times[-1] + 0.0005
        slots[k] = end
        records.append(
            RequestRecord(
                index=i,
                ok=True,
                start_s=start,
                first_byte_s=start + 0.001,
                first_token_s=times[0],
                end_s=end,
                input_tokens=100,
                output_tokens=out_tokens,
                chunk_times_s=times,
                chunk_tokens=[1] * out_tokens,
            )
        )
    return records


def store_run(store: RunStore, records: list[RequestRecord], **labels: str) -> str:
    run_id = store.create_run(
        labels=labels, config={"concurrency": 8, "requests": len(records)}, meta={}
    )
    store.add_requests(run_id, records)
    store.finish_run(run_id, "complete")
    return run_id


def _by_key(candidate):
    return {(m.metric, m.statistic): m for m in candidate.metrics}


def test_a_30_percent_ttft_shift_is_worse_and_itl_stays_within_noise(tmp_path):
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        base = store_run(store, synthetic_records(300, seed=1), engine="vllm", version="0.10")
        cand = store_run(
            store, synthetic_records(300, seed=2, ttft_ms=260.0), engine="vllm", version="0.11"
        )
    result = compare_runs(CompareRunsRequest(run_ids=[base, cand], db=str(db), resamples=500))
    (c,) = result.candidates
    m = _by_key(c)
    for stat in ("p50", "p95"):
        assert m[("ttft_ms", stat)].verdict == "worse"
        assert m[("ttft_ms", stat)].change_pct == pytest.approx(30, abs=12)
        assert m[("ttft_ms", stat)].diff_ci_low > 0
    assert m[("ttft_ms", "p50")].p_value < 1e-6
    assert m[("itl_ms", "p50")].verdict == "within noise"
    assert c.label_changes == {"version": "0.10 -> 0.11"}
    assert (
        "ttft_ms.p50" in c.worse and not c.better or all(not b.startswith("ttft") for b in c.better)
    )


def test_a_faster_candidate_is_better(tmp_path):
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        base = store_run(store, synthetic_records(200, seed=3, itl_ms=25.0))
        cand = store_run(store, synthetic_records(200, seed=4, itl_ms=15.0))
    (c,) = compare_runs(
        CompareRunsRequest(run_ids=[base, cand], db=str(db), resamples=300)
    ).candidates
    m = _by_key(c)
    assert m[("itl_ms", "p50")].verdict == "better"
    assert m[("tpot_ms", "p50")].verdict == "better"
    assert m[("output_token_throughput", "rate")].verdict == "better"


def test_same_distribution_is_called_within_noise_almost_always(tmp_path):
    """Over several pairs of runs from one distribution, false alarms stay near the nominal 5 %."""
    db = tmp_path / "runs.db"
    verdicts = []
    with RunStore(db) as store:
        ids = [store_run(store, synthetic_records(150, seed=100 + i)) for i in range(8)]
    for a, b in zip(ids[0::2], ids[1::2], strict=True):
        (c,) = compare_runs(
            CompareRunsRequest(run_ids=[a, b], db=str(db), resamples=400)
        ).candidates
        verdicts += [m.verdict for m in c.metrics]
    false_alarms = sum(v in ("better", "worse") for v in verdicts)
    assert false_alarms / len(verdicts) <= 0.1, verdicts


def test_compare_several_candidates_and_unknown_id(tmp_path):
    from inferwise.calculators.errors import InputError

    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        ids = [store_run(store, synthetic_records(40, seed=s)) for s in (5, 6, 7)]
    result = compare_runs(CompareRunsRequest(run_ids=ids, db=str(db), resamples=200))
    assert [c.run_id for c in result.candidates] == ids[1:]
    with pytest.raises(InputError, match="unknown run"):
        compare_runs(CompareRunsRequest(run_ids=[ids[0], "20990101-000000-dead"], db=str(db)))
    with pytest.raises(InputError, match="twice"):
        compare_runs(CompareRunsRequest(run_ids=[ids[0], ids[0]], db=str(db)))


def test_goodput_is_compared_when_there_is_an_slo(tmp_path):
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        base = store_run(store, synthetic_records(200, seed=8))
        cand = store_run(store, synthetic_records(200, seed=9, ttft_ms=320.0))
    (c,) = compare_runs(
        CompareRunsRequest(run_ids=[base, cand], db=str(db), resamples=300, slo={"ttft_ms": 250.0})
    ).candidates
    g = _by_key(c)[("goodput", "rate")]
    assert g.baseline > g.candidate
    assert g.verdict == "worse"


def test_a_run_where_everything_failed_is_not_comparable_rather_than_an_error(tmp_path):
    db = tmp_path / "runs.db"
    failed = [
        RequestRecord(
            index=i,
            ok=False,
            start_s=i * 0.1,
            error_class="connect_refused",
            error_message="refused",
        )
        for i in range(10)
    ]
    with RunStore(db) as store:
        base = store_run(store, synthetic_records(50, seed=11))
        cand = store_run(store, failed)
    (c,) = compare_runs(
        CompareRunsRequest(run_ids=[base, cand], db=str(db), resamples=200)
    ).candidates
    assert c.completed == 0 and c.failed == 10
    assert {m.verdict for m in c.metrics} == {"not comparable"}


def test_results_are_valid_against_their_published_json_schemas(tmp_path):
    """MCP clients get these as structured output: the JSON must match the schema the tool lists."""
    jsonschema = pytest.importorskip("jsonschema")
    from inferwise.probes.runs import (
        CompareRunsResult,
        ListRunsRequest,
        ListRunsResult,
        RunDetail,
        ShowRunRequest,
        list_runs,
        show_run,
    )

    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        base = store_run(store, synthetic_records(60, seed=12))
        cand = store_run(store, synthetic_records(60, seed=13, ttft_ms=300.0))
    cases = [
        (
            compare_runs(CompareRunsRequest(run_ids=[base, cand], db=str(db), resamples=200)),
            CompareRunsResult,
        ),
        (list_runs(ListRunsRequest(db=str(db))), ListRunsResult),
        (show_run(ShowRunRequest(run_id=cand, db=str(db))), RunDetail),
    ]
    for result, model in cases:
        jsonschema.validate(
            result.model_dump(mode="json"), model.model_json_schema(mode="serialization")
        )
