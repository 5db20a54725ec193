"""The evidence-rule engine: clause semantics, absent facts, and the shipped rule files."""

from __future__ import annotations

import pytest

from inferwise.knowledge.rule_engine import (
    Fact,
    RuleError,
    _parse_rule,
    check_clause,
    evaluate,
    holds,
    load_rules,
    render,
)

FACTS = {
    "observations.queue_depth": Fact(12.0, "measured"),
    "deployment.max_num_seqs": Fact(8, "stated"),
    "observations.concurrency": Fact(8.0, "measured"),
    "gpu.interconnect": Fact("pcie", "catalog"),
    "derived.long_prompts": Fact(False, "derived"),
}


@pytest.mark.parametrize(
    ("clause", "expected"),
    [
        ("observations.queue_depth >= 5", True),
        ("observations.queue_depth < 5", False),
        ("observations.concurrency >= deployment.max_num_seqs", True),
        ("gpu.interconnect == 'pcie'", True),
        ("gpu.interconnect != 'pcie'", False),
        ("derived.long_prompts", False),
        ("not derived.long_prompts", True),
        ("observations.kv_cache_usage >= 0.9", False),  # absent: never fires
        ("observations.kv_cache_usage < 0.9", False),  # absent: never fires either way
        ("not observations.kv_cache_usage", True),
        ("observations.kv_cache_usage is missing", True),
        ("observations.queue_depth is set", True),
        ("observations.queue_depth >= observations.missing", False),
    ],
)
def test_clause_semantics(clause, expected):
    assert holds(clause, FACTS) is expected


def test_render_quotes_facts_and_reports_their_sources():
    text, sources = render("{observations.queue_depth} waiting on {gpu.interconnect}; {x.y}", FACTS)
    assert text == "12 waiting on pcie; ?"
    assert sources == ("measured", "catalog")
    assert render("{f:pct}", {"f": Fact(0.456, "measured")})[0] == "46 %"


def test_malformed_rules_are_rejected_with_file_and_rule():
    with pytest.raises(RuleError, match="x.toml"):
        _parse_rule(
            {"id": "a", "when": ["x >"], "weights": {"queueing": 1}, "evidence": "e"}, "x.toml", 0
        )
    with pytest.raises(RuleError, match="unknown hypothesis"):
        _parse_rule(
            {"id": "a", "when": ["x"], "weights": {"queuing": 1}, "evidence": "e"}, "x.toml", 0
        )
    with pytest.raises(RuleError):
        _parse_rule({"id": "a", "when": ["x"], "weights": {"queueing": 1}}, "x.toml", 0)
    with pytest.raises(RuleError):
        check_clause("a b c d", "here")


def test_shipped_rules_load_and_every_clause_names_a_fact_family():
    rules = load_rules()
    assert len(rules) >= 60
    families = {
        "symptom",
        "observations",
        "traffic",
        "slo",
        "deployment",
        "product",
        "derived",
        "gpu",
        "fit",
        "predicted",
        "budget",
        "run",
        "constraints",
    }
    for r in rules:
        for c in r.when:
            name = c.removeprefix("not ").split()[0]
            assert name.split(".")[0] in families, (r.id, c)


def test_evaluate_groups_findings_by_hypothesis():
    out = evaluate({"symptom.cold_start_spikes": Fact(True, "stated")})
    assert out["cold_start"][0].weight > 0
    assert out["cold_start"][0].sources == ("stated",)
