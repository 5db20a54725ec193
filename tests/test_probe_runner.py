"""`inferwise probe` end to end against a local reference server: stored rows, sweeps, open loop,
the API key never leaving the process, CLI exit codes and Ctrl-C/SIGTERM keeping finished rows."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.runner import ProbeRequest, run_probe
from inferwise.probes.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


from bench.refserver import RefServer  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("INFERWISE_ALLOW_HOSTS", raising=False)
    monkeypatch.delenv("INFERWISE_DB", raising=False)


@pytest.fixture(scope="module")
def server():
    with RefServer(ttft_lo_ms=10, ttft_hi_ms=40, itl_ms=3) as s:
        yield s


def probe(**kw):
    kw.setdefault("metrics_interval_s", 0)
    return asyncio.run(run_probe(ProbeRequest(**kw)))


def test_closed_loop_run_is_stored_request_by_request(server, tmp_path) -> None:
    db = str(tmp_path / "runs.db")
    res = probe(
        url=server.base_url,
        concurrency=3,
        requests=12,
        warmup_requests=2,
        output_tokens=6,
        slo={"ttft_ms": 1000, "e2e_ms": 5000},
        db=db,
        label={"engine": "ref"},
    )
    assert res.status == "complete" and not res.all_failed
    s = res.summary
    assert (s.completed, s.failed, s.warmup_excluded) == (12, 0, 2)
    assert s.slo_attainment_pct == 100.0 and s.goodput and s.goodput > 0
    assert s.ttft_ms.p50 is not None and 10 <= s.ttft_ms.p50 < 500
    assert s.total_output_tokens == 12 * 6 and not s.tokens_approximate
    assert (
        res.calibration.calibrated
        and res.calibration.mean_input_tokens_error_pct == pytest.approx(0, abs=1)
    )
    store = RunStore(db)
    run = store.get_run(res.run_id)
    assert (
        run.status == "complete"
        and run.labels["engine"] == "ref"
        and run.labels["model"] == "ref-model"
    )
    rows = store.requests(res.run_id)
    assert len(rows) == 14 and sum(r.warmup for r in rows) == 2
    assert all(
        r.prompt_text is None and r.output_text is None for r in rows
    )  # not stored unless asked
    assert run.summary.completed == 12


def test_store_text_and_completions_endpoint(server, tmp_path) -> None:
    db = str(tmp_path / "runs.db")
    res = probe(
        url=server.base_url + "/v1",
        endpoint="completions",
        requests=2,
        output_tokens=3,
        store_text=True,
        db=db,
    )
    rows = RunStore(db).requests(res.run_id)
    assert all(r.prompt_text and r.output_text == " tok" * 3 for r in rows)


def test_open_loop_records_schedule_and_sweep_makes_one_run_per_point(server, tmp_path) -> None:
    db = str(tmp_path / "runs.db")
    res = probe(
        url=server.base_url,
        request_rate=50,
        sweep=[40, 80],
        requests=10,
        output_tokens=3,
        db=db,
        seed=5,
    )
    assert [p.request_rate for p in res.sweep] == [40, 80]
    assert len({p.run_id for p in res.sweep}) == 2
    labels = [RunStore(db).get_run(p.run_id).labels for p in res.sweep]
    assert labels[0]["sweep_id"] == labels[1]["sweep_id"] and labels[1]["sweep_value"] == "80"
    rows = RunStore(db).requests(res.sweep[0].run_id)
    assert len(rows) == 10 and all(r.scheduled_s is not None for r in rows)
    assert res.client_health.schedule_delay_ms.count == 10
    assert res.load.startswith("open loop, 80 req/s")


def test_duration_bound(server, tmp_path) -> None:
    t0 = time.monotonic()
    res = probe(
        url=server.base_url,
        concurrency=2,
        duration_s=0.5,
        output_tokens=3,
        db=str(tmp_path / "r.db"),
    )
    assert time.monotonic() - t0 < 5
    assert res.summary.completed >= 4


def test_failed_requests_are_classified_not_fatal(tmp_path) -> None:
    with RefServer(ttft_lo_ms=5, ttft_hi_ms=5, itl_ms=1, fault="http_503", fault_share=0.5) as srv:
        res = probe(
            url=srv.base_url,
            model="m",
            concurrency=2,
            requests=20,
            output_tokens=2,
            calibrate=False,
            db=str(tmp_path / "r.db"),
        )
    assert 0 < res.summary.failed < 20 and res.summary.completed + res.summary.failed == 20
    assert res.errors[0].error_class == "http_5xx" and res.errors[0].examples
    assert res.status == "complete" and not res.all_failed


def test_retry_after_is_honoured_only_when_asked(tmp_path) -> None:
    with RefServer(
        ttft_lo_ms=5, ttft_hi_ms=5, itl_ms=1, fault="http_429", fault_share=0.5, retry_after_s=0.05
    ) as srv:
        plain = probe(
            url=srv.base_url,
            model="m",
            requests=10,
            output_tokens=2,
            calibrate=False,
            db=str(tmp_path / "a.db"),
        )
        patient = probe(
            url=srv.base_url,
            model="m",
            requests=10,
            output_tokens=2,
            calibrate=False,
            honor_retry_after=True,
            db=str(tmp_path / "b.db"),
        )
    assert plain.summary.errors.get("http_429", 0) > 0
    assert patient.summary.errors.get("http_429", 0) < plain.summary.errors["http_429"]


def test_all_failed_marks_the_result(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = probe(url=f"http://127.0.0.1:{port}", requests=3, db=str(tmp_path / "r.db"))
    assert res.all_failed and res.status == "failed"
    assert res.errors[0].error_class == "connect_refused"
    assert RunStore(str(tmp_path / "r.db")).get_run(res.run_id).status == "failed"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"requests": 2000}, "requests"),
        ({"concurrency": 600}, "concurrency"),
        ({"duration_s": 3600}, "duration_s"),
        ({"sweep": [1, 1000]}, "sweep"),  # the value to fix is in the sweep
        ({"sweep": [float("nan")]}, "sweep"),
        ({"sweep": [float("inf")]}, "sweep"),
        ({"sweep": [1e300]}, "sweep"),
        ({"concurrency": 100_000}, "concurrency"),  # the stream cap, not the prompt memory
        ({"url": "http://169.254.169.254"}, "url"),
        ({"url": "http://10.9.9.9:8000"}, "url"),
    ],
)
def test_caps_and_policy_refuse_before_sending(kw, field, tmp_path) -> None:
    args = {"url": "http://127.0.0.1:9", "db": str(tmp_path / "r.db"), **kw}
    with pytest.raises(InputError) as err:
        probe(**args)
    assert err.value.field == field


def test_caps_can_be_raised_explicitly() -> None:
    req = ProbeRequest(url="http://127.0.0.1:9", requests=2000, max_requests=5000)
    from inferwise.probes.runner import _check_bounds

    assert _check_bounds(req)[0] == 2000


def test_api_key_is_sent_but_never_printed_logged_or_stored(tmp_path, monkeypatch) -> None:
    key = "sk-live-DO-NOT-LEAK-0123456789abcdef"
    monkeypatch.setenv("MY_KEY", key)
    db = tmp_path / "r.db"
    with RefServer(ttft_lo_ms=5, ttft_hi_ms=5, itl_ms=1, fault="http_400_echo") as srv:
        res = probe(
            url=srv.base_url,
            model="m",
            requests=3,
            api_key_env="MY_KEY",
            calibrate=False,
            db=str(db),
        )
    assert res.errors and res.errors[0].error_class == "http_4xx"
    assert "***" in res.errors[0].examples[0]  # the server echoed it back; we scrubbed it
    from inferwise.server.render import render

    outputs = [res.model_dump_json(), render("probe.md.j2", res)]
    for text in outputs:
        assert key not in text
    con = sqlite3.connect(db)
    dump = "\n".join(con.iterdump())
    con.close()
    assert key not in dump
    for f in tmp_path.glob("r.db*"):
        assert key.encode() not in f.read_bytes()


def test_api_key_env_takes_a_name_not_a_key() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ProbeRequest(url="http://127.0.0.1:9", api_key_env="sk-abc-123")


# ----------------------------------------------------------------------------- CLI


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inferwise.server", "probe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_cli_exit_codes(server, tmp_path, capsys) -> None:
    db = str(tmp_path / "r.db")
    ok = cli(
        server.base_url,
        "--requests",
        "3",
        "--output-tokens",
        "3",
        "--db",
        db,
        "--json",
        "--metrics-interval-s",
        "0",
    )
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["summary"]["completed"] == 3 and out["run_id"]
    for field in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(out["summary"][field]) >= {"mean", "p50", "p90", "p95", "p99"}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = cli(f"http://127.0.0.1:{port}", "--requests", "2", "--db", db)
    assert dead.returncode == 1
    assert "connect_refused" in dead.stdout

    from inferwise.server.cli import main

    capsys.readouterr()
    for bad in (
        ["127.0.0.1:8000"],
        [server.base_url, "--requests", "0"],
        ["http://169.254.169.254/"],
        [server.base_url, "--slo", "latency=5"],
        [server.base_url, "--duration", "-1"],
        [server.base_url, "--concurrency", "2", "--request-rate", "3"],
    ):
        assert main(["probe", *bad, "--db", db]) == 2, bad
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGINT, 1), (signal.SIGTERM, 1), (signal.SIGINT, 2), (signal.SIGTERM, 2)],
)
def test_interrupt_keeps_finished_rows_and_marks_the_run(tmp_path, sig, workers) -> None:
    db = tmp_path / "r.db"
    with RefServer(ttft_lo_ms=20, ttft_hi_ms=20, itl_ms=10) as srv:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferwise.server",
                "probe",
                srv.base_url,
                "--requests",
                "500",
                "--concurrency",
                "4",
                "--output-tokens",
                "20",
                "--db",
                str(db),
                "--json",
                "--metrics-interval-s",
                "0",
                "--workers",
                str(workers),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        rows = 0
        while time.monotonic() < deadline and rows < 8:
            time.sleep(0.2)
            if db.exists():
                with sqlite3.connect(db) as con, __import__("contextlib").suppress(sqlite3.Error):
                    rows = con.execute("select count(*) from requests").fetchone()[0]
        # like Ctrl-C in a terminal: the signal goes to the whole process group (workers too)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=20)
    assert "Traceback" not in err
    result = json.loads(out)
    assert result["status"] == "interrupted"
    store = RunStore(str(db))
    run = store.get_run(result["run_id"])
    kept = store.requests(result["run_id"])
    assert run.status == "interrupted"
    assert 8 <= len(kept) < 500
    assert all(r.ok for r in kept)  # in-flight requests were cancelled, not stored as failures
    assert result["summary"]["completed"] == len(kept)


def test_a_strict_policy_passed_in_wins_over_allow_hosts(server, tmp_path) -> None:
    """What the MCP server does: its operator policy, not the caller's allow_hosts, decides."""
    from inferwise.probes.policy import TargetPolicy

    strict = TargetPolicy.from_entries(["10.0.0.0/8"], mode="strict")
    req = ProbeRequest(
        url=server.base_url, requests=1, allow_hosts=["127.0.0.1"], db=str(tmp_path / "r.db")
    )
    with pytest.raises(InputError, match="operator"):
        asyncio.run(run_probe(req, policy=strict))
    allowed = TargetPolicy.from_entries(["127.0.0.1"], mode="strict")
    res = asyncio.run(run_probe(req.model_copy(update={"metrics_interval_s": 0}), policy=allowed))
    assert res.summary.completed == 1


def test_fields_a_strict_api_rejects_are_dropped_and_said(tmp_path) -> None:
    with RefServer(
        ttft_lo_ms=5, ttft_hi_ms=5, itl_ms=1, reject_fields=("ignore_eos", "continuous_usage_stats")
    ) as srv:
        res = probe(url=srv.base_url, requests=3, output_tokens=4, db=str(tmp_path / "r.db"))
    assert res.summary.completed == 3, res.errors
    assert any("ignore_eos" in n for n in res.notes) and any(
        "per-chunk usage" in n for n in res.notes
    )


def test_duration_bound_still_stops_at_the_request_cap(server, tmp_path) -> None:
    res = probe(
        url=server.base_url,
        concurrency=4,
        duration_s=30,
        max_requests=12,
        output_tokens=2,
        db=str(tmp_path / "r.db"),
    )
    assert res.summary.completed == 12


def test_signal_handlers_are_put_back_after_a_run(server, tmp_path) -> None:
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))

    async def main():
        inside = signal.getsignal(signal.SIGINT)
        res = await run_probe(
            ProbeRequest(
                url=server.base_url, requests=1, metrics_interval_s=0, db=str(tmp_path / "r.db")
            )
        )
        return inside, signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), res

    inside, after_int, after_term, res = asyncio.run(main())
    assert res.summary.completed == 1
    assert after_int == inside and after_term == before[1]


@pytest.mark.parametrize("shape", [{"concurrency": 6}, {"request_rate": 60.0}])
def test_worker_processes_share_the_load_and_every_request_is_stored_once(
    server, tmp_path, shape
) -> None:
    db = str(tmp_path / "r.db")
    res = probe(url=server.base_url, requests=24, output_tokens=4, workers=2, db=db, **shape)
    rows = RunStore(db).requests(res.run_id)
    assert sorted(r.index for r in rows) == list(range(24))
    assert res.summary.completed == 24 and res.summary.client_health.workers == 2
    assert res.summary.client_health.loop_lag_ms.count > 0  # the children's samples
    if "request_rate" in shape:
        assert all(r.scheduled_s is not None for r in rows)
        assert res.summary.client_health.schedule_delay_ms.count == 24


def test_a_starved_client_is_flagged_saturated(server, tmp_path, monkeypatch) -> None:
    """Block the probe's loop after every request (as a starved CPU would): the summary
    must say the client, not the server, added latency."""
    from inferwise.probes import client
    from inferwise.probes.health import busy_wait

    real = client.to_record

    def slow_to_record(*a, **kw):
        busy_wait(0.03)
        return real(*a, **kw)

    monkeypatch.setattr(client, "to_record", slow_to_record)
    res = probe(
        url=server.base_url,
        concurrency=4,
        requests=16,
        output_tokens=4,
        calibrate=False,
        db=str(tmp_path / "r.db"),
    )
    assert res.client_health.saturated and res.summary.client_health.saturated
    assert any("raise --workers" in n for n in res.notes)
    assert RunStore(str(tmp_path / "r.db")).get_run(res.run_id).summary.client_health.saturated


def test_without_streaming_ttft_equals_e2e_and_says_so(server, tmp_path) -> None:
    res = probe(
        url=server.base_url, requests=3, output_tokens=4, stream=False, db=str(tmp_path / "r.db")
    )
    s = res.summary
    assert s.completed == 3 and s.ttft_ms.p50 == pytest.approx(s.e2e_ms.p50)
    assert s.itl_ms.count == 0
    assert any("TTFT equals end-to-end" in n for n in res.notes)


def test_dataset_prompts_are_sent_and_need_no_calibration(server, tmp_path) -> None:
    data = tmp_path / "d.jsonl"
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a colour."},
            ]
        },
        {"prompt": "Count to three.", "output_tokens": 3},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    db = str(tmp_path / "r.db")
    res = probe(
        url=server.base_url, requests=4, output_tokens=2, dataset=str(data), store_text=True, db=db
    )
    assert res.summary.completed == 4 and not res.calibration.calibrated
    stored = RunStore(db).requests(res.run_id)
    assert [r.prompt_text for r in stored][:2] == ["Name a colour.", "Count to three."]
    assert [r.output_tokens for r in stored][:2] == [2, 3]


def test_a_worker_that_cannot_start_is_an_operational_error(server, tmp_path, monkeypatch) -> None:
    from inferwise.calculators.errors import OperationalError

    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(OperationalError, match="worker 0 did not start"):
        probe(
            url=server.base_url, requests=4, workers=2, output_tokens=2, db=str(tmp_path / "r.db")
        )
    assert RunStore(str(tmp_path / "r.db")).list_runs()[0].status == "failed"


def test_markdown_renders_sweeps_errors_and_notes(tmp_path) -> None:
    from inferwise.server.render import render

    with RefServer(ttft_lo_ms=5, ttft_hi_ms=5, itl_ms=1, fault="http_503", fault_share=0.3) as srv:
        res = probe(
            url=srv.base_url,
            concurrency=2,
            sweep=[1, 2],
            requests=6,
            output_tokens=3,
            slo={"ttft_ms": 100},
            db=str(tmp_path / "r.db"),
        )
    text = render("probe.md.j2", res)
    assert "### Sweep" in text and "### Errors" in text and "http_5xx" in text
    assert text.count("| complete |") == 2
    assert "goodput" in text and res.run_id in text


def test_a_failing_progress_channel_does_not_end_the_run(caplog):
    """An MCP client that went away mid-run: its progress callback raises, the probe goes on."""
    import asyncio
    import logging

    from inferwise.probes.session import report_progress

    calls = []

    async def broken(done, total, msg):
        calls.append(done)
        raise ConnectionResetError("client gone")

    with caplog.at_level(logging.DEBUG, logger="inferwise.probes.session"):
        asyncio.run(report_progress(broken, 3, 10, "3 of 10 requests"))
    assert calls == [3]
    assert "progress report dropped" in caplog.text


def test_a_blank_model_is_refused_not_read_as_the_servers_first() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="must not be empty or blank"):
        ProbeRequest(url="http://127.0.0.1:9", model="  ")
