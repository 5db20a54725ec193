"""Properties of the fit that must hold for any deployment (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwise.calculators.architecture import from_config
from inferwise.calculators.catalog import load_model
from inferwise.calculators.fit import FitRequest, _estimate, estimate_fit_with_available
from inferwise.calculators.params import weight_bytes
from inferwise.calculators.quantization import resolve_quantization

MODELS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen3-30B-A3B",
    "openai/gpt-oss-20b",
    "google/gemma-2-9b-it",
    "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "mistralai/Mixtral-8x7B-v0.1",
]
GPUS = ["h100-sxm-80gb", "h200-sxm-141gb", "a100-sxm-80gb", "l40s", "rtx-4090", "b200"]
VERSIONS = ["0.6.4", "0.9.2", "0.11.0", "0.24.0", None]
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fit(**kw):
    return _estimate(FitRequest.model_validate(kw), with_suggestions=False)


deployments = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "gpu": st.sampled_from(GPUS),
        "tensor_parallel_size": st.sampled_from([1, 2, 4]),
        "max_model_len": st.sampled_from([2048, 4096, 8192]),
        "engine_version": st.sampled_from(VERSIONS),
    }
)


@FAST
@given(d=deployments, lo=st.floats(0.3, 0.9), step=st.floats(0.01, 0.1))
def test_more_utilization_never_fewer_kv_tokens(d, lo, step):
    a = fit(**d, gpu_memory_utilization=lo)
    b = fit(**d, gpu_memory_utilization=min(1.0, lo + step))
    assert b.kv_cache_tokens >= a.kv_cache_tokens
    assert b.per_gpu.kv_cache_gib >= a.per_gpu.kv_cache_gib


@FAST
@given(d=deployments, avail_gib=st.floats(4, 60))
def test_fp8_kv_about_doubles_tokens(d, avail_gib):
    d = {k: v for k, v in d.items() if k != "gpu"} | {"gpu_memory_gib": 80.0}
    auto = estimate_fit_with_available(FitRequest.model_validate(d), int(avail_gib * 2**30))
    fp8 = estimate_fit_with_available(
        FitRequest.model_validate(d | {"kv_cache_dtype": "fp8"}), int(avail_gib * 2**30)
    )
    assert auto.kv_cache_tokens > 0
    assert 1.9 <= fp8.kv_cache_tokens / auto.kv_cache_tokens <= 2.1


@FAST
@given(model=st.sampled_from(MODELS), tp=st.sampled_from([1, 2]))
def test_doubling_tp_halves_per_gpu_weights_of_sharded_layers(model, tp):
    arch = from_config(load_model(model).config)
    scheme = resolve_quantization(None, arch.quantization_config)
    one = weight_bytes(arch, scheme, 2, tp)
    two = weight_bytes(arch, scheme, 2, 2 * tp)
    sharded_one = one.per_gpu_bytes
    # Halved up to the replicated parts (norms, routers, MLA down-projections,
    # replicated KV heads), which are a few percent at most.
    assert two.per_gpu_bytes < sharded_one
    assert two.per_gpu_bytes >= sharded_one / 2
    assert two.per_gpu_bytes <= sharded_one / 2 * 1.06
    assert two.total_bytes == one.total_bytes


@FAST
@given(d=deployments, util=st.floats(0.05, 1.0), seqs=st.integers(1, 2048))
def test_results_are_never_negative(d, util, seqs):
    r = fit(**d, gpu_memory_utilization=util, max_num_seqs=seqs)
    g = r.per_gpu
    for value in (
        g.total_gib,
        g.usable_gib,
        g.weights_gib,
        g.activation_gib,
        g.non_torch_gib,
        g.cuda_graph_gib,
        g.kv_cache_gib,
        g.headroom_gib,
    ):
        assert value >= 0
    assert r.kv_cache_tokens >= 0 and r.max_concurrency >= 0 and r.kv_cache_blocks >= 0
    if not r.fits:
        assert r.verdict.startswith("Does not fit")


@FAST
@given(d=deployments, conc=st.integers(1, 64), ctx=st.integers(128, 8192))
def test_question_answers_are_consistent(d, conc, ctx):
    r = fit(
        **d,
        gpu_memory_utilization=0.9,
        context_tokens=min(ctx, d["max_model_len"]),
        concurrency=conc,
    )
    a = r.answer
    assert a is not None
    assert a.fits == (a.max_concurrency_at_context >= conc and r.per_gpu.kv_cache_gib > 0)
    if a.max_context_at_concurrency:
        assert a.max_context_at_concurrency <= r.max_model_len
