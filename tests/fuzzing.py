"""Hostile values for every field of a registry input model, shared by the fuzz tests.

The strategies mix values a user would type with the ones that broke the tools
before (rates of 1e-310, 1e308 targets, NaN, 5,000-digit integers, deep JSON,
10,000-character strings, device files as paths), so a short run reaches the
corners. What a field accepts is read from its annotation, not listed by hand:
a field added later is fuzzed too.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from hypothesis import strategies as st

MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
GPUS = ("h100", "a100-sxm-80gb", "l40s", "", "NVIDIA H100 80GB HBM3")

HOSTILE_FLOATS = (
    0.0,
    -0.0,
    -1.0,
    5e-324,
    1e-320,
    1e-310,
    1e-9,
    0.5,
    1.0,
    3.0,
    1e6,
    1e18,
    1e308,
    float("inf"),
    float("-inf"),
    float("nan"),
)
HOSTILE_INTS = (0, 1, -1, 2, 8, 64, 4096, 131072, 2**31, 2**63, 10**18, -(10**28), 10**400)
HOSTILE_STRINGS = (
    "",
    " ",
    "x" * 10_000,
    "/dev/zero",
    "/dev/null",
    "/proc/self/environ",
    "/",
    "../../../../etc/passwd",
    "nan",
    "inf",
    "1e309",
    "-1",
    "\x00",
    "é" * 50,
    '{"a": ' * 2000 + "1" + "}" * 2000,
    "[" * 5000 + "]" * 5000,
)


def deep_json(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(HOSTILE_INTS),
    st.sampled_from(HOSTILE_FLOATS),
    st.sampled_from(HOSTILE_STRINGS[:14]),
    st.text(max_size=20),
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
PERCENTILE_DICT = st.dictionaries(
    st.sampled_from(["p50", "p90", "p95", "p99", "mean", "p0", "x"]),
    st.sampled_from(HOSTILE_FLOATS),
    max_size=3,
)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            inner, _ = _unwrap(args[0])
            return inner, optional
        return annotation, optional
    return annotation, False


def for_field(name: str, annotation: Any, metadata: list[Any] = ()) -> st.SearchStrategy[Any]:
    """A strategy for one field, by its name (the domain), its type (the shape) and its
    bounds: values inside the bounds that are extreme (1e-310 where > 0 is the rule)
    reach past validation into the calculators, values outside test the validation."""
    base, optional = _unwrap(annotation)
    strategy = _for_type(name, base)
    if base in (int, float):
        strategy = st.one_of(_in_bounds(base, metadata), _in_bounds(base, metadata), strategy)
    return st.one_of(st.none(), strategy) if optional else strategy


def _in_bounds(base: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    lo = hi = None
    for m in metadata:
        for attr in ("ge", "gt"):
            if getattr(m, attr, None) is not None:
                lo = getattr(m, attr)
        for attr in ("le", "lt"):
            if getattr(m, attr, None) is not None:
                hi = getattr(m, attr)
    values = HOSTILE_INTS if base is int else HOSTILE_FLOATS
    edges = [v for v in (lo, hi) if v is not None]
    if base is int and lo is not None:
        edges.append(lo + 1)
    inside = [v for v in values if (lo is None or v >= lo) and (hi is None or v <= hi)]
    inside = [*edges, *edges, *inside]  # the bounds themselves, twice as likely
    if base is int:
        ranged = st.integers(min_value=lo, max_value=hi)
    else:
        ranged = st.floats(min_value=lo, max_value=hi, allow_nan=False)
    return st.one_of(st.sampled_from(inside), ranged) if inside else ranged


def _for_type(name: str, base: Any) -> st.SearchStrategy[Any]:
    from pydantic import BaseModel

    origin = typing.get_origin(base)
    if base is bool:
        return st.booleans()
    if origin is typing.Literal:
        return st.one_of(st.sampled_from(typing.get_args(base)), st.just("bogus"))
    if base is int:
        return st.one_of(st.sampled_from(HOSTILE_INTS), st.integers(-10, 10**6))
    if base is float:
        return st.one_of(
            st.sampled_from(HOSTILE_FLOATS), st.floats(allow_nan=True, allow_infinity=True)
        )
    if base is str:
        if name == "model":
            return st.one_of(st.sampled_from(MODELS), st.sampled_from(HOSTILE_STRINGS))
        if name == "gpu":
            return st.one_of(st.sampled_from(GPUS), st.sampled_from(HOSTILE_STRINGS))
        return st.one_of(st.sampled_from(HOSTILE_STRINGS), st.text(max_size=30))
    if origin is list:
        (item,) = typing.get_args(base) or (Any,)
        return st.lists(_for_type(name, item), max_size=6)
    if origin is dict:
        if name.startswith("slo"):
            return PERCENTILE_DICT
        return st.dictionaries(
            st.sampled_from(["max_position_embeddings", "num_hidden_layers", "k", "ttft_ms"]),
            st.one_of(
                st.sampled_from(["1e309", "1000000000", "nan", "-1", "x"]), st.text(max_size=8)
            ),
            max_size=3,
        )
    if isinstance(base, type) and issubclass(base, BaseModel):
        return st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    n: for_field(n, f.annotation, f.metadata) for n, f in base.model_fields.items()
                },
            ),
            JSON,
            st.just(deep_json(300)),
        )
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_for_type(name, a) for a in typing.get_args(base)])
    return st.one_of(JSON, st.just(deep_json(300)))


def model_dict(model: Any) -> st.SearchStrategy[dict]:
    """A dict of `model`'s shape (sub-models as dicts of their shape too) holding hostile
    values: reaches the code that reads a well-formed document with extreme numbers."""
    from pydantic import BaseModel

    def strategy(name: str, info: Any) -> st.SearchStrategy[Any]:
        base, optional = _unwrap(info.annotation)
        if isinstance(base, type) and issubclass(base, BaseModel):
            return model_dict(base)
        return for_field(name, info.annotation, info.metadata)

    return st.fixed_dictionaries(
        {}, optional={n: strategy(n, f) for n, f in model.model_fields.items()}
    )


def kwargs_for(model: Any, skip: frozenset[str] = frozenset()) -> st.SearchStrategy[dict]:
    """Keyword arguments for `model`: required fields always, others sometimes."""
    required = {}
    optional = {}
    for n, f in model.model_fields.items():
        if n in skip:
            continue
        (required if f.is_required() else optional)[n] = for_field(n, f.annotation, f.metadata)
    return st.fixed_dictionaries(required, optional=optional)
