"""A Llama-3.1-8B-shaped step model on an H100 with round efficiency factors: the toy engine
the simulation tests step through (its numbers are made up on purpose, so a test checks the
simulation's arithmetic, not the calibration)."""

from __future__ import annotations

from inferwise.calculators.roofline import Efficiency, Hardware, StepModel, dense_shape

H100 = Hardware("h100", 989.5, 3350, "nvlink", 450)
EFF = Efficiency(0.5, 0.8, 1.5, 0.01, 10.0, 0.7)


def toy_8b(**kw) -> StepModel:
    shape = dense_shape(
        "llama-8b",
        8.03e9,
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        head_dim=128,
        num_kv_heads=8,
        vocab_size=128_256,
    )
    kw.setdefault("kv_capacity_tokens", 400_000)
    kw.setdefault("max_num_seqs", 256)
    kw.setdefault("max_num_batched_tokens", 8192)
    return StepModel(shape, H100, EFF, **kw)
