"""`inferwise runs consistency A B`: are two runs' greedy outputs the same, prompt by prompt?

A change that claims no quality effect (prefix caching, a scheduler setting,
routing) should leave greedy (temperature 0) outputs identical. Every run
stores a hash of each output, so the share of identical outputs needs no
stored text; where both runs stored their texts (``--store-text``) the first
divergent position is located, in characters of the output text (the probe
does not keep token boundaries of the text, only per-chunk times).

Requests are paired by prompt id (dataset rows: the row's `id` or a hash of
its prompt; a prompt repeated in a run counts once, its first completed
request) and otherwise by request index, which is the same prompt only when
both runs replayed the same dataset.
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError

_DB_DESC = "Run database file (default: $INFERWISE_DB or the user's data dir)."


class ConsistencyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[str] = Field(
        min_length=2,
        max_length=2,
        description="Two run ids: the reference first, then the run to check against it.",
        json_schema_extra={"cli_positional": True},
    )
    examples: int = Field(default=5, ge=0, le=100, description="Divergent pairs to show.")
    db: str | None = Field(default=None, description=_DB_DESC)


class Divergence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_id: str | None = None
    index: int
    first_divergent_char: int | None = Field(
        default=None, description="0-based character position of the first difference."
    )
    reference_excerpt: str | None = None
    candidate_excerpt: str | None = None


class ConsistencyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reference_id: str
    candidate_id: str
    paired_by: Literal["prompt_id", "index"]
    pairs: int = Field(description="Completed outputs present in both runs.")
    identical: int
    identical_share: float | None = Field(default=None, description="identical / pairs (0-1).")
    compared_text: int = Field(0, description="Divergent pairs whose texts both runs stored.")
    first_divergent_char_min: int | None = Field(
        default=None, description="Earliest first divergence over the divergent pairs (characters)."
    )
    first_divergent_char_median: float | None = None
    divergences: list[Divergence] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def first_difference(a: str, b: str) -> int | None:
    """0-based index of the first character where `a` and `b` differ; None if equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _pairs(ref: list[Any], cand: list[Any]) -> tuple[str, list[tuple[Any, Any]]]:
    def usable(records: list[Any]) -> list[Any]:
        return sorted((r for r in records if r.ok and not r.warmup), key=lambda r: r.index)

    a, b = usable(ref), usable(cand)
    if any(r.prompt_id for r in a) and any(r.prompt_id for r in b):
        first_a: dict[str, Any] = {}
        first_b: dict[str, Any] = {}
        for r in a:
            first_a.setdefault(r.prompt_id, r)
        for r in b:
            first_b.setdefault(r.prompt_id, r)
        keys = [k for k in first_a if k in first_b and k is not None]
        return "prompt_id", [(first_a[k], first_b[k]) for k in keys]
    by_index = {r.index: r for r in b}
    return "index", [(r, by_index[r.index]) for r in a if r.index in by_index]


def _same(x: Any, y: Any) -> bool | None:
    if x.output_text is not None and y.output_text is not None:
        return x.output_text == y.output_text
    if x.output_sha256 and y.output_sha256:
        return x.output_sha256 == y.output_sha256
    return None


def _excerpt(text: str, at: int) -> str:
    return text[max(0, at - 20) : at + 40]


def consistency(req: ConsistencyRequest) -> ConsistencyResult:
    from inferwise.probes.store import RunStore

    with RunStore(req.db, create=req.db is None) as store:
        try:
            ids = [store.resolve(r) for r in req.run_ids]
        except InputError as exc:
            raise InputError("run_ids", exc.message, exc.accepted) from None
        if ids[0] == ids[1]:
            raise InputError("run_ids", "the same run is given twice", "two distinct run ids")
        ref, cand = store.requests(ids[0]), store.requests(ids[1])
    paired_by, pairs = _pairs(ref, cand)
    verdicts = [(x, y, _same(x, y)) for x, y in pairs]
    judged = [(x, y, v) for x, y, v in verdicts if v is not None]
    identical = sum(1 for *_, v in judged if v)
    out = ConsistencyResult(
        reference_id=ids[0],
        candidate_id=ids[1],
        paired_by=paired_by,
        pairs=len(judged),
        identical=identical,
        identical_share=identical / len(judged) if judged else None,
    )
    _locate(out, [(x, y) for x, y, v in judged if not v], req.examples)
    _notes(out, paired_by, len(pairs) - len(judged))
    return out


def _locate(out: ConsistencyResult, divergent: list[tuple[Any, Any]], examples: int) -> None:
    """First divergent character of each divergent pair whose texts both runs stored."""
    positions: list[int] = []
    for x, y in divergent:
        at = None
        if x.output_text is not None and y.output_text is not None:
            at = first_difference(x.output_text, y.output_text)
            if at is not None:
                positions.append(at)
        if len(out.divergences) < examples:
            out.divergences.append(
                Divergence(
                    prompt_id=x.prompt_id,
                    index=x.index,
                    first_divergent_char=at,
                    reference_excerpt=None if at is None else _excerpt(x.output_text, at),
                    candidate_excerpt=None if at is None else _excerpt(y.output_text, at),
                )
            )
    out.compared_text = len(positions)
    if positions:
        out.first_divergent_char_min = min(positions)
        out.first_divergent_char_median = statistics.median(positions)
    elif divergent:
        out.notes.append(
            "outputs differ but the texts were not stored: probe with --store-text to locate "
            "the first divergent character"
        )


def _notes(out: ConsistencyResult, paired_by: str, unjudged: int) -> None:
    if paired_by == "index":
        out.notes.append(
            "paired by request index (no prompt ids): the same prompt only when both runs "
            "replayed the same --dataset; synthetic prompts differ per run by design"
        )
    if unjudged:
        out.notes.append(
            f"{unjudged} pairs have neither stored text nor an output hash (older runs)"
        )
    if not out.pairs:
        out.notes.append("no completed output is present in both runs")
