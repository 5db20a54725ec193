"""`inferwise runs list|show|compare|export` from the command line: output, exit codes, one-line errors."""

from __future__ import annotations

import csv
import io
import json

import pytest

from inferwise.probes.records import RequestRecord
from inferwise.probes.store import RunStore
from inferwise.server.cli import main


def _records(n: int, ttft_s: float, seed: int) -> list[RequestRecord]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        start = i * 0.05
        first = start + ttft_s * rng.uniform(0.9, 1.1)
        times = [first + k * 0.01 for k in range(5)]
        ok = i % 10 != 9
        out.append(
            RequestRecord(
                index=i,
                ok=ok,
                start_s=start,
                first_token_s=first if ok else None,
                end_s=times[-1] if ok else None,
                output_tokens=5 if ok else None,
                input_tokens=20,
                chunk_times_s=times if ok else [],
                chunk_tokens=[1] * 5 if ok else [],
                error_class=None if ok else "http_5xx",
                error_message=None if ok else "HTTP 503",
                http_status=None if ok else 503,
            )
        )
    return out


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        ids = []
        for label, ttft in (("a", 0.1), ("b", 0.15)):
            run_id = store.create_run(
                labels={"variant": label}, config={"concurrency": 4, "requests": 60}, meta={}
            )
            store.add_requests(run_id, _records(60, ttft, seed=len(ids)))
            store.add_metric_samples(
                run_id, [(0.1, "vllm:num_requests_waiting", {"engine": "0"}, 3.0)]
            )
            store.finish_run(run_id, "complete")
            ids.append(run_id)
    return str(path), ids


def test_list_shows_every_run_with_headline_numbers(db, capsys):
    path, ids = db
    assert main(["runs", "list", "--db", path]) == 0
    out = capsys.readouterr().out
    assert all(i in out for i in ids) and "variant=b" in out and "closed loop, concurrency 4" in out
    assert main(["runs", "list", "--db", path, "--label", "variant=a", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in data["runs"]] == [ids[0]]
    assert data["runs"][0]["completed"] == 54 and data["runs"][0]["failed"] == 6
    assert data["runs"][0]["ttft_p50_ms"] == pytest.approx(100, rel=0.1)


def test_show_recomputes_and_lists_errors_and_server_metrics(db, capsys):
    path, ids = db
    assert main(["runs", "show", ids[1][:-1], "--db", path, "--json"]) == 0  # a unique prefix works
    data = json.loads(capsys.readouterr().out)
    assert data["run_id"] == ids[1]
    assert data["summary"]["completed"] == 54 and data["summary"]["failed"] == 6
    assert data["errors"] == [{"error_class": "http_5xx", "count": 6, "examples": ["HTTP 503"]}]
    assert data["server_engine"] == "vllm"
    assert [m["concept"] for m in data["server_metrics"]] == ["requests_waiting"]
    assert main(["runs", "show", "latest", "--db", path]) == 0
    md = capsys.readouterr().out
    assert "### Errors" in md and "http_5xx" in md and "requests_waiting" in md


def test_compare_reports_the_shift(db, capsys):
    path, ids = db
    assert main(["runs", "compare", *ids, "--db", path, "--resamples", "300", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (cand,) = data["candidates"]
    assert "ttft_ms.p50" in cand["worse"]
    assert cand["label_changes"] == {"variant": "a -> b"}
    assert main(["runs", "compare", *ids, "--db", path, "--resamples", "300"]) == 0
    assert "**worse**" in capsys.readouterr().out


def test_export_csv_to_stdout_and_jsonl_to_a_file(db, capsys, tmp_path):
    path, ids = db
    assert main(["runs", "export", ids[0], "--db", path, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 60 and rows[0]["run_id"] == ids[0]
    assert float(rows[0]["ttft_ms"]) == pytest.approx(100, rel=0.15)
    assert rows[9]["ok"] == "False" and rows[9]["error_class"] == "http_5xx"
    target = tmp_path / "out.jsonl"
    assert (
        main(["runs", "export", ids[0], "--db", path, "--output", str(target), "--include-chunks"])
        == 0
    )
    assert "Exported 60 requests" in capsys.readouterr().out
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(lines) == 60 and len(lines[0]["chunk_times_s"]) == 5
    assert lines[0]["itl_mean_ms"] == pytest.approx(10, abs=0.01)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["runs", "show", "20990101-000000-beef"], "unknown run"),
        (["runs", "export", "nope"], "unknown run"),
        (["runs", "compare", "only-one"], "at least 2"),
        (["runs", "list", "--limit", "0"], "--limit"),
        (["runs", "export", "latest", "--format", "xml"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(db, capsys, argv, needle):
    path, _ = db
    assert main([*argv, "--db", path]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_database_file_is_bad_input(tmp_path, capsys):
    assert main(["runs", "show", "latest", "--db", str(tmp_path / "absent.db")]) == 2
    assert "no run database" in capsys.readouterr().err
    assert not (tmp_path / "absent.db").exists()


def test_probe_against_the_simulator_stores_runs_that_runs_commands_read(tmp_path, capsys):
    """End to end: sim -> probe -> store -> runs list/show/compare."""
    from inferwise.probes.sim import SimServer

    path = str(tmp_path / "runs.db")
    with SimServer(ttft_ms=15, itl_ms=3, max_num_seqs=2) as sim:
        for conc in ("1", "4"):
            argv = [
                "probe",
                sim.base_url,
                "--requests",
                "16",
                "--concurrency",
                conc,
                "--input-tokens",
                "24",
                "--output-tokens",
                "6",
                "--db",
                path,
                "--label",
                f"c={conc}",
                "--json",
            ]
            assert main(argv) == 0
    capsys.readouterr()
    assert main(["runs", "list", "--db", path, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert len(runs) == 2 and all(r["status"] == "complete" and r["completed"] == 16 for r in runs)
    newest, oldest = runs[0]["run_id"], runs[1]["run_id"]
    assert main(["runs", "show", newest, "--db", path, "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["summary"]["completed"] == 16 and detail["labels"]["c"] == "4"
    assert (
        main(["runs", "compare", oldest, newest, "--db", path, "--resamples", "200", "--json"]) == 0
    )
    (cand,) = json.loads(capsys.readouterr().out)["candidates"]
    # 4 streams on 2 slots queue: TTFT gets worse than at concurrency 1
    assert "ttft_ms.p50" in cand["worse"]


def test_markdown_renders_for_empty_failed_and_stale_runs(tmp_path, capsys):
    import os
    import subprocess
    import sys

    path = str(tmp_path / "runs.db")
    assert main(["runs", "list", "--db", path]) == 2  # no such file yet: bad input, nothing created
    with RunStore(path) as store:
        pass
    assert main(["runs", "list", "--db", path]) == 0
    assert "No runs stored" in capsys.readouterr().out
    with RunStore(path) as store:
        ok_id = store.create_run(config={"request_rate": "inf", "requests": 5})
        store.add_requests(ok_id, _records(20, 0.1, seed=1))
        store.finish_run(ok_id, "complete")
        failed_id = store.create_run(config={"request_rate": 2.0, "burstiness": 0.5})
        store.add_requests(
            failed_id,
            [
                RequestRecord(index=i, ok=False, start_s=i, error_class="connect_refused")
                for i in range(3)
            ],
        )
        store.finish_run(failed_id, "failed")
    # a writer that dies without finishing its run
    code = (
        "import os, sys; from inferwise.probes.store import RunStore; "
        "s = RunStore(sys.argv[1]); print(s.create_run(labels={'x': 'y'})); os._exit(0)"
    )
    stale_id = subprocess.run(
        [sys.executable, "-c", code, path],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    ).stdout.strip()
    assert main(["runs", "list", "--db", path]) == 0
    out = capsys.readouterr().out
    assert (
        "stale (writer gone)" in out
        and "all requests at once" in out
        and "gamma (burstiness 0.5)" in out
    )
    for run_id in (failed_id, stale_id):
        assert main(["runs", "show", run_id, "--db", path]) == 0
    out = capsys.readouterr().out
    assert "connect_refused" in out and "process writing this run is gone" in out
    assert main(["runs", "compare", ok_id, failed_id, "--db", path, "--resamples", "100"]) == 0
    assert "not comparable" in capsys.readouterr().out
    assert main(["runs", "export", stale_id, "--db", path, "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("run_id,index,ok")
