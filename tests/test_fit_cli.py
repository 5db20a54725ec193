"""`inferwise fit` from the command line: results, rendering and bad input."""

from __future__ import annotations

import json

import pytest

from inferwise.server.cli import main


def run(capsys, *args):
    code = main(["fit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_has_the_contract_fields(capsys):
    code, out, err = run(
        capsys, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--json"
    )
    assert code == 0, err
    d = json.loads(out)
    for key in (
        "fits",
        "per_gpu",
        "kv_bytes_per_token",
        "kv_cache_tokens",
        "max_concurrency",
        "assumptions",
        "warnings",
        "suggestions",
        "num_gpus",
        "max_model_len",
        "parameters",
        "weights_bytes_total",
        "engine",
        "engine_version",
        "quantities",
    ):
        assert key in d, key
    for key in (
        "total_gib",
        "usable_gib",
        "weights_gib",
        "activation_gib",
        "non_torch_gib",
        "cuda_graph_gib",
        "kv_cache_gib",
        "headroom_gib",
    ):
        assert key in d["per_gpu"], key
    assert d["fits"] is True
    assert d["kv_bytes_per_token"] == 131072
    assert d["parameters"]["total"] == 8_030_261_248
    assert {q["provenance"] for q in d["quantities"]} <= {"measured", "computed", "assumed"}
    # usable = total x utilization; the parts add up to it
    g = d["per_gpu"]
    assert g["usable_gib"] == pytest.approx(g["total_gib"] * 0.9, abs=0.01)
    parts = g["weights_gib"] + g["activation_gib"] + g["non_torch_gib"] + g["kv_cache_gib"]
    parts += g["cuda_graph_gib"] if g["cuda_graph_in_budget"] else 0
    assert parts == pytest.approx(g["usable_gib"], abs=0.02)


def test_vllm_style_flags_and_the_question(capsys):
    code, out, err = run(
        capsys,
        "--model",
        "meta-llama/Llama-3.3-70B-Instruct",
        "--gpu",
        "H100",
        "-tp",
        "4",
        "--max-model-len",
        "32768",
        "--kv-cache-dtype",
        "fp8",
        "--context-tokens",
        "16000",
        "--concurrency",
        "40",
        "--engine-version",
        "0.11.0",
        "--json",
    )
    assert code == 0, err
    d = json.loads(out)
    a = d["answer"]
    assert a["context_tokens"] == 16000 and a["concurrency"] == 40
    assert a["fits"] == (a["max_concurrency_at_context"] >= 40)
    assert d["tensor_parallel_size"] == 4 and d["num_gpus"] == 4
    assert d["engine_version"] == "0.11.0"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_question_longer_than_max_model_len_fits_no_request(capsys, engine):
    """Requests longer than max_model_len are rejected however much KV cache is free: the
    answer is zero of them, and the option offered is the context the question needs."""
    code, out, err = run(
        capsys,
        *("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100"),
        *("--max-model-len", "8192", "--context-tokens", "16000", "--concurrency", "4"),
        *("--engine", engine, "--json"),
    )
    assert code == 0, err
    d = json.loads(out)
    assert d["answer"]["fits"] is False
    assert d["answer"]["max_concurrency_at_context"] == 0
    if engine == "vllm":
        longer = [s for s in d["suggestions"] if s["flags"] == "--max-model-len 16000"]
        assert longer and longer[0]["fits"] is True


def test_markdown_rendering_shows_the_table_and_figures(capsys):
    code, out, err = run(
        capsys,
        "--model",
        "Qwen/Qwen3-30B-A3B",
        "--gpu",
        "a100-sxm-80gb",
        "--context-tokens",
        "8192",
        "--concurrency",
        "16",
    )
    assert code == 0, err
    for text in (
        "Per GPU",
        "KV cache",
        "GPU KV cache size",
        "Maximum concurrency",
        "Options",
        "Assumptions",
        "Your question",
    ):
        assert text in out, text


def test_a_deployment_that_does_not_fit_is_a_result_with_vllms_wording(capsys):
    code, out, err = run(capsys, "--model", "openai/gpt-oss-120b", "--gpu", "h100", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["fits"] is False
    assert d["verdict"].startswith("Does not fit")
    assert any("max seq len" in w or "No available memory" in w for w in d["warnings"])
    # and it says what would make it fit, with numbers
    fixes = [s for s in d["suggestions"] if s["fits"]]
    assert fixes and all(s["kv_cache_tokens"] > 0 for s in fixes)


def test_weights_larger_than_the_gpu(capsys):
    code, out, _ = run(capsys, "--model", "meta-llama/Llama-3.1-405B", "--gpu", "l40s", "--json")
    assert code == 0
    d = json.loads(out)
    assert not d["fits"] and "weights need" in d["verdict"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "no-such/model", "--gpu", "h100"], "closest"),
        (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h1000"], "--gpu"),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--gpu-memory-utilization",
                "1.5",
            ],
            "--gpu-memory-utilization",
        ),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--gpu-memory-utilization",
                "0",
            ],
            "--gpu-memory-utilization",
        ),
        (
            ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "-tp", "3"],
            "--tensor-parallel-size",
        ),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--max-model-len",
                "0",
            ],
            "--max-model-len",
        ),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--max-model-len",
                "999999",
            ],
            "--max-model-len",
        ),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--num-gpus",
                "1",
                "-tp",
                "2",
            ],
            "--num-gpus",
        ),
        (["--model", "meta-llama/Llama-3.1-8B-Instruct"], "gpu"),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--engine-version",
                "banana",
            ],
            "--engine-version",
        ),
        (
            [
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--gpu",
                "h100",
                "--quantization",
                "awq",
            ],
            "--quantization",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_flag(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_unsupported_architecture_in_a_config_file_fails_closed(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {"model_type": "rwkv", "architectures": ["RwkvForCausalLM"], "hidden_size": 2048}
        )
    )
    code, _, err = run(capsys, "--model", str(cfg), "--gpu", "h100")
    assert code == 2
    assert "'rwkv' is not supported" in err and "supported:" in err and "--hf-overrides" in err


def test_config_file_missing_a_field_names_it(capsys, tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "max_position_embeddings": 4096,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, _, err = run(capsys, "--model", str(tmp_path), "--gpu", "h100")
    assert code == 2 and "num_hidden_layers" in err
    # and the override flag supplies it
    code, out, err = run(
        capsys,
        "--model",
        str(tmp_path),
        "--gpu",
        "h100",
        "--hf-overrides",
        "num_hidden_layers=32",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["parameters"]["total"] > 6e9


def test_malformed_config_file(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run(capsys, "--model", str(tmp_path / "config.json"), "--gpu", "h100")
    assert code == 2 and "not valid JSON" in err


def test_sglang_engine(capsys):
    code, out, err = run(
        capsys, "--model", "Qwen/Qwen3-8B", "--gpu", "h100", "--engine", "sglang", "--json"
    )
    assert code == 0, err
    d = json.loads(out)
    assert d["engine"] == "sglang" and d["block_size"] == 1
    assert any("mem_fraction_static" in a for a in d["assumptions"])


@pytest.mark.parametrize(
    "flags",
    [
        ["--limit-mm-per-prompt", '{"image": 0, "video": 0}'],  # vLLM's JSON form
        ["--limit-mm-per-prompt", "image=0,video=0"],
        ["--limit-mm-per-prompt", "image=0", "--limit-mm-per-prompt", "video=0"],
    ],
)
def test_limit_mm_per_prompt_takes_vllms_spellings(capsys, flags):
    """Text-only Qwen2.5-VL: no encoder profiling, and on 0.10.1+ no tower weights."""
    base = [
        "fit",
        "--model",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "--gpu",
        "l4",
        "--max-model-len",
        "16384",
        "--json",
    ]
    assert main(base) == 0
    with_images = json.loads(capsys.readouterr().out)
    assert main(base + flags) == 0
    text_only = json.loads(capsys.readouterr().out)
    assert text_only["per_gpu"]["weights_gib"] < with_images["per_gpu"]["weights_gib"] - 1.2
    assert text_only["kv_cache_tokens"] > with_images["kv_cache_tokens"]
