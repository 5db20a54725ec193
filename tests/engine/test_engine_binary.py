"""Finding the llama-server binary, and failing clearly when it is missing or broken.

Most of these need no real binary (they use a stand-in script) and run in the
fast suite; the last one starts the real server on a file that is not a model
and is marked ``engine``.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from inferwise.probes import llamacpp
from inferwise.probes.llamacpp import (
    BINARY_ENV,
    EngineUnavailable,
    LlamaServer,
    cache_dir,
    cached_binary_path,
    ensure_llama_server,
    find_llama_server,
)


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache and no override: the situation on a machine that never built it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(BINARY_ENV, raising=False)
    return tmp_path


def test_cache_is_per_version_under_xdg_cache_home(no_binary: Path) -> None:
    assert cache_dir("1.2.3") == no_binary / "cache" / "inferwise" / "llama.cpp" / "1.2.3"
    assert cached_binary_path() == cache_dir() / "bin" / "llama-server"
    assert llamacpp.LLAMA_CPP_PYTHON_VERSION in str(cached_binary_path())


def test_missing_binary_names_the_command_that_builds_it(no_binary: Path) -> None:
    assert find_llama_server() is None
    with pytest.raises(EngineUnavailable, match=r"\.ci/prepare-engine"):
        ensure_llama_server()


def test_a_cached_binary_counts_only_if_it_runs(no_binary: Path) -> None:
    target = cached_binary_path()
    _script(target, "exit 3")  # e.g. built for another CPU, or half copied
    assert find_llama_server() is None
    _script(target, 'echo "version: 9 (build 1, commit abc)"')
    assert find_llama_server() == target
    assert llamacpp.binary_version(target) == "version: 9 (build 1, commit abc)"


def test_the_environment_override_wins_over_the_cache(
    no_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(cached_binary_path(), 'echo "version: cached"')
    own = _script(no_binary / "mine" / "llama-server", 'echo "version: mine"')
    monkeypatch.setenv(BINARY_ENV, str(own))
    assert find_llama_server() == own
    monkeypatch.setenv(BINARY_ENV, str(no_binary / "absent"))
    assert find_llama_server() is None  # a wrong override is not silently replaced


def test_a_build_that_waited_for_the_lock_reuses_what_the_other_one_built(no_binary: Path) -> None:
    if not all(shutil.which(t) for t in ("cmake", "ninja", "c++")):
        pytest.skip("needs cmake, ninja and a C++ compiler on PATH")
    target = _script(cached_binary_path(), 'echo "version: built by someone else"')
    assert llamacpp.build_llama_server() == target  # returned at once, nothing downloaded
    assert not (cache_dir() / "build.log").exists()


def test_extract_takes_only_the_vendored_tree(tmp_path: Path) -> None:
    src = tmp_path / "pkg"
    (src / "vendor" / "llama.cpp").mkdir(parents=True)
    (src / "vendor" / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
    (src / "setup.py").write_text("")
    sdist = tmp_path / "llama_cpp_python-0.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="llama_cpp_python-0.0.0")
    root = llamacpp._extract_vendor(sdist, tmp_path / "out")
    assert (root / "CMakeLists.txt").is_file()
    assert not (tmp_path / "out" / "llama_cpp_python-0.0.0" / "setup.py").exists()


def test_build_options_fetch_nothing() -> None:
    """The web UI download, BoringSSL and LLGuidance are all off; the build is static and portable."""
    opts = set(llamacpp.CMAKE_OPTIONS)
    for flag in (
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_LLGUIDANCE=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DGGML_NATIVE=OFF",
    ):
        assert flag in opts


@pytest.mark.engine
def test_a_server_that_cannot_load_its_model_fails_fast_with_its_log(
    engine_binary: Path, tmp_path: Path
) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"GGUF but not really" + os.urandom(64))
    server = LlamaServer(model_path=bogus, binary=engine_binary, startup_timeout_s=30)
    with pytest.raises(EngineUnavailable, match="exited"):
        server.start()
    assert server.process is not None and server.process.poll() is not None
