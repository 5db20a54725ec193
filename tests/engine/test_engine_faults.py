"""A real server process dying in the middle of a probe run.

The server is SIGKILLed half a request's length after a fixed number of
requests finished (timed from the probe's own progress callback, with the
request length read back from the run store), so the streams in flight are
cut mid-way and every later request finds the port closed. The run must
neither crash nor call itself interrupted (the client was not stopped); it is
complete but partly failed, with every finished request kept and the
failures classified.
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

pytestmark = pytest.mark.engine

KILL_AFTER = 4
REQUESTS = 16
CONCURRENCY = 4
OUTPUT_TOKENS = 48


def test_killing_the_server_mid_run_keeps_finished_requests_and_classifies_the_rest(
    start_llama_server, probe_engine
) -> None:
    from inferwise.probes.store import RunStore

    server = start_llama_server()
    killed_at: list[float] = []

    async def progress(done: float, total: float | None, message: str) -> None:
        if done >= KILL_AFTER and not killed_at:
            e2e_ms = await stored_request_length_ms()
            killed_at.append(done)
            # the next wave has just started: kill it half-way through its streams
            asyncio.get_running_loop().call_later(e2e_ms / 2000.0, server.kill)

    async def stored_request_length_ms() -> float:
        """The median finished request's E2E, read back from the store. Its writer thread
        commits within milliseconds, but the progress callback can come first (a CI run
        read an empty store; the error, swallowed by the progress reporter, left the kill
        unscheduled): wait for it, up to a second."""
        for _ in range(100):
            with RunStore(probe_engine.db) as store:
                (run,) = store.list_runs(limit=1)
                stored = [r.e2e_ms for r in store.requests(run.run_id) if r.ok]
            if stored:
                return statistics.median(stored)
            await asyncio.sleep(0.01)
        raise AssertionError("no finished request reached the store within a second")

    result, records = probe_engine(
        server,
        progress=progress,
        concurrency=CONCURRENCY,
        requests=REQUESTS,
        output_tokens=OUTPUT_TOKENS,
        connect_timeout_s=2.0,
        read_timeout_s=10.0,
    )
    assert killed_at, "the server was never killed"
    assert server.process is not None and server.process.poll() is not None

    # not interrupted (nobody stopped the client), not lost: a complete run with failures
    assert result.status == "complete"
    assert not result.all_failed
    measured = [r for r in records if not r.warmup]
    assert len(measured) == REQUESTS, "a request went missing from the store"
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    assert len(ok) >= KILL_AFTER and failed
    assert result.summary.completed == len(ok) and result.summary.failed == len(failed)
    for rec in ok:  # finished requests are whole
        assert rec.output_tokens == OUTPUT_TOKENS and rec.server_timings

    classes = {r.error_class for r in failed}
    # streams in flight were cut; requests sent afterwards were refused
    assert classes <= {"stream_cut", "connect_refused"}, classes
    assert "connect_refused" in classes
    cut = [r for r in failed if r.error_class == "stream_cut"]
    assert cut, "no stream was in flight when the server died"
    # a cut stream keeps its partial timings: it got a first token, not the whole output
    assert any(
        r.first_token_s is not None and 0 < len(r.chunk_times_s) < OUTPUT_TOKENS for r in cut
    )

    # the summary says what happened, class by class, with an example message each
    by_class = {e.error_class: e for e in result.errors}
    assert sum(e.count for e in result.errors) == len(failed)
    for cls in classes:
        assert by_class[cls].examples and by_class[cls].examples[0]
    assert result.summary.errors == {c: by_class[c].count for c in classes}

    # the stored run reads back the same after the fact
    with RunStore(probe_engine.db) as store:
        stored = store.get_run(result.run_id)
        assert stored.status == "complete"
        assert len(store.requests(result.run_id)) == REQUESTS


def test_the_cli_reports_a_server_death_in_its_summary(start_llama_server, tmp_path) -> None:
    """``inferwise probe`` against a server killed mid-run: exit 0, and an Errors table."""
    import subprocess
    import sys
    import time

    from inferwise.probes.store import RunStore

    server = start_llama_server()
    db = tmp_path / "cli.db"
    cmd = [
        sys.executable, "-m", "inferwise.server.cli", "probe", server.base_url,
        "--concurrency", "4", "--requests", "24", "--input-tokens", "32",
        "--output-tokens", "48", "--db", str(db),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                with RunStore(db) as store:
                    runs = store.list_runs(limit=1)
                    done = len(store.requests(runs[0].run_id)) if runs else 0
                if done >= KILL_AFTER:
                    time.sleep(0.3)  # let the next wave start streaming
                    server.kill()
                    break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert server.process is not None and server.process.poll() is not None, "never killed"
    assert proc.returncode == 0, err  # some requests finished: the command did its job
    assert "Traceback" not in err
    assert "### Errors" in out
    assert "connect_refused" in out
    assert "· complete ·" in out
