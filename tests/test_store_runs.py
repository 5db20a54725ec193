"""The run store keeps everything, survives a killed writer, and reads back what was written."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.records import RequestRecord
from inferwise.probes.store import SCHEMA_VERSION, MetricPoint, RunStore, default_db_path


def _record(i: int, ok: bool = True, **kw) -> RequestRecord:
    base = dict(
        index=i,
        ok=ok,
        start_s=i * 0.1,
        first_byte_s=i * 0.1 + 0.01,
        first_token_s=i * 0.1 + 0.05,
        end_s=i * 0.1 + 0.2,
        input_tokens=50,
        output_tokens=3,
        chunk_times_s=[0.05, 0.1, 0.15],
        chunk_tokens=[1, 1, 1],
    )
    if not ok:
        base.update(
            first_token_s=None,
            end_s=None,
            output_tokens=None,
            chunk_times_s=[],
            chunk_tokens=[],
            error_class="http_429",
            error_message="rate limited",
            http_status=429,
        )
    base.update(kw)
    return RequestRecord(**base)


def test_round_trip_of_runs_requests_and_metrics(tmp_path):
    db = tmp_path / "sub" / "runs.db"
    with RunStore(db) as store:
        run_id = store.create_run(
            labels={"engine": "vllm", "gpu": "h100"}, config={"concurrency": 4}, meta={"tool": "x"}
        )
        records = [
            _record(0, server_timings={"prompt_ms": 12.5}),
            _record(1, ok=False),
            _record(2, warmup=True),
        ]
        store.add_request(run_id, records[0])
        store.add_requests(run_id, records[1:])
        store.add_metric_samples(
            run_id,
            [
                (0.5, "vllm:num_requests_running", {"engine": "0"}, 3),
                MetricPoint(t_s=1.0, name="x", value=1.5),
                {"t_s": 1.5, "name": "y", "value": 2},
            ],
        )
        store.finish_run(run_id, "complete", {"completed": 1})
    assert db.exists()
    with RunStore(db) as store:
        run = store.get_run(run_id)
        assert run.status == "complete" and not run.stale
        assert run.labels == {"engine": "vllm", "gpu": "h100"}
        assert run.config == {"concurrency": 4} and run.meta == {"tool": "x"}
        assert run.summary.completed == 1 and run.request_count == 3 and run.finished_at
        assert store.requests(run_id) == records  # every field, lists and dicts included
        points = store.metric_samples(run_id)
        assert [(p.t_s, p.name, p.labels, p.value) for p in points] == [
            (0.5, "vllm:num_requests_running", {"engine": "0"}, 3.0),
            (1.0, "x", {}, 1.5),
            (1.5, "y", {}, 2.0),
        ]
        assert [p.name for p in store.metric_samples(run_id, name="y")] == ["y"]


def test_wal_mode_and_schema_version(tmp_path):
    db = tmp_path / "runs.db"
    RunStore(db).close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    from inferwise.calculators.errors import OperationalError

    with pytest.raises(OperationalError, match="newer inferwise"):
        RunStore(db)


def test_text_is_stored_only_when_given(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        run_id = store.create_run()
        store.add_request(run_id, _record(0))
        store.add_request(run_id, _record(1, prompt_text="hi", output_text="there"))
        rows = store._conn.execute(
            "SELECT prompt_text, output_text FROM requests ORDER BY idx"
        ).fetchall()
    assert rows == [(None, None), ("hi", "there")]


def test_unknown_run_id_names_recent_ones(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        with pytest.raises(InputError, match="none stored yet"):
            store.get_run("20260101-000000-0000")
        ids = [store.create_run() for _ in range(2)]
        with pytest.raises(InputError) as err:
            store.requests("nope")
    assert err.value.field == "run_id"
    assert all(i in err.value.message for i in ids)


def test_list_filters_by_labels_and_limits_newest_first(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        a = store.create_run(labels={"engine": "vllm"})
        b = store.create_run(labels={"engine": "sglang"})
        c = store.create_run(labels={"engine": "vllm", "tp": "2"})
        assert [r.run_id for r in store.list_runs()] == [
            c,
            b,
            a,
        ]  # newest first, even within a second
        assert {r.run_id for r in store.list_runs(labels={"engine": "vllm"})} == {a, c}
        assert [r.run_id for r in store.list_runs(labels={"engine": "vllm", "tp": "2"})] == [c]
        assert len(store.list_runs(limit=1)) == 1


def test_resolve_prefix_and_latest(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        with pytest.raises(InputError, match="no runs"):
            store.resolve("latest")
        run_id = store.create_run()
        assert store.resolve("latest") == run_id
        assert store.resolve(run_id) == run_id
        assert store.resolve(run_id[:-2]) == run_id


def test_default_path_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    monkeypatch.delenv("INFERWISE_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "inferwise" / "runs.db"
    with RunStore() as store:
        assert store.path == tmp_path / "data" / "inferwise" / "runs.db"


def test_missing_or_broken_database_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no run database"):
        RunStore(tmp_path / "absent.db", create=False)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a usable run database"):
        RunStore(junk)
    # reading a path that is no SQLite file leaves nothing beside it (no lock file)
    text = tmp_path / "notes.md"
    text.write_text("# notes\n")
    with pytest.raises(InputError, match="is not a run database"):
        RunStore(text, create=False)
    assert not (tmp_path / "notes.md.lock").exists()
    assert (tmp_path / "notes.md").read_text() == "# notes\n"


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from inferwise.probes.records import RequestRecord
    from inferwise.probes.store import RunStore
    store = RunStore(sys.argv[1])
    run_id = store.create_run(labels={"who": "writer"})
    print(run_id, flush=True)
    for i in range(int(sys.argv[2])):
        store.add_request(run_id, RequestRecord(index=i, ok=True, start_s=i, first_token_s=i + 0.1, end_s=i + 0.2,
                                                output_tokens=2, chunk_times_s=[i + 0.1, i + 0.2], chunk_tokens=[1, 1]))
    print("written", flush=True)
    if sys.argv[3] == "exit":
        os._exit(0)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_killed_writer_leaves_a_readable_database_with_every_row(tmp_path, how):
    db = tmp_path / "runs.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), "25", how], stdout=subprocess.PIPE, text=True
    )
    run_id = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "written"
    if how == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "runs.db-wal").exists()  # the writer never checkpointed or closed
    with RunStore(db) as store:
        run = store.get_run(run_id)
        assert run.status == "running" and run.stale
        assert run.display_status.startswith("running (stale")
        records = store.requests(run_id)
    assert [r.index for r in records] == list(range(25))


def test_a_live_writer_is_not_stale(tmp_path):
    db = tmp_path / "runs.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), "3", "sleep"], stdout=subprocess.PIPE, text=True
    )
    try:
        run_id = proc.stdout.readline().strip()
        proc.stdout.readline()
        with RunStore(db) as store:
            run = store.get_run(run_id)
            assert run.status == "running" and not run.stale and run.request_count == 3
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_concurrent_reader_sees_rows_while_the_writer_writes(tmp_path):
    db = tmp_path / "runs.db"
    writer = RunStore(db)
    reader = RunStore(db)
    run_id = writer.create_run()
    for i in range(5):
        writer.add_request(run_id, _record(i))
        assert len(reader.requests(run_id)) == i + 1
    writer.close()
    reader.close()


def test_run_ids_sort_by_creation_time():
    from datetime import UTC, datetime

    from inferwise.probes.store import new_run_id

    a = new_run_id(datetime(2026, 1, 1, 9, 0, 0, tzinfo=UTC))
    b = new_run_id(datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC))
    assert a < b and a.startswith("20260101-090000-") and len(a) == len("20260101-090000-abcd")


def test_a_file_from_before_a_new_record_field_gains_the_column(tmp_path):
    db = tmp_path / "old.db"
    with RunStore(db) as store:
        run_id = store.create_run()
        store.add_request(run_id, _record(0))
    conn = sqlite3.connect(
        db
    )  # rebuild `requests` without the server_timings column, as an older version wrote it
    cols = [r[1] for r in conn.execute("PRAGMA table_info(requests)") if r[1] != "server_timings"]
    conn.execute(f"CREATE TABLE r2 AS SELECT {', '.join(cols)} FROM requests")
    conn.execute("DROP TABLE requests")
    conn.execute("ALTER TABLE r2 RENAME TO requests")
    conn.commit()
    conn.close()
    with RunStore(db) as store:
        assert store.requests(run_id)[0].server_timings is None
        store.add_request(run_id, _record(1, server_timings={"prompt_ms": 3.0}))
        assert store.requests(run_id)[1].server_timings == {"prompt_ms": 3.0}
