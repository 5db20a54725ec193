"""The command line, generated from the operation registry.

Every flag comes from a field of the operation's pydantic input model: the
field `tensor_parallel_size` becomes `--tensor-parallel-size`, its description
the help text. Values are handed to pydantic as strings so that validation,
and its error messages, live in one place. A subcommand's parser is only built
when that subcommand runs, which keeps `inferwise --help` and start-up fast.

Exit codes: 0 the command ran; 2 bad input (one line on stderr); 1 the job
itself failed.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferwise.calculators.errors import InputError, OperationalError, classify_unexpected
from inferwise.server.registry import OPERATIONS, Operation, _resolve


class UsageError(Exception):
    """Raised instead of argparse's own exit so every usage error is one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # noqa: D102 - argparse API
        raise UsageError(f"{self.prog}: {message}")


@dataclass(frozen=True)
class Service:
    """A long-running command (a server) whose flags also come from a pydantic model.

    `func_ref` takes the validated model and returns an exit code."""

    name: str
    summary: str
    input_ref: str
    func_ref: str


SERVICES: list[Service] = [
    Service(
        "sim",
        "Serve a simulated OpenAI-compatible engine on localhost (no GPU needed).",
        "inferwise.probes.sim:SimConfig",
        "inferwise.probes.sim:serve",
    ),
    Service(
        "mcp",
        "Serve inferwise to AI assistants over MCP (stdio, or streamable HTTP on localhost).",
        "inferwise.server.mcp_server:MCPConfig",
        "inferwise.server.mcp_server:serve",
    ),
    Service(
        "demo",
        "Start the simulated engine and run fit, predict, probe and plan against it.",
        "inferwise.server.demo:DemoConfig",
        "inferwise.server.demo:run_demo",
    ),
]


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap_optional(args[0])
    if origin is typing.Annotated:
        return _unwrap_optional(typing.get_args(annotation)[0])
    return annotation


def _not_nan(value: Any, field: str) -> Any:
    """A flag's text as given, except "nan": pydantic would read it as a float and answer
    with a range message ("greater than 0") that hides what was wrong."""
    if isinstance(value, str) and value.strip().lower().lstrip("+-") == "nan":
        raise InputError(field, "NaN is not a number", "a number")
    return value


def _list_value(values: list[str], field: str) -> list[str]:
    """A list flag's items, comma-separated or repeated; a flag given with nothing in it is
    refused rather than read as "not given" (``--gpus ""`` would search every GPU)."""
    out = [p for item in values for p in str(item).split(",") if p.strip()]
    if not out:
        raise InputError(field, "given without a value", "one or more values, comma-separated")
    return out


def _kv_pairs(values: list[str], field: str) -> dict[str, str]:
    """KEY=VALUE flags, repeated or comma-separated, or a JSON object as vLLM takes it
    (``--limit-mm-per-prompt '{"image": 0}'``); values stay text for the model to type."""
    out: dict[str, str] = {}
    for item in values:
        if item.lstrip().startswith("{"):
            out.update(_json_pairs(item, field))
            continue
        for part in item.split(",") if "{" not in item and "[" not in item else [item]:
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise InputError(field, f"expected key=value, got {part!r}")
            out[key.strip()] = value.strip()
    return out


def _json_pairs(text: str, field: str) -> dict[str, str]:
    import json

    from inferwise.calculators.files import loads_json

    data = loads_json(text, field)
    if not isinstance(data, dict):
        raise InputError(field, "expected a JSON object of key: value pairs")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


def _is_structured(annotation: Any) -> bool:
    """True for fields that hold pydantic models (or lists/dicts of them): those take JSON on the CLI."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    args = typing.get_args(annotation)
    return bool(args) and any(_is_structured(_unwrap_optional(a)) for a in args)


def _structured_value(text: str, field: str) -> Any:
    import tomllib
    from pathlib import Path

    from inferwise.calculators.files import MiB, check_depth, loads_json, read_text

    where = "the value"
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        raw = read_text(path, field, 4 * MiB)
        if path.suffix.lower() == ".toml":
            try:
                data = tomllib.loads(raw)
            except (tomllib.TOMLDecodeError, RecursionError) as exc:
                raise InputError(field, f"{path} is not valid TOML: {exc}") from None
            check_depth(data, field, str(path))
            return data
        text, where = raw, str(path)
    return loads_json(text, field, where)


def _add_field(parser: argparse.ArgumentParser, name: str, info: Any) -> Callable[[Any], Any]:
    """Add one flag for a model field; return the converter from argparse value to model input."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    annotation = _unwrap_optional(info.annotation)
    origin = typing.get_origin(annotation)
    help_text = (info.description or "").replace("%", "%%")
    if (
        not info.is_required()
        and info.default not in (None, PydanticUndefined())
        and not isinstance(info.default, (list, dict))
    ):
        help_text += f" [default: {info.default}]"
    kwargs: dict[str, Any] = {"help": help_text, "dest": name, "default": argparse.SUPPRESS}
    convert: Callable[[Any], Any] = lambda v: v  # noqa: E731
    if annotation in (float, int):
        convert = lambda v, _n=name: _not_nan(v, _n)  # noqa: E731

    if _is_structured(annotation):
        # Steps of an agentic task and similar nested inputs: JSON text, or @path to a JSON/TOML file.
        kwargs["metavar"] = "JSON|@FILE"
        convert = lambda v, _n=name: _structured_value(v, _n)  # noqa: E731
    elif annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif origin is typing.Literal:
        kwargs["choices"] = [str(a) for a in typing.get_args(annotation)]
        kwargs["metavar"] = "{" + ",".join(kwargs["choices"]) + "}"
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        kwargs["choices"] = [str(m.value) for m in annotation]
    elif origin in (list, tuple, set, typing.Sequence, Sequence):
        kwargs["nargs"] = "+"
        kwargs["action"] = "extend"
        # "--sweep 1,2,4" and "--sweep 1 2 4" both work
        convert = lambda v, _n=name: _list_value(v, _n)  # noqa: E731
    elif origin is dict:
        kwargs["action"] = "append"
        kwargs["metavar"] = "KEY=VALUE"
        convert = lambda v, _n=name: _kv_pairs(v, _n)  # noqa: E731

    if extra.get("cli_positional"):
        kwargs.pop("dest")
        if not info.is_required():
            kwargs["nargs"] = "?"
        parser.add_argument(name, **kwargs)
    else:
        flags = [flag_name(name), *extra.get("cli_aliases", [])]
        if info.is_required():
            kwargs["required"] = True
        parser.add_argument(*flags, **kwargs)
    return convert


def PydanticUndefined() -> Any:  # noqa: N802 - mirrors pydantic's sentinel name
    from pydantic_core import PydanticUndefined as undefined

    return undefined


def build_parser(
    prog: str, model: Any, description: str, with_json: bool, with_report: bool = False
) -> tuple[_Parser, dict]:
    parser = _Parser(prog=prog, description=description)
    converters = {name: _add_field(parser, name, info) for name, info in model.model_fields.items()}
    if with_json:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
    if with_report:
        parser.add_argument(
            "--report",
            metavar="FILE.html",
            help="also write the result as a self-contained HTML report with its figures",
        )
    return parser, converters


def _location_to_flag(model: Any, loc: Sequence[Any]) -> str:
    if not loc:
        return "input"
    head = str(loc[0])
    info = model.model_fields.get(head) if model is not None else None
    if info is not None:
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        base = head.upper() if extra.get("cli_positional") else flag_name(head)
    else:
        base = flag_name(head)
    rest = ".".join(str(p) for p in loc[1:])
    return f"{base}{'.' + rest if rest else ''}"


def validation_message(model: Any, exc: Any, flag_style: bool = True) -> str:
    """One line naming each offending input and what is accepted."""
    parts = []
    for err in exc.errors():
        loc = err.get("loc", ())
        where = (
            _location_to_flag(model, loc)
            if flag_style
            else ".".join(str(p) for p in loc) or "input"
        )
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def parse_input(
    op_name: str,
    model: Any,
    argv: list[str],
    description: str,
    with_json: bool = True,
    report_to: list[str] | None = None,
):
    """Parse argv into a validated model instance; returns (instance, wants_json). With
    ``report_to`` (a list) the command takes --report, whose path is appended to it."""
    from pydantic import ValidationError

    parser, converters = build_parser(
        f"inferwise {op_name}", model, description, with_json, report_to is not None
    )
    ns = vars(parser.parse_args(argv))
    wants_json = bool(ns.pop("json", False))
    report = ns.pop("report", None)
    if report_to is not None and report:
        report_to.append(report)
    data = {k: converters[k](v) for k, v in ns.items()}
    try:
        return model.model_validate(data), wants_json
    except ValidationError as exc:
        raise InputError("input", validation_message(model, exc)) from None


def _message_for_cli(exc: InputError, model: Any = None) -> str:
    field = exc.field
    if field and field != "input" and "." not in field and " " not in field:
        field = _location_to_flag(model, [field]) if model is not None else flag_name(field)
    text = f"{field}: {exc.message}" if field != "input" else exc.message
    if exc.accepted:
        text += f" (accepted: {exc.accepted})"
    return text


async def _stderr_progress(done: float, total: float | None, message: str = "") -> None:
    if sys.stderr.isatty():
        tail = f"/{total:g}" if total else ""
        sys.stderr.write(f"\r{done:g}{tail} {message}".ljust(60)[:120])
        sys.stderr.flush()
    elif total and done >= total:
        sys.stderr.write(f"{done:g}/{total:g} {message}\n")


def run_operation(op: Operation, argv: list[str]) -> int:
    reports: list[str] | None = [] if op.extra.get("report") else None
    request, wants_json = parse_input(op.name, op.input_model, argv, op.summary, report_to=reports)
    if reports:
        _report_target(reports[0])  # a bad path fails before the work, not after
    if op.is_async:
        import inspect

        kwargs = {}
        if "progress" in inspect.signature(op.func).parameters:
            kwargs["progress"] = _stderr_progress
        result = asyncio.run(op.func(request, **kwargs))
        if sys.stderr.isatty():
            sys.stderr.write("\n")
    else:
        from inferwise.calculators.deadline import compute_budget, default_budget_s

        with compute_budget(default_budget_s(op.compute_budget_s)):
            result = op.func(request)
    if wants_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        from inferwise.server.render import render

        sys.stdout.write(render(op.template, result))
    if reports:
        _write_report(op, result, reports[0])
    if op.exit_nonzero_field and getattr(result, op.exit_nonzero_field, False):
        return 1
    return 0


def _report_target(path_text: str) -> Any:
    from pathlib import Path

    path = Path(path_text).expanduser()
    if path.is_dir() or not path.parent.is_dir():
        raise InputError("report", f"cannot write {path}", "a file path in an existing folder")
    return path


def _write_report(op: Operation, result: Any, path_text: str) -> None:
    """The calculator's result as an HTML report (server.reports), beside the table."""
    import inferwise.server.reports as reports

    report = getattr(reports, op.extra["report"])(result)
    path = _report_target(path_text)
    try:
        path.write_text(report.html, encoding="utf-8")
    except OSError as exc:
        raise OperationalError(f"cannot write the report: {exc.strerror or exc}") from None
    sys.stderr.write(f"report: {path} ({len(report.figures)} figure(s))\n")


def _top_help() -> str:
    lines = ["usage: inferwise COMMAND [options]", "", "commands:"]
    seen: set[str] = set()
    for op in OPERATIONS:
        lines.append(f"  {op.name:<14} {op.summary}")
        seen.add(op.name)
    for svc in SERVICES:
        lines.append(f"  {svc.name:<14} {svc.summary}")
    lines += ["", "Run 'inferwise COMMAND --help' for a command's options.", ""]
    return "\n".join(lines)


def _match(argv: list[str]) -> tuple[Operation | Service | None, list[str]]:
    if len(argv) >= 2 and f"{argv[0]} {argv[1]}" in {op.name for op in OPERATIONS}:
        name = f"{argv[0]} {argv[1]}"
        return next(op for op in OPERATIONS if op.name == name), argv[2:]
    for op in OPERATIONS:
        if op.name == argv[0]:
            return op, argv[1:]
    for svc in SERVICES:
        if svc.name == argv[0]:
            return svc, argv[1:]
    return None, argv


def _error_line(text: str) -> None:
    """An error is one line on stderr: line breaks a message quotes from the input (a file
    name, a JSON key) are shown escaped, so a script reading stderr sees one line."""
    sys.stderr.write(text.replace("\r", "\\r").replace("\n", "\\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(_top_help())
        return 0
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import version

        sys.stdout.write(f"inferwise {version('inferwise')}\n")
        return 0
    target, rest = _match(argv)
    if target is None:
        groups = sorted({op.name.split()[0] for op in OPERATIONS if " " in op.name})
        if argv[0] in groups:
            subs = [op.name.split()[1] for op in OPERATIONS if op.name.startswith(argv[0] + " ")]
            sys.stderr.write(f"inferwise {argv[0]}: choose one of: {', '.join(subs)}\n")
        else:
            names = (
                [op.name for op in OPERATIONS if " " not in op.name]
                + groups
                + [s.name for s in SERVICES]
            )
            sys.stderr.write(
                f"inferwise: unknown command {argv[0]!r} (accepted: {', '.join(names)})\n"
            )
        return 2
    model = None
    try:
        model = _resolve(target.input_ref) if isinstance(target, Service) else target.input_model
        if isinstance(target, Service):
            request, _ = parse_input(target.name, model, rest, target.summary, with_json=False)
            return int(_resolve(target.func_ref)(request) or 0)
        return run_operation(target, rest)
    except UsageError as exc:
        _error_line(str(exc))
        return 2
    except InputError as exc:
        _error_line(f"inferwise {target.name}: {_message_for_cli(exc, model)}")
        return 2
    except OperationalError as exc:
        _error_line(f"inferwise {target.name}: {exc}")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"inferwise {target.name}: interrupted\n")
        return 130
    except Exception as exc:  # unmapped: too-large input, or a bug said as one; one line
        import os

        if os.environ.get("INFERWISE_DEBUG"):
            raise
        mapped = classify_unexpected(exc)
        if isinstance(mapped, InputError):
            _error_line(f"inferwise {target.name}: {_message_for_cli(mapped, model)}")
            return 2
        _error_line(f"inferwise {target.name}: {mapped}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
