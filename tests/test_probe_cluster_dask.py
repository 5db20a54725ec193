"""--cluster against real Dask processes: a `dask scheduler` and two `dask worker`s started
on 127.0.0.1 by the fixture (stopped by PID), probing the reference server, whose own send
log is the truth for TTFT. Bounded: a few hundred requests, each test seconds."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _start_worker(scheduler: str, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "dask"), "worker", scheduler, "--host", "127.0.0.1", "--nthreads", "1",
         "--no-nanny", "--no-dashboard", "--name", name, "--death-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _wait_workers(scheduler: str, n: int, timeout_s: float = 60) -> None:
    from distributed import Client

    with Client(scheduler, timeout=timeout_s) as c:
        c.wait_for_workers(n, timeout=timeout_s)
        end = time.monotonic() + timeout_s
        while len(c.scheduler_info(n_workers=-1)["workers"]) != n:  # a killed one has left
            assert time.monotonic() < end, "the scheduler kept a dead worker"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def dask_cluster():
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers = [_start_worker(address, f"w{k}") for k in (1, 2)]
    try:
        _wait_workers(address, 2)
        yield address
    finally:
        for p in [*workers, scheduler]:
            _stop(p)


@pytest.fixture(scope="module")
def refserver():
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "refserver.py"), "--port", str(port),
         "--ttft-lo-ms", "20", "--ttft-hi-ms", "200", "--itl-ms", "15"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("ready")
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(server)


def _served(url: str) -> int:
    with urllib.request.urlopen(url + "/_log", timeout=30) as resp:
        return len(json.loads(resp.read()))


def _stored(db: str) -> int:
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as c:
        try:
            return c.execute("SELECT count(*) FROM requests").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            return 0


def _request(url: str, db: str, **kw):
    from inferwise.probes.runner import ProbeRequest

    base = dict(
        url=url, model="ref-model", calibrate=False, metrics_interval_s=0, db=db,
        input_tokens=64, output_tokens=16, max_duration_s=120,
    )  # fmt: skip
    return ProbeRequest(**{**base, **kw})


TTFT_ERROR_MS = 5.0
"""The cluster probe's TTFT median error at concurrency 128 on a quiet machine (measured
about 3.6 ms here)."""
LOCAL_MARGIN_MS = 2.0
"""On a machine so busy that a plain local probe of the same load is itself off by more
than 5 ms (a CI run saw the cluster's at 6-17 ms), what the cluster is judged on is its own
share: no more than the local probe's error, measured right after, plus this margin."""


def local_ttft_error_ms(refserver: str, args: argparse.Namespace, tmp_path: Path, n: int) -> float:
    """The TTFT median error of the same load probed without the cluster, plus the margin."""
    from bench import probe_precision

    local = argparse.Namespace(**{**vars(args), "cluster": None})
    point = probe_precision.run_point(refserver, 128, 384, local, str(tmp_path / f"l{n}.db"))
    return point["ttft_error_ms"]["median"] + LOCAL_MARGIN_MS


def test_every_request_stored_and_ttft_within_5_ms_at_concurrency_128(
    dask_cluster, refserver, tmp_path
) -> None:
    from bench import probe_precision
    from inferwise.probes.store import RunStore

    args = argparse.Namespace(
        transport="probe", workers=1, input_tokens=64, output_tokens=8,
        slo_ttft_ms=110.0, slo_e2e_ms=600.0, cluster=dask_cluster,
    )  # fmt: skip
    # eight tokens a stream: the first token is what is judged, and 128 streams of 32 tokens
    # keep two shared cores so busy that their lag, not the probe's, is measured
    for attempt in range(3):  # another try only when a neighbour's burst spoilt one
        db = str(tmp_path / f"r{attempt}.db")
        point = probe_precision.run_point(refserver, 128, 384, args, db)
        assert point["matched_requests"] == 384 and point["failed"] == 0, point
        error_ms = point["ttft_error_ms"]["median"]
        allowed_ms = TTFT_ERROR_MS
        if error_ms > allowed_ms:
            allowed_ms = max(allowed_ms, local_ttft_error_ms(refserver, args, tmp_path, attempt))
        print(
            f"try {attempt + 1}: TTFT error {point['ttft_error_ms']}, allowed {allowed_ms:.1f} ms"
        )
        if error_ms <= allowed_ms:
            break
    assert error_ms <= allowed_ms, (point, allowed_ms)
    with RunStore(db) as store:
        run = store.list_runs()[0]
        assert run.status == "complete" and len(store.requests(run.run_id)) == 384
    cluster = run.meta["cluster"]
    assert cluster["scheduler"] == dask_cluster
    assert sorted(w["name"] for w in cluster["workers"]) == ["w1", "w2"]
    assert sum(w["requests"] for w in cluster["workers"]) == 384
    for w in cluster["workers"]:
        # one machine, one clock: the measured offset is zero within half the round trip
        assert abs(w["clock_offset_ms"]) <= w["rtt_ms"] / 2 + 0.5, w
        assert w["lag_p99_ms"] is not None and not w["lost"]


def test_an_open_loop_keeps_its_arrival_times_across_workers(
    dask_cluster, refserver, tmp_path
) -> None:
    from inferwise.probes.runner import run_probe

    req = _request(refserver, str(tmp_path / "r.db"), request_rate=80.0, requests=60,
                   cluster=dask_cluster)  # fmt: skip
    result = asyncio.run(run_probe(req))
    assert result.status == "complete" and result.summary.completed == 60
    assert result.cluster is not None and len(result.cluster.workers) == 2
    # arrivals were sent on time on both workers (the schedule is the driver's, shifted)
    assert result.client_health.schedule_delay_ms.count == 60
    assert result.client_health.schedule_delay_ms.p50 < 10.0, result.client_health


def test_a_worker_killed_mid_run_is_accounted_for(dask_cluster, refserver, tmp_path) -> None:
    from inferwise.probes.runner import run_probe

    victim = _start_worker(dask_cluster, "victim")
    try:
        _wait_workers(dask_cluster, 3)
        db = str(tmp_path / "r.db")
        req = _request(refserver, db, concurrency=12, requests=72, output_tokens=48,
                       cluster=dask_cluster)  # fmt: skip

        async def main():
            task = asyncio.create_task(run_probe(req))
            end = time.monotonic() + 60
            while _stored(db) < 12 and not task.done() and time.monotonic() < end:
                await asyncio.sleep(0.05)
            os.kill(victim.pid, signal.SIGKILL)
            return await task

        result = asyncio.run(main())
    finally:
        _stop(victim)
    _wait_workers(dask_cluster, 2)  # the next test finds the two workers again
    assert result.status == "complete"
    assert result.summary.completed + result.summary.failed == 72  # every request accounted for
    lost = next(e for e in result.errors if e.error_class == "worker_lost")
    assert lost.count == result.summary.failed and lost.count > 0
    assert all("worker victim" in x for x in lost.examples)
    workers = {w.name: w for w in result.cluster.workers}
    assert workers["victim"].lost and workers["victim"].lost_requests == lost.count
    assert not workers["w1"].lost and not workers["w2"].lost
    assert any("victim" in n and "worker_lost" in n for n in result.notes)
    assert _stored(db) == 72


def test_ctrl_c_of_the_driver_marks_the_run_interrupted_and_keeps_what_finished(
    dask_cluster, refserver, tmp_path
) -> None:
    db = str(tmp_path / "r.db")
    driver = subprocess.Popen(
        [str(BIN / "inferwise"), "probe", refserver, "--model", "ref-model",
         "--cluster", dask_cluster, "--concurrency", "8", "--requests", "400",
         "--output-tokens", "48", "--no-calibrate", "--metrics-interval-s", "0", "--db", db,
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        end = time.monotonic() + 60
        while _stored(db) < 10 and time.monotonic() < end and driver.poll() is None:
            time.sleep(0.05)
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=40)
    finally:
        _stop(driver)
    result = json.loads(out)
    assert result["status"] == "interrupted", err
    kept = _stored(db)
    assert 10 <= kept < 400 and result["summary"]["completed"] + result["summary"]["failed"] == kept
    # the workers stopped sending: the server sees no new requests after the driver left
    served = _served(refserver)
    time.sleep(1.0)
    assert _served(refserver) == served
    with contextlib.closing(sqlite3.connect(db)) as c:
        assert c.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"


def test_a_driver_that_dies_keeps_what_it_stored_and_the_workers_stop(
    dask_cluster, refserver, tmp_path
) -> None:
    from inferwise.probes.runs import ShowRunRequest, show_run

    db = str(tmp_path / "r.db")
    driver = subprocess.Popen(
        [str(BIN / "inferwise"), "probe", refserver, "--model", "ref-model",
         "--cluster", dask_cluster, "--concurrency", "8", "--requests", "400",
         "--output-tokens", "48", "--no-calibrate", "--metrics-interval-s", "0", "--db", db],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        end = time.monotonic() + 60
        while _stored(db) < 10 and time.monotonic() < end and driver.poll() is None:
            time.sleep(0.05)
        driver.kill()
        driver.wait(10)
    finally:
        _stop(driver)
    kept = _stored(db)
    assert kept >= 10
    detail = show_run(ShowRunRequest(run_id="latest", db=db))
    assert detail.stale and detail.requests_stored == kept
    # the scheduler cancels the dead driver's tasks; their clients stop sending
    end = time.monotonic() + 15
    while True:
        served = _served(refserver)
        time.sleep(1.0)
        if _served(refserver) == served:
            break
        assert time.monotonic() < end, "the workers kept sending after the driver died"


def test_a_tls_scheduler_is_reached_with_certificates_from_the_environment(
    refserver, tmp_path, monkeypatch
) -> None:
    pytest.importorskip("cryptography")  # Dask's Security.temporary() makes the certificate
    from distributed.security import Security

    from inferwise.probes.runner import run_probe

    sec = Security.temporary()
    files = {}
    for name, pem in (("ca", sec.tls_ca_file), ("cert", sec.tls_client_cert),
                      ("key", sec.tls_client_key)):  # fmt: skip
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(pem)
    tls = ["--tls-ca-file", str(files["ca"]), "--tls-cert", str(files["cert"]),
           "--tls-key", str(files["key"])]  # fmt: skip
    port = _free_port()
    address = f"tls://127.0.0.1:{port}"
    scheduler = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard", *tls],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    worker = subprocess.Popen(
        [str(BIN / "dask"), "worker", address, "--host", "127.0.0.1", "--nthreads", "1",
         "--no-nanny", "--no-dashboard", "--name", "tls-1", "--death-timeout", "30", *tls],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for k in ("ca", "cert", "key"):
            monkeypatch.setenv(f"INFERWISE_DASK_TLS_{k.upper()}", str(files[k]))
        req = _request(refserver, str(tmp_path / "r.db"), concurrency=4, requests=16,
                       cluster=address)  # fmt: skip
        end = time.monotonic() + 60
        while True:  # the worker registers with the scheduler after it starts
            result = asyncio.run(run_probe(req)) if _tls_workers(address, sec) else None
            if result is not None or time.monotonic() > end:
                break
            time.sleep(0.5)
    finally:
        _stop(worker)
        _stop(scheduler)
    assert result is not None and result.summary.completed == 16
    assert result.cluster.scheduler == address
    assert [w.name for w in result.cluster.workers] == ["tls-1"]
    assert result.cluster.workers[0].address.startswith("tls://")


def _tls_workers(address: str, sec) -> int:
    from distributed import Client

    try:
        with Client(address, security=sec, timeout=5) as c:
            return len(c.scheduler_info(n_workers=-1)["workers"])
    except OSError:
        return 0


def test_a_terminal_ctrl_c_to_the_whole_group_spares_local_workers(refserver, tmp_path) -> None:
    """local:N workers share the terminal's process group: its SIGINT reaches them too, and
    must not turn the requests they still had into worker_lost failures."""
    db = str(tmp_path / "r.db")
    driver = subprocess.Popen(
        [str(BIN / "inferwise"), "probe", refserver, "--model", "ref-model",
         "--cluster", "local:2", "--concurrency", "8", "--requests", "400",
         "--output-tokens", "48", "--no-calibrate", "--metrics-interval-s", "0", "--db", db,
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        end = time.monotonic() + 90
        while _stored(db) < 10 and time.monotonic() < end and driver.poll() is None:
            time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGINT)
        out, err = driver.communicate(timeout=60)
    finally:
        _stop(driver)
    result = json.loads(out)
    assert result["status"] == "interrupted", err
    assert result["summary"]["failed"] == 0 and not result["errors"], result["errors"]
    assert result["summary"]["completed"] == _stored(db) >= 10
    assert "Traceback" not in err
