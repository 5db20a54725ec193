"""The tool listing as an assistant reads it: the same tools, at a fraction of the tokens.

``tools/list`` is paid for by every session before the user has asked anything, and the
schemas pydantic derives are written for validators, not readers: a ``title`` on every
property that restates its name, ``anyOf [X, null]`` for every optional field, and output
schemas that spell out every nested field of results whose full content arrives anyway as
structured content. This module rewrites the listed schemas only (the server still
validates arguments and results with the full models):

* input schemas lose the restated titles, optional fields become ``"type": [X, "null"]``,
  and each description keeps its first sentence (the CLI's ``--help`` keeps the rest);
* output schemas name the fields an assistant acts on (:data:`KEY_OUTPUT_FIELDS`, the
  contract fields of DESIGN.md), each with its type and description, and allow the rest
  (``additionalProperties``), so the full structured content still conforms.
"""

from __future__ import annotations

import re
from typing import Any

KEY_OUTPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "estimate_memory_fit": (
        "fits", "verdict", "per_gpu", "kv_bytes_per_token", "kv_cache_tokens",
        "max_concurrency", "answer", "assumptions", "warnings", "suggestions",
    ),
    "predict_performance": (
        "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "output_tokens_per_s", "requests_per_s",
        "bound", "assumptions", "warnings",
    ),
    "decompose_latency_budget": (
        "components", "binding", "feasible", "max_rate_under_slo", "slo_attainment",
        "assumptions", "warnings",
    ),
    "recommend_deployment": (
        "feasible", "verdict", "recommended", "candidates", "pareto", "nearest",
        "assumptions", "warnings",
    ),
    "probe_endpoint": (
        "run_id", "status", "summary", "errors", "client_health", "notes", "all_failed",
    ),
    "diagnose_bottleneck": ("summary", "hypotheses", "missing_measurements", "assumptions"),
    "plan_experiments": (
        "assumptions", "missing_measurements", "targets", "baseline", "leading_hypothesis",
        "stages", "acceptance_criteria", "facts_to_verify",
    ),
    "search_knowledge": ("hits",),
    "list_runs": ("runs",),
    "compare_runs": ("baseline_id", "candidates", "notes"),
    "render_report": ("report_id", "kind", "title", "resource_uri", "figures"),
    "calibrate_deployment": ("name", "factors", "fitted", "held", "residual_spread", "warnings"),
}  # fmt: skip
"""Per tool, the output fields its listed schema describes; the result holds more."""

SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!vs)\.(?=\s+[A-Z(])|;(?=\s)")
"""A sentence ends at a full stop before a capital (not in "e.g." / "i.e.") or a semicolon."""
LISTING_ONLY = ("cli_aliases", "maxLength", "minLength")
"""Schema keys a tool caller has no use for: the CLI's aliases, and string length limits
(the server still enforces them, and its error names the limit)."""


SHARED_OWNER = "estimate_memory_fit"
"""The tool whose listing describes the deployment fields every sizing tool shares."""
SHARED_DETAIL = (
    *("description", "minimum", "maximum", "exclusiveMinimum", "default", "enum", "type"),
    *("additionalProperties", "maxProperties"),
)
"""What the shared fields list under their owner only: words, type, choices, bounds and
defaults. The other tools list the name alone and say whose listing describes it; the
server validates every argument with the full model, and its error names the field."""


def shared_fields() -> frozenset[str]:
    """The deployment's fields (calculators.deployment.Deployment): described once, under
    :data:`SHARED_OWNER`; other tools list them with their types and bounds only."""
    from inferwise.calculators.deployment import Deployment

    return frozenset(Deployment.model_fields)


LEVER_OWNER = "predict_performance"
"""The tool whose description spells out the what-if lever fields predict and budget share."""


def lever_fields() -> frozenset[str]:
    """The serving levers' flags (speculative decoding, prefix caching, disaggregation, and
    SGLang's request-intake interval): described once, in words, under :data:`LEVER_OWNER`."""
    from inferwise.calculators.disaggregation import DisaggregationFields
    from inferwise.calculators.prefix_cache import PrefixCacheFields
    from inferwise.calculators.spec_decode import SpeculativeFields

    return frozenset(
        [*SpeculativeFields.model_fields, *PrefixCacheFields.model_fields]
        + [*DisaggregationFields.model_fields, "scheduler_recv_interval"]
    )


def compact_tool(tool: dict[str, Any], shared: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One listed tool (a ``Tool`` dumped by alias) with its schemas made compact; the
    ``shared`` fields lose their descriptions and bounds outside :data:`SHARED_OWNER`; the
    lever ones and the trace options are named in the description (:func:`_listed_once`)."""
    out = dict(tool)
    if isinstance(out.get("inputSchema"), dict):
        out["inputSchema"] = compact_input(out["inputSchema"])
        if out["name"] != SHARED_OWNER:
            _undescribe(out["inputSchema"], shared, out)
        if out["name"] in WORKLOAD_BORROWERS:
            _undescribe(
                out["inputSchema"],
                frozenset({"workload"}),
                out,
                owner=WORKLOAD_OWNER,
                what="Workload",
            )
        if out["name"] in LOAD_BORROWERS:
            _undescribe(
                out["inputSchema"], LOAD_FIELDS, out, owner=LEVER_OWNER, what="Load and length"
            )
        _listed_once(out["inputSchema"], lever_fields(), out)
        _listed_once(out["inputSchema"], TRACE_OPTIONS, out, TRACE_OWNER, TRACE_SUMMARY, None)
    if isinstance(out.get("outputSchema"), dict):
        out["outputSchema"] = summary_output(
            out["outputSchema"], KEY_OUTPUT_FIELDS.get(out["name"])
        )
    return out


LOAD_FIELDS = frozenset(
    ("input_tokens", "output_tokens", "input_tokens_p95", "output_tokens_p95", "request_rate",
     "concurrency", "burstiness", "num_requests", "seed", "calibration")
)  # fmt: skip
"""predict_performance's load, length and calibration fields, which the budget tool shares."""
LOAD_BORROWERS = ("decompose_latency_budget",)
WORKLOAD_OWNER = "plan_experiments"
WORKLOAD_BORROWERS = ("recommend_deployment", "diagnose_bottleneck")
"""The tools whose workload field means what plan_experiments' says (described once)."""


def _undescribe(
    schema: dict[str, Any],
    shared: frozenset[str],
    tool: dict[str, Any],
    owner: str = SHARED_OWNER,
    what: str = "Deployment",
) -> None:
    props = schema.get("properties", {})
    named = [n for n in props if n in shared]
    for name in named:
        for key in SHARED_DETAIL:
            props[name].pop(key, None)
    if named:
        tool["description"] = (
            tool.get("description", "")
            + f" {what} fields ({', '.join(named[:3])}, ...) are as in {owner}."
        )


LEVER_SUMMARY = (
    " Levers: speculative_method (ngram, eagle, eagle3, mtp, draft_model), "
    "num_speculative_tokens (K, 1-16), spec_acceptance_length (tokens per verify step at K) or "
    "spec_acceptance_rate (per token), draft_model, spec_task (chat, code, math); "
    "prefix_cache_hit_rate (0-1 of prompt tokens), prefix_cache_distinct_prefixes; "
    "disaggregate ('P:D' workers), kv_transfer_gbps (per worker), kv_transfer_latency_ms; "
    "scheduler_recv_interval (SGLang: decode steps per intake)."
)
"""The lever fields in words: cheaper in the listing than ten described properties."""


def _listed_once(
    schema: dict[str, Any],
    fields: frozenset[str],
    tool: dict[str, Any],
    owner: str = LEVER_OWNER,
    summary: str = LEVER_SUMMARY,
    elsewhere: str | None = "what-if lever fields",
) -> None:
    """A group of fields (the what-if levers, the trace replay's options): left out of the
    listed properties and named in the tool description, in full under `owner`. The listed
    input schemas do not forbid other keys, and the server validates arguments with the
    full model (bounds included)."""
    props = schema.get("properties", {})
    named = [n for n in props if n in fields]
    for name in named:
        del props[name]
    if named:
        extra = (
            summary
            if tool.get("name") == owner
            else f" Takes {owner}'s {elsewhere}."
            if elsewhere
            else f" Takes {', '.join(named)} (as in {owner})."
        )
        tool["description"] = tool.get("description", "") + extra


TRACE_OWNER = "probe_endpoint"
TRACE_OPTIONS = frozenset({"trace_format", "trace_time_scale", "trace_start", "trace_duration"})
"""Options of a trace replay (the `trace` file itself stays a listed property)."""
TRACE_SUMMARY = (
    " Trace replay options: trace_format (mooncake, burstgpt, azure, jsonl; default guessed), "
    "trace_time_scale (speed: arrival gaps divided by it), trace_start / trace_duration "
    "(window, s of trace time)."
)


def compact_input(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema without restated titles and with nullable types folded."""
    return _walk(schema, defs=schema.get("$defs", {}), short=True)


def summary_output(schema: dict[str, Any], keep: tuple[str, ...] | None) -> dict[str, Any]:
    """An object schema naming ``keep`` (all top-level fields when None), each a flat
    type and description, and open to the rest of the result."""
    props = schema.get("properties", {})
    defs = schema.get("$defs", {})
    names = [n for n in (keep or tuple(props)) if n in props]
    return {
        "type": "object",
        "properties": {n: _flat(props[n], defs) for n in names},
        "additionalProperties": True,
    }


def _flat(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A property reduced to its JSON type(s) and description (nested objects by name)."""
    out: dict[str, Any] = {}
    types = _types(prop, defs)
    if types:
        out["type"] = types[0] if len(types) == 1 else types
    description = prop.get("description") or _resolved(prop, defs).get("description")
    if description:
        out["description"] = _first_sentence(description)
    return out


def _types(prop: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    if "anyOf" in prop:
        found: list[str] = []
        for option in prop["anyOf"]:
            for t in _types(option, defs):
                if t not in found:
                    found.append(t)
        return found
    resolved = _resolved(prop, defs)
    t = resolved.get("type")
    if isinstance(t, list):
        return [str(x) for x in t]
    if t:
        return [str(t)]
    if "enum" in resolved or "const" in resolved:
        return ["string"]
    return ["object"] if "properties" in resolved else []


def _resolved(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return defs.get(ref.rsplit("/", 1)[1], {})
    return prop


def _walk(node: Any, defs: dict[str, Any], short: bool) -> Any:
    if isinstance(node, list):
        return [_walk(x, defs, short) for x in node]
    if not isinstance(node, dict):
        return node
    node = _fold_nullable(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue  # restates the property name
        if key in LISTING_ONLY or (key == "default" and value in (None, {}, [])):
            continue  # null, nothing, is what an optional field defaults to
        if key in ("maximum", "exclusiveMaximum") and _is_sanity_cap(value):
            continue  # a bound against absurd input, not a limit a caller plans with
        if key == "description" and isinstance(value, str) and short:
            out[key] = _first_sentence(value)
        elif key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: _walk(v, defs, short) for name, v in value.items()}
        else:
            out[key] = _walk(value, defs, short)
    return out


SANITY_CAP = 1 << 20
"""Upper bounds at or above this (2^30 tokens, a million sequences...) only keep absurd
input out; the server enforces them and its error names them."""


def _is_sanity_cap(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= SANITY_CAP


def _fold_nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [{type: X, ...}, {type: null}]`` -> ``{type: [X, null], ...}``."""
    options = node.get("anyOf")
    if not isinstance(options, list) or len(options) != 2:
        return node
    nulls = [o for o in options if o == {"type": "null"}]
    others = [o for o in options if o != {"type": "null"}]
    if len(nulls) != 1 or len(others) != 1 or not isinstance(others[0].get("type"), str):
        return node
    merged = {k: v for k, v in node.items() if k != "anyOf"}
    merged.update(others[0])
    merged["type"] = [others[0]["type"], "null"]
    return merged


def _first_sentence(text: str) -> str:
    """The description's first sentence, without its closing full stop (a listed
    description is one sentence; the stop costs a character in every one of them)."""
    text = text.strip()
    m = SENTENCE_END.search(text)
    first = text[: m.start() + 1] if m else text
    return first[:-1] if first.endswith(".") and not first.endswith("..") else first
