"""What `--cluster` means and what a cluster run reports: the address, its TLS files, and
the `cluster` block of the run's JSON.

Only the stdlib and pydantic are imported here: the probe's input and output models
(loaded by the MCP server at start-up) use these, and the Dask engine itself is imported
only when a cluster run starts (:mod:`inferwise.probes.cluster`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError

MAX_LOCAL_WORKERS = 64
"""`local:N` starts N worker processes on this machine; as many as `--workers` allows."""
TLS_ENV = {
    "cluster_tls_ca": "INFERWISE_DASK_TLS_CA",
    "cluster_tls_cert": "INFERWISE_DASK_TLS_CERT",
    "cluster_tls_key": "INFERWISE_DASK_TLS_KEY",
}
"""Where the scheduler connection's certificate paths come from when no flag gives them."""
INSTALL_HINT = 'pip install "inferwise[distributed]" (installs dask and distributed)'

_ADDRESS = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})")


class ClusterWorker(BaseModel):
    """One Dask worker's share of a cluster run."""

    model_config = ConfigDict(extra="forbid")

    address: str
    name: str
    requests: int = Field(
        0, description="Requests this worker finished (stored), failed ones included."
    )
    clock_offset_ms: float | None = Field(
        None,
        description="Worker clock minus driver clock before the load (round-trip midpoint); "
        "the worker's timestamps were shifted by it.",
    )
    clock_offset_after_ms: float | None = Field(
        None, description="The same offset measured after the load (drift = after - before)."
    )
    rtt_ms: float | None = Field(
        None, description="Round trip of the best offset sample: the offset is within half of it."
    )
    lag_p99_ms: float | None = Field(None, description="Event-loop lag P99 of its client.")
    saturated: bool = False
    lost: bool = Field(False, description="The worker died (or its task failed) mid-run.")
    lost_requests: int = Field(0, description="Its requests marked failed as worker_lost.")


class ClusterInfo(BaseModel):
    """The `cluster` block of a run: which scheduler and workers carried the load."""

    model_config = ConfigDict(extra="forbid")

    scheduler: str
    workers: list[ClusterWorker] = Field(default_factory=list)


@dataclass(frozen=True)
class ClusterTarget:
    """A checked `--cluster` value: a scheduler to connect to, or N local workers to start."""

    kind: str  # "scheduler" | "local"
    address: str = ""
    host: str = ""
    port: int = 0
    local_workers: int = 0
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def tls(self) -> bool:
        return self.address.startswith("tls://")


def parse_cluster(
    value: str,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> ClusterTarget:
    """`tcp://host:port`, `tls://host:port` or `local:N`, with TLS files from the flags or
    the environment (INFERWISE_DASK_TLS_*). Raises InputError naming the field."""
    v = value.strip()
    given = {"cluster_tls_ca": tls_ca, "cluster_tls_cert": tls_cert, "cluster_tls_key": tls_key}
    files = {k: x or os.environ.get(TLS_ENV[k]) or None for k, x in given.items()}
    if v.startswith("local:"):
        n = v.removeprefix("local:")
        if not n.isdigit() or not 1 <= int(n) <= MAX_LOCAL_WORKERS:
            raise InputError(
                "cluster", f"{value!r}: N must be 1-{MAX_LOCAL_WORKERS}", "local:N, e.g. local:2"
            )
        if any(given.values()):
            raise InputError(
                "cluster_tls_ca", "TLS files apply to a scheduler address, not local:N"
            )
        return ClusterTarget(kind="local", address=v, local_workers=int(n))
    m = _ADDRESS.fullmatch(v)
    if not m or not 1 <= int(m.group(3)) <= 65535:
        raise InputError(
            "cluster",
            f"not a scheduler address: {value!r}",
            "tcp://HOST:PORT, tls://HOST:PORT (Dask scheduler) or local:N",
        )
    host = m.group(2).strip("[]")
    if m.group(1) == "tcp" and any(files.values()):
        field = next(k for k, x in files.items() if x)
        raise InputError(field, "TLS files given for a tcp:// scheduler", "use tls://HOST:PORT")
    if m.group(1) == "tls":
        _check_tls_files(files)
    return ClusterTarget(
        kind="scheduler",
        address=v,
        host=host,
        port=int(m.group(3)),
        tls_ca=files["cluster_tls_ca"],
        tls_cert=files["cluster_tls_cert"],
        tls_key=files["cluster_tls_key"],
    )


def _check_tls_files(files: dict[str, str | None]) -> None:
    """tls:// needs the CA that signed the scheduler's certificate and this client's own
    certificate and key (Dask's TLS is mutual); each must be a readable file."""
    for field, path in files.items():
        if not path:
            raise InputError(
                field,
                "a tls:// scheduler needs the CA, certificate and key files",
                f"--{field.replace('_', '-')} PATH or env {TLS_ENV[field]}",
            )
        p = Path(path).expanduser()
        if not p.is_file() or not os.access(p, os.R_OK):
            raise InputError(field, f"{path!r} is not a readable file", "a PEM file path")
