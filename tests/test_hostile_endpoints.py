"""The probe against endpoints that misbehave on purpose: every case ends within its
timeouts plus 5 s, under 600 MB of peak memory, with what was measured kept.

Each case runs the real CLI in a child process (its own peak RSS, read with
wait4) against :mod:`hostile_server` on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from hostile_server import HostileServer

PEAK_RSS_MB = 600
GRACE_S = 5.0


# the CLI, reporting its own peak RSS on its last stderr line
CLI_WITH_PEAK = (
    "import resource, sys\n"
    "from inferwise.server.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "sys.stderr.write(f'PEAK_KB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
    "sys.exit(rc)\n"
)


def run_probe(url: str, db: str, *args: str, timeout: float = 60):
    """(exit code, stdout, stderr, wall seconds, peak RSS MB) of one `inferwise probe`."""
    cmd = [sys.executable, "-c", CLI_WITH_PEAK, "probe", url, "--db", db, *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ)
    wall = time.monotonic() - t0
    err, _, peak = p.stderr.rpartition("PEAK_KB=")
    return p.returncode, p.stdout, err, wall, int(peak.strip()) / 1024


def _records(db: str) -> list[dict]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY idx")]


def _row_bytes(db: str) -> int:
    with sqlite3.connect(db) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(requests)")]
        total = " + ".join(f"coalesce(length({c}), 0)" for c in cols)
        return int(conn.execute(f"SELECT max({total}) FROM requests").fetchone()[0] or 0)


QUICK = [
    "--model",
    "m",
    "--requests",
    "1",
    "--total-timeout-s",
    "2",
    "--stall-timeout-s",
    "2",
    "--read-timeout-s",
    "2",
    "--metrics-interval-s",
    "0",
    "--no-calibrate",
    "--json",
]


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["flood", "long_line"])
def test_a_flooding_server_is_cut_at_the_response_cap_and_the_request_kept(
    tmp_path, behaviour
) -> None:
    db = str(tmp_path / "runs.db")
    with HostileServer(behaviour) as srv:
        rc, out, err, wall, peak = run_probe(srv.url, db, *QUICK)
    assert rc == 1, err  # the one request failed: an operational failure
    assert wall < 2 + GRACE_S
    assert peak < PEAK_RSS_MB
    result = json.loads(out)
    assert [e["error_class"] for e in result["errors"]] == ["over_limit"]
    (row,) = _records(db)
    assert row["error_class"] == "over_limit" and not row["ok"]
    assert _row_bytes(db) < 1 << 20  # what was kept is bounded, not 147 MB


@pytest.mark.slow
def test_a_gzip_bomb_on_metrics_is_not_decompressed_whole(tmp_path) -> None:
    db = str(tmp_path / "runs.db")
    args = [a for a in QUICK if a not in ("--metrics-interval-s", "0")]
    with HostileServer("normal", metrics_bomb_mib=1024) as srv:
        rc, out, err, wall, peak = run_probe(srv.url, db, *args, "--metrics-interval-s", "0.2")
        scrapes = srv.metrics_requests
    assert rc == 0, err
    assert peak < PEAK_RSS_MB
    assert scrapes == 1  # a page over the cap ends the scraping: a bomb repeats
    assert any("larger than 16 MiB" in n for n in json.loads(out)["notes"])


@pytest.mark.slow
def test_a_slow_drip_server_is_stopped_at_the_calls_time_cap(tmp_path) -> None:
    db = str(tmp_path / "runs.db")
    args = [
        "--model",
        "m",
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--max-duration-s",
        "3",
        "--metrics-interval-s",
        "0",
        "--json",
    ]
    with HostileServer("slow_drip") as srv:
        rc, out, err, wall, peak = run_probe(srv.url, db, *args)
    assert wall < 3 + GRACE_S, (wall, err)
    result = json.loads(out)
    assert result["status"] == "interrupted"
    assert any("time cap" in n for n in result["notes"])


def _probe_in_process(url: str, db: str, **kw):
    import asyncio

    from inferwise.probes.runner import ProbeRequest, run_probe

    req = ProbeRequest(
        url=url, db=db, model="m", requests=2, metrics_interval_s=0, calibrate=False, **kw
    )
    return asyncio.run(run_probe(req))


def test_a_stream_that_says_done_first_is_not_complete_and_later_tokens_are_ignored(
    tmp_path,
) -> None:
    db = str(tmp_path / "runs.db")
    with HostileServer("done_first") as srv:
        result = _probe_in_process(srv.url, db)
    assert result.summary.completed == 0
    assert [e.error_class for e in result.errors] == ["malformed_sse"]


def test_implausible_usage_counts_are_ignored_not_stored(tmp_path) -> None:
    db = str(tmp_path / "runs.db")
    with HostileServer("huge_usage") as srv:
        result = _probe_in_process(srv.url, db, output_tokens=8)
    assert result.summary.completed == 2
    rows = _records(db)
    assert all(r["output_tokens"] == 8 and r["tokens_approximate"] for r in rows)
    assert all(r["input_tokens"] is None for r in rows)


def test_stored_text_never_holds_the_api_key_an_endpoint_echoes(tmp_path, monkeypatch) -> None:
    key = "sk-test-" + "9f" * 12
    monkeypatch.setenv("OPENAI_API_KEY", key)
    db = str(tmp_path / "runs.db")
    with HostileServer("echo_auth") as srv:
        result = _probe_in_process(srv.url, db, store_text=True)
    assert result.summary.completed == 2
    raw = (tmp_path / "runs.db").read_bytes()
    rows = _records(db)
    assert all("***" in r["output_text"] for r in rows)
    assert key.encode() not in raw
    from inferwise.server.cli import main

    out = tmp_path / "export.jsonl"
    assert (
        main(["runs", "export", result.run_id, "--db", db, "--include-text", "--output", str(out)])
        == 0
    )
    assert key not in out.read_text()
