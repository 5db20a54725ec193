"""Score staged measurements blind, before they join tests/data/perf_measurements.toml.

New published measurements are judged with the stored factors before anything else may
change a factor: the printed score is the blind one the data file's comment quotes. Each
staged entry is first checked as the data file's tests check it (required keys, an id the
file does not hold yet, a model in the local catalog, a deployment that builds, the engine
settings its conditions state); an entry that fails is named with the reason and left out
of the score.

    python -m bench.score_new_data STAGED.toml [STAGED.toml ...]
    python -m bench.score_new_data STAGED.toml --fill-stated FILLED.toml

Staged files hold ``[[measurement]]`` tables in the data file's format; their ``split``
is ignored (every entry is scored as held out). ``--fill-stated`` first writes the staged
text to FILLED.toml with each setting an entry's conditions state but the entry lacks put
in before its ``values`` line (a setting the entry carries with another value is left for
the check to name), and scores that file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from collections import defaultdict

from bench.prediction_intervals import DATA, residuals
from inferwise.calculators.calibration import (
    MEASUREMENT_KEYS,
    load_measurements,
    measurement_deployment,
    missing_settings,
    simulate_measurement,
)
from inferwise.calculators.catalog import list_models

WITHIN = 0.30


def staged(paths: list[str]) -> list[dict]:
    """Every entry of the staged files, scored as held out."""
    out: list[dict] = []
    for p in paths:
        with open(p, "rb") as fh:
            out += [{**m, "split": "held_out"} for m in tomllib.load(fh).get("measurement", [])]
    return out


def fill_stated(text: str) -> tuple[str, int]:
    """The staged text with every entry's absent stated settings (``missing_settings`` the
    entry has no value for) written in before its ``values`` line, and how many were added.
    Works on the text, so the file's comments and layout stay as they were."""
    entries = {m["id"]: m for m in tomllib.loads(text).get("measurement", [])}
    out: list[str] = []
    current, added = None, 0
    for line in text.split("\n"):
        if line.startswith("id = "):
            current = tomllib.loads(line)["id"]
        if line.startswith("values = ") and current in entries:
            m = entries[current]
            for key, value in missing_settings(m).items():
                if key not in m:
                    out.append(f"{key} = {_number(key, value)}")
                    added += 1
        out.append(line)
    return "\n".join(out), added


def _number(key: str, value: float) -> str:
    """A stated setting as TOML: the memory fraction a float, token counts integers."""
    return repr(value) if key == "gpu_memory_utilization" else str(int(value))


def problem(m: dict, known_ids: set[str], models: set[str]) -> str | None:
    """Why an entry cannot join the data file as it stands, or None."""
    absent = [k for k in MEASUREMENT_KEYS if k not in m]
    if absent:
        return f"missing {', '.join(absent)}"
    if m["id"] in known_ids:
        return "its id is already in the data file"
    if m["model"] not in models:
        return f"{m['model']} is not in the local catalog (calculators/data/models)"
    try:
        measurement_deployment(m)
    except Exception as exc:  # noqa: BLE001 - reported, the entry is left out
        return f"no deployment: {str(exc).splitlines()[0][:160]}"
    stated = missing_settings(m)
    if stated:
        return "conditions state " + ", ".join(f"{k} = {v:g}" for k, v in stated.items())
    return None


def refused(m: dict) -> str:
    """Why the simulator predicts nothing for an entry (the exception it raised)."""
    try:
        simulate_measurement(m)
    except Exception as exc:  # noqa: BLE001 - reported, the entry is left out
        return str(exc).splitlines()[0][:160]
    return "no value predicted"


def score(entries: list[dict]) -> tuple[list[tuple[str, str, int, int, float]], list[str]]:
    """(source, metric family, within, values, median predicted/measured) per cell, and the
    ids the simulator predicted nothing for (left out of the cells)."""
    rs = residuals(entries)
    failed = sorted({r.measurement for r in rs if r.predicted <= 0})
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rs:
        if r.measurement not in failed:
            cells[(r.source, r.family)].append(r.predicted / r.measured)
    rows = []
    for (source, family), ratios in sorted(cells.items()):
        within = sum(1 for x in ratios if abs(x - 1.0) <= WITHIN)
        rows.append((source, family, within, len(ratios), statistics.median(ratios)))
    return rows, failed


def _filled(files: list[str], out: str) -> list[str]:
    """Write the one staged file with its stated settings filled in; the path to score."""
    if len(files) != 1:
        raise ValueError(f"takes one staged file, got {len(files)}")
    with open(files[0], encoding="utf-8") as fh:
        text, added = fill_stated(fh.read())
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {out}: {added} stated settings filled in")
    return [out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="TOML files of staged [[measurement]] entries")
    ap.add_argument(
        "--fill-stated",
        metavar="FILLED.toml",
        help="write the staged entries with the settings their conditions state filled in, "
        "and score that file (one staged file only)",
    )
    args = ap.parse_args()
    known = {m["id"] for m in load_measurements(DATA)}
    models = {m.hf_id for m in list_models()}
    try:
        files = _filled(args.files, args.fill_stated) if args.fill_stated else args.files
        entries = staged(files)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        print(f"score_new_data: files: not a readable TOML file of [[measurement]] tables ({exc})")
        return 2
    except ValueError as exc:
        print(f"score_new_data: --fill-stated: {exc}")
        return 2
    good = []
    for m in entries:
        why = problem(m, known, models)
        if why:
            print(f"left out {m.get('id', '?')}: {why}")
        else:
            good.append(m)
    rows, failed = score(good)
    by_id = {m["id"]: m for m in good}
    for i in failed:
        print(f"left out {i}: the simulator refused it ({refused(by_id[i])})")
    print(f"\n{'source':60} {'family':10} {'within30':>9} {'median ratio':>13}")
    for source, family, within, n, median in rows:
        print(f"{source[-60:]:60} {family:10} {within:4d}/{n:<4d} {median:13.2f}")
    total, n = sum(r[2] for r in rows), sum(r[3] for r in rows)
    share = f"{total / n:.0%}" if n else "-"
    scored = len(good) - len(failed)
    print(f"\nblind: {total} of {n} values within +-{WITHIN:.0%} ({share}), {scored} entries")
    return 0 if scored else 1


if __name__ == "__main__":
    sys.exit(main())
