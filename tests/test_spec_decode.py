"""Speculative decoding in predict and budget (issue 15): the draft + verify step model,
acceptance conversions, validation, the memory fit with a drafter, the CLI/MCP contract
and a held-out comparison against published vLLM speed-ups."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from inferwise.calculators import spec_decode as sd
from inferwise.calculators.budget import BudgetRequest, decompose_budget
from inferwise.calculators.errors import InputError
from inferwise.calculators.predict import PredictRequest, predict_performance
from inferwise.calculators.roofline import Efficiency, Hardware, StepModel, dense_shape
from inferwise.server.cli import main

L8 = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
MEASUREMENTS = Path(__file__).parent / "data" / "spec_decode_measurements.toml"


# --------------------------------------------------------------------------- a hand-computable engine


def _toy() -> StepModel:
    """8e9 parameters (0.524e9 of them embedding = LM head), bf16, on a GPU of 1000 TFLOPS
    and 2000 GB/s, efficiencies 1, no overheads: every term is arithmetic on these numbers."""
    shape = dense_shape(
        "toy-8b",
        8e9,
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        head_dim=128,
        num_kv_heads=8,
        vocab_size=128_000,
    )
    eff = Efficiency(
        compute_fraction=1.0,
        bandwidth_fraction=1.0,
        step_overhead_ms=0.0,
        per_seq_overhead_ms=0.0,
        allreduce_latency_us=0.0,
        link_fraction=1.0,
    )
    hw = Hardware("toy", 1000.0, 2000.0, "nvlink", 450.0)
    return StepModel(shape=shape, hardware=hw, efficiency=eff, max_num_seqs=1024)


def _ngram(model: StepModel) -> sd.Drafter:
    return sd.build_drafter(SimpleNamespace(speculative_method="ngram"), model)


def test_tau_and_alpha_convert_both_ways() -> None:
    # 1 + a + a^2 with a = 0.5 at K = 2
    assert sd.tau_from_alpha(0.5, 2) == pytest.approx(1.75)
    assert sd.tau_from_alpha(0.0, 5) == pytest.approx(1.0)
    for alpha in (0.1, 0.55, 0.8, 0.95):
        for k in (1, 3, 8, 16):
            assert sd.alpha_from_tau(sd.tau_from_alpha(alpha, k), k) == pytest.approx(
                alpha, abs=1e-9
            )
    assert sd.alpha_from_tau(1.0, 4) == 0.0


def test_low_batch_speedup_is_tau_times_the_step_cost_ratio() -> None:
    """Batch 1, no context: the plain step reads the 7.476e9 matmul weights (14.95 GB) in
    7.476 ms; verifying K+1 = 4 tokens reads the same bytes (compute 0.06 ms), so the gain
    is TAU x 7.476 / (7.476 + n-gram lookup + speculative-step bookkeeping)."""
    model = _toy()
    weights_ms = (8e9 - 128_000 * 4096) * 2 / 2000e9 * 1e3
    assert model.decode_ms(1, 0) == pytest.approx(weights_ms)
    assert sd.verify_ms(model, 1, 0, 3) == pytest.approx(weights_ms)
    c = sd.drafter_constants()
    acc = sd.Acceptance(alpha=sd.alpha_from_tau(3.0, 3), source="test", measured=((3, 3.0),))
    expected = 3.0 * weights_ms / (weights_ms + c["ngram_cpu_ms"] + c["spec_step_overhead_ms"])
    assert sd.itl_speedup(_ngram(model), model, acc, 1, 0, 3) == pytest.approx(expected)
    assert 2.4 < expected < 3.0


def test_high_batch_verify_is_compute_bound_and_speculation_is_off() -> None:
    """Batch 512, K = 3: verify runs 2048 tokens, 2 x 7.476e9 x 2048 / 1e15 s = 30.6 ms of
    compute against 7.65 ms for the plain step (512 tokens): TAU 2 cannot pay for it."""
    model = _toy()
    body = 8e9 - 128_000 * 4096
    assert sd.verify_ms(model, 512, 0, 3) == pytest.approx(2 * body * 2048 / 1e15 * 1e3)
    acc = sd.Acceptance(alpha=sd.alpha_from_tau(2.0, 3), source="test", measured=((3, 2.0),))
    gain = sd.itl_speedup(_ngram(model), model, acc, 512, 0, 3)
    assert gain == pytest.approx(2.0 * (2 * body * 512 / 1e15 * 1e3) / (30.62 + 1.57), rel=2e-3)
    assert gain < 1.0
    assert sd._best_k(_ngram(model), model, acc, 512, 0)[0] is None
    assert sd._best_k(_ngram(model), model, acc, 1, 0)[0] is not None
    be = sd.break_even(_ngram(model), model, acc, 0, 3)
    assert be is not None and 1 < be < 512
    assert sd.itl_speedup(_ngram(model), model, acc, be, 0, 3) <= 1.0
    assert sd.itl_speedup(_ngram(model), model, acc, be - 1, 0, 3) > 1.0


def test_acceptance_length_one_gives_no_gain() -> None:
    model = _toy()
    acc = sd.Acceptance(alpha=0.0, source="test", measured=((4, 1.0),))
    for batch in (1, 8, 64):
        assert sd.itl_speedup(_ngram(model), model, acc, batch, 512, 4) < 1.0


def test_higher_acceptance_is_never_slower_and_gain_shrinks_with_concurrency() -> None:
    req = PredictRequest(**L8, speculative_method="eagle3", spec_acceptance_rate=0.5)
    target = StepModel.from_deployment(req)
    drafter = sd.build_drafter(req, target)
    for k in (1, 4, 8):
        for batch in (1, 32, 256):
            gains = [
                sd.itl_speedup(drafter, target, sd.Acceptance(a, "t"), batch, 1500, k)
                for a in (0.0, 0.3, 0.6, 0.8, 0.95)
            ]
            assert gains == sorted(gains)
        # short context (the physics check): the weights dominate the plain step, so a
        # wider verify only adds compute. At long context the KV read dominates, which the
        # verify shares across its K+1 queries (MagicDec's observation): the gain need not shrink.
        by_batch = [
            sd.itl_speedup(drafter, target, sd.Acceptance(0.7, "t"), b, 256, k)
            for b in (1, 8, 32, 128, 512)
        ]
        assert by_batch == sorted(by_batch, reverse=True)


def test_published_default_is_the_measurement_at_a_measured_k() -> None:
    acc = sd.default_acceptance("eagle3", "chat", 4)
    assert acc.tau(4) == pytest.approx(3.08)  # vLLM #20780, EAGLE-3 on MT-Bench at K=4
    assert "20780" in acc.source
    taus = [acc.tau(k) for k in range(1, 17)]
    assert taus == sorted(taus) and all(t <= k + 1 for k, t in zip(range(1, 17), taus, strict=True))
    mtp = sd.default_acceptance("mtp", "chat", None)
    assert mtp.tau(1) == pytest.approx(1.85)  # DeepSeek-V3 report: 85-90 % second-token acceptance
    with pytest.raises(InputError) as err:
        sd.default_acceptance("ngram", "code", 4)
    assert err.value.field == "spec_acceptance_length"


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"speculative_method": "eagle3", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"speculative_method": "eagle3", "num_speculative_tokens": 17}, "num_speculative_tokens"),
        (
            {
                "speculative_method": "eagle3",
                "num_speculative_tokens": 3,
                "spec_acceptance_length": 4.5,
            },
            "spec_acceptance_length",
        ),
        ({"speculative_method": "eagle3", "spec_acceptance_length": 2.0}, "num_speculative_tokens"),
        ({"speculative_method": "ngram", "spec_acceptance_rate": 1.0}, "spec_acceptance_rate"),
        ({"speculative_method": "ngram", "spec_acceptance_length": 0.5}, "spec_acceptance_length"),
        ({"speculative_method": "draft_model"}, "draft_model"),
        ({"speculative_method": "eagle", "draft_model": "x/y"}, "draft_model"),
        ({"num_speculative_tokens": 3}, "speculative_method"),
        (
            {
                "speculative_method": "ngram",
                "spec_acceptance_rate": 0.5,
                "spec_acceptance_length": 2.0,
                "num_speculative_tokens": 2,
            },
            "spec_acceptance_rate",
        ),
    ],
)
def test_bad_speculative_flags_name_the_field(extra, needle) -> None:
    with pytest.raises(ValidationError) as err:
        PredictRequest(**L8, **extra)
    assert needle in str(err.value)


def test_methods_that_do_not_apply_fail_closed() -> None:
    with pytest.raises(InputError) as err:
        predict_performance(PredictRequest(**L8, speculative_method="mtp", num_requests=20))
    assert (
        err.value.field == "speculative_method" and "num_nextn_predict_layers" in err.value.message
    )
    moe = {"model": "Qwen/Qwen3-30B-A3B", "gpu": "h100-sxm-80gb"}
    with pytest.raises(InputError) as err:
        predict_performance(
            PredictRequest(
                **moe, speculative_method="eagle3", spec_acceptance_rate=0.6, num_requests=20
            )
        )
    assert err.value.field == "speculative_method"


def test_memory_fit_charges_the_draft_model() -> None:
    """Llama-3.2-1B as the drafter of Llama-3.1-8B on one H100: its 1.236e9 matmul parameters
    (tied LM head included) take 2.47 GB, and every token's KV grows from 131,072 B
    (2 x 32 layers x 8 heads x 128 x 2 B) by 32,768 B (2 x 16 x 8 x 64 x 2 B)."""
    req = PredictRequest(
        **L8,
        concurrency=1,
        speculative_method="draft_model",
        draft_model="meta-llama/Llama-3.2-1B-Instruct",
        spec_acceptance_rate=0.7,
        num_requests=20,
    )
    res = predict_performance(req)
    s = res.speculative
    assert s is not None
    assert s.drafter_weight_gib_per_gpu * 2**30 == pytest.approx(2.47e9, rel=0.01)
    expected = int(
        (res.kv_cache_tokens * 131_072 - s.drafter_weight_gib_per_gpu * 2**30) // (131_072 + 32_768)
    )
    assert s.kv_cache_tokens == pytest.approx(expected, abs=1)
    assert s.kv_cache_tokens < 0.8 * res.kv_cache_tokens
    assert s.draft_ms > 0 and s.num_speculative_tokens in sd.RECOMMEND_K


def test_mtp_on_deepseek_v3_uses_its_own_layer() -> None:
    res = predict_performance(
        PredictRequest(
            model="deepseek-ai/DeepSeek-V3",
            gpu="h200-sxm-141gb",
            tensor_parallel_size=8,
            concurrency=1,
            input_tokens=512,
            output_tokens=128,
            speculative_method="mtp",
            num_speculative_tokens=1,
            num_requests=20,
        )
    )
    s = res.speculative
    assert s is not None and s.tokens_per_step == pytest.approx(1.85)
    assert 1.0 < s.itl_speedup < 1.85
    assert 0 < s.kv_cache_tokens < res.kv_cache_tokens


def test_predict_output_recommendation_and_off_when_unset() -> None:
    plain = predict_performance(PredictRequest(**L8, concurrency=1, num_requests=20))
    assert plain.speculative is None
    res = predict_performance(
        PredictRequest(**L8, concurrency=1, num_requests=20, speculative_method="eagle3")
    )
    s = res.speculative
    assert s is not None and s.k_chosen_by == "best at this load"
    assert s.itl_speedup > 1.2 and s.throughput_speedup > 1.0
    assert s.itl_ms_mean < res.itl_ms.mean
    levels = {lv.concurrency: lv for lv in s.recommendation}
    assert levels[1].recommended_k is not None
    assert levels[1].itl_speedup >= max(lv.itl_speedup for lv in s.recommendation) - 1e-9
    dumped = res.model_dump()["speculative"]
    for key in ("tokens_per_step", "itl_speedup", "throughput_speedup", "break_even_concurrency"):
        assert key in dumped


def test_budget_reports_speculation_at_the_design_load() -> None:
    res = decompose_budget(
        BudgetRequest(
            **L8,
            request_rate=2,
            slo_itl_ms={"p95": 50},
            speculative_method="ngram",
            num_speculative_tokens=3,
            spec_acceptance_length=2.0,
            num_requests=60,
        ),
        find_max_rate=False,
    )
    assert res.speculative is not None and res.speculative.tokens_per_step == 2.0
    assert res.speculative.itl_speedup > 1.0


def test_cli_flags_and_template(capsys) -> None:
    base = ["predict", "--model", L8["model"], "--gpu", "h100", "--concurrency", "1"]
    args = [
        *base,
        "--num-requests",
        "20",
        "--speculative-method",
        "eagle3",
        "--num-speculative-tokens",
        "4",
    ]
    assert main([*args, "--spec-acceptance-length", "3.08"]) == 0
    out = capsys.readouterr().out
    assert "Speculative decoding (eagle3, K = 4)" in out and "Break-even concurrency" in out
    assert main([*args, "--spec-acceptance-length", "6"]) == 2
    assert "spec_acceptance_length" in capsys.readouterr().err
    assert main([*base, "--speculative-method", "mtp"]) == 2
    assert "--speculative-method" in capsys.readouterr().err
    assert main([*base, "--speculative-method", "ngram", "--spec-task", "summarization"]) == 2


def test_budget_cli_and_mcp_parameters_carry_the_contract_names(monkeypatch, tmp_path) -> None:
    """The contract names on both requests, in the MCP listing's words, and accepted by the
    MCP tools (the listing names them in the description to stay under its size cap)."""
    names = (
        "speculative_method",
        "num_speculative_tokens",
        "spec_acceptance_length",
        "spec_acceptance_rate",
        "draft_model",
    )
    assert set(names) <= set(BudgetRequest.model_fields) & set(PredictRequest.model_fields)
    from mcp.client import Client

    from inferwise.server import mcp_server

    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    args = {
        **L8,
        "concurrency": 1,
        "num_requests": 20,
        "speculative_method": "eagle3",
        "num_speculative_tokens": 4,
        "spec_acceptance_length": 3.08,
    }

    async def go():
        async with Client(mcp_server.build_server()) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            ok = await client.call_tool("predict_performance", args)
            bad = await client.call_tool(
                "predict_performance", {**args, "spec_acceptance_length": 9.0}
            )
            return tools, ok, bad

    tools, ok, bad = asyncio.run(go())
    assert all(n in tools["predict_performance"].description for n in names)
    assert "predict_performance" in tools["decompose_latency_budget"].description
    assert not ok.is_error and ok.structured_content["speculative"]["tokens_per_step"] == 3.08
    assert bad.is_error and "spec_acceptance_length" in bad.content[0].text


def test_held_out_published_speedups() -> None:
    """vLLM issue #20780 (Llama-3.1-8B-Instruct on H100, batch 1, MT-Bench): EAGLE-1 and
    EAGLE-3 speed-ups for K = 2..7, the measured acceptance lengths as inputs. Never used to
    set any factor (the overheads come from vLLM PR #16035). At this writing the model is
    6-7 % low for EAGLE-1 and 9-24 % high for EAGLE-3 (bench/spec_decode_accuracy.py)."""
    from bench.spec_decode_accuracy import calibrate, load_cases, predicted_speedups

    cases = load_cases()
    cal = next(c for c in cases if c["role"] == "calibration")
    fwd, step = calibrate(cal)
    consts = sd.drafter_constants()
    assert fwd == pytest.approx(consts["draft_forward_overhead_ms"], abs=0.01)
    assert step == pytest.approx(consts["spec_step_overhead_ms"], abs=0.01)
    for case in (c for c in cases if c["role"] == "held-out"):
        pred = predicted_speedups(case)
        errors = [p / m - 1 for p, m in zip(pred, case["speedup"], strict=True)]
        assert max(abs(e) for e in errors) < 0.30, (case["method"], errors)
    with MEASUREMENTS.open("rb") as fh:
        assert all("url" in c for c in tomllib.load(fh)["case"])


def test_draft_model_must_share_the_vocabulary() -> None:
    with pytest.raises(InputError) as err:
        predict_performance(
            PredictRequest(
                **L8,
                speculative_method="draft_model",
                draft_model="Qwen/Qwen2.5-0.5B-Instruct",
                spec_acceptance_rate=0.6,
                num_requests=20,
            )
        )
    assert err.value.field == "draft_model" and "vocabulary" in err.value.message


def test_weak_acceptance_at_high_concurrency_is_off() -> None:
    """n-gram at a 25 % per-token rate on a busy 8B engine: worth a little alone, nothing at
    256 sequences, and the per-load table says so. (At 20 % it breaks even alone since the
    one-GPU decode step of vLLM 0.14+ is shorter: the speculative step's fixed costs weigh more.)"""
    res = predict_performance(
        PredictRequest(
            **L8,
            concurrency=256,
            input_tokens=128,
            output_tokens=128,
            speculative_method="ngram",
            spec_acceptance_rate=0.25,
            num_requests=300,
        )
    )
    s = res.speculative
    assert s is not None and s.itl_speedup < 1.0 and "leave speculation off" in s.notes[0]
    levels = {lv.concurrency: lv.recommended_k for lv in s.recommendation}
    assert levels[1] is not None and levels[256] is None
    assert s.break_even_concurrency is not None and s.break_even_concurrency < 256


def test_code_and_math_defaults_accept_more_than_chat_by_the_published_median() -> None:
    """Issue 15: code and math accept more than open chat; the factor is the median of the
    published same-drafter pairs, and the source says how wide they spread."""
    from inferwise.calculators.spec_tasks import task_factor

    base = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}
    base.update(concurrency=4, speculative_method="eagle3", num_speculative_tokens=3)
    chat = predict_performance(PredictRequest(**base)).speculative
    for task in ("code", "math"):
        s = predict_performance(PredictRequest(**base, spec_task=task)).speculative
        f = task_factor(task)
        assert f.low < f.ratio < f.high and f.pairs >= 3
        assert s.tokens_per_step == pytest.approx(min(4.0, chat.tokens_per_step * f.ratio))
        assert s.itl_speedup > chat.itl_speedup
        assert "published same-drafter pairs" in s.acceptance_source


def test_an_unknown_spec_task_is_exit_2_naming_the_flag() -> None:
    cmd = [sys.executable, "-m", "inferwise.server", "predict"]
    cmd += ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100"]
    cmd += ["--speculative-method", "eagle3", "--spec-task", "poetry"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "spec-task" in p.stderr.replace("_", "-")
