"""Re-run the README's deterministic console examples and print the lines they no longer show.

The README promises real commands with their real output; a change to the model or to a
data file moves those outputs silently. This runs every ```console block whose commands need
nothing outside the repository (no server, no probe, no trace-driven probe) and prints, per
block, each shown line the fresh output lacks, beside the fresh line that starts the same way.
Blocks that build on each other's stored state (a calibration, then predictions with it; runs
imported from a file, then explained) run in README order against one throwaway run database,
with run ids, creation times and the database's path read as placeholders. Wall-clock figures
("in 6.3 s") differ from machine to machine and show up here too: read them, do not chase them.

    .venv/bin/python bench/readme_examples.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDS_MORE = (
    "sim ", "probe ", "runs ", "report ", "dask ", "explain ", "calibrate ", "calibrations ",
    "workload --from", "--calibration", "--db", ".gguf", "&",
)  # fmt: skip
"""Commands that need a running server, stored runs or files a test writes first."""
STATEFUL = ("calibrate ", "--calibration", "calibrations list", "runs import ", "explain ")
"""Commands that need only what earlier README blocks stored: run in order, in one database."""
RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b")
VOLATILE = (
    (RUN_ID, "RUN"),
    (re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}"), "TIME"),
    (re.compile(r"/tmp/[\w./-]*readme\.db"), "DB"),
)
"""What differs between two honest runs of a stateful block: ids, clock times, the db path."""


def console_blocks(text: str) -> list[tuple[list[str], list[str]]]:
    """(commands, shown output lines) per ```console block; backslash continuations joined."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        lines, commands, shown, i = body.split("\n"), [], [], 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ "):
                command = line[2:]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1] + " " + lines[i].strip()
                commands.append(command)
            elif line.strip():
                shown.append(line)
            i += 1
        blocks.append((commands, shown))
    return blocks


def run_block(commands: list[str], db: str | None = None) -> str:
    """The commands' combined output (with `db`, against that run database)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if db:
        env["INFERWISE_DB"] = db
    run = subprocess.run(
        " ; ".join(commands), shell=True, executable="/bin/bash", capture_output=True,
        text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    return run.stdout + run.stderr


def placeholders(text: str) -> str:
    for pattern, name in VOLATILE:
        text = pattern.sub(name, text)
    return text


def drift(shown: list[str], fresh: str) -> tuple[list[str], list[str]]:
    """Shown lines missing from a fresh run, and the fresh lines that start like them."""
    fresh = placeholders(fresh)
    missing = [
        s
        for s in shown
        if not s.strip().startswith(("…", "...")) and placeholders(s).rstrip() not in fresh
    ]
    starts = {placeholders(m)[:12] for m in missing}
    return missing, [line for line in fresh.splitlines() if line[:12] in starts]


def stateful(commands: list[str]) -> bool:
    return all(any(s in c for s in STATEFUL) for c in commands)


def main() -> None:
    moved = 0
    ids: dict[str, str] = {}  # README run id -> the id the fresh import gave it
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "readme.db")
        for commands, shown in console_blocks((ROOT / "README.md").read_text()):
            if commands and stateful(commands):
                commands = [RUN_ID.sub(lambda m: ids.get(m[0], m[0]), c) for c in commands]
                fresh = run_block(commands, db)
                if any("runs import " in c for c in commands):  # same layout, ids in order
                    shown_ids, fresh_ids = RUN_ID.findall("\n".join(shown)), RUN_ID.findall(fresh)
                    ids.update(zip(shown_ids, fresh_ids, strict=False))
            elif commands and not any(s in c for c in commands for s in NEEDS_MORE):
                fresh = run_block(commands)
            else:
                continue
            moved += report(commands, *drift(shown, fresh))
    print(f"blocks whose shown output moved: {moved}")


def report(commands: list[str], missing: list[str], now: list[str]) -> int:
    """Print a block whose shown lines moved; 1 if it did."""
    if not missing:
        return 0
    print("=" * 80, "\n$", " ; ".join(commands)[:300])
    for line in missing[:12]:
        print("  README:", line[:160])
    for line in now[:12]:
        print("  now   :", line[:160])
    return 1


if __name__ == "__main__":
    main()
