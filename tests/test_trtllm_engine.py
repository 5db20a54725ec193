"""--engine trtllm: TensorRT-LLM's memory rule (KV cache = 0.9 of the memory free after
weights and runtime buffers, whole 32-token blocks), its no-evict admission, its own
efficiency factors, and its launch line from the recommender."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit
from inferwise.calculators.predict import PredictRequest, predict_performance
from inferwise.knowledge.recommending import RecommendRequest, recommend_deployment
from inferwise.server.cli import main

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GiB = 1 << 30


def fit(**kw):
    return estimate_fit(FitRequest(model=MODEL, gpu="h100-sxm-80gb", **kw), with_suggestions=False)


def test_kv_cache_is_the_free_fraction_of_what_weights_and_buffers_leave():
    trt = fit(engine="trtllm")
    g = trt.per_gpu
    free_gib = g.total_gib - g.weights_gib - g.activation_gib - g.non_torch_gib
    assert g.kv_cache_gib == pytest.approx(0.9 * free_gib, abs=0.01)
    # whole 32-token blocks of 128 KiB per token (Llama-3.1-8B, BF16: 32 layers x 8 KV heads x 128 x 2 x 2)
    assert trt.kv_bytes_per_token == 131072 and trt.kv_cache_tokens % 32 == 0
    assert trt.kv_cache_tokens == int(g.kv_cache_gib * GiB // 131072) // 32 * 32
    assert (trt.engine, trt.max_num_seqs, trt.max_num_batched_tokens, trt.block_size) == (
        "trtllm", 2048, 8192, 32,
    )  # fmt: skip
    # the same weights and runtime as vLLM's accounting; only the rule on the rest differs
    vllm = fit(engine="vllm", max_num_batched_tokens=8192)
    assert g.weights_gib == vllm.per_gpu.weights_gib
    assert g.activation_gib == vllm.per_gpu.activation_gib
    assert trt.kv_cache_tokens != vllm.kv_cache_tokens
    assert any("kv_cache_free_gpu_memory_fraction" in a for a in trt.assumptions)


def test_gpu_memory_utilization_stands_for_the_free_memory_fraction():
    at_90, at_50 = fit(engine="trtllm"), fit(engine="trtllm", gpu_memory_utilization=0.5)
    assert at_50.per_gpu.kv_cache_gib == pytest.approx(at_90.per_gpu.kv_cache_gib * 5 / 9, abs=0.01)
    assert fit(engine="trtllm", block_size=64).kv_cache_tokens % 64 == 0


def test_a_batch_size_above_max_num_tokens_runs_capped_where_vllm_refuses():
    # MLPerf's TensorRT-LLM configs set max_batch_size 2048 with max_num_tokens 1536
    trt = fit(engine="trtllm", max_num_seqs=2048, max_num_batched_tokens=1536)
    assert (trt.max_num_seqs, trt.max_num_batched_tokens) == (1536, 1536)
    assert any("at most 1,536 sequences decode at once" in a for a in trt.assumptions)
    with pytest.raises(InputError, match="vLLM refuses to start"):
        fit(engine="vllm", max_num_seqs=2048, max_num_batched_tokens=1536)


def test_hybrid_state_models_are_refused_naming_the_engine(tmp_path: Path):
    src = Path(__file__).parent / "data" / "hybrid_configs" / "jamba-1.5-mini.json"
    (tmp_path / "config.json").write_text(src.read_text())
    req = FitRequest(model=str(tmp_path / "config.json"), gpu_memory_gib=80.0, engine="trtllm")
    with pytest.raises(InputError) as e:
        estimate_fit(req, with_suggestions=False)
    assert e.value.field == "engine" and "vllm" in e.value.message


def predict(**kw):
    base = {"model": MODEL, "gpu": "h100-sxm-80gb", "input_tokens": 4000, "output_tokens": 1000}
    return predict_performance(PredictRequest(**{**base, **kw}))


def test_predict_caps_the_batch_where_whole_requests_fit_and_never_preempts():
    r = predict(engine="trtllm", concurrency=256)
    cap = r.kv_cache_tokens // 5000
    assert r.max_num_seqs == cap < 256  # the KV cache holds ~90 whole 5,000-token requests
    assert r.preemptions == 0 and r.queue_ms.p50 > 0  # the rest wait instead
    assert "engine.trtllm" in r.factors_source
    assert any("GUARANTEED_NO_EVICT" in a for a in r.assumptions)
    vllm = predict(engine="vllm", concurrency=256)
    # vLLM admits on the tokens in hand and preempts (recomputes) when the cache runs out
    assert vllm.max_num_seqs > cap and vllm.preemptions > 0


def test_cli_takes_engine_trtllm_and_rejects_an_unknown_engine(capsys):
    argv = ["predict", "--model", MODEL, "--gpu", "h100", "--engine", "trtllm", "--json"]
    assert main([*argv, "--concurrency", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "trtllm" and out["max_num_seqs"] <= 2048
    assert main(["fit", "--model", MODEL, "--gpu", "h100", "--engine", "tensorrt"]) == 2
    assert "trtllm" in capsys.readouterr().err


def test_recommend_gives_a_trtllm_serve_line_and_reads_a_workloads_tensorrt_llm(tmp_path: Path):
    req = {
        "model": [MODEL], "gpus": ["h100-sxm-80gb"], "request_rate": 4.0, "input_tokens": 800,
        "output_tokens": 150, "slo_ttft_ms": {"p95": 1000}, "slo_itl_ms": {"p95": 60}, "top": 1,
    }  # fmt: skip
    r = recommend_deployment(RecommendRequest(**req, engine="trtllm"))
    line = r.recommended.serve_command
    assert line.startswith("trtllm-serve ") and "--backend pytorch" in line
    for flag in ("--tp_size", "--max_seq_len", "--max_batch_size", "--max_num_tokens"):
        assert flag in line
    assert r.recommended.engine == "trtllm"
    wl = tmp_path / "wl.toml"
    wl.write_text(
        "\n".join(
            [
                'name = "trt"',
                "[traffic]",
                'mode = "online"',
                "arrival_rate_rps = 4",
                "input_tokens = { p50 = 800 }",
                "output_tokens = { p50 = 150 }",
                "[slo]",
                "ttft_ms = { p95 = 1000 }",
                "[deployment]",
                f'model = "{MODEL}"',
                'engine = "tensorrt-llm"',
            ]
        )  # fmt: skip
    )
    from_workload = recommend_deployment(
        RecommendRequest(workload=str(wl), gpus=["h100-sxm-80gb"], top=1)
    )
    assert from_workload.recommended.serve_command.startswith("trtllm-serve ")


def test_mcp_predict_tool_takes_engine_trtllm():
    import asyncio

    from inferwise.server.mcp_server import make_tool_function
    from inferwise.server.registry import BY_TOOL

    fn = make_tool_function(BY_TOOL["predict_performance"])
    result = asyncio.run(
        fn(model=MODEL, gpu="h100", engine="trtllm", input_tokens=4000, output_tokens=1000,
           concurrency=256)
    )  # fmt: skip
    data = result.structured_content
    assert data["engine"] == "trtllm" and data["preemptions"] == 0
    assert data["max_num_seqs"] == data["kv_cache_tokens"] // 5000


def test_auto_kv_cache_takes_the_checkpoints_fp8_under_tensorrt_llm_only():
    """TensorRT-LLM's kv_cache_config dtype 'auto' is the checkpoint's: NVIDIA's ModelOpt
    FP8 export says kv_cache_quant_algo FP8, so TensorRT-LLM caches one byte per value and
    the fit says why; vLLM's 'auto' stays the model dtype. An explicit dtype is kept."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel

    base = {"model": "nvidia/Llama-3.1-70B-Instruct-FP8", "gpu": "h100", "tensor_parallel_size": 2}
    trt = estimate_fit(FitRequest(**base, engine="trtllm", max_model_len=8192))
    vllm = estimate_fit(FitRequest(**base, engine="vllm", max_model_len=8192))
    assert trt.kv_bytes_per_token == vllm.kv_bytes_per_token / 2
    assert "kv_cache_quant_algo" in trt.kv_cache_dtype and "bfloat16" in vllm.kv_cache_dtype
    pinned = estimate_fit(
        FitRequest(**base, engine="trtllm", kv_cache_dtype="bfloat16", max_model_len=8192)
    )
    assert pinned.kv_bytes_per_token == vllm.kv_bytes_per_token
    step = StepModel.from_deployment(Deployment(**base, engine="trtllm", max_model_len=8192))
    assert step.shape.kv_bytes_per_token == trt.kv_bytes_per_token * 2  # both ranks
