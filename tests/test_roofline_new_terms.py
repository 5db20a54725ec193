"""The optional roofline terms of issue 13: a GEMM efficiency ramp over the step's token
count and a per-sequence decode-attention cost. Both default to off (today's model)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferwise.calculators.roofline import Efficiency, Hardware, StepModel, dense_shape

H100 = Hardware(
    "h100", peak_tflops=1000.0, bandwidth_gb_per_s=3000, interconnect="nvlink", link_gb_per_s=450
)
BASE = Efficiency(
    compute_fraction=0.5,
    bandwidth_fraction=1.0,
    step_overhead_ms=0.0,
    per_seq_overhead_ms=0.0,
    allreduce_latency_us=0.0,
    link_fraction=1.0,
)
SHAPE = dense_shape(
    "toy",
    8e9,
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    head_dim=128,
    num_kv_heads=8,
    vocab_size=128_256,
)


def model(eff: Efficiency) -> StepModel:
    return StepModel(shape=SHAPE, hardware=H100, efficiency=eff)


def test_defaults_keep_the_old_step_times():
    old = model(BASE).breakdown(2048, 64, 64 * 1000)
    new = model(replace(BASE, compute_half_tokens=0.0, attn_seq_overhead_us=0.0)).breakdown(
        2048, 64, 64 * 1000
    )
    assert new == old


def test_the_gemm_ramp_slows_small_steps_and_spares_big_prefills():
    half = 256.0
    ramp = model(replace(BASE, compute_half_tokens=half))
    flat = model(BASE)
    for tokens in (64, 2048, 8192):
        # no attention pairs: the ramp is the GEMMs', attention kernels are not few-row GEMMs
        gemms = [m.breakdown(tokens, 0, 0, prefill_pairs=0.0).compute_ms for m in (ramp, flat)]
        assert gemms[0] / gemms[1] == pytest.approx((tokens + half) / tokens, rel=1e-6)
        pairs = tokens * tokens / 2.0
        attention = [
            m.breakdown(tokens, 0, 0, pairs).compute_ms - g
            for m, g in zip((ramp, flat), gemms, strict=True)
        ]
        assert attention[0] == pytest.approx(attention[1], rel=1e-9)


def test_decode_attention_pays_per_sequence_per_layer():
    us = 2.0
    with_cost = model(replace(BASE, attn_seq_overhead_us=us)).breakdown(0, 100, 100 * 500)
    without = model(BASE).breakdown(0, 100, 100 * 500)
    assert with_cost.overhead_ms - without.overhead_ms == pytest.approx(us * 1e-3 * 100 * 32)


def test_a_hidden_host_step_is_a_floor_not_a_cost():
    """vLLM 0.14+ on one GPU: the host's step work overlaps the GPU's, so a step takes the longer
    of the two; the simulator's decode fast path (DecodeLine) agrees with the full step."""
    host_ms = 1.0
    serial = model(replace(BASE, step_overhead_ms=host_ms))
    hidden = replace(serial, hides_host_step=True)
    big = (0, 64, 64 * 2000)  # GPU work well above 1 ms: the host's step is hidden
    gpu_ms = serial.step_ms(*big) - host_ms
    assert gpu_ms > host_ms
    assert hidden.step_ms(*big) == pytest.approx(gpu_ms, rel=1e-9)
    tiny = replace(hidden, shape=replace(SHAPE, dense_weight_bytes=SHAPE.dense_weight_bytes / 100))
    tiny_serial = replace(tiny, hides_host_step=False)
    assert tiny_serial.step_ms(0, 1, 10) - host_ms < host_ms  # the GPU's part is shorter
    assert tiny.step_ms(0, 1, 10) == pytest.approx(host_ms, rel=1e-9)  # so the host's sets it
    for m in (hidden, tiny):
        line = m.decode_line(8)
        for kv in (0.0, 8 * 500.0, 8 * 50_000.0):
            a = line.attended_tokens(kv)
            fast = max(line.c0 + line.c1 * a, line.m0 + line.m1 * a, line.floor) + line.fixed
            assert fast == pytest.approx(m.step_ms(0, 8, int(kv)), rel=1e-9)


def test_a_calibration_keeps_its_own_step_cost_serial():
    """A user calibration fits its own step cost on its own runs, so a deployment built with
    it keeps that cost in every step; the admission lag of vLLM 0.14+ is the engine's and
    applies either way."""
    from inferwise.calculators.deployment import Deployment

    dep = Deployment(model="Qwen/Qwen3-8B", gpu="h100-sxm-80gb", engine_version="0.30.0")
    published = StepModel.from_deployment(dep)
    calibrated = StepModel.from_deployment(dep, efficiency=published.efficiency)
    assert published.hides_host_step and not calibrated.hides_host_step
    assert published.schedules_ahead and calibrated.schedules_ahead
    step = published.efficiency.step_overhead_ms
    assert calibrated.step_ms(0, 8, 8000) == pytest.approx(published.step_ms(0, 8, 8000) + step)
