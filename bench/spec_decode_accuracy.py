"""How close the speculative-decoding step model comes to published speed-ups.

Reads tests/data/spec_decode_measurements.toml. For the calibration case it re-derives
the two drafter overheads stored in calculators/data/spec_decode.toml (per head forward,
per speculative step) from the measured speed-ups; for the held-out cases it prints each
predicted batch-1 speed-up beside the published one, with the error, and the best K
each side picks.

    .venv/bin/python -m bench.spec_decode_accuracy
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferwise.calculators import spec_decode as sd
from inferwise.calculators.predict import PredictRequest
from inferwise.calculators.roofline import StepModel

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "spec_decode_measurements.toml"
CONTEXT_TOKENS = 256.0
"""Mean context during decode in these MT-Bench runs: ~128-token prompts, 256-token outputs."""


def load_cases() -> list[dict[str, Any]]:
    with DATA.open("rb") as fh:
        return list(tomllib.load(fh)["case"])


def _models(case: dict[str, Any], k: int, tau: float) -> tuple[Any, Any, Any]:
    """The request, target step model and drafter of one case at K and its measured TAU."""
    req = PredictRequest(
        model=case["model"],
        gpu=case["gpu"],
        engine_version=case["engine_version"],
        speculative_method=case["method"],
        num_speculative_tokens=k,
        spec_acceptance_length=tau,
    )
    target = StepModel.from_deployment(req)
    return req, target, sd.build_drafter(req, target)


def predicted_speedups(case: dict[str, Any]) -> list[float]:
    """Batch-1 ITL speed-up per K of the case, the measured acceptance length as input."""
    out = []
    for k, tau in zip(case["k"], case["acceptance_length"], strict=True):
        req, target, drafter = _models(case, k, tau)
        acc = sd.resolve_acceptance(req)
        out.append(sd.itl_speedup(drafter, target, acc, 1, CONTEXT_TOKENS, k))
    return out


def calibrate(case: dict[str, Any]) -> tuple[float, float]:
    """(per head forward, per speculative step) overheads in ms that make the model meet the
    case's two measured speed-ups exactly: the step time they imply, minus the roofline's
    verify and head forwards, is linear in K."""
    residual = []
    for k, tau, speedup in zip(case["k"], case["acceptance_length"], case["speedup"], strict=True):
        req, target, drafter = _models(case, k, tau)
        bare = replace(
            drafter.forward, efficiency=replace(drafter.forward.efficiency, step_overhead_ms=0.0)
        )
        head = bare.step_ms(0, 1, int(CONTEXT_TOKENS))
        need = tau * target.decode_ms(1, CONTEXT_TOKENS) / speedup
        residual.append((k, need - sd.verify_ms(target, 1, CONTEXT_TOKENS, k) - k * head))
    (k1, r1), (k2, r2) = residual[0], residual[-1]
    per_forward = (r2 - r1) / (k2 - k1)
    return per_forward, r1 - k1 * per_forward


def main() -> None:
    for case in load_cases():
        print(f"\n[{case['role']}] {case['method']} on {case['model']} ({case['gpu']})")
        print(f"  {case['source']}")
        if case["role"] == "calibration":
            fwd, step = calibrate(case)
            print(
                f"  calibrated: draft_forward_overhead_ms = {fwd:.2f}, spec_step_overhead_ms = {step:.2f}"
            )
        pred = predicted_speedups(case)
        print("   K   TAU  published  predicted   error")
        for k, tau, pub, p in zip(
            case["k"], case["acceptance_length"], case["speedup"], pred, strict=True
        ):
            print(f"  {k:2d}  {tau:4.2f}  {pub:8.3f}x  {p:8.3f}x  {(p / pub - 1) * 100:+6.1f}%")
        best_pub = case["k"][max(range(len(pred)), key=lambda i: case["speedup"][i])]
        best_pred = case["k"][max(range(len(pred)), key=lambda i: pred[i])]
        print(f"  best K: published {best_pub}, predicted {best_pred}")


if __name__ == "__main__":
    main()
