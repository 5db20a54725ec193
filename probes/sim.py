"""`inferwise sim`: a simulated OpenAI-compatible engine on localhost, no GPU needed.

It is the target of the probe's tests and of `inferwise demo`, and the
reference server of the probe's precision benchmark: it logs, per request,
the monotonic time it sent every token-bearing chunk (`SimServer.send_log`,
or GET /sim/send_log), which is the truth a client's measurements are
compared with.

Timing: with `--model` and `--gpu` the engine steps at the speed the roofline
`StepModel` predicts for that deployment; otherwise it follows a fixed
schedule (`--ttft-ms`, `--itl-ms`). Either way one continuous-batching loop
serves every request, so queueing and batch growth show up as they would on
a real engine (see sim_engine.py). /metrics speaks vLLM's metric names.

The models here import only pydantic at module level; uvicorn is imported
when the server starts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from copy import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferwise.calculators.deployment import Deployment, Dtype, KvCacheDtype
from inferwise.calculators.errors import InputError, OperationalError


def _as_in_deployment(name: str) -> Any:
    """`Deployment`'s own field (type bounds, default, help), so the simulated engine's
    deployment flags cannot drift from `fit`/`predict`'s. Without the CLI aliases
    (-tp, -pp): `inferwise sim` has never taken them."""
    info = copy(Deployment.model_fields[name])
    info.json_schema_extra = None
    return info


class SimConfig(BaseModel):
    """Flags of `inferwise sim` (and the keyword arguments of SimServer)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    host: str = Field(
        default="127.0.0.1",
        description="Address to listen on; loopback only unless --allow-remote.",
    )
    allow_remote: bool = Field(
        default=False, description="Allow listening on a non-loopback address."
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    served_model_name: str = Field(
        default="inferwise/sim",
        min_length=1,
        description="Model id the API reports and accepts (vLLM --served-model-name).",
    )
    strict_model_name: bool = Field(
        default=False,
        description="Answer 404 to requests naming another model, as vLLM does; by default any name is "
        "accepted, as llama.cpp does.",
    )
    # --- deployment: when `model` is given the roofline model times the engine steps
    model: str | None = Field(
        default=None,
        description="Model (Hugging Face id from the catalog) whose deployment the engine's step times follow; "
        "needs --gpu. Without it the fixed schedule (--ttft-ms, --itl-ms) applies.",
    )
    hf_overrides: dict[str, str] = _as_in_deployment("hf_overrides")
    gpu: str | None = _as_in_deployment("gpu")
    gpu_memory_gib: float | None = _as_in_deployment("gpu_memory_gib")
    tensor_parallel_size: int = _as_in_deployment("tensor_parallel_size")
    gpu_memory_utilization: float = _as_in_deployment("gpu_memory_utilization")
    quantization: str | None = _as_in_deployment("quantization")
    pipeline_parallel_size: int = _as_in_deployment("pipeline_parallel_size")
    dtype: Dtype = _as_in_deployment("dtype")
    kv_cache_dtype: KvCacheDtype = _as_in_deployment("kv_cache_dtype")
    block_size: int | None = _as_in_deployment("block_size")
    enforce_eager: bool = _as_in_deployment("enforce_eager")
    engine: Literal["vllm", "sglang", "trtllm"] = _as_in_deployment("engine")
    """trtllm: its KV cache and efficiency factors; the served engine admits as vLLM does
    (a request's output length is not known when it arrives). sglang: vLLM's step factors, and
    its per-request front-end cost before every first byte (added to slow_first_byte_ms)."""
    engine_version: str | None = _as_in_deployment("engine_version")
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="Longest prompt + output in tokens the server accepts; default: with --model "
        "the context window the memory fit resolves (the model's own, as vLLM does), else 32768.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Sequences running at once (slots); more requests wait in the queue. Default: 16, or the "
        "deployment's engine default.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Token budget of one engine step (chunked prefill); default: unlimited, "
        "or the deployment's engine default.",
    )
    # --- fixed schedule
    ttft_ms: float = Field(
        default=50.0,
        ge=0,
        le=600_000,
        description="Fixed schedule: time of a step that prefills (TTFT at concurrency 1), ms.",
    )
    itl_ms: float = Field(
        default=10.0,
        ge=0,
        le=60_000,
        description="Fixed schedule: time of a decode step (ITL at concurrency 1), ms.",
    )
    itl_per_seq_ms: float = Field(
        default=0.1,
        ge=0,
        le=1000,
        description="Fixed schedule: extra step time per additional running sequence, ms "
        "(ITL grows with the batch).",
    )
    kv_capacity_tokens: int = Field(
        default=262_144,
        ge=64,
        description="Fixed schedule: KV cache size in tokens (admission and preemption).",
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="Count prefix-cache hits over 16-token blocks (with a deployment, hits skip prefill).",
    )
    # --- output
    reasoning_tokens: int = Field(
        default=0,
        ge=0,
        description="Chat: the first N output tokens stream as delta.reasoning_content (a reasoning model's "
        "thinking), the rest as content.",
    )
    tokens_per_chunk: int = Field(
        default=1, ge=1, le=64, description="Tokens carried by each streamed chunk."
    )
    default_max_tokens: int = Field(
        default=256, ge=1, description="Output tokens when a request gives no max_tokens."
    )
    eos_mean_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Simulate end-of-sequence after a random number of tokens with this mean (requests with "
        "ignore_eos or min_tokens override it); default: every request runs to max_tokens.",
    )
    seed: int = Field(
        default=0, description="Seed of the fault draws and of simulated EOS lengths."
    )
    # --- faults
    fault_429_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of requests answered 429 (with Retry-After: 1)."
    )
    fault_503_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of requests answered 503."
    )
    fault_cut_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of requests whose connection drops mid-stream."
    )
    fault_stall_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of requests whose stream stalls for --stall-s mid-way.",
    )
    fault_error_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of requests that end with an error object mid-stream (500 when not streamed).",
    )
    stall_s: float = Field(default=2.0, ge=0, le=600, description="Length of a stall, seconds.")
    slow_first_byte_ms: float = Field(
        default=0.0, ge=0, le=600_000, description="Delay before every response's first byte, ms."
    )
    echo_answers: bool = Field(
        default=False,
        description="Reply with the text of the prompt's last [[answer: ...]] marker (then end, "
        "unless ignore_eos): known answers for testing graders end to end.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="warning", description="uvicorn log level."
    )

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        total = (
            self.fault_429_rate
            + self.fault_503_rate
            + self.fault_cut_rate
            + self.fault_stall_rate
            + self.fault_error_rate
        )
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:g}; at most 1")
        if self.model is not None and self.gpu is None and self.gpu_memory_gib is None:
            raise ValueError("--model needs --gpu (or --gpu-memory-gib) for the roofline timing")
        return self


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(config: SimConfig) -> None:
    if not _is_loopback(config.host) and not config.allow_remote:
        raise InputError(
            "host",
            f"{config.host} is not a loopback address",
            "127.0.0.1, ::1, localhost; or --allow-remote",
        )


def deployment_of(config: SimConfig) -> Deployment | None:
    """The deployment whose roofline times the engine, or None in fixed-schedule mode."""
    if config.model is None:
        return None
    from pydantic import ValidationError

    fields = {
        name: getattr(config, name)
        for name in Deployment.model_fields
        if name in SimConfig.model_fields
    }
    try:
        return Deployment(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first.get("loc") else "model"
        raise InputError(field, first.get("msg", "invalid")) from None


def build_app(config: SimConfig) -> Any:
    """The ASGI app, with the timing model resolved now so bad deployments fail before binding."""
    from inferwise.probes.sim_engine import FixedTiming, SimEngine
    from inferwise.probes.sim_http import SimApp, SimSettings

    timing: Any
    front_end_ms = 0.0
    max_model_len = config.max_model_len
    max_num_seqs = config.max_num_seqs or 16
    kv_capacity = config.kv_capacity_tokens
    batched = config.max_num_batched_tokens
    if config.model is not None:
        from inferwise.calculators.roofline import StepModel

        dep = deployment_of(config)
        assert dep is not None
        step = StepModel.from_deployment(dep)
        timing = step
        max_num_seqs = int(step.max_num_seqs)
        kv_capacity = int(step.kv_capacity_tokens)
        batched = int(step.max_num_batched_tokens)
        max_model_len = max_model_len or step.max_model_len
        # the engine's API server before the scheduler (SGLang's, per its factors), as predict has it
        front_end_ms = step.efficiency.request_overhead_ms
    else:
        timing = FixedTiming(config.ttft_ms, config.itl_ms, config.itl_per_seq_ms)
    # SimSettings is the HTTP side's share of SimConfig, under the same names
    shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(SimSettings)}
    settings = SimSettings(
        **{
            **shared,
            "max_model_len": max_model_len or 32768,
            "slow_first_byte_ms": config.slow_first_byte_ms + front_end_ms,
        }
    )

    def engine_factory() -> SimEngine:
        return SimEngine(
            timing,
            max_num_seqs=max_num_seqs,
            kv_capacity_tokens=kv_capacity,
            max_num_batched_tokens=batched,
            enable_prefix_caching=config.enable_prefix_caching,
            eos_mean_tokens=config.eos_mean_tokens,
            seed=config.seed,
        )

    return SimApp(settings, engine_factory)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio turns Nagle off (TCP_NODELAY) only for sockets that say they
    # are TCP; without it every response written in two parts waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError("port", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app: Any, config: SimConfig) -> Any:
    import uvicorn

    ucfg = uvicorn.Config(
        app,
        log_level=config.log_level,
        access_log=False,
        lifespan="on",
        http="h11",
        loop="asyncio",
        timeout_graceful_shutdown=1,
        timeout_keep_alive=30,
        backlog=2048,
    )
    return uvicorn.Server(ucfg)


def serve(config: SimConfig, *, ready_line: bool = False) -> int:
    """Run the simulated engine until Ctrl-C. Returns the exit code."""
    check_host(config)
    app = build_app(config)
    sock = _bind(config.host, config.port)
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    if ready_line:
        sys.stdout.write(f"READY {port}\n")
        sys.stdout.flush()
    mode = (
        f"roofline of {config.model} on {config.gpu or f'{config.gpu_memory_gib} GiB'}"
        if config.model
        else (f"fixed schedule ttft={config.ttft_ms:g} ms, itl={config.itl_ms:g} ms")
    )
    sys.stderr.write(
        f"inferwise sim: serving {config.served_model_name} at http://{host}:{port}/v1 ({mode}); "
        f"metrics at /metrics; Ctrl-C stops\n"
    )
    server = _uvicorn_server(app, config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal to whatever
    # handler was there before; make that a clean exit (0) rather than death by SIGTERM
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class SimServer:
    """The simulated engine on a free 127.0.0.1 port, for tests and `inferwise demo`.

    In a background thread by default (the send log is read directly); with
    `process=True` in a child process, so that its CPU time does not compete
    with the client's event loop for the GIL (what a precision benchmark
    wants); the send log then comes over GET /sim/send_log.
    """

    def __init__(self, config: SimConfig | None = None, *, process: bool = False, **overrides: Any):
        base = config.model_dump() if config is not None else {}
        base.update(overrides)
        base.setdefault("port", 0)
        base.setdefault("log_level", "critical")
        self.config = SimConfig.model_validate(base)
        check_host(self.config)
        self.process = process
        self.app: Any = None
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("SimServer is not running")
        return f"http://{self.config.host}:{self.port}"

    def __enter__(self) -> SimServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.process:
            self._start_process()
            return
        self.app = build_app(self.config)
        sock = _bind(self.config.host, self.config.port)
        self.port = sock.getsockname()[1]
        self._server = _uvicorn_server(self.app, self.config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True, name="inferwise-sim"
        )
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OperationalError("the simulated engine did not start")
            time.sleep(0.005)

    def _start_process(self) -> None:
        cmd = [sys.executable, "-m", "inferwise.probes.sim", self.config.model_dump_json()]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        result: list[str] = []
        reader = threading.Thread(
            target=lambda: result.append(self._proc.stdout.readline()), daemon=True
        )  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout=20)
        line = result[0] if result else ""
        if not line.startswith("READY "):
            self.stop()
            raise OperationalError("the simulated engine process did not start")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None

    @property
    def send_log(self) -> dict[str, Any]:
        """Per request id: the server's SendLogEntry (arrival, every chunk's send time and tokens)."""
        from inferwise.probes.sim_http import SendLogEntry

        if self.app is not None:
            for _ in range(100):  # the server thread may insert while we copy
                try:
                    return dict(self.app.send_log)
                except RuntimeError:
                    time.sleep(0.001)
            raise OperationalError("could not read the send log while the server was busy")
        import httpx

        raw = httpx.get(self.base_url + "/sim/send_log", timeout=30).json()
        return {rid: SendLogEntry.from_json(d) for rid, d in raw.items()}


def _main(argv: list[str]) -> int:
    config = SimConfig.model_validate(json.loads(argv[0]))
    return serve(config, ready_line=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
