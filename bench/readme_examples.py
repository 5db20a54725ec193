"""Re-run the README's deterministic console examples and print the lines they no longer show.

The README promises real commands with their real output; a change to the model or to a
data file moves those outputs silently. This runs every ```console block whose commands need
nothing outside the repository (no server, no stored run, no calibration, no trace-driven
probe) and prints, per block, each shown line the fresh output lacks, beside the fresh line
that starts the same way. Wall-clock figures ("in 6.3 s") differ from machine to machine and
show up here too: read them, do not chase them.

    .venv/bin/python bench/readme_examples.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDS_MORE = (
    "sim ", "probe ", "runs ", "report ", "dask ", "explain ", "calibrate ", "calibrations ",
    "workload --from", "--calibration", "--db", ".gguf", "&",
)  # fmt: skip
"""Commands that need a running server, stored runs or files a test writes first."""


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


def drift(commands: list[str], shown: list[str]) -> tuple[list[str], list[str]]:
    """Shown lines missing from a fresh run, and the fresh lines that start like them."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(
        " ; ".join(commands), shell=True, executable="/bin/bash", capture_output=True,
        text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    fresh = run.stdout + run.stderr
    missing = [
        s for s in shown if not s.strip().startswith(("…", "...")) and s.rstrip() not in fresh
    ]
    starts = {m[:12] for m in missing}
    return missing, [line for line in fresh.splitlines() if line[:12] in starts]


def main() -> None:
    moved = 0
    for commands, shown in console_blocks((ROOT / "README.md").read_text()):
        if not commands or any(s in c for c in commands for s in NEEDS_MORE):
            continue
        missing, now = drift(commands, shown)
        if missing:
            moved += 1
            print("=" * 80, "\n$", " ; ".join(commands)[:300])
            for line in missing[:12]:
                print("  README:", line[:160])
            for line in now[:12]:
                print("  now   :", line[:160])
    print(f"blocks whose shown output moved: {moved}")


if __name__ == "__main__":
    main()
