"""Playbooks: the structured optimisations diagnosis and planning build on."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from inferwise.calculators.errors import InputError
from inferwise.knowledge import kb
from inferwise.knowledge.playbooks import (
    PlaybookError,
    get_playbook,
    load_playbooks,
    parse_playbook,
    playbooks_for,
)
from inferwise.knowledge.vocabulary import HYPOTHESES

VALID = """
id = "demo"
title = "Demo"
summary = "Change one thing."
variable = "deployment.max_num_seqs"
addresses = ["queueing"]
preconditions = ["a"]
risks = ["b"]
interactions = ["c"]
measure = ["inferwise probe URL --concurrency 8"]
acceptance = ["d"]
rollback = "undo"
complexity = 2
doc = "metrics"

[effects]
ttft = "-"
itl = "0"
throughput = "+"
memory = "0"
quality = "0"

[[knobs]]
engine = "vllm"
flag = "--max-num-seqs"
doc = "https://docs.vllm.ai/en/latest/configuration/engine_args/"
"""


def test_at_least_fourteen_playbooks_load_and_are_ordered_by_complexity():
    pbs = load_playbooks()
    assert len(pbs) >= 14
    assert [p.complexity for p in pbs] == sorted(p.complexity for p in pbs)
    assert len({p.id for p in pbs}) == len(pbs)


def test_every_hypothesis_has_a_playbook_and_results_are_least_complex_first():
    for hid in HYPOTHESES:
        found = playbooks_for(hid)
        assert found, hid
        assert all(hid in p.addresses for p in found)
        assert [p.complexity for p in found] == sorted(p.complexity for p in found)


def test_playbooks_point_at_existing_documents_and_real_engine_flags():
    ids = {d.id for d in kb.list_documents()}
    for p in load_playbooks():
        assert p.doc in ids, (p.id, p.doc)
        assert kb.get_document(p.doc).playbooks.count(p.id) == 1
        assert 1 <= p.complexity <= 5
        engines = {k.engine for k in p.knobs}
        assert engines, p.id
        for k in p.knobs:
            assert k.doc.startswith("https://")
            if k.engine in ("vllm", "sglang") and k.flag.startswith("--"):
                # flags are spelled as on the command line, e.g. --max-num-seqs
                assert re.match(r"--[a-z0-9][a-z0-9-]*", k.flag), k.flag


def test_measure_steps_name_a_command_or_an_engine_metric():
    for p in load_playbooks():
        text = " ".join(p.measure)
        assert "inferwise " in text or "vllm:" in text or "sglang:" in text, p.id


def test_well_known_flags_are_where_engines_document_them():
    flags = {(k.engine, k.flag.split()[0]) for p in load_playbooks() for k in p.knobs}
    for expected in [
        ("vllm", "--enable-prefix-caching"),
        ("vllm", "--max-num-seqs"),
        ("vllm", "--max-num-batched-tokens"),
        ("vllm", "--kv-cache-dtype"),
        ("vllm", "--quantization"),
        ("vllm", "--tensor-parallel-size"),
        ("vllm", "--data-parallel-size"),
        ("sglang", "--max-running-requests"),
        ("sglang", "--chunked-prefill-size"),
        ("sglang", "--disable-radix-cache"),
        ("sglang", "--tp-size"),
    ]:
        assert expected in flags, expected


def test_parse_valid_playbook():
    p = parse_playbook(VALID, "playbooks/demo.toml")
    assert p.addresses == ("queueing",)
    assert p.effects.throughput == "+"
    assert p.knobs[0].flag == "--max-num-seqs"
    assert replace(p, complexity=3).complexity == 3  # frozen dataclass, copy works


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda t: t.replace('addresses = ["queueing"]', 'addresses = ["queuing"]'),
            "unknown hypothesis",
        ),
        (lambda t: t.replace('rollback = "undo"\n', ""), "missing field"),
        (lambda t: t.replace("complexity = 2", "complexity = 9"), "complexity"),
        (lambda t: t.replace('engine = "vllm"', 'engine = "vlm"'), "unknown engine"),
        (lambda t: t.replace('quality = "0"', ""), "effects"),
        (lambda t: 'extra = "x"\n' + t, "unknown field"),
        (lambda t: t.replace('id = "demo"', 'id = "other"'), "file name"),
        (lambda t: t.replace("[effects]", "[effects"), "invalid TOML"),
    ],
)
def test_invalid_playbooks_raise_with_file_and_field(mutate, message):
    with pytest.raises(PlaybookError, match=message) as info:
        parse_playbook(mutate(VALID), "playbooks/demo.toml")
    assert "playbooks/demo.toml" in str(info.value)


def test_unknown_ids_are_input_errors_listing_what_exists():
    with pytest.raises(InputError) as info:
        playbooks_for("gpu_too_slow")
    assert info.value.field == "hypothesis" and "queueing" in (info.value.accepted or "")
    with pytest.raises(InputError):
        get_playbook("nope")
    assert get_playbook("prefix_caching").doc == "kv-cache-prefix-caching"
