"""Human rendering of operation results: one jinja2 Markdown template per operation."""

from __future__ import annotations

import contextlib
import math
from functools import lru_cache
from typing import Any

from pydantic import BaseModel


def fmt(value: Any, digits: int = 1) -> str:
    """Numbers for tables: fixed decimals, thousands separators, '-' for missing; a value
    too small for the decimals shows two significant digits instead of 0."""
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
        digits = int(digits)  # a template macro hands it over as text
        if value and abs(value) < 0.5 * 10.0**-digits:  # not zero: say how small
            return f"{value:.2g}"
        return f"{value:,.{digits}f}"
    return str(value)


def _bytecode_cache() -> Any:
    """Compiled templates kept in the user's cache directory (jinja2 checks each
    against its source's checksum): compiling the fit template costs more than
    a fit, and a stdio MCP server or a CLI run starts with none compiled."""
    import jinja2

    from inferwise.server.mcp_tool_cache import cache_dir

    folder = cache_dir()
    if folder is None:
        return None
    folder = folder / "templates"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None

    class _BestEffortCache(jinja2.FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: Any) -> None:
            with contextlib.suppress(OSError):  # a full or read-only disk must not fail rendering
                super().dump_bytecode(bucket)

    return _BestEffortCache(str(folder))


def rate(value: Any) -> str:
    """A rate as people write it: three significant digits (0.001, 2.5, 120), so a slow
    rate does not print as 0.00."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return fmt(value)
    if math.isinf(value) or math.isnan(value):
        return fmt(float(value))
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


@lru_cache(maxsize=1)
def environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("inferwise.server", "templates"),
        bytecode_cache=_bytecode_cache(),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["fmt"] = fmt
    env.filters["rate"] = rate
    return env


def render(template: str, result: BaseModel) -> str:
    """Render `result` with `template`; the template sees the model as `r` and its dict as `d`."""
    tpl = environment().get_template(template)
    return tpl.render(r=result, d=result.model_dump(mode="json"), fmt=fmt).rstrip() + "\n"
