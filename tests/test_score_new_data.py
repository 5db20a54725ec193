"""bench/score_new_data.py: staged measurements are checked as the data file's tests check
them, then scored blind; an entry that cannot join is named with its reason."""

from __future__ import annotations

import json
import re
import sys

from bench import score_new_data
from inferwise.calculators.calibration import load_measurements

SOURCE_ID = "delphine-l40s-qwen25-7b-e1-concurrency-4"


def _toml(m: dict) -> str:
    lines = ["[[measurement]]"]
    for k, v in m.items():
        if k == "values":
            inner = ", ".join(f'"{name}" = {value}' for name, value in v.items())
            lines.append(f"values = {{ {inner} }}")
        elif isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def test_staged_entries_are_checked_then_scored_blind(tmp_path, capsys, monkeypatch) -> None:
    stored = next(m for m in load_measurements(score_new_data.DATA) if m["id"] == SOURCE_ID)
    unset = {k: v for k, v in stored.items() if k != "gpu_memory_utilization"}
    staged = [
        {**stored, "id": "staged-ok"},
        {**stored, "id": "staged-fp16", "quantization": "fp16"},  # a dtype, not a method
        {**unset, "id": "staged-unset"},  # its conditions state the memory fraction
        {**stored, "id": "staged-unknown", "model": "nobody/not-a-model"},
        stored,  # already in the data file
    ]
    path = tmp_path / "staged.toml"
    path.write_text("\n".join(_toml(m) for m in staged))
    monkeypatch.setattr(sys, "argv", ["score_new_data", str(path)])
    assert score_new_data.main() == 0
    out = capsys.readouterr().out
    assert "left out staged-fp16: the simulator refused it (quantization" in out
    assert "left out staged-unset: conditions state gpu_memory_utilization = 0.9" in out
    assert "left out staged-unknown: nobody/not-a-model is not in the local catalog" in out
    assert f"left out {SOURCE_ID}: its id is already in the data file" in out
    scored = re.search(r"blind: (\d+) of (\d+) values within \+-30% \(\d+%\), 1 entries", out)
    assert scored and int(scored.group(2)) == len(stored["values"])  # only staged-ok scored


def test_a_file_that_is_not_toml_is_refused_by_name(tmp_path, capsys, monkeypatch) -> None:
    bad = tmp_path / "staged.toml"
    bad.write_text("[[measurement]\nid = ")
    monkeypatch.setattr(sys, "argv", ["score_new_data", str(bad)])
    assert score_new_data.main() == 2
    assert "not a readable TOML file" in capsys.readouterr().out


def test_fill_stated_writes_in_what_the_conditions_state(tmp_path, capsys, monkeypatch) -> None:
    """--fill-stated copies the staged text with each absent stated setting put in before the
    entry's values line (comments kept), then scores the copy: the entry that failed the
    stated-settings check now joins the score."""
    stored = next(m for m in load_measurements(score_new_data.DATA) if m["id"] == SOURCE_ID)
    unset = {k: v for k, v in stored.items() if k != "gpu_memory_utilization"}
    path, filled = tmp_path / "staged.toml", tmp_path / "filled.toml"
    path.write_text("# staged by hand\n" + _toml({**unset, "id": "staged-unset"}))
    monkeypatch.setattr(sys, "argv", ["score_new_data", str(path), "--fill-stated", str(filled)])
    assert score_new_data.main() == 0
    out = capsys.readouterr().out
    assert "1 stated settings filled in" in out and "left out" not in out
    text = filled.read_text()
    assert text.startswith("# staged by hand")
    entry = load_measurements(filled)[0]
    assert entry["gpu_memory_utilization"] == stored["gpu_memory_utilization"]
    assert re.search(r"blind: \d+ of \d+ values within \+-30% \(\d+%\), 1 entries", out)
    monkeypatch.setattr(
        sys, "argv", ["score_new_data", str(path), str(path), "--fill-stated", str(filled)]
    )
    assert score_new_data.main() == 2
    assert "takes one staged file" in capsys.readouterr().out
