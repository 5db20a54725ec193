"""The run store: every probe run, its requests and the server's metrics, in one SQLite file.

Why SQLite in WAL mode with a commit per request: a probe can be killed at
any moment (Ctrl-C, OOM, a closed laptop) and must keep every request that
finished. Each `add_request` is its own transaction, so the database on disk
is always a consistent prefix of the run; a reader never needs the writer to
have closed cleanly. A run whose writer died stays `running` on disk; readers
see it as stale (its process is gone) instead of pretending it is still going.

Layout (schema version in `schema_version`):

* runs(run_id, created_at, finished_at, status, labels, config, meta, summary, pid, host)
  - JSON text in labels/config/meta/summary;
* requests(run_id, idx, <every RequestRecord field>) - lists and dicts as JSON text,
  prompt/output text only when the caller stored it;
* metric_samples(run_id, t_s, name, labels, value).

sqlite-utils is imported inside methods: the registry imports probes.runs,
which imports this module, and MCP start-up must stay light.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError, OperationalError
from inferwise.probes.records import RequestRecord
from inferwise.probes.summary import ProbeSummary

RunStatus = Literal["running", "complete", "interrupted", "failed"]
SCHEMA_VERSION = 1

_RECORD_JSON_FIELDS = {"chunk_times_s", "chunk_tokens", "server_timings"}


def default_db_path() -> Path:
    """$INFERWISE_DB, else ${XDG_DATA_HOME:-~/.local/share}/inferwise/runs.db."""
    env = os.environ.get("INFERWISE_DB")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "inferwise" / "runs.db"


def new_run_id(now: datetime | None = None) -> str:
    """Short, sortable by creation time (UTC), unique enough for one user: 20261129-170501-3fa2."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class MetricPoint(BaseModel):
    """One server-metric value at a time in the run (seconds since the run's start)."""

    model_config = ConfigDict(extra="forbid")

    t_s: float
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    value: float


class StoredRun(BaseModel):
    """A run's row, with its JSON columns decoded."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    created_at: str = Field(description="ISO 8601, UTC.")
    finished_at: str | None = None
    status: RunStatus
    stale: bool = Field(
        default=False,
        description="Status is still `running` but the process that wrote it is gone: the run was killed.",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)
    summary: ProbeSummary | None = Field(
        default=None,
        description="The summary the run was closed with; None while running, or when it was "
        "written by an older release in another shape (callers then recompute it from the rows).",
    )
    request_count: int = 0
    pid: int | None = None
    host: str | None = None

    @property
    def display_status(self) -> str:
        return "running (stale: writer gone)" if self.stale else self.status


def _dumps(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, default=str, sort_keys=True)


def _stored_summary(text: Any) -> ProbeSummary | None:
    from pydantic import ValidationError

    data = _loads(text, None)
    if not isinstance(data, dict):
        return None
    try:
        return ProbeSummary.model_validate(data)
    except ValidationError:
        return None


def _loads(text: Any, default: Any) -> Any:
    if text is None or text == "":
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


@contextlib.contextmanager
def _creation_lock(path: Path) -> Iterator[None]:
    """Serialise opening (and so creating and migrating) one run database across
    processes. Two probes creating the same new file raced: SQLite answers the switch of
    a new file to WAL with "database is locked" at once, without waiting out the busy
    timeout, and both would create the tables. An advisory lock on a side file makes the
    second opener wait for the first (POSIX; elsewhere the race is left to SQLite)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    if str(path) == ":memory:":  # SQLite's private in-memory database: nothing to share
        yield
        return
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # a read-only folder: nobody can be creating the file here
        yield
        return
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OperationalError(
                        f"{path} stayed locked by another process for 30 s"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing releases the lock


SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_file(path: Path) -> None:
    """A path given to read runs from must already be an SQLite file: opening anything else
    would leave a lock file beside it before SQLite refused it."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise InputError("db", f"cannot read {path}: {exc.strerror or exc}") from None
    if head != SQLITE_HEADER:
        raise InputError(
            "db", f"{path} is not a run database", "a path written by `inferwise probe --db`"
        )


class RunStore:
    """One SQLite file of runs. Cheap to open; safe to share between threads of one process."""

    def __init__(self, path: str | Path | None = None, *, create: bool = True):
        import sqlite3

        self.path = Path(path).expanduser() if path is not None else default_db_path()
        if not create and not self.path.exists():
            raise InputError(
                "db", f"no run database at {self.path}", "a path written by `inferwise probe --db`"
            )
        if not create:
            _check_sqlite_file(self.path)  # before the lock and journal files appear beside it
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=10.0, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise InputError("db", f"cannot open {self.path}: {exc}") from None
        self._lock = threading.RLock()
        self._conn = conn
        try:
            with _creation_lock(self.path):
                conn.execute("PRAGMA busy_timeout=10000")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                self._migrate()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise InputError("db", f"{self.path} is not a usable run database: {exc}") from None

    # ----------------------------------------------------------------- plumbing

    @property
    def db(self) -> Any:
        import sqlite_utils

        return sqlite_utils.Database(self._conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self._lock:
            db = self.db
            if not db["schema_version"].exists():
                db["schema_version"].create({"version": int})
                self._conn.execute("INSERT INTO schema_version (version) VALUES (0)")
            row = self._conn.execute("SELECT max(version) FROM schema_version").fetchone()
            version = int(row[0] or 0)
            if version > SCHEMA_VERSION:
                raise OperationalError(
                    f"{self.path} was written by a newer inferwise (schema {version} > {SCHEMA_VERSION})"
                )
            if version < 1:
                self._create_v1(db)
                self._conn.execute("UPDATE schema_version SET version = 1")
            self._add_new_record_columns(db)
            self._conn.commit()
            self._request_columns = [
                "run_id",
                "idx",
                *db["requests"].columns_dict.keys() - {"run_id", "idx"},
            ]
            self._insert_request_sql = (
                f"INSERT OR REPLACE INTO requests ({', '.join(_quote(c) for c in self._request_columns)}) "
                f"VALUES ({', '.join('?' for _ in self._request_columns)})"
            )

    def _add_new_record_columns(self, db: Any) -> None:
        """RequestRecord fields added since the file was created become new (NULL) columns."""
        have = set(db["requests"].columns_dict)
        for name, info in RequestRecord.model_fields.items():
            if name != "index" and name not in have:
                db["requests"].add_column(name, _column_type(name, info.annotation))

    def _create_v1(self, db: Any) -> None:
        db["runs"].create(
            {
                "run_id": str,
                "created_at": str,
                "finished_at": str,
                "status": str,
                "labels": str,
                "config": str,
                "meta": str,
                "summary": str,
                "pid": int,
                "host": str,
            },
            pk="run_id",
            if_not_exists=True,
        )
        columns: dict[str, Any] = {"run_id": str, "idx": int}
        for name, info in RequestRecord.model_fields.items():
            if name == "index":
                continue
            columns[name] = _column_type(name, info.annotation)
        db["requests"].create(columns, pk=("run_id", "idx"), if_not_exists=True)
        db["metric_samples"].create(
            {"run_id": str, "t_s": float, "name": str, "labels": str, "value": float},
            if_not_exists=True,
        )
        db["metric_samples"].create_index(["run_id", "t_s"], if_not_exists=True)

    # ----------------------------------------------------------------- writing

    def create_run(
        self,
        *,
        labels: dict[str, str] | None = None,
        config: dict[str, Any] | BaseModel | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        """Start a run (status `running`); returns its id."""
        run_id = new_run_id()
        row = {
            "run_id": run_id,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "finished_at": None,
            "status": "running",
            "labels": _dumps({str(k): str(v) for k, v in (labels or {}).items()}),
            "config": _dumps(config or {}),
            "meta": _dumps(meta or {}),
            "summary": None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        with self._lock:
            for _ in range(5):
                try:
                    self.db["runs"].insert(row)
                    break
                except Exception as exc:  # id collision within one second: draw again
                    if "UNIQUE" not in str(exc):
                        raise
                    row["run_id"] = run_id = new_run_id()
            self._conn.commit()
        return run_id

    def add_request(self, run_id: str, record: RequestRecord) -> None:
        """Store one finished request and commit at once: nothing is lost if the process dies next."""
        self.add_requests(run_id, [record])

    def add_requests(self, run_id: str, records: Iterable[RequestRecord]) -> None:
        rows = [_record_row(run_id, r) for r in records]
        if not rows:
            return
        cols = self._request_columns
        values = [tuple(row.get(c) for c in cols) for row in rows]
        with self._lock:
            # plain executemany: sqlite-utils' per-call table introspection costs ~2 ms, and this
            # runs on the probe's event loop after every request
            self._conn.executemany(self._insert_request_sql, values)
            self._conn.commit()

    def add_metric_samples(self, run_id: str, samples: Iterable[Any]) -> int:
        """Store server-metric points: MetricPoint, dicts or (t_s, name, labels, value) tuples."""
        rows = []
        for s in samples:
            if isinstance(s, MetricPoint):
                t_s, name, labels, value = s.t_s, s.name, s.labels, s.value
            elif isinstance(s, dict):
                t_s, name, labels, value = s["t_s"], s["name"], s.get("labels") or {}, s["value"]
            else:
                t_s, name, labels, value = s
            rows.append(
                {
                    "run_id": run_id,
                    "t_s": float(t_s),
                    "name": str(name),
                    "labels": _dumps(labels),
                    "value": float(value),
                }
            )
        if rows:
            with self._lock:
                self.db["metric_samples"].insert_all(rows)
                self._conn.commit()
        return len(rows)

    def update_meta(self, run_id: str, items: dict[str, Any]) -> None:
        """Add `items` to a run's meta (what is learnt while it runs, e.g. its cluster)."""
        row = self._require(run_id)
        meta = {**(_loads(row.get("meta"), {}) or {}), **items}
        with self._lock:
            self._conn.execute("UPDATE runs SET meta = ? WHERE run_id = ?", (_dumps(meta), run_id))
            self._conn.commit()

    def finish_run(
        self, run_id: str, status: RunStatus, summary: dict[str, Any] | BaseModel | None = None
    ) -> None:
        """Close a run: complete, interrupted (Ctrl-C, SIGTERM) or failed."""
        self._require(run_id)
        with self._lock:
            self._conn.execute(
                "UPDATE runs SET status = ?, finished_at = ?, summary = ? WHERE run_id = ?",
                (
                    status,
                    datetime.now(UTC).isoformat(timespec="seconds"),
                    _dumps(summary) if summary is not None else None,
                    run_id,
                ),
            )
            self._conn.commit()

    # ----------------------------------------------------------------- reading

    def _require(self, run_id: str) -> dict[str, Any]:
        with self._lock:
            cur = self._conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,))
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        if row is None:
            recent = [r.run_id for r in self.list_runs(limit=5)]
            hint = ", ".join(recent) if recent else "none stored yet"
            raise InputError(
                "run_id",
                f"unknown run {run_id!r}; recent: {hint}",
                "an id from `inferwise runs list`",
            )
        return dict(zip(names, row, strict=True))

    def _to_stored(self, row: dict[str, Any], count: int) -> StoredRun:
        stale = False
        if (
            row["status"] == "running"
            and row.get("pid")
            and row.get("host") == socket.gethostname()
        ):
            stale = not _pid_alive(int(row["pid"]))
        status = (
            row["status"]
            if row["status"] in ("running", "complete", "interrupted", "failed")
            else "failed"
        )
        return StoredRun(
            run_id=row["run_id"],
            created_at=row["created_at"],
            finished_at=row.get("finished_at"),
            status=status,
            stale=stale,
            labels={str(k): str(v) for k, v in (_loads(row.get("labels"), {}) or {}).items()},
            config=_loads(row.get("config"), {}) or {},
            meta=_loads(row.get("meta"), {}) or {},
            summary=_stored_summary(row.get("summary")),
            request_count=count,
            pid=row.get("pid"),
            host=row.get("host"),
        )

    def get_run(self, run_id: str) -> StoredRun:
        row = self._require(run_id)
        with self._lock:
            count = self._conn.execute(
                "SELECT count(*) FROM requests WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
        return self._to_stored(row, int(count))

    def resolve(self, run_id: str) -> str:
        """Accept a full id or a unique prefix of one (`20261129-1705`), or `latest`."""
        if run_id == "latest":
            runs = self.list_runs(limit=1)
            if not runs:
                raise InputError("run_id", "no runs stored yet", "run `inferwise probe` first")
            return runs[0].run_id
        with self._lock:
            exact = self._conn.execute(
                "SELECT run_id FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if exact:
                return run_id
            matches = [
                r[0]
                for r in self._conn.execute(
                    "SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY run_id DESC LIMIT 3",
                    (run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
                )
            ]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise InputError(
                "run_id",
                f"{run_id!r} matches several runs: {', '.join(matches)}",
                "a longer prefix",
            )
        self._require(run_id)  # raises the unknown-id error with recent ids
        return run_id

    def list_runs(self, limit: int = 20, labels: dict[str, str] | None = None) -> list[StoredRun]:
        """Newest first; `labels` keeps runs that carry every given key=value."""
        want = {str(k): str(v) for k, v in (labels or {}).items()}
        out: list[StoredRun] = []
        with self._lock:
            cur = self._conn.execute(
                "SELECT r.*, (SELECT count(*) FROM requests q WHERE q.run_id = r.run_id) AS _count "
                "FROM runs r ORDER BY r.rowid DESC"
            )
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        for raw in rows:
            row = dict(zip(names, raw, strict=True))
            count = int(row.pop("_count") or 0)
            run = self._to_stored(row, count)
            if all(run.labels.get(k) == v for k, v in want.items()):
                out.append(run)
                if len(out) >= limit:
                    break
        return out

    def requests(self, run_id: str) -> list[RequestRecord]:
        """Every stored request of the run, in schedule order."""
        self._require(run_id)
        with self._lock:
            cur = self._conn.execute(
                "SELECT * FROM requests WHERE run_id = ? ORDER BY idx", (run_id,)
            )
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        fields = RequestRecord.model_fields
        out = []
        for raw in rows:
            row = dict(zip(names, raw, strict=True))
            data: dict[str, Any] = {"index": row["idx"]}
            for name in fields:
                if name == "index" or name not in row or row[name] is None:
                    continue
                value = row[name]
                if name in _RECORD_JSON_FIELDS or _is_container(fields[name].annotation):
                    value = _loads(value, None)
                    if value is None:
                        continue
                elif _is_bool(fields[name].annotation):
                    value = bool(value)
                data[name] = value
            out.append(RequestRecord.model_validate(data))
        return out

    def metric_samples(self, run_id: str, name: str | None = None) -> list[MetricPoint]:
        self._require(run_id)
        sql = "SELECT t_s, name, labels, value FROM metric_samples WHERE run_id = ?"
        args: list[Any] = [run_id]
        if name:
            sql += " AND name = ?"
            args.append(name)
        sql += " ORDER BY t_s, rowid"
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        return [
            MetricPoint(
                t_s=t,
                name=n,
                labels={str(k): str(v) for k, v in (_loads(lab, {}) or {}).items()},
                value=v,
            )
            for t, n, lab, v in rows
        ]


# --------------------------------------------------------------------------- row mapping


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _is_container(annotation: Any) -> bool:
    import typing

    origin = typing.get_origin(annotation)
    if origin in (list, dict, tuple, set):
        return True
    return any(_is_container(a) for a in typing.get_args(annotation) if a is not type(None))


def _is_bool(annotation: Any) -> bool:
    import typing

    if annotation is bool:
        return True
    return any(a is bool for a in typing.get_args(annotation))


def _column_type(name: str, annotation: Any) -> type:
    import typing

    if name in _RECORD_JSON_FIELDS or _is_container(annotation):
        return str
    args: Sequence[Any] = [a for a in typing.get_args(annotation) if a is not type(None)] or [
        annotation
    ]
    for a in args:
        if a is bool or a is int:
            return int
        if a is float:
            return float
    return str


def _record_row(run_id: str, record: RequestRecord) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run_id, "idx": record.index}
    for name, info in RequestRecord.model_fields.items():
        if name == "index":
            continue
        value = getattr(record, name)
        if name in _RECORD_JSON_FIELDS or _is_container(info.annotation):
            value = None if value is None else json.dumps(value)
        elif isinstance(value, bool):
            value = int(value)
        row[name] = value
    return row
