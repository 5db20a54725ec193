"""Every `inferwise ...` command that a plan or a diagnosis prints, for every example workload,
must parse with the real CLI: flags drift as calculators and the probe evolve, and a user
copies these lines.

Recipes in the knowledge files use placeholders (URL, N, R, <p50>); those are replaced by a
plausible value before parsing, so the check is on flag names, choices and value types. A
command cut short with "..." is checked up to that point."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose
from inferwise.knowledge.planning import PlanRequest, plan_experiments

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "workloads").glob("*"))
CMD = re.compile(r"inferwise (?:runs |kb )?[a-z]+[^`\n;]*")
PLACEHOLDER = re.compile(r"^(<.*>|[A-Z][A-Z0-9_]*|R_peak_x1\.5|2x_capacity)$")
BY_FLAG = {"--model": "meta-llama/Llama-3.1-8B-Instruct", "--gpu": "h100-sxm-80gb"}


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


def _commands(result) -> set[str]:
    return {m.strip() for s in _strings(result.model_dump()) for m in CMD.findall(s)}


def _argv(text: str, parser) -> list[str]:
    """The parsable prefix of a command in prose: flags, their values and positionals, with
    placeholders replaced; stops at "...", a parenthesis or the first word of prose."""
    tokens = re.findall(r"<[^>]*>|\S+", text)
    actions = parser._option_string_actions  # noqa: SLF001 - argparse exposes no public lookup
    positionals = [a for a in parser._actions if not a.option_strings]  # noqa: SLF001
    out: list[str] = []
    expect_value = False
    n_pos = 0
    for tok in tokens:
        if tok in ("...", "…") or tok.startswith("("):
            break
        if tok.startswith("--"):
            if tok not in actions:
                out.append(tok)  # unknown flag: let argparse reject it
                break
            out.append(tok)
            expect_value = actions[tok].nargs != 0
            continue
        if expect_value:
            out.append(BY_FLAG.get(out[-1], "2") if PLACEHOLDER.match(tok) else tok.rstrip(".,"))
            expect_value = False
            continue
        if n_pos < len(positionals) and not out:
            out.append("http://127.0.0.1:8000" if PLACEHOLDER.match(tok) or "HOST" in tok else tok)
            n_pos += 1
            continue
        break  # prose after the command
    if out and out[-1] in actions and actions[out[-1]].nargs != 0:
        out.pop()  # a flag whose value was elided ("--request-rate ...")
    return out


@pytest.fixture(scope="module")
def printed() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in EXAMPLES:
        cmds = _commands(plan_experiments(PlanRequest(workload=str(p))))
        cmds |= _commands(diagnose(DiagnoseRequest(workload=str(p))))
        out[p.stem] = cmds
    return out


def test_every_example_prints_commands(printed):
    for name, cmds in printed.items():
        assert any(c.startswith("inferwise probe ") for c in cmds), name


def test_every_printed_command_parses_with_the_real_cli(printed):
    from inferwise.server import cli
    from inferwise.server.registry import BY_NAME

    checked = 0
    for name, cmds in printed.items():
        for cmd in sorted(cmds):
            words = [w.rstrip(".,:") for w in cmd.split()]
            op = BY_NAME.get(" ".join(words[1:3])) or BY_NAME.get(words[1])
            assert op is not None, (name, cmd)
            rest = cmd.split(op.name, 1)[1].lstrip(".,:")
            parser, _ = cli.build_parser(f"inferwise {op.name}", op.input_model, op.summary, True)
            argv = _argv(rest, parser)
            if not argv:
                continue  # a bare mention ("`inferwise budget` says ...")
            try:
                parser.parse_args(argv)
            except (SystemExit, cli.UsageError):
                pytest.fail(f"{name}: does not parse: {cmd!r} (argv {argv})")
            checked += 1
    assert checked >= 40


def test_complete_plan_probe_commands_validate_and_carry_the_workload(printed):
    """The probe lines the plan composes itself are complete: they validate as a request and
    use the workload's own lengths."""
    from inferwise.server import cli
    from inferwise.server.registry import BY_NAME

    probe = BY_NAME["probe"]
    for p in EXAMPLES:
        plan = plan_experiments(PlanRequest(workload=str(p), url="http://127.0.0.1:8000"))
        for stage in plan.stages:
            for m in stage.measure:
                if m.startswith("inferwise probe http"):
                    argv = shlex.split(m.split("   (")[0])[2:]
                    cli.parse_input("probe", probe.input_model, argv, probe.summary)
                    assert "--input-tokens" in argv and "--output-tokens" in argv, m


def test_a_workload_with_config_overrides_is_sized_and_its_commands_carry_them():
    """A Llama 4 deployment in a workload file is served with vLLM's --hf-overrides
    model_type=llama4_text; stated as deployment.hf_overrides, the plan sizes the language
    model (not refused over the vision tower) and every calculator command and launch line it
    prints carries the override."""
    import json

    wl = json.loads((ROOT / "examples" / "workloads" / "support-chat.json").read_text())
    wl["deployment"] = {
        **wl.get("deployment", {}),
        "model": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "gpu": "h100-sxm-80gb",
        "tensor_parallel_size": 4,
        "max_model_len": 32768,
    }
    refused = json.dumps(plan_experiments(PlanRequest(workload=json.dumps(wl))).model_dump())
    assert "vision tower" in refused
    wl["deployment"]["hf_overrides"] = {"model_type": "llama4_text"}
    plan = plan_experiments(PlanRequest(workload=json.dumps(wl)))
    text = json.dumps(plan.model_dump())
    assert "vision tower" not in text
    calc = [c for c in _commands(plan) if re.match(r"inferwise (fit|predict|budget) --", c)]
    assert calc and all("--hf-overrides model_type=llama4_text" in c for c in calc)
    assert """--hf-overrides '{\\"model_type\\": \\"llama4_text\\"}'""" in text  # vllm serve
