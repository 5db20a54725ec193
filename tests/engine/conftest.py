"""Fixtures for the real-engine suite: the llama-server binary, the generated model, a running server.

Every test here needs the binary that ``.ci/prepare-engine`` builds; without it
the tests skip with a reason that names that command, so the fast suite runs
anywhere (``pytest -m "not engine"`` leaves them out altogether).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferwise.probes.llamacpp import (
    EngineUnavailable,
    GeneratedModel,
    LlamaServer,
    ensure_llama_server,
    write_test_model,
)

# One seed for the whole suite: the same model bytes on every machine.
MODEL_SEED = 20261129
# Four slots: the load tests sweep concurrency 1, 2, 4, 8 across them.
N_SLOTS = 4


@pytest.fixture(scope="session")
def engine_binary() -> Path:
    try:
        return ensure_llama_server()
    except EngineUnavailable as exc:
        pytest.skip(f"llama-server not available: {exc}")


@pytest.fixture(scope="session")
def engine_model(tmp_path_factory: pytest.TempPathFactory) -> GeneratedModel:
    pytest.importorskip(
        "gguf", reason="the test model is written with the gguf package (dev extra)"
    )
    return write_test_model(
        tmp_path_factory.mktemp("engine-model") / "test-llama.gguf", seed=MODEL_SEED
    )


@pytest.fixture(scope="session")
def llama_server(
    engine_binary: Path, engine_model: GeneratedModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """One server for the read-only tests (they do not disturb each other's numbers: they run in turn)."""
    log = tmp_path_factory.mktemp("engine-log") / "llama-server.log"
    server = LlamaServer(
        model_path=engine_model.path, binary=engine_binary, n_parallel=N_SLOTS, log_path=log
    )
    with server:
        yield server


@pytest.fixture
def start_llama_server(
    engine_binary: Path, engine_model: GeneratedModel, tmp_path: Path
) -> Iterator[Callable[..., LlamaServer]]:
    """A factory for a private server (tests that kill it); every one started is stopped afterwards."""
    started: list[LlamaServer] = []

    def start(**kwargs: object) -> LlamaServer:
        kwargs.setdefault("n_parallel", N_SLOTS)
        server = LlamaServer(
            model_path=engine_model.path,
            binary=engine_binary,
            log_path=tmp_path / f"llama-server-{len(started)}.log",
            **kwargs,  # type: ignore[arg-type]
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def probe_engine(tmp_path: Path) -> Callable[..., tuple[object, list[object]]]:
    """Run the real probe (``run_probe``) against a server; return the result and the stored records.

    Small, bounded runs: short synthetic prompts and outputs, metrics scraped
    every 0.2 s, everything in a per-test run database.
    """
    import asyncio

    from inferwise.probes.runner import ProbeRequest, run_probe
    from inferwise.probes.store import RunStore

    db = tmp_path / "runs.db"

    def probe(server: LlamaServer, progress: object = None, **overrides: object):
        settings: dict[str, object] = {
            "url": server.base_url,
            "db": str(db),
            "requests": 8,
            "input_tokens": 48,
            "output_tokens": 32,
            "metrics_interval_s": 0.2,
            "label": {"engine": "llama.cpp", "slots": str(server.n_parallel)},
        }
        settings.update(overrides)
        result = asyncio.run(run_probe(ProbeRequest(**settings), progress=progress))  # type: ignore[arg-type]
        with RunStore(db) as store:
            records = store.requests(result.run_id)
        return result, records

    probe.db = db  # type: ignore[attr-defined]
    return probe
