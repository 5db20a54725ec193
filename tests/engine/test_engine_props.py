"""The probe records the engine's own slot count with the run, so diagnosis need not guess it."""

from __future__ import annotations

import pytest

from inferwise.probes.store import RunStore


@pytest.mark.engine
def test_probe_stores_llama_cpp_slot_count(llama_server, probe_engine) -> None:
    result, _ = probe_engine(llama_server, requests=2, output_tokens=4)
    with RunStore(probe_engine.db) as store:
        meta = store.get_run(result.run_id).meta
    assert meta["server"] == {"engine": "llama.cpp", "max_num_seqs": llama_server.n_parallel}


def test_servers_without_props_leave_it_out(tmp_path) -> None:
    import asyncio

    from inferwise.probes.runner import ProbeRequest, run_probe
    from inferwise.probes.sim import SimConfig, SimServer

    with SimServer(SimConfig(ttft_ms=5, itl_ms=1)) as sim:
        result = asyncio.run(
            run_probe(
                ProbeRequest(
                    url=sim.base_url, requests=2, output_tokens=4, db=str(tmp_path / "r.db")
                )
            )
        )
    with RunStore(tmp_path / "r.db") as store:
        assert "server" not in store.get_run(result.run_id).meta
