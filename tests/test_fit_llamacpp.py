"""llama.cpp memory fit from GGUF headers: KV cells and bytes as llama.cpp allocates them
(hand-computed from its rules), the layer split across GPUs, the --fit context reduction,
architectures it does not model failing closed, flags of the wrong engine refused, and GGUF
files read from a stand-in Hub by range requests only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gguf_files import tensor_bytes, write_gguf
from hub_standin import HubStandin

from inferwise.calculators import gguf_file, gguf_hub, hub
from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit

GIB = 1 << 30


def fit(model: Path | str, **kw) -> object:
    kw.setdefault("gpu", "l4")
    return estimate_fit(FitRequest(model=str(model), engine="llama.cpp", **kw))


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    """A llama-architecture header: 4 layers, 2 KV heads of 64, Q8_0 weights."""
    return write_gguf(tmp_path / "llama.gguf", "llama")


def test_kv_bytes_per_cell_follow_the_cache_types(llama: Path) -> None:
    # per layer and cell: 2 KV heads x 64 dims for K and for V
    f16 = fit(llama, ctx_size=4096)
    assert f16.kv_bytes_per_token == 4 * (2 * 64 * 2 + 2 * 64 * 2)
    q8 = fit(llama, ctx_size=4096, cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8.kv_bytes_per_token == 4 * 2 * (128 * 34 // 32)
    q4k = fit(llama, ctx_size=4096, cache_type_k="q4_0")
    assert q4k.kv_bytes_per_token == 4 * (128 * 18 // 32 + 128 * 2)
    assert f16.per_gpu.kv_cache_gib == pytest.approx(4096 * 2048 / GIB, abs=1e-3)


def test_context_is_padded_to_256_cells_and_split_over_slots(llama: Path) -> None:
    unified = fit(llama, ctx_size=1000)  # auto slots: 4 sharing one pool
    assert (unified.kv_cache_tokens, unified.max_model_len, unified.max_num_seqs) == (1024, 1024, 4)
    split = fit(llama, ctx_size=1000, parallel=3)  # one stream per slot: 333 -> 512 each
    assert (split.kv_cache_tokens, split.max_model_len, split.max_num_seqs) == (1536, 512, 3)
    assert split.max_concurrency == 3.0
    shared = fit(llama, ctx_size=1000, parallel=3, kv_unified=True)
    assert (shared.kv_cache_tokens, shared.max_model_len) == (1024, 1024)


def test_the_question_counts_slots_and_the_shared_pool(llama: Path) -> None:
    pool = fit(llama, ctx_size=8192, context_tokens=3000, concurrency=3)
    assert pool.answer.max_concurrency_at_context == 2  # 8192 // 3000
    assert not pool.answer.fits
    slots = fit(llama, ctx_size=8192, parallel=2, context_tokens=4096, concurrency=2)
    assert slots.answer.fits and slots.answer.max_concurrency_at_context == 2
    assert not fit(llama, ctx_size=8192, parallel=2, context_tokens=5000).answer.fits


def test_sliding_window_layers_get_the_smaller_cache(tmp_path: Path) -> None:
    # Gemma 3: five window layers per full one; window 512, ubatch 512, 4 unified slots
    path = write_gguf(tmp_path / "g3.gguf", "gemma3", n_layer=12, sliding_window=512)
    r = fit(path, ctx_size=32768)
    per_layer = 2 * 64 * 2 * 2
    swa_cells = 512 * 4 + 512  # n_swa x slots + n_ubatch, already a multiple of 256
    expected = 2 * per_layer * 32768 + 10 * per_layer * swa_cells
    assert r.per_gpu.kv_cache_gib == pytest.approx(expected / GIB, abs=1e-3)
    assert r.kv_bytes_per_token_per_layer == {"full": per_layer, "sliding": per_layer}
    full = fit(path, ctx_size=32768, swa_full=True)
    assert full.per_gpu.kv_cache_gib == pytest.approx(12 * per_layer * 32768 / GIB, abs=1e-3)
    # a stated pattern overrides the architecture's default
    listed = [True, False] * 6
    path2 = write_gguf(
        tmp_path / "g3b.gguf",
        "gemma3",
        n_layer=12,
        sliding_window=512,
        extra={"gemma3.attention.sliding_window_pattern": listed},
    )
    r2 = fit(path2, ctx_size=32768)
    assert r2.per_gpu.kv_cache_gib == pytest.approx(
        (6 * per_layer * 32768 + 6 * per_layer * swa_cells) / GIB, abs=1e-3
    )


def test_weights_are_the_header_bytes_with_embeddings_in_host_memory(llama: Path) -> None:
    r = fit(llama, ctx_size=4096)
    embd = tensor_bytes((1000, 256), "Q8_0")
    assert r.weights_bytes_total == gguf_file.load_gguf(str(llama)).total_bytes
    assert r.per_gpu.weights_gib == pytest.approx((r.weights_bytes_total - embd) / GIB, abs=1e-3)
    assert any("measured from the GGUF header" in q.detail for q in r.quantities)


def test_tied_embeddings_put_a_copy_of_the_table_on_the_gpu(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tied.gguf", "llama", tie_embeddings=True)
    r = fit(path, ctx_size=4096)
    assert r.per_gpu.weights_gib == pytest.approx(r.weights_bytes_total / GIB, abs=1e-3)


def test_layers_are_split_over_gpus_and_the_output_goes_last(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "big.gguf", "llama", n_layer=7, n_embd=1024, n_head=8)
    one = fit(path, ctx_size=8192)
    two = fit(path, ctx_size=8192, num_gpus=2)
    # 8 slots (7 layers + output) dealt 4 and 4: GPU 0 holds layers 0-3, GPU 1 layers 4-6
    # and the output; with a small vocabulary GPU 0 is the fuller one
    assert two.num_gpus == 2
    assert two.per_gpu.kv_cache_gib == pytest.approx(one.per_gpu.kv_cache_gib * 4 / 7, abs=1e-3)
    assert two.per_gpu.weights_gib < one.per_gpu.weights_gib
    with pytest.raises(InputError) as err:
        fit(path, tensor_parallel_size=2)
    assert err.value.field == "tensor_parallel_size" and "--num-gpus" in str(err.value)


def test_an_unset_context_is_shortened_as_the_fit_step_does(tmp_path: Path) -> None:
    # 32 layers x 8 KV heads x 128: 256 KiB per cell in f16; 1M training context
    path = write_gguf(
        tmp_path / "long.gguf",
        "llama",
        n_layer=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=1024,
        context=1 << 20,
    )
    r = fit(path, gpu_memory_gib=24.0)
    assert r.fits
    assert 4096 < r.kv_cache_tokens < 1 << 20 and r.kv_cache_tokens % 256 == 0
    assert r.per_gpu.headroom_gib >= 1.0 - 0.01  # the 1,024 MiB margin
    assert r.estimated_max_model_len == r.max_model_len
    assert any("--fit step shortens the context" in a for a in r.assumptions)
    explicit = fit(path, gpu_memory_gib=24.0, ctx_size=1 << 20)
    assert not explicit.fits and "Does not fit" in explicit.verdict
    assert any(s.fits for s in explicit.suggestions)


def test_moe_active_parameters_scale_the_routed_experts(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "moe.gguf", "qwen3moe", n_expert=8, n_expert_used=2)
    r = fit(path, ctx_size=4096)
    experts = 4 * 3 * 8 * 512 * 256
    assert r.parameters.total - r.parameters.active_per_token == experts * 6 // 8


@pytest.mark.parametrize(
    ("arch", "extra", "says"),
    [
        ("deepseek2", {}, "multi-head latent attention"),
        ("mamba2", {"mamba2.ssm.state_size": 128}, "not modelled"),
        ("jamba", {"jamba.ssm.state_size": 16}, "not modelled"),
        ("unheard-of", {}, "not modelled"),
    ],
)
def test_caches_it_does_not_model_fail_closed(tmp_path: Path, arch, extra, says) -> None:
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, extra=extra)
    with pytest.raises(InputError) as err:
        fit(path, ctx_size=4096)
    assert err.value.field == "model" and says in str(err.value)


def test_flags_of_the_other_engine_are_refused(llama: Path) -> None:
    with pytest.raises(InputError, match="--ctx-size"):
        fit(llama, max_model_len=4096)
    with pytest.raises(InputError, match="add --engine llama.cpp"):
        estimate_fit(FitRequest(model=str(llama), gpu="l4", ctx_size=4096))
    with pytest.raises(InputError, match="GGUF files"):
        fit("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(InputError, match="flash attention"):
        fit(llama, cache_type_v="q8_0", flash_attn="off")
    with pytest.raises(InputError, match="not a readable GGUF"):
        bad = llama.with_name("bad.gguf")
        bad.write_bytes(b"GGUF" + b"\0" * 64)
        fit(bad)


def test_a_missing_split_part_is_named(tmp_path: Path) -> None:
    first = write_gguf(tmp_path / "m-00001-of-00002.gguf", "llama")
    with pytest.raises(InputError, match="m-00002-of-00002.gguf"):
        fit(first)


def test_the_cli_prints_the_llamacpp_table_and_exits_2_on_a_bad_flag(llama: Path) -> None:
    cmd = [sys.executable, "-m", "inferwise.server.cli", "fit", "--model", str(llama)]
    ok = subprocess.run(
        [*cmd, "--engine", "llama.cpp", "--gpu", "l4", "-c", "8192", "-np", "2", "-ctk", "q8_0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "-c 8,192 · -np 2" in ok.stdout and "Compute buffer" in ok.stdout
    bad = subprocess.run(
        [*cmd, "--gpu", "l4", "-c", "8192"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--engine llama.cpp" in bad.stderr


# --------------------------------------------------------------------------- the Hub

TOKEN = "hf_" + "q9" * 17


def _header_of(path: Path) -> bytes:
    """A GGUF file as the stand-in serves it: the header bytes, then zeros to its size (the
    stand-in refuses any GET without a Range, so the zeros are never sent whole)."""
    return path.read_bytes()


@pytest.fixture
def gguf_hub_standin(tmp_path: Path, monkeypatch):
    q4 = write_gguf(tmp_path / "Model-Q4_K_M.gguf", "llama", n_layer=6)
    q8 = write_gguf(tmp_path / "Model-Q8_0.gguf", "llama", n_layer=6)
    repos = {
        "acme/Model-GGUF": {
            "files": {
                "Model-Q4_K_M.gguf": _header_of(q4),
                "Model-Q8_0.gguf": _header_of(q8),
                "mmproj-Model-Q8_0.gguf": b"GGUF",
                "README.md": b"# model",
            }
        },
        "acme/Gated-GGUF": {"files": {"Model-Q4_K_M.gguf": _header_of(q4)}, "gated": True},
    }
    with HubStandin(repos, token=TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("INFERWISE_HUB", raising=False)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        hub.forget()
        gguf_hub.forget()
        yield server
    gguf_hub.forget()


def test_a_quant_tag_on_the_hub_is_read_by_range_requests_only(gguf_hub_standin, monkeypatch):
    monkeypatch.setattr(gguf_hub, "FIRST_READ_BYTES", 512)  # force the prefix to grow
    r = fit("acme/Model-GGUF:Q4_K_M", ctx_size=4096)
    assert r.model_source == "hub" and r.model_revision
    assert r.parameters.total > 0 and r.kv_bytes_per_token == 6 * 512
    gets = [q for q in gguf_hub_standin.requests if q.path.endswith(".gguf")]
    assert gets and all("range" in q.headers for q in gets)
    assert len(gets) >= 2  # 512 bytes did not hold the header: it was read again, larger
    assert all("Q4_K_M" in q.path for q in gets)
    assert gguf_hub_standin.refused == []
    assert gguf_hub_standin.leaks(TOKEN) == []
    assert TOKEN not in r.model_dump_json()


def test_a_tag_that_matches_nothing_or_a_gated_repo_says_what_to_do(gguf_hub_standin, monkeypatch):
    with pytest.raises(InputError) as err:
        fit("acme/Model-GGUF:Q5_K_S")
    assert "no GGUF file matching 'Q5_K_S'" in str(err.value)
    assert "Model-Q8_0.gguf" in (err.value.accepted or "")
    monkeypatch.delenv("HF_TOKEN")
    gguf_hub.forget()
    with pytest.raises(InputError, match="HF_TOKEN"):
        fit("acme/Gated-GGUF:Q4_K_M")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="local .gguf path"):
        fit("acme/Model-GGUF:Q8_0")


# --------------------------------------------------------------------------- compute buffers

COMPUTE_DATA = Path(__file__).parent / "data" / "llamacpp_compute_buffers.toml"


def _compute_mib(row: dict) -> float:
    from inferwise.calculators import llamacpp_fit as lf

    shape = lf.Shape(
        n_layer=2,
        n_embd=row["n_embd"],
        n_ctx_train=1 << 20,
        kv_heads=(row.get("n_head_kv", 8),) * 2,
        head_k=row["n_embd"] // row["n_head"],
        head_v=row["n_embd"] // row["n_head"],
        swa_layers=(False, False),
        n_swa=0,
        n_vocab=row.get("n_vocab", 32000),
        n_ff=row["n_ff"],
        n_head=row["n_head"],
        n_ff_active=row["n_ff"],
    )
    parallel = row.get("parallel", 1)
    s = lf.settings_for(
        shape,
        ctx_size=row["ctx"],
        parallel=parallel,
        kv_unified=parallel == 1 or None,
        ubatch_size=row["ubatch"],
        type_k="f16",
        type_v="f16",
        flash_attn=row["flash_attn"],
        swa_full=False,
    )
    return lf.compute_buffer_bytes(shape, s, holds_output=True) / (1 << 20)


def test_compute_buffers_match_the_measured_cpu_runs_and_published_cuda_logs() -> None:
    import tomllib

    data = tomllib.loads(COMPUTE_DATA.read_text())
    cpu = [abs(_compute_mib(r) / r["compute_mib"] - 1) for r in data["cpu"]]
    assert len(cpu) >= 40 and max(cpu) < 0.03
    review = [abs(_compute_mib(r) / r["compute_mib"] - 1) for r in data["cpu_review"]]
    assert max(review) < 0.08
    cuda = [abs(_compute_mib(r) / r["compute_mib"] - 1) for r in data["cuda"]]
    assert len(cuda) == 4 and max(cuda) < 0.08  # the CUDA backend's own scratch on top


def test_vllm_settings_are_refused_and_the_fit_margin_applies_with_c_given(tmp_path: Path) -> None:
    llama = write_gguf(
        tmp_path / "m.gguf", "llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8
    )
    with pytest.raises(InputError, match="-ctk"):
        fit(llama, ctx_size=4096, kv_cache_dtype="fp8")
    for flags in (
        {"enforce_eager": True},
        {"quantization": "awq"},
        {"gpu_memory_utilization": 0.5},
    ):
        with pytest.raises(InputError, match="not a llama.cpp setting"):
            fit(llama, ctx_size=4096, **flags)
    with pytest.raises(InputError, match="whole layers"):
        fit(llama, ctx_size=4096, num_gpus=40)
    # 128 KiB per cell: 30,720 cells are 3.75 GiB; on a 6.2 GiB GPU less than 1 GiB stays free
    tight = fit(llama, ctx_size=30720, gpu_memory_gib=6.2)
    assert tight.per_gpu.headroom_gib < 1.0
    assert not tight.fits and "--fit step" in tight.verdict
    busy = fit(llama, ctx_size=8192, parallel=2, concurrency=3)
    assert any("exceeds the 2 slot(s)" in w for w in busy.warnings)


def test_a_gguf_file_for_vllm_points_to_the_llamacpp_engine(llama: Path) -> None:
    with pytest.raises(InputError, match="add --engine llama.cpp"):
        estimate_fit(FitRequest(model=str(llama), gpu="l4"))
