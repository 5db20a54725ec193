"""Human rendering of operation results: one jinja2 Markdown template per operation."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from pydantic import BaseModel


def fmt(value: Any, digits: int = 1) -> str:
    """Numbers for tables: fixed decimals, thousands separators, '-' for missing."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    return str(value)


@lru_cache(maxsize=1)
def environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("inferwise.server", "templates"),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["fmt"] = fmt
    return env


def render(template: str, result: BaseModel) -> str:
    """Render `result` with `template`; the template sees the model as `r` and its dict as `d`."""
    tpl = environment().get_template(template)
    return tpl.render(r=result, d=result.model_dump(mode="json"), fmt=fmt).rstrip() + "\n"
