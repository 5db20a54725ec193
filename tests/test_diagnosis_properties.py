"""Properties that hold for any valid workload: diagnosis never crashes, ranks consistently,
and never reports a measurement the workload did not contain."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose
from inferwise.knowledge.vocabulary import HYPOTHESES, SYMPTOMS

ms = st.floats(min_value=0.5, max_value=120_000, allow_nan=False)
frac = st.floats(min_value=0, max_value=1, allow_nan=False)


def pct() -> st.SearchStrategy[dict]:
    """Targets: any values (a p50 target above the p95 one is redundant, not invalid)."""
    return st.fixed_dictionaries({}, optional={"p50": ms, "p95": ms, "p99": ms})


def measured() -> st.SearchStrategy[dict]:
    """A measured distribution: percentiles that do not decrease (the workload file's rule)."""
    return (
        st.lists(ms, min_size=3, max_size=3)
        .map(sorted)
        .flatmap(
            lambda v: st.fixed_dictionaries(
                {}, optional={"p50": st.just(v[0]), "p95": st.just(v[1]), "p99": st.just(v[2])}
            )
        )
    )


observations = st.fixed_dictionaries(
    {},
    optional={
        "ttft_ms": measured(),
        "itl_ms": measured(),
        "e2e_ms": measured(),
        "queue_depth": st.floats(min_value=0, max_value=500),
        "concurrency": st.floats(min_value=0, max_value=512),
        "gpu_util": frac,
        "cpu_util": frac,
        "kv_cache_usage": frac,
        "preemptions_per_min": st.floats(min_value=0, max_value=100),
        "prefix_cache_hit_rate": frac,
        "error_rate": frac,
        "requests_per_s": st.floats(min_value=0, max_value=200),
    },
)
workloads = st.fixed_dictionaries(
    {},
    optional={
        "observations": observations,
        "slo": st.fixed_dictionaries({}, optional={"ttft_ms": pct(), "itl_ms": pct()}),
        "traffic": st.fixed_dictionaries(
            {},
            optional={
                "arrival_rate_rps": st.floats(min_value=0, max_value=100),
                "peak_to_mean": st.floats(min_value=1, max_value=10),
                "shared_prefix_fraction": frac,
                "batch_share": frac,
                "input_tokens": st.fixed_dictionaries({"p50": st.integers(1, 100_000)}),
            },
        ),
        "deployment": st.fixed_dictionaries(
            {},
            optional={
                "gpu": st.sampled_from(["h100-sxm-80gb", "l40s", "a100-sxm-80gb", "mi300x"]),
                "tensor_parallel_size": st.sampled_from([1, 2, 4, 8]),
                "replicas": st.integers(1, 8),
                "scale_to_zero": st.booleans(),
                "max_num_seqs": st.integers(1, 1024),
            },
        ),
        "symptoms": st.lists(st.sampled_from(sorted(SYMPTOMS)), max_size=4),
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads)
def test_any_valid_workload_diagnoses_consistently(wl):
    r = diagnose(DiagnoseRequest(workload=json.dumps(wl), limit=24))
    scores = [h.score for h in r.hypotheses]
    assert scores == sorted(scores, reverse=True)
    for h in r.hypotheses:
        assert h.id in HYPOTHESES and h.score > 0 and 0 < h.confidence < 1
        assert h.evidence and h.how_to_prove
    ids = [h.id for h in r.hypotheses]
    assert len(ids) == len(set(ids))
    # measured facts come only from the workload's observations (no run was given)
    given_obs = wl.get("observations", {})
    for f in r.facts:
        if f.source == "measured":
            top = f.name.split(".")[1]
            assert top in given_obs, f.name
    # a missing measurement is never something the file already gives
    from inferwise.knowledge.workload import get_path, parse_workload

    parsed = parse_workload(wl)
    for m in r.missing_measurements:
        assert get_path(parsed, m.field) is None, m.field
    # quoted evidence never shows an unfilled placeholder
    unfilled = re.compile(r"(^|[\s(])\?([\s),.x%]|$)")  # rule_engine.render's mark for a gap
    for h in r.hypotheses:
        for e in [*h.evidence, *h.counter_evidence]:
            assert not unfilled.search(e) and "{" not in e, e
