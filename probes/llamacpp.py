"""A real inference engine for the integration tests: llama.cpp's ``llama-server``.

The probe, the metrics scraper and the diagnosis have to meet a real engine,
not only the simulator. This module holds the three pieces that make that
possible on a CPU-only machine without downloading any model:

* locating (or building once) ``llama-server`` from the llama.cpp sources
  vendored in the pinned llama-cpp-python sdist on PyPI, cached per version in
  the user's cache directory;
* ``write_test_model``: a small llama-architecture GGUF (about 40M parameters,
  80 MB in f16) with random weights and an embedded tokenizer and chat
  template, deterministic from a seed, built so that it never samples
  end-of-text and every token decodes to visible text (output lengths are
  exactly ``max_tokens``, one streamed chunk per token). It is sized so that
  one decode step takes a few milliseconds on one CPU core: long enough that
  the gaps between streamed tokens stand well above scheduler noise, short
  enough that a whole test run takes seconds;
* ``LlamaServer``: starts the server on a free loopback port with parallel
  slots, ``/metrics`` and prompt caching off, waits for ``/health`` and stops
  it by PID.

Only the standard library is imported at module level; numpy, gguf and httpx
are imported where they are used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwise.probes.prompts import WORDS

# The llama-cpp-python release whose vendored llama.cpp we build. Pinned with
# its sdist hash so a changed upload on PyPI is noticed instead of built.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# Environment variable naming an existing llama-server binary (skips the cache).
BINARY_ENV = "INFERWISE_LLAMA_SERVER"

# cmake options: static, CPU only, portable (GGML_NATIVE=OFF builds the AVX2/FMA/F16C
# baseline instead of -march=native, so the cache needs no CPU key), and nothing
# that fetches from the network at configure or build time (web UI download,
# BoringSSL, LLGuidance).
CMAKE_OPTIONS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_LLGUIDANCE=OFF",
)


class EngineUnavailable(RuntimeError):
    """The llama-server binary is missing or cannot run; the message says how to get it."""


# --------------------------------------------------------------------------- binary


def cache_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where the binary for ``version`` lives: ``$XDG_CACHE_HOME/inferwise/llama.cpp/<version>``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferwise" / "llama.cpp" / version


def cached_binary_path(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return cache_dir(version) / "bin" / "llama-server"


def binary_version(binary: Path, timeout_s: float = 20.0) -> str | None:
    """The first line of ``llama-server --version``, or None when it does not run.

    Running it (not just checking the file exists) catches a binary built for
    another CPU or a half-copied file.
    """
    try:
        proc = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    text = (proc.stdout + proc.stderr).strip()
    for line in text.splitlines():
        if line.startswith("version:"):
            return line.strip()
    return text.splitlines()[0] if text else "unknown"


def find_llama_server(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path | None:
    """The usable binary: ``$INFERWISE_LLAMA_SERVER`` if set, else the cached build; None if neither runs."""
    override = os.environ.get(BINARY_ENV)
    candidates = [Path(override)] if override else [cached_binary_path(version)]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK) and binary_version(path) is not None:
            return path
    return None


def ensure_llama_server(
    *, build: bool = False, jobs: int = 2, version: str = LLAMA_CPP_PYTHON_VERSION
) -> Path:
    """Return a runnable llama-server, building it into the cache first when ``build`` is true.

    Without ``build`` a missing binary raises ``EngineUnavailable`` whose
    message names the command that builds it, so a test can skip with it.
    """
    found = find_llama_server(version)
    if found is not None:
        return found
    if not build:
        raise EngineUnavailable(
            f"llama-server {version} is not built: run .ci/prepare-engine "
            f"(or `python -m inferwise.probes.llamacpp build`): a few minutes on 2 idle cores; "
            f"cache: {cached_binary_path(version)}"
        )
    return build_llama_server(jobs=jobs, version=version)


def _log(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log_file: Path, cwd: Path | None = None) -> None:
    """Run a build step with its output in ``log_file``; on failure show the log's tail."""
    with log_file.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise EngineUnavailable(f"build step failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def _download_sdist(version: str, dest: Path, log_file: Path) -> Path:
    """Fetch the sdist through pip (the ordinary registry client) and check its hash."""
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={version}",
            "-d",
            str(dest),
        ],
        log_file,
    )
    sdists = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise EngineUnavailable(f"pip download produced no sdist in {dest}")
    sdist = sdists[0]
    if version == LLAMA_CPP_PYTHON_VERSION:
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != LLAMA_CPP_PYTHON_SDIST_SHA256:
            raise EngineUnavailable(
                f"{sdist.name}: sha256 {digest} differs from the pinned {LLAMA_CPP_PYTHON_SDIST_SHA256}"
            )
    return sdist


def _extract_vendor(sdist: Path, dest: Path) -> Path:
    """Extract only ``vendor/llama.cpp`` from the sdist, refusing paths that escape ``dest``."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in f"/{m.name}/"]
        if not members:
            raise EngineUnavailable(f"{sdist.name} holds no vendor/llama.cpp")
        tar.extractall(dest, members=members, filter="data")
    roots = sorted(dest.glob("*/vendor/llama.cpp"))
    if not roots:
        raise EngineUnavailable(f"vendor/llama.cpp not found after extracting {sdist.name}")
    return roots[0]


def build_llama_server(
    *,
    jobs: int = 2,
    version: str = LLAMA_CPP_PYTHON_VERSION,
    work_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """Download, configure and build llama-server, then install it into the cache atomically.

    The build tree lives in a temporary directory (removed afterwards); only the
    binary and a ``build-info.json`` (version, options, minutes taken) are kept.
    A lock file serialises concurrent builds: whoever waited for the lock
    finds the binary the other one built and returns it (unless ``force``).
    """
    import fcntl

    for tool in ("cmake", "ninja", "c++"):
        if shutil.which(tool) is None:
            raise EngineUnavailable(f"building llama-server needs `{tool}` on PATH")
    target = cached_binary_path(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (cache_dir(version) / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and binary_version(target) is not None:
            return target
        return _build_locked(target, jobs, version, work_dir)


def _build_locked(target: Path, jobs: int, version: str, work_dir: Path | None) -> Path:
    log_file = cache_dir(version) / "build.log"
    log_file.write_text("")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-build-", dir=work_dir) as tmp:
        tmp_path = Path(tmp)
        _log(f"downloading llama-cpp-python=={version} sdist")
        sdist = _download_sdist(version, tmp_path / "dl", log_file)
        source = _extract_vendor(sdist, tmp_path / "src")
        build = tmp_path / "build"
        _log(f"configuring {source}")
        _run(
            ["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *CMAKE_OPTIONS], log_file
        )
        _log(f"building llama-server with -j{jobs} (log: {log_file})")
        _run(["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"], log_file)
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise EngineUnavailable(f"the build finished without {built}")
        staging = target.with_name(f".llama-server.{os.getpid()}")
        shutil.copy2(built, staging)
        os.replace(staging, target)
    minutes = (time.monotonic() - started) / 60.0
    reported = binary_version(target)
    if reported is None:
        raise EngineUnavailable(f"the built {target} does not run `--version`; see {log_file}")
    info = {
        "llama_cpp_python_version": version,
        "llama_server_version": reported,
        "cmake_options": list(CMAKE_OPTIONS),
        "jobs": jobs,
        "build_minutes": round(minutes, 2),
        "built_at_unix": int(time.time()),
    }
    (cache_dir(version) / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
    _log(f"built {target} ({reported}) in {minutes:.1f} min")
    return target


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class GeneratedModel:
    """What a test needs to know about the generated model."""

    path: Path
    seed: int
    n_vocab: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    n_params: int
    file_bytes: int


# A ChatML template, rendered by llama.cpp's jinja engine for /v1/chat/completions.
# Its markers are control tokens of the vocabulary, so a chat turn costs a handful
# of tokens as with a real model (not dozens of spelled-out characters).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# id 0..4; <s>/</s> at llama.cpp's SentencePiece defaults (1, 2)
_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
_N_SPECIAL = len(_SPECIAL_TOKENS)
_N_BYTES = 256  # <0x00> .. <0xFF>: SentencePiece byte fallback, so any text tokenizes
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Common English words get a piece of their own, as in any real vocabulary, so
# ordinary text costs about one token per word (the probe's prompt-length
# calibration sees a realistic ratio): the probe's own prompt words first, then
# more everyday ones.
_COMMON_WORDS = [
    *WORDS,
    *(  # noqa: SIM905 - a word list reads better as text
        "a i you he she we his her our your my me him them what when where who why how there "
        "here then now just like so if up out no yes do does did get got go going come came see "
        "saw know think take give tell ask find want need feel try leave call keep let begin "
        "seem help show hear play run move live believe bring happen write provide sit stand "
        "lose pay meet include continue set learn change lead understand watch follow stop "
        "create speak read allow add spend grow open walk win offer remember love consider "
        "appear buy wait serve die send expect build stay fall cut reach kill remain day man "
        "woman child life thing back three last own old big little different same next early "
        "young important few public bad able very much even still too never always often again "
        "really most down off through between during before without against among user assistant"
    ).split(),
]


def _word_pieces(n: int, rng: Any) -> list[str]:
    """``n`` distinct pieces: letters, "▁"-letters, common words, then random pseudo-words.

    llama.cpp's SentencePiece tokenizer builds a word by merging adjacent
    pieces, so a word is reachable only if every prefix of it ("▁t", "▁th",
    "▁the") is a piece too; the common words come with their prefixes. Every
    piece decodes to plain ASCII, so each generated token streams as its own
    chunk (no held-back partial UTF-8) and can never start a stop string.
    """
    pieces: list[str] = list(_LETTERS) + ["▁" + c for c in _LETTERS]
    seen = set(pieces)
    for word in _COMMON_WORDS:
        piece = "▁" + word
        for end in range(2, len(piece) + 1):
            if piece[:end] not in seen:
                seen.add(piece[:end])
                pieces.append(piece[:end])
    if len(pieces) > n:
        raise ValueError(f"n_vocab is too small for the common words ({len(pieces)} pieces needed)")
    while len(pieces) < n:
        length = int(rng.integers(2, 7))
        word = "▁" + "".join(_LETTERS[int(i)] for i in rng.integers(0, 26, size=length))
        if word not in seen:
            seen.add(word)
            pieces.append(word)
    return pieces


def write_test_model(
    path: str | Path,
    seed: int = 0,
    *,
    n_vocab: int = 8192,
    n_layer: int = 8,
    n_embd: int = 512,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_ff: int = 2048,
    n_ctx_train: int = 4096,
    dtype: str = "f16",
) -> GeneratedModel:
    """Write a random-weight llama GGUF with an embedded SentencePiece-style vocab.

    Same seed and shape, same bytes. The weights are random (std 1/sqrt(fan_in))
    except for one reserved residual channel that makes end-of-text and the
    non-text tokens unreachable: every token embedding holds +1 in channel 0,
    no layer writes to it (row 0 of every attention-output and FFN-down matrix
    is zero), so after the final RMS norm channel 0 is always positive; the
    output rows of the special tokens (<unk>, <s>, </s>, <|im_start|>,
    <|im_end|>) and the 256 byte tokens carry -1e4 there,
    which puts their logits far below every word token. Hence generation never
    stops early and every sampled token is a visible word piece.
    """
    import numpy as np

    try:
        import gguf
    except ImportError as exc:  # gguf is a dev dependency
        raise EngineUnavailable(
            "writing the test model needs the `gguf` package (pip install gguf)"
        ) from exc

    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', not {dtype!r}")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head and n_head by n_head_kv")
    n_words = n_vocab - _N_SPECIAL - _N_BYTES
    if n_words < 2 * len(_LETTERS):
        raise ValueError(f"n_vocab must be at least {_N_SPECIAL + _N_BYTES + 2 * len(_LETTERS)}")

    rng = np.random.default_rng(seed)
    np_dtype = np.float16 if dtype == "f16" else np.float32
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv

    tokens = list(_SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(_N_BYTES)]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * (_N_SPECIAL - 1)
    types += [gguf.TokenType.BYTE] * _N_BYTES
    scores = [0.0] * (_N_SPECIAL + _N_BYTES)
    words = _word_pieces(n_words, rng)
    tokens += words
    types += [gguf.TokenType.NORMAL] * n_words
    # SentencePiece merges by score: longer pieces score higher so prompts use them.
    scores += [float(len(w)) - 0.001 * i for i, w in enumerate(words)]

    def mat(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    tensors: list[tuple[str, Any]] = []
    embd = rng.standard_normal((n_vocab, n_embd)).astype(np.float32) * 0.5
    embd[:, 0] = 1.0  # the reserved channel
    tensors.append(("token_embd.weight", embd))
    for i in range(n_layer):
        wo = mat(n_embd, n_embd)
        wo[0, :] = 0.0
        down = mat(n_embd, n_ff)
        down[0, :] = 0.0
        tensors += [
            (f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32)),
            (f"blk.{i}.attn_q.weight", mat(n_embd, n_embd)),
            (f"blk.{i}.attn_k.weight", mat(n_embd_kv, n_embd)),
            (f"blk.{i}.attn_v.weight", mat(n_embd_kv, n_embd)),
            (f"blk.{i}.attn_output.weight", wo),
            (f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32)),
            (f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd)),
            (f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd)),
            (f"blk.{i}.ffn_down.weight", down),
        ]
    tensors.append(("output_norm.weight", np.ones(n_embd, dtype=np.float32)))
    out = rng.standard_normal((n_vocab, n_embd)).astype(np.float32) * (4.0 / np.sqrt(n_embd))
    out[:, 0] = 0.0
    out[: _N_SPECIAL + _N_BYTES, 0] = -1.0e4
    tensors.append(("output.weight", out))

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"inferwise-test-llama-{n_layer}x{n_embd}-seed{seed}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
    )
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    n_params = 0
    for name, arr in tensors:
        n_params += int(arr.size)
        # norms stay f32 as llama.cpp expects; matrices take the requested dtype
        writer.add_tensor(name, arr if arr.ndim == 1 else arr.astype(np_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return GeneratedModel(
        path=path,
        seed=seed,
        n_vocab=n_vocab,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        n_ctx_train=n_ctx_train,
        n_params=n_params,
        file_bytes=path.stat().st_size,
    )


# --------------------------------------------------------------------------- server


def free_port() -> int:
    """A loopback port that was free a moment ago (the server start retries if it was taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaServer:
    """``llama-server`` as a context manager: started on a free loopback port, stopped by PID.

    Prompt caching is off (``--no-cache-prompt``, ``--cache-ram 0``) so a
    repeated prompt is prefilled every time and latencies repeat; ``--ignore-eos``
    backs up the model's own guarantee that outputs run to ``max_tokens``.
    ``ctx_per_slot`` tokens of KV cache are reserved for each of the
    ``n_parallel`` slots (4096 leaves room for the probe's 512-word
    calibration prompt). One compute thread by default: on a 2-core machine the
    other core stays free for the server's HTTP thread and the probe, so the
    timestamps on both sides are not late by a time slice.
    """

    model_path: Path
    binary: Path | None = None
    n_parallel: int = 4
    ctx_per_slot: int = 4096
    threads: int = 1
    alias: str = "inferwise-test"
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 60.0
    log_path: Path | None = None
    port: int = 0
    """0 picks a free port at start."""
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log_fh: Any = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        binary = self.binary or ensure_llama_server()
        return [
            str(binary),
            "--model", str(self.model_path),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--alias", self.alias,
            "--parallel", str(self.n_parallel),
            "--ctx-size", str(self.ctx_per_slot * self.n_parallel),
            "--threads", str(self.threads),
            "--threads-batch", str(self.threads),
            "--metrics",
            "--no-cache-prompt",
            "--cache-ram", "0",
            "--ignore-eos",
            "--jinja",
            "--no-ui",
            *self.extra_args,
        ]  # fmt: skip

    def log_text(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return ""

    def start(self) -> LlamaServer:
        if self.binary is None:
            self.binary = ensure_llama_server()
        last_error = ""
        fixed_port = self.port
        for _attempt in range(1 if fixed_port else 3):  # a free port can be taken before we bind it
            self.port = fixed_port or free_port()
            if self.log_path is None:
                fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
                os.close(fd)
                self.log_path = Path(name)
            self._log_fh = self.log_path.open("ab")
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the test run does not reach it first
            )
            try:
                self._wait_ready()
                return self
            except EngineUnavailable as exc:
                last_error = str(exc)
                self.stop()
                if "address already in use" not in last_error.lower():
                    break
        raise EngineUnavailable(last_error)

    def _wait_ready(self) -> None:
        """Poll /health: connection refused, then 503 while loading, then 200."""
        import httpx

        deadline = time.monotonic() + self.startup_timeout_s
        status = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = "\n".join(self.log_text().splitlines()[-20:])
                raise EngineUnavailable(
                    f"llama-server exited with {self.process.returncode} while starting:\n{tail}"
                )
            try:
                status = httpx.get(f"{self.base_url}/health", timeout=2.0).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                return
            time.sleep(0.05)
        raise EngineUnavailable(
            f"llama-server not ready after {self.startup_timeout_s:.0f} s (last /health: {status})"
        )

    def kill(self) -> None:
        """SIGKILL the server: a crash as the client sees it (for fault tests)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL if it does not exit within ``timeout_s``."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=timeout_s)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m inferwise.probes.llamacpp build|path|model PATH`` for CI and developers."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m inferwise.probes.llamacpp")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser(
        "build", help="build llama-server into the cache unless a runnable one is there"
    )
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    sub.add_parser("path", help="print the cached binary's path (exit 1 when absent)")
    m = sub.add_parser("model", help="write the random-weight test model")
    m.add_argument("path")
    m.add_argument("--seed", type=int, default=0)
    v = sub.add_parser(
        "serve", help="serve the test model (or --model) until Ctrl-C, to probe by hand"
    )
    v.add_argument("--model", help="a GGUF file; default: the test model written to a temp dir")
    v.add_argument("--port", type=int, default=0, help="default: a free port")
    v.add_argument("--slots", type=int, default=4, help="parallel slots (-np)")
    v.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            found = None if args.force else find_llama_server()
            if found is not None:
                _log(f"cached: {found} ({binary_version(found)})")
            else:
                found = build_llama_server(jobs=args.jobs, force=args.force)
            print(found)
        elif args.cmd == "path":
            print(ensure_llama_server())
        elif args.cmd == "serve":
            return _serve(args)
        else:
            info = write_test_model(args.path, seed=args.seed)
            print(
                json.dumps(
                    {k: str(v) if isinstance(v, Path) else v for k, v in info.__dict__.items()}
                )
            )
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _serve(args: Any) -> int:
    with tempfile.TemporaryDirectory(prefix="inferwise-llama-") as tmp:
        model = Path(args.model) if args.model else write_test_model(Path(tmp) / "test.gguf").path
        server = LlamaServer(
            model_path=model,
            n_parallel=args.slots,
            threads=args.threads,
            port=args.port,
            log_path=Path(tmp) / "llama-server.log",
        )
        with server:
            print(
                f"llama-server (pid {server.pid}) serving {model.name} at {server.base_url}",
                flush=True,
            )
            print(
                f"try: inferwise probe {server.base_url} --concurrency 8 --requests 32", flush=True
            )
            try:
                assert server.process is not None
                server.process.wait()
            except KeyboardInterrupt:
                pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
