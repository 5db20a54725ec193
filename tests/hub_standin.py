"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests that drive ``huggingface_hub``
for real (``hf_hub_download``, ``HfApi.model_info``) without reaching the network.

Why: the Hub code path (metadata HEAD, download GET, error headers, the cache layout) is
only exercised honestly by the library itself; mocking ``hf_hub_download`` would test
nothing. This server answers the HTTP contract ``huggingface_hub`` 2.4.0 relies on, read
from its source (``file_download.get_hf_file_metadata`` / ``_get_metadata_or_catch_error``
/ ``http_get``, ``utils/_http.hf_raise_for_status``, ``hf_api.HfApi.model_info``):

* ``HEAD|GET /{repo_id}/resolve/{revision}/{filename}`` answers 200 (HEAD without a body)
  with ``X-Repo-Commit`` (required, or the library raises ``FileMetadataError``), ``ETag``
  (the quoted git blob sha1, the cache's blob name) and ``Content-Length`` (the expected
  size). No ``X-Linked-Etag`` / ``X-Linked-Size`` (LFS) and no ``X-Xet-Hash`` / ``Link:
  xet-auth`` (Xet) are ever sent, and there is no redirect, so every file is a plain
  regular file downloaded from the same URL, whatever ``HF_HUB_DISABLE_XET`` says. A
  ``Range`` GET answers 206 with ``Content-Range``.
* Errors carry ``X-Error-Code`` / ``X-Error-Message`` as the real Hub does, which is what
  the library maps to its exception classes (status codes alone are not enough: its 401
  fallback to ``RepositoryNotFoundError`` only matches ``https://`` URLs):

  ============================  ======  ===============  =================================
  case                          status  X-Error-Code     ``hf_hub_download`` raises
  ============================  ======  ===============  =================================
  unknown repo                  401 *   RepoNotFound     ``errors.RepositoryNotFoundError``
  gated repo, no/wrong token    401/403 GatedRepo        ``errors.GatedRepoError``
  unknown revision              404     RevisionNotFound ``errors.RevisionNotFoundError``
  unknown file in a known repo  404     EntryNotFound    ``errors.RemoteEntryNotFoundError``
  weight GET without Range      403     (none)           ``errors.HfHubHTTPError`` (403)
  ============================  ======  ===============  =================================

  (*) 404 when the request carries an ``Authorization`` header, like the real Hub.
  ``GatedRepoError`` subclasses ``RepositoryNotFoundError`` and ``RemoteEntryNotFoundError``
  subclasses ``EntryNotFoundError``: catch the gated case first. The EntryNotFound reply
  carries ``X-Repo-Commit`` so the library records the miss under ``.no_exist``.
* ``GET /api/models/{repo_id}`` and ``/api/models/{repo_id}/revision/{revision}`` answer the
  JSON ``ModelInfo(**data)`` parses: ``id``, ``sha``, ``siblings`` (``[{"rfilename": ...}]``,
  with ``size`` / ``blobId`` when ``blobs=true``), ``gated`` (``False`` or ``"manual"`` /
  ``"auto"``), ``config`` (``architectures`` / ``model_type`` of config.json), and ``expand``
  filters the keys. As on the real Hub, a gated repo's *info* is public (only its files
  need the token); an unknown repo or revision gets the same errors as above.

Every request is kept in ``hub.requests`` as ``HubRequest(method, path, headers)`` (path
with its query string, header names lower-cased), before it is answered. A GET of a file
ending in ``.safetensors``, ``.bin``, ``.gguf`` or ``.pt`` without a ``Range`` header is
refused with 403 and also kept in ``hub.refused``: a test asserts ``hub.refused == []`` to
prove no weights were downloaded, and ``hub.leaks(token) == []`` to prove the token went
nowhere but the ``Authorization`` header.

How a test must point ``huggingface_hub`` 2.4.0 at it. ``huggingface_hub.constants`` reads
``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_HUB_DISABLE_XET``
and ``HF_HUB_ETAG_TIMEOUT`` once, when ``huggingface_hub`` is first imported in the
process; setting them later changes nothing (and ``huggingface_hub.model_info``, the
module-level function, is bound to an ``HfApi()`` built at import). The server's port is
only known once it runs, so pass things per call instead::

    with HubStandin(repos, token="hf_test_token") as hub:
        path = hf_hub_download(repo_id, "config.json", revision="main",
                               endpoint=hub.endpoint, cache_dir=tmp_path, token=False)
        info = HfApi(endpoint=hub.endpoint).model_info(repo_id, token=False)

``HF_TOKEN`` is the exception: it is read on every call (when ``token`` is None or True),
so ``monkeypatch.setenv("HF_TOKEN", ...)`` works; a stored login under ``HF_HOME`` is read
too, so tests pass ``token=`` explicitly (a string or ``False``). Offline mode per call is
``local_files_only=True``; process-wide it is ``monkeypatch.setattr(huggingface_hub.constants,
"HF_HUB_OFFLINE", True)`` (``is_offline_mode()`` reads that attribute at call time). To
redirect calls that take no ``endpoint=`` argument, patch *both*
``constants.ENDPOINT`` and ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (``hf_hub_url`` builds
from the template), or set the variables in a subprocess's environment before it imports
``huggingface_hub``.

One request goes elsewhere unless a test stops it: the first ``build_hf_headers`` of a
process (the user-agent's agent detection, ``utils/_detect_agent.py``) GETs
``{constants.ENDPOINT}/api/agent-harnesses``, i.e. https://huggingface.co when
``HF_ENDPOINT`` was unset at import, whatever ``endpoint=`` the call was given. Stop it
with ``HF_HUB_DISABLE_TELEMETRY=1`` (or ``DO_NOT_TRACK=1``) before the import, or after it
with ``monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)``
(read at call time); offline mode stops it too. It never carries the token. When
``HF_ENDPOINT`` names this server, that GET arrives here, is recorded, and gets a 404
(the library then detects no agent and writes nothing under ``HF_HOME``).

The server is an ``http.server.ThreadingHTTPServer`` on 127.0.0.1, port 0, on its own
thread, started by ``with`` and stopped (open keep-alive connections closed) on exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple, TypedDict
from urllib.parse import parse_qs, unquote, urlsplit

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
COMMIT = re.compile(r"[0-9a-f]{40}")
RESOLVE_PATH = re.compile(
    r"^/(?:(?P<type>datasets|spaces|kernels)/)?"
    r"(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<revision>[^/]+)/(?P<filename>.+)$"
)
API_PATH = re.compile(
    r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)(?:/revision/(?P<revision>[^/]+))?/?$"
)
TIMESTAMP = "2024-01-01T00:00:00.000Z"


class RepoSpec(TypedDict, total=False):
    """One repository: its files, its single commit, whether it is gated, and any extra
    fields to merge into its model_info JSON (``tags``, ``library_name``, ``safetensors``...)."""

    files: dict[str, bytes]
    commit: str
    gated: bool | str
    info: dict[str, Any]


class HubRequest(NamedTuple):
    """A request as received: method, raw path with query, headers with lower-cased names."""

    method: str
    path: str
    headers: dict[str, str]


class _Reply(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's content: the Hub's ETag for a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _content_type(filename: str) -> str:
    if filename.endswith(".json"):
        return "application/json"
    if filename.endswith((".md", ".txt", ".py", ".yaml", ".yml", ".jinja")):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


def _error(status: int, message: str, code: str | None = None, **headers: str) -> _Reply:
    out = {"X-Error-Message": message, **headers}
    if code is not None:
        out["X-Error-Code"] = code
    return _Reply(status, out, json.dumps({"error": message}).encode())


def _byte_range(spec: str, size: int) -> tuple[int, int] | None:
    """(first, last) inclusive for a single ``bytes=`` range, None if unsatisfiable."""
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", spec, re.IGNORECASE)
    if match is None or not any(match.groups()):
        return None
    start, end = match.groups()
    if not start:  # suffix range: the last N bytes
        first, last = max(size - int(end), 0), size - 1
    else:
        first, last = int(start), min(int(end), size - 1) if end else size - 1
    return (first, last) if first <= last and first < size else None


class HubStandin:
    """The Hub for ``repos`` on ``http://127.0.0.1:<port>``; ``token`` is the one access
    token it accepts (``Authorization: Bearer <token>``) for gated repositories.

    ``repos`` maps a repo id to ``{"files": {name: bytes}, "commit": "<40 hex>",
    "gated": bool, "info": {...}}``; "main" and the commit resolve, nothing else does.
    Attributes: ``endpoint``, ``port``, ``requests`` (every ``HubRequest``), ``refused``
    (the weight GETs answered 403)."""

    def __init__(
        self,
        repos: Mapping[str, RepoSpec],
        token: str | None = None,
        *,
        weight_suffixes: Iterable[str] = WEIGHT_SUFFIXES,
    ) -> None:
        self.repos: dict[str, RepoSpec] = {}
        for repo_id, spec in repos.items():
            commit = spec.get("commit") or hashlib.sha1(repo_id.encode()).hexdigest()
            if not COMMIT.fullmatch(commit):
                raise ValueError(f"{repo_id}: commit must be 40 lower-case hex digits")
            self.repos[repo_id] = {**spec, "commit": commit, "files": dict(spec.get("files", {}))}
        self.token = token
        self.weight_suffixes = tuple(weight_suffixes)
        self.requests: list[HubRequest] = []
        self.refused: list[HubRequest] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None  # kept after stop, for messages

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("HubStandin has not been started")
        return self._port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HubStandin:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        # a restart keeps the port, so a test can take the Hub away and bring it back
        server = ThreadingHTTPServer(("127.0.0.1", self._port or 0), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # keep-alive handler threads wait on these
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server = None

    def leaks(self, secret: str) -> list[tuple[HubRequest, str]]:
        """Where ``secret`` was sent other than as the Authorization header: (request, place)."""
        found = []
        with self._lock:
            requests = list(self.requests)
        for request in requests:
            if secret in request.path or secret in unquote(request.path):
                found.append((request, "path"))
            for name, value in request.headers.items():
                if name != "authorization" and secret in value:
                    found.append((request, name))
        return found

    # --- answering -----------------------------------------------------------------

    def _record(self, request: HubRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _answer(self, request: HubRequest) -> _Reply:
        path = urlsplit(request.path).path
        if request.method in ("GET", "HEAD") and (match := RESOLVE_PATH.match(path)):
            if match["type"] is not None:  # only model repositories are stood in for
                return self._repo_not_found(request)
            return self._resolve(
                request,
                unquote(match["repo"]),
                unquote(match["revision"]),
                unquote(match["filename"]),
            )
        if request.method == "GET" and (match := API_PATH.match(path)):
            revision = unquote(match["revision"]) if match["revision"] else None
            return self._model_info(request, unquote(match["repo"]), revision)
        return _error(404, f"HubStandin has no route for {request.method} {path}")

    def _repo_not_found(self, request: HubRequest) -> _Reply:
        status = 404 if "authorization" in request.headers else 401
        return _error(status, "Repository not found", "RepoNotFound")

    def _revision(self, repo: RepoSpec, revision: str | None) -> str | None:
        commit = repo["commit"]
        return commit if revision in (None, "main", commit) else None

    def _resolve(self, request: HubRequest, repo_id: str, revision: str, filename: str) -> _Reply:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._repo_not_found(request)
        if repo.get("gated"):
            sent = request.headers.get("authorization")
            if sent is None:
                return _error(
                    401,
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in.",
                    "GatedRepo",
                )
            if self.token is None or sent != f"Bearer {self.token}":
                return _error(
                    403,
                    f"Access to model {repo_id} is restricted and you are not in the authorized list.",
                    "GatedRepo",
                )
        commit = self._revision(repo, revision)
        if commit is None:
            return _error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        data = repo["files"].get(filename)
        if data is None:
            return _error(404, "Entry not found", "EntryNotFound", **{"X-Repo-Commit": commit})
        headers = {
            "Content-Type": _content_type(filename),
            "ETag": f'"{git_blob_sha1(data)}"',
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
        }
        wanted = request.headers.get("range")
        if request.method == "GET" and filename.endswith(self.weight_suffixes) and wanted is None:
            with self._lock:
                self.refused.append(request)
            return _error(403, "HubStandin refuses to send weight files (GET without Range)")
        if wanted is not None and request.method == "GET":
            span = _byte_range(wanted, len(data))
            if span is None:
                return _Reply(416, {**headers, "Content-Range": f"bytes */{len(data)}"}, b"")
            first, last = span
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            return _Reply(206, headers, data[first : last + 1])
        return _Reply(200, headers, data)

    def _model_info(self, request: HubRequest, repo_id: str, revision: str | None) -> _Reply:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._repo_not_found(request)
        commit = self._revision(repo, revision)
        if commit is None:
            return _error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        query = parse_qs(urlsplit(request.path).query)
        blobs = query.get("blobs", ["false"])[-1].lower() == "true"
        files = repo["files"]
        siblings: list[dict[str, Any]] = []
        for name in sorted(files):
            entry: dict[str, Any] = {"rfilename": name}
            if blobs:
                entry.update(size=len(files[name]), blobId=git_blob_sha1(files[name]))
            siblings.append(entry)
        gated = repo.get("gated", False)
        body: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": commit,
            "lastModified": TIMESTAMP,
            "createdAt": TIMESTAMP,
            "private": False,
            "disabled": False,
            "gated": "manual" if gated is True else gated,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(len(b) for b in files.values()),
        }
        config = _config_summary(files.get("config.json"))
        if config is not None:
            body["config"] = config
        body.update(repo.get("info", {}))
        if expand := query.get("expand"):
            body = {k: v for k, v in body.items() if k in ("_id", "id") or k in expand}
        return _Reply(200, {"Content-Type": "application/json"}, json.dumps(body).encode())


def _config_summary(raw: bytes | None) -> dict[str, Any] | None:
    """The part of config.json the Hub echoes in model_info's ``config``."""
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return {k: parsed[k] for k in ("architectures", "model_type") if k in parsed}


def _make_handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx2's pooled client expects

        def setup(self) -> None:
            super().setup()
            with hub._lock:
                hub._connections.add(self.connection)

        def finish(self) -> None:
            with hub._lock:
                hub._connections.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)  # drain a body so the connection stays usable
            request = HubRequest(
                self.command, self.path, {k.lower(): v for k, v in self.headers.items()}
            )
            hub._record(request)
            reply = hub._answer(request)
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _serve

    return Handler
