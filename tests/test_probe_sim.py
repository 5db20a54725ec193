"""The probe against the project's simulated engine: multi-token chunks, /metrics scraping, faults."""

from __future__ import annotations

import asyncio

import pytest

from inferwise.probes.runner import ProbeRequest, run_probe
from inferwise.probes.sim import SimServer
from inferwise.probes.store import RunStore


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("INFERWISE_ALLOW_HOSTS", raising=False)


def probe(**kw):
    return asyncio.run(run_probe(ProbeRequest(**kw)))


def test_multi_token_chunks_split_itl_and_metrics_are_scraped(tmp_path) -> None:
    db = str(tmp_path / "r.db")
    with SimServer(ttft_ms=20, itl_ms=4, itl_per_seq_ms=0, tokens_per_chunk=4) as sim:
        res = probe(
            url=sim.base_url,
            concurrency=2,
            requests=8,
            output_tokens=16,
            db=db,
            metrics_interval_s=0.1,
        )
    s = res.summary
    assert s.completed == 8, res.errors
    assert s.chunks.tokens_per_chunk_mean == pytest.approx(4, rel=0.05)
    # per-token ITL is the chunk gap split over the chunk's tokens
    assert s.itl_ms.p50 == pytest.approx(s.chunks.chunk_gap_ms.p50 / 4, rel=0.15)
    assert s.total_output_tokens == 8 * 16 and not s.tokens_approximate
    assert res.model == sim.config.served_model_name
    assert res.server_metrics, res.notes
    assert RunStore(db).metric_samples(res.run_id)


@pytest.mark.parametrize(
    ("fault", "error_class"),
    [
        ({"fault_503_rate": 1.0}, "http_5xx"),
        ({"fault_429_rate": 1.0}, "http_429"),
        ({"fault_cut_rate": 1.0}, "stream_cut"),
        ({"fault_stall_rate": 1.0, "stall_s": 3.0}, "stalled"),
    ],
)
def test_sim_faults_are_classified(tmp_path, fault, error_class) -> None:
    with SimServer(ttft_ms=5, itl_ms=2, **fault) as sim:
        res = probe(
            url=sim.base_url,
            model=sim.config.served_model_name,
            requests=2,
            output_tokens=30,
            stall_timeout_s=0.5,
            calibrate=False,
            metrics_interval_s=0,
            db=str(tmp_path / "r.db"),
        )
    assert res.all_failed
    assert [e.error_class for e in res.errors] == [error_class]


def test_early_end_of_sequence_is_reported(tmp_path) -> None:
    """A server that stops before max_tokens (here the sim, with ignore_eos turned off)."""
    with SimServer(ttft_ms=5, itl_ms=1, eos_mean_tokens=4) as sim:
        res = probe(
            url=sim.base_url,
            requests=6,
            output_tokens=64,
            ignore_eos=False,
            metrics_interval_s=0,
            db=str(tmp_path / "r.db"),
        )
    assert res.summary.completed == 6
    assert any("stopped early" in n for n in res.notes)


def test_shared_prefix_fraction_shows_up_as_prefix_cache_hits(tmp_path) -> None:
    hits = {}
    for fraction in (0.0, 0.8):
        with SimServer(ttft_ms=5, itl_ms=1) as sim:
            res = probe(
                url=sim.base_url,
                requests=8,
                output_tokens=2,
                input_tokens=400,
                shared_prefix_fraction=fraction,
                metrics_interval_s=0.1,
                db=str(tmp_path / "r.db"),
            )
        m = res.server_metrics
        hits[fraction] = m["prefix_cache_hits"] / m["prefix_cache_queries"]
    assert hits[0.0] < 0.05
    assert 0.5 < hits[0.8] < 0.85  # the first request cannot hit; the others share 80 %


def test_sim_deployment_flags_are_the_deployment_fields_of_predict() -> None:
    """`inferwise sim --gpu ... --tensor-parallel-size ...` accepts exactly what `predict` accepts."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.probes.sim import SimConfig

    sim_props = SimConfig.model_json_schema()["properties"]
    dep_props = Deployment.model_json_schema()["properties"]
    shared = ["gpu", "gpu_memory_gib", "tensor_parallel_size", "pipeline_parallel_size"]
    shared += ["gpu_memory_utilization", "quantization", "dtype", "kv_cache_dtype"]
    shared += ["block_size", "enforce_eager", "engine", "engine_version"]
    for name in shared:
        dep = {k: v for k, v in dep_props[name].items() if k != "cli_aliases"}
        assert sim_props[name] == dep, name
    assert "cli_aliases" not in sim_props["tensor_parallel_size"]
    with pytest.raises(ValueError):
        SimConfig(gpu_memory_gib=0)
    with pytest.raises(ValueError):
        SimConfig(tensor_parallel_size=129)


def test_the_simulated_engine_takes_config_overrides_as_predict_does():
    """`inferwise sim --hf-overrides` times the overridden model: Llama 4's language model
    alone, which without the override is refused naming that flag."""
    from inferwise.calculators.errors import InputError
    from inferwise.calculators.roofline import StepModel
    from inferwise.probes.sim import SimConfig, deployment_of

    scout = {
        "model": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "gpu": "h100-sxm-80gb",
        "tensor_parallel_size": 4,
        "max_model_len": 32_768,
    }
    with pytest.raises(InputError, match="--hf-overrides model_type=llama4_text"):
        StepModel.from_deployment(deployment_of(SimConfig(**scout)))
    dep = deployment_of(SimConfig(**scout, hf_overrides={"model_type": "llama4_text"}))
    assert dep.hf_overrides == {"model_type": "llama4_text"}
    assert StepModel.from_deployment(dep).shape.num_experts == 16
