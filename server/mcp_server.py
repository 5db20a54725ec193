"""The MCP door: every registered operation as a tool, the knowledge and catalogs as resources.

Tools are generated from the same registry as the CLI. Each tool gets *flat*
parameters, one per input-model field (a single model parameter would nest
every argument under one key, which LLM callers handle badly), and the output
model as its output schema. A call validates the arguments against the input
model (so model-level rules such as "gpu or gpu_memory_gib" apply too), runs
the operation, and returns the structured result plus its Markdown rendering.

Start-up: a stdio server is launched for every client session, so `serve`
builds it with `lazy_tools=True`: a tool (and its operation's models) is built
when first called, and `tools/list` comes from a disk cache of the listing
that is rebuilt whenever the source or the libraries change
(`mcp_tool_cache`). The HTTP server and `build_server()` build every tool up
front.

Security: fields listed as `mcp_hidden` (the run-store path, the API-key
variable, target allowlists, cap overrides) are not offered to the model; the
probe runs in the strict target policy, configured only by whoever starts the
server (environment variables), never by a tool argument, and over MCP a
`cluster` must be a scheduler's address (`local:N` would start processes here).
File arguments (traces, workload and benchmark files, local models) must lie in
one folder, $INFERWISE_MCP_FILES_DIR or the folder the server started in.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
import re
import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticUndefined

from inferwise.calculators.errors import InputError, OperationalError, classify_unexpected
from inferwise.server.registry import BY_TOOL, Operation

# Never offered to the calling model: they choose local files, secrets or safety limits.
MCP_HIDDEN_FIELDS = frozenset(
    {
        "db",
        "api_key_env",
        "allow_hosts",
        "allow_cidrs",
        "allow_private",
        "allow_remote",
        "max_requests",
        "max_duration_s",
        "max_concurrency",
        "dataset",
        "store_text",
        "output",
        "cluster_tls_ca",
        "cluster_tls_cert",
        "cluster_tls_key",
        "max_prompt_tokens_in_flight",
    }
)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")

HEAVY_CALLS_AT_ONCE = max(4, os.cpu_count() or 4)
"""Worker threads the non-inline tools share. Their own limiter, not anyio's default
one: a burst of slow calls then waits here, and leaves the threads the SDK and the
probe's set-up use free."""

PROBE_CAPS_ENV = {
    "max_requests": "INFERWISE_MCP_MAX_REQUESTS",
    "max_duration_s": "INFERWISE_MCP_MAX_DURATION_S",
    "max_concurrency": "INFERWISE_MCP_MAX_CONCURRENCY",
    "max_prompt_tokens_in_flight": "INFERWISE_MCP_MAX_PROMPT_TOKENS_IN_FLIGHT",
}
"""The operator's per-call caps for probe_endpoint (environment of the server, never a
tool argument); unset, the probe's own defaults apply."""

INLINE_TOOLS = frozenset({"estimate_memory_fit"})
"""Synchronous tools fast enough to run on the event loop (about a millisecond;
tens at most for a first request on an architecture). A registry entry can
say so itself with ``extra={"inline": True}`` (or False)."""


class MCPConfig(BaseModel):
    """How `inferwise mcp` serves."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["stdio", "http"] = Field(
        default="stdio",
        description="stdio for a client that launches the server; http for streamable HTTP.",
    )
    host: str = Field(default="127.0.0.1", description="Address to bind the HTTP transport to.")
    port: int = Field(default=8765, ge=1, le=65535, description="Port of the HTTP transport.")
    allowed_host: list[str] | None = Field(
        default=None,
        description="Extra Host header values accepted over HTTP (host:port); required for a non-local bind.",
    )
    token_env: str | None = Field(
        default=None,
        description="Name of an environment variable holding a bearer token that HTTP clients must send.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="WARNING", description="Server log level (stderr)."
    )


def _tool_error_text(exc: InputError, fields: frozenset[str] = frozenset()) -> str:
    text = f"argument {exc.field!r}: {exc.message}"
    if exc.accepted:
        text += f" (accepted: {exc.accepted})"
    return _as_arguments(text, fields)


_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")


def _as_arguments(text: str, fields: frozenset[str]) -> str:
    """The calculators word their errors for the CLI (``--slo-e2e-ms p95=15000``); over MCP
    a flag that is one of the tool's own arguments is named as the argument (``slo_e2e_ms``).
    Other flags (an engine's ``--split-mode``, a command to run) stay as written."""

    def name(m: re.Match[str]) -> str:
        arg = m.group(1).replace("-", "_")
        return arg if arg in fields else m.group(0)

    return _FLAG.sub(name, text)


def operator_probe_caps() -> dict[str, float]:
    """The caps the server's operator set for probe calls, from the environment."""
    caps: dict[str, float] = {}
    for name, env in PROBE_CAPS_ENV.items():
        raw = os.environ.get(env, "").strip()
        if raw:
            try:
                caps[name] = float(raw) if name.endswith("_s") else int(raw)
            except ValueError:
                raise OperationalError(
                    f"{env}={raw!r} is not a number; the operator must fix it"
                ) from None
    return caps


@functools.cache
def _heavy_limiter() -> Any:
    import anyio

    return anyio.CapacityLimiter(HEAVY_CALLS_AT_ONCE)


def _bounded(op: Operation, func: Any = None) -> Any:
    """`op.func(request)` (or `func`) under the compute budget (set on the thread that runs it)."""
    from inferwise.calculators.deadline import compute_budget, default_budget_s

    def run(request: Any) -> Any:
        with compute_budget(default_budget_s(op.compute_budget_s)):
            return (func or op.func)(request)

    return run


async def _run_with_content(op: Operation, request: Any) -> tuple[Any, list[Any]]:
    """An operation whose MCP reply carries images or links (``op.mcp_ref``), on a worker."""
    import anyio

    from inferwise.server.registry import _resolve

    func = _bounded(op, _resolve(op.mcp_ref))
    return await anyio.to_thread.run_sync(func, request, limiter=_heavy_limiter())


DATASET_DIR_ENV = "INFERWISE_MCP_DATASET_DIR"
"""The one folder whose eval/prompt files probe_endpoint may read (the operator's choice;
unset, the calling model cannot name a local file: its text would be sent to the target)."""


def _dataset_in_operator_dir(request: Any) -> Any:
    """probe_endpoint's dataset: a file inside $INFERWISE_MCP_DATASET_DIR, or refused."""
    from pathlib import Path

    if not getattr(request, "dataset", None):
        return request
    root = Path(os.environ[DATASET_DIR_ENV]).expanduser().resolve()
    path = root / request.dataset
    if not _resolves_inside(path, root):
        raise InputError(
            "dataset", f"{request.dataset} is outside the operator's dataset folder", str(root)
        )
    return request.model_copy(update={"dataset": str(path.resolve())})


def _resolves_inside(path: Any, root: Any) -> bool:
    """Whether `path`, links followed, lies in `root` (a NUL byte or a link loop: no)."""
    try:
        return path.expanduser().resolve().is_relative_to(root)
    except (OSError, ValueError, RuntimeError):
        return False


FILES_DIR_ENV = "INFERWISE_MCP_FILES_DIR"
"""The folder whose files (traces, workload files, benchmark files, local models) tool
arguments may name; unset, the folder the server was started in (a coding assistant starts it
in the project). A path elsewhere is refused before it is opened, so a caller learns nothing
about files outside it, not even whether they exist."""

FILE_ARGUMENTS = ("trace", "workload", "from_file", "model")
"""Tool arguments that may name a local file or folder."""


def _files_root() -> Any:
    from pathlib import Path

    return Path(os.environ.get(FILES_DIR_ENV) or os.getcwd()).expanduser().resolve()


def _local_files_in_root(kwargs: dict[str, Any]) -> None:
    """Refuse a file argument that names a path outside the files folder."""
    from pathlib import Path

    root = _files_root()
    for name in FILE_ARGUMENTS:
        value = kwargs.get(name)
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, str) or not _names_a_path(name, v):
                continue
            if not _resolves_inside(Path(v), root):
                raise InputError(
                    name,
                    "a path outside the folder this server reads files from",
                    f"a path inside {root} (the server's operator sets {FILES_DIR_ENV})"
                    + (", or the workload's JSON itself" if name == "workload" else ""),
                )


def _names_a_path(name: str, value: str) -> bool:
    """Whether an argument's text is a local path: a trace or benchmark file always; a
    workload unless it is inline JSON; a model when it is written as a path (a Hugging Face
    id is org/name, which no absolute, home or dot path is)."""
    text = value.strip()
    if name == "workload":
        return not text.startswith(("{", "["))
    if name == "model":
        return text.startswith(("/", "~", ".")) or text.lower().endswith(".gguf")
    return bool(text)


def _no_local_cluster(request: Any) -> None:
    """Over MCP a probe may spread over a Dask scheduler the operator allowlisted, but not
    over `local:N`, which would start N worker processes on the server's own machine."""
    cluster = (getattr(request, "cluster", None) or "").strip()
    if cluster.startswith("local"):
        raise InputError(
            "cluster",
            "local:N starts worker processes on the server's machine, which a tool call may not",
            "a scheduler address the operator allowlisted, tcp://HOST:PORT or tls://HOST:PORT",
        )


def _exposed_fields(op: Operation) -> dict[str, Any]:
    hidden = MCP_HIDDEN_FIELDS | set(op.extra.get("mcp_hidden", ()))
    if os.environ.get(DATASET_DIR_ENV):
        hidden = hidden - {"dataset"}
    return {n: f for n, f in op.input_model.model_fields.items() if n not in hidden}


def make_tool_function(op: Operation, strict_probe_policy: Any = None) -> Any:
    """Build an async function with one keyword parameter per exposed input field.

    The SDK reads the signature to build the tool's input schema and output
    schema; the body re-validates with the real input model and maps our errors
    to ToolError so the caller sees which argument to fix.
    """
    from mcp_types import CallToolResult, TextContent

    from inferwise.server.render import render

    async def tool(**kwargs: Any) -> Any:
        ctx = kwargs.pop("ctx", None)
        request = _validated(op, kwargs)
        extra: list[Any] = []
        try:
            if op.mcp_ref:
                result, extra = await _run_with_content(op, request)
            else:
                result = await _run(op, request, ctx, strict_probe_policy)
            text = render(op.template, result)
        except Exception as exc:  # a door never lets an exception through unworded
            raise _tool_error(exc, frozenset(_exposed_fields(op))) from None
        return CallToolResult(
            content=[TextContent(type="text", text=text), *extra],
            structured_content=result.model_dump(mode="json"),
        )

    parameters, annotations = _signature(op)
    tool.__signature__ = inspect.Signature(parameters, return_annotation=op.output_model)  # type: ignore[attr-defined]
    tool.__annotations__ = annotations
    tool.__name__ = op.tool_name or op.name
    return tool


def _validated(op: Operation, kwargs: dict[str, Any]) -> Any:
    """The input model from the arguments (the probe's with the operator's caps)."""
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import ValidationError

    from inferwise.server.cli import validation_message

    model = op.input_model
    try:
        _local_files_in_root(kwargs)
        request = model.model_validate(kwargs)
        if op.tool_name == "probe_endpoint":
            request = model.model_validate({**request.model_dump(), **operator_probe_caps()})
            request = _dataset_in_operator_dir(request)
            _no_local_cluster(request)
    except InputError as exc:
        raise ToolError(_tool_error_text(exc, frozenset(_exposed_fields(op)))) from None
    except ValidationError as exc:
        raise ToolError(validation_message(model, exc, flag_style=False)) from None
    except OperationalError as exc:
        raise ToolError(str(exc)) from None
    return request


async def _run(op: Operation, request: Any, ctx: Any, strict_probe_policy: Any) -> Any:
    """Run the operation where it belongs: async ones on the loop (with progress and the
    strict policy), fast pure ones inline, the rest on the bounded worker threads."""
    if op.is_async:
        extra: dict[str, Any] = {}
        params = inspect.signature(op.func).parameters
        if "progress" in params and ctx is not None:

            async def progress(done: float, total: float | None = None, message: str = "") -> None:
                # a client that went away must not fail the run
                with contextlib.suppress(Exception):
                    await ctx.report_progress(done, total, message or None)

            extra["progress"] = progress
        if "policy" in params and strict_probe_policy is not None:
            extra["policy"] = strict_probe_policy
        return await op.func(request, **extra)
    # Fast pure calculations run on the event loop: the hop to a worker thread
    # and back costs more than they do. Anything slow or doing I/O keeps the
    # thread, so the server stays responsive (progress, cancellation, pings).
    if op.extra.get("inline", op.tool_name in INLINE_TOOLS) and not _may_fetch(request):
        return _bounded(op)(request)
    import anyio

    return await anyio.to_thread.run_sync(_bounded(op), request, limiter=_heavy_limiter())


def _may_fetch(request: Any) -> bool:
    """A model id not yet resolved may be read from the Hub: network I/O, not for the loop."""
    from inferwise.calculators import hub

    return hub.may_reach_network(
        getattr(request, "model", None), getattr(request, "revision", None)
    )


def _tool_error(exc: Exception, fields: frozenset[str] = frozenset()) -> Exception:
    """The ToolError a caller sees for `exc`: the field to fix (named as the tool's argument),
    or the failure in words."""
    from mcp.server.mcpserver.exceptions import ToolError

    if isinstance(exc, InputError):
        return ToolError(_tool_error_text(exc, fields))
    if isinstance(exc, OperationalError):
        return ToolError(str(exc))
    if os.environ.get("INFERWISE_DEBUG"):
        raise exc
    mapped = classify_unexpected(exc)
    if isinstance(mapped, InputError):
        return ToolError(_tool_error_text(mapped, fields))
    return ToolError(str(mapped))


def _signature(op: Operation) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """One keyword parameter per exposed field, carrying its default; the FieldInfo copy
    keeps description and constraints, so the SDK's schema is the model's."""
    from mcp.server.mcpserver import Context

    parameters = []
    annotations: dict[str, Any] = {}
    for name, info in _exposed_fields(op).items():
        default = (
            inspect.Parameter.empty
            if info.is_required()
            else info.get_default(call_default_factory=True)
        )
        meta = copy.copy(info)
        meta.default, meta.default_factory = PydanticUndefined, None
        annotation = Annotated[info.annotation, meta]
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
        annotations[name] = annotation
    parameters.append(
        inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Context)
    )
    annotations["ctx"] = Context
    annotations["return"] = op.output_model
    return parameters, annotations


def strict_policy_from_env() -> Any:
    """The probe policy for MCP callers: allowlist only, set by the operator's environment."""
    try:
        from inferwise.probes.policy import TargetPolicy
    except ImportError:  # the probe is not installed in this build
        return None
    return TargetPolicy.from_entries(
        [os.environ.get("INFERWISE_MCP_ALLOW_HOSTS", "")], mode="strict"
    )


def _add_tool(server: Any, tool_name: str, op: Operation, policy: Any) -> None:
    from mcp_types import ToolAnnotations

    server.add_tool(
        make_tool_function(op, strict_probe_policy=policy),
        name=tool_name,
        title=op.title,
        description=op.description,
        annotations=ToolAnnotations(
            title=op.title,
            read_only_hint=op.read_only,
            destructive_hint=False,
            idempotent_hint=op.read_only,
            open_world_hint=op.open_world,
        ),
    )


@functools.cache
def _checked_server_class() -> type:
    """MCPServer that refuses argument names a tool does not have and words argument
    validation errors as the CLI does, in one line.

    The SDK's own argument model ignores unknown names (a caller's `tp=2` would silently
    run with tensor_parallel_size 1) and answers a constraint violation with pydantic's
    multi-line text and a documentation link.
    """
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from pydantic import ValidationError

    class CheckedArgumentsServer(MCPServer):
        async def list_tools(self) -> list[Any]:
            """The tools with compact listed schemas (``mcp_schema``); calls still validate
            against the full models."""
            from mcp_types import Tool as MCPTool

            from inferwise.server.mcp_schema import compact_tool, shared_fields

            shared = shared_fields()
            return [
                MCPTool.model_validate(
                    compact_tool(
                        t.model_dump(mode="json", by_alias=True, exclude_none=True), shared
                    )
                )
                for t in await super().list_tools()
            ]

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            op = BY_TOOL.get(name)
            if op is not None:
                accepted = list(_exposed_fields(op))
                unknown = sorted(set(arguments or {}) - set(accepted))
                if unknown:
                    raise ToolError(
                        f"Error executing tool {name}: unknown argument(s) "
                        f"{', '.join(repr(u) for u in unknown)} (accepted: {', '.join(accepted)})"
                    )
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                cause = exc.__cause__
                if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                    raise
                from inferwise.server.cli import validation_message  # only on this error path

                raise ToolError(
                    f"Error executing tool {name}: {validation_message(None, cause, flag_style=False)}"
                ) from cause

    return CheckedArgumentsServer


@functools.cache
def _lazy_server_class() -> type:
    """MCPServer whose tools are built on first use (see ``mcp_tool_cache``).

    Defined on demand because importing the SDK is most of start-up.
    """
    from mcp_types import Tool as MCPTool

    from inferwise.server import mcp_tool_cache

    class LazyToolsServer(_checked_server_class()):  # type: ignore[misc]
        """Builds a tool when it is first called; lists from the disk cache while it is current.

        Everything else, and every tool once built, is the SDK's own behaviour.
        """

        def defer_tools(self, pending: dict[str, Operation], policy: Any) -> None:
            self._pending = dict(pending)
            self._policy = policy
            self._order = list(pending)
            self._listing_key: str | None = None

        def _build(self, name: str) -> None:
            op = self._pending.pop(name, None)
            if op is not None:
                _add_tool(self, name, op, self._policy)

        def _build_all(self) -> None:
            for name in list(self._pending):
                self._build(name)

        async def list_tools(self) -> list[Any]:
            if self._pending:
                if self._listing_key is None:
                    self._listing_key = mcp_tool_cache.fingerprint()
                stored = mcp_tool_cache.load(self._listing_key)
                if stored is not None:
                    return [MCPTool.model_validate(t) for t in stored]
                self._build_all()
            rank = {name: i for i, name in enumerate(self._order)}
            tools = sorted(await super().list_tools(), key=lambda t: rank.get(t.name, len(rank)))
            if self._listing_key is not None:
                mcp_tool_cache.store(
                    self._listing_key,
                    [t.model_dump(mode="json", by_alias=True, exclude_unset=True) for t in tools],
                )
                self._listing_key = None
            return tools

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            # Only stdio serves lazily, and over stdio the SDK looks up no input schema
            # before the call (that lookup validates HTTP Mcp-Param headers, and the HTTP
            # server builds every tool up front); so building here is enough, with no
            # reach into the SDK's private methods.
            self._build(name)
            return await super().call_tool(name, arguments, context)

    return LazyToolsServer


def build_server(log_level: str = "WARNING", lazy_tools: bool = False) -> Any:
    """Create the MCPServer with every tool, resource and prompt registered.

    ``lazy_tools`` (what stdio uses, where every client session pays the
    start-up): each tool is built when first called, and ``tools/list`` is
    answered from the disk cache while it matches the source
    (``mcp_tool_cache``), so start-up imports no operation's models.
    """
    from importlib.metadata import version

    from inferwise.server import mcp_content

    cls = _lazy_server_class() if lazy_tools else _checked_server_class()
    server = cls(
        name="inferwise",
        title="inferwise: measured LLM inference advice",
        version=version("inferwise"),
        instructions=mcp_content.INSTRUCTIONS,
        log_level=log_level,  # type: ignore[arg-type]
    )
    policy = strict_policy_from_env()
    if lazy_tools:
        server.defer_tools(BY_TOOL, policy)
    else:
        for tool_name, op in BY_TOOL.items():
            _add_tool(server, tool_name, op, policy)
    mcp_content.register_resources(server)
    mcp_content.register_prompts(server)
    return server


def _check_bind(config: MCPConfig) -> None:
    """A non-local bind must name the Host headers it accepts; otherwise DNS-rebinding protection would be off."""
    if config.host not in LOCAL_HOSTS and not config.allowed_host:
        raise InputError(
            "host",
            f"binding to {config.host} exposes the server beyond this machine; pass --allowed-host HOST:PORT "
            "for every name clients will use (and set --token-env)",
        )


def transport_security(config: MCPConfig) -> Any:
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", *(config.allowed_host or [])]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    origins += [f"http://{h}" for h in config.allowed_host or []] + [
        f"https://{h}" for h in config.allowed_host or []
    ]
    # Always explicit: the SDK turns the Host check off for any bind it does not recognise as local.
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


class BearerTokenMiddleware:
    """Refuse HTTP requests without the operator's bearer token (constant-time compare)."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            import hmac

            headers = dict(scope.get("headers") or [])
            got = headers.get(b"authorization", b"")
            if not hmac.compare_digest(got, b"Bearer " + self._token):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send(
                    {"type": "http.response.body", "body": b"missing or wrong bearer token\n"}
                )
                return
        await self.app(scope, receive, send)


def http_app(config: MCPConfig, server: Any = None) -> Any:
    """The streamable-HTTP ASGI app (SSE responses, so progress notifications flow; never json_response)."""
    _check_bind(config)
    server = server or build_server(config.log_level)
    app = server.streamable_http_app(
        transport_security=transport_security(config), host=config.host
    )
    if config.token_env:
        token = os.environ.get(config.token_env)
        if not token:
            raise InputError(
                "token_env", f"environment variable {config.token_env} is not set or empty"
            )
        app = BearerTokenMiddleware(app, token)
    return app


def serve(config: MCPConfig) -> int:
    if config.transport == "stdio":
        build_server(config.log_level, lazy_tools=True).run("stdio")
        return 0
    import socket

    import anyio
    import uvicorn

    app = http_app(config)
    # Bind before announcing: a port in use is the caller's to fix (exit 2, one line), not a
    # "serving on" line followed by uvicorn's error and its exit code 3.
    sock = socket.socket(
        socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        raise InputError(
            "port", f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
        ) from None
    sock.listen(2048)
    sys.stderr.write(f"inferwise MCP (streamable HTTP) on http://{config.host}:{config.port}/mcp\n")
    uv = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level.lower())
    )
    anyio.run(functools.partial(uv.serve, sockets=[sock]))
    return 0
