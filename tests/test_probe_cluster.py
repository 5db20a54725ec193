"""--cluster without a cluster: the address and TLS flags, the policy on the scheduler, the
missing extra, how the driver splits the load and accounts for a lost worker, and the
aggregate saturation verdict. (The runs against real Dask processes are in
test_probe_cluster_dask.py.)"""

from __future__ import annotations

import asyncio
import sys

import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.cluster import (
    ClusterLoad,
    _approved_address,
    apply_cluster_health,
    cluster_info,
    drift_note,
    lost_records,
    plan_slices,
)
from inferwise.probes.cluster_models import ClusterTarget, parse_cluster
from inferwise.probes.policy import TargetPolicy
from inferwise.probes.summary import summarize
from inferwise.server import cli


def _pem(tmp_path, name: str) -> str:
    p = tmp_path / name
    p.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(p)


def test_scheduler_addresses_and_local_workers_parse() -> None:
    t = parse_cluster("tcp://127.0.0.1:8786")
    assert (t.kind, t.host, t.port, t.tls) == ("scheduler", "127.0.0.1", 8786, False)
    assert parse_cluster("tcp://[::1]:8786").host == "::1"
    assert parse_cluster("local:4") == ClusterTarget(
        kind="local", address="local:4", local_workers=4
    )


@pytest.mark.parametrize(
    "value",
    ["127.0.0.1:8786", "http://127.0.0.1:8786", "tcp://host", "tcp://h:0", "tcp://h:70000",
     "local:0", "local:65", "local:x", "inproc://x", "tcp://a b:1"],
)  # fmt: skip
def test_bad_cluster_values_name_the_field_and_the_forms(value: str) -> None:
    with pytest.raises(InputError) as e:
        parse_cluster(value)
    assert e.value.field == "cluster"


def test_tls_needs_all_three_readable_files_from_flags_or_env(tmp_path, monkeypatch) -> None:
    for k in ("CA", "CERT", "KEY"):
        monkeypatch.delenv(f"INFERWISE_DASK_TLS_{k}", raising=False)
    ca, cert, key = (_pem(tmp_path, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    t = parse_cluster("tls://127.0.0.1:8786", ca, cert, key)
    assert t.tls and (t.tls_ca, t.tls_cert, t.tls_key) == (ca, cert, key)
    with pytest.raises(InputError) as e:
        parse_cluster("tls://127.0.0.1:8786", ca, cert)
    assert e.value.field == "cluster_tls_key" and "INFERWISE_DASK_TLS_KEY" in e.value.accepted
    with pytest.raises(InputError) as e:
        parse_cluster("tls://127.0.0.1:8786", ca, cert, str(tmp_path / "missing.pem"))
    assert e.value.field == "cluster_tls_key" and "not a readable file" in e.value.message
    # the environment fills what no flag gives
    monkeypatch.setenv("INFERWISE_DASK_TLS_CA", ca)
    monkeypatch.setenv("INFERWISE_DASK_TLS_CERT", cert)
    monkeypatch.setenv("INFERWISE_DASK_TLS_KEY", key)
    assert parse_cluster("tls://127.0.0.1:8786").tls_key == key
    # certificates for a plain tcp:// scheduler, or for local workers, are a mistake
    with pytest.raises(InputError) as e:
        parse_cluster("tcp://127.0.0.1:8786")
    assert e.value.field == "cluster_tls_ca" and "tls://" in e.value.accepted
    with pytest.raises(InputError):
        parse_cluster("local:2", tls_ca=ca)


def test_the_cli_refuses_bad_cluster_flags_with_exit_2(tmp_path, capsys) -> None:
    db = str(tmp_path / "r.db")
    url = "http://127.0.0.1:9"
    assert cli.main(["probe", url, "--cluster", "127.0.0.1:8786", "--db", db]) == 2
    assert "cluster" in capsys.readouterr().err
    args = ["probe", url, "--cluster", "local:2", "--workers", "2", "--db", db]
    assert cli.main(args) == 2
    assert "workers" in capsys.readouterr().err
    assert cli.main(["probe", url, "--cluster-tls-ca", _pem(tmp_path, "ca"), "--db", db]) == 2
    assert "--cluster tls://" in capsys.readouterr().err


def test_without_the_extra_cluster_is_exit_2_saying_what_to_install(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    code = cli.main(
        ["probe", "http://127.0.0.1:9", "--cluster", "local:2", "--db", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert 'pip install "inferwise[distributed]"' in err and "Traceback" not in err


def test_the_scheduler_passes_the_url_policy() -> None:
    asyncio.run(_policy_cases())


async def _policy_cases() -> None:
    policy = TargetPolicy.from_entries([])
    loop = parse_cluster("tcp://127.0.0.1:8786")
    assert await _approved_address(loop, policy) == "tcp://127.0.0.1:8786"
    private = parse_cluster("tcp://10.1.2.3:8786")
    with pytest.raises(InputError) as e:
        await _approved_address(private, policy)
    assert e.value.field == "cluster" and "--allow-hosts 10.1.2.3" in e.value.message
    assert await _approved_address(private, TargetPolicy.from_entries(["10.1.2.3"])) == (
        "tcp://10.1.2.3:8786"
    )
    with pytest.raises(InputError):
        await _approved_address(parse_cluster("tcp://169.254.169.254:8786"), policy)
    strict = TargetPolicy.from_entries([], mode="strict")
    with pytest.raises(InputError):  # MCP: only the operator's allowlist counts
        await _approved_address(loop, strict)


def _load(mode: str, **kw) -> ClusterLoad:
    base = dict(
        setup={}, mode=mode, concurrency=5, first_index=2, count=11, schedule=None,
        origin=0.0, duration_s=None, hard_deadline=None, max_in_flight=64,
    )  # fmt: skip
    return ClusterLoad(**{**base, **kw})


WORKERS = {"tcp://127.0.0.1:1": "a", "tcp://127.0.0.1:2": "b"}


def test_a_closed_loop_splits_concurrency_and_index_blocks() -> None:
    slices = plan_slices(_load("closed"), WORKERS)
    assert [s.go["concurrency"] for s in slices] == [3, 2]
    got = [i for s in slices for i, _ in s.entries]
    assert sorted(got) == list(range(2, 13)) and len(set(got)) == 11  # each index once
    assert [s.name for s in slices] == ["a", "b"]
    # concurrency 1 uses one worker: a second would only idle
    assert len(plan_slices(_load("closed", concurrency=1), WORKERS)) == 1


def test_an_open_loop_deals_arrivals_by_time_keeping_absolute_times() -> None:
    schedule = [0.1 * k for k in range(1, 8)]
    slices = plan_slices(_load("open", schedule=schedule, count=7, max_in_flight=9), WORKERS)
    merged = sorted((t, i) for s in slices for i, t in s.entries)
    assert merged == [(t, 2 + k) for k, t in enumerate(schedule)]
    assert [s.go["max_in_flight"] for s in slices] == [4, 4]
    assert slices[0].go["schedule"] == schedule[0::2]


def test_a_lost_workers_unfinished_requests_fail_as_worker_lost_naming_it() -> None:
    s = plan_slices(_load("closed", concurrency=4, count=20, first_index=0), WORKERS)[1]
    assert s.go["concurrency"] == 2 and len(s.entries) == 10
    first = s.entries[0][0]
    s.received = {first, first + 2, first + 3}  # finished; first + 1 and first + 4 in flight
    out = lost_records(s, 5.0, count_bounded=True)
    assert {r.index for r in out} == {i for i, _ in s.entries} - s.received
    assert all(not r.ok and r.error_class == "worker_lost" for r in out)
    in_flight = [r for r in out if r.error_message.startswith("in flight")]
    assert {r.index for r in in_flight} == {first + 1, first + 4}
    assert "worker b (tcp://127.0.0.1:2)" in out[0].error_message
    # a duration-bounded run has no fixed remainder: only what was in flight is lost
    assert len(lost_records(s, 5.0, count_bounded=False)) == 2


def test_an_open_loop_lost_worker_splits_in_flight_from_not_yet_due() -> None:
    schedule = [1.0, 2.0, 3.0, 4.0]
    s = plan_slices(_load("open", schedule=schedule, count=4, first_index=0), {"w": "w"})[0]
    s.received = {0}
    out = lost_records(s, 2.5, count_bounded=False)
    assert [(r.index, r.error_message.split(":")[0][:9]) for r in out] == [
        (1, "in flight"), (2, "not sent"), (3, "not sent"),
    ]  # fmt: skip
    assert all(r.scheduled_s is None for r in out)  # no fake schedule delay


def test_one_saturated_worker_makes_the_aggregate_verdict_saturated() -> None:
    slices = plan_slices(_load("closed"), WORKERS)
    slices[0].lag_ms = [1.0] * 100
    slices[1].lag_ms = [1.0] * 90 + [40.0] * 10
    info = cluster_info("tcp://127.0.0.1:8786", slices)
    assert [w.saturated for w in info.workers] == [False, True]
    summary = summarize([], loop_lag_ms=[x for s in slices for x in s.lag_ms])
    apply_cluster_health(summary, info)
    assert summary.client_health.saturated and summary.client_health.workers == 2
    assert any("worker b" in n for n in summary.client_health.notes)


def test_clock_drift_is_reported_only_beyond_the_measurements_uncertainty() -> None:
    s = plan_slices(_load("closed"), WORKERS)[0]
    s.offset_s, s.rtt_s, s.rtt_after_s = 0.5, 0.002, 0.002
    s.offset_after_s = 0.5015
    assert drift_note(s) is None  # 1.5 ms against 2 ms of round trip
    s.offset_after_s = 0.510
    assert "+10.0 ms" in drift_note(s)
    info = cluster_info("tcp://x:1", [s])
    assert info.workers[0].clock_offset_ms == 500.0


def test_the_mcp_tool_takes_cluster_under_the_operators_allowlist(tmp_path, monkeypatch) -> None:
    from mcp.client import Client

    from inferwise.server import mcp_server

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("INFERWISE_MCP_ALLOW_HOSTS", "127.0.0.1")
    server = mcp_server.build_server()

    async def go():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            base = {"url": "http://127.0.0.1:9", "model": "m", "requests": 1}
            bad = await client.call_tool("probe_endpoint", {**base, "cluster": "bogus"})
            private = await client.call_tool(
                "probe_endpoint", {**base, "cluster": "tcp://10.9.9.9:8786"}
            )
            return tools["probe_endpoint"], bad, private

    tool, bad, private = asyncio.run(go())
    props = tool.input_schema["properties"]
    assert "cluster" in props and not any(k.startswith("cluster_tls") for k in props)
    assert bad.is_error and "cluster" in bad.content[0].text
    # strict mode: the scheduler is refused unless the operator allowlisted it
    assert private.is_error and "10.9.9.9" in private.content[0].text
