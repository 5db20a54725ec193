"""The lines a user runs: start the recommended replica, and probe it at its design load."""

from __future__ import annotations

import json
import shlex

from .screen import Screened
from .space import FP8, INT4, Config
from .spec import SearchSpec

VERIFY_REQUESTS = 200
"""Enough requests for a p95 with a few samples beyond it; a minute or two of load."""


def serve_command(s: Screened, spec: SearchSpec) -> str:
    """The exact engine start line of one replica."""
    c = s.config
    if spec.engine == "trtllm":
        return _trtllm_serve(s)
    if spec.engine == "sglang":
        parts = [
            "python -m sglang.launch_server",
            f"--model-path {shlex.quote(c.model)}",
            f"--tp {c.tensor_parallel_size}",
            *([f"--pp-size {c.pipeline_parallel_size}"] if c.pipeline_parallel_size > 1 else []),
            *(["--quantization fp8"] if c.quantization_flag == FP8 else []),
            *(["--kv-cache-dtype fp8_e4m3"] if c.kv_cache_dtype == "fp8" else []),
            f"--context-length {s.max_model_len}",
            f"--max-running-requests {s.max_num_seqs}",
            f"--chunked-prefill-size {s.max_num_batched_tokens}",
            *([f"--revision {shlex.quote(c.revision)}"] if c.revision else []),
            *([f"--json-model-override-args {_overrides(c)}"] if c.hf_overrides else []),
        ]
        return " ".join(parts)
    parts = [
        f"vllm serve {shlex.quote(c.model)}",
        *([f"--revision {shlex.quote(c.revision)}"] if c.revision else []),
        f"--tensor-parallel-size {c.tensor_parallel_size}",
        *(
            [f"--pipeline-parallel-size {c.pipeline_parallel_size}"]
            if c.pipeline_parallel_size > 1
            else []
        ),
        *(["--quantization fp8"] if c.quantization_flag == FP8 else []),
        *(["--kv-cache-dtype fp8"] if c.kv_cache_dtype == "fp8" else []),
        f"--max-model-len {s.max_model_len}",
        f"--max-num-seqs {s.max_num_seqs}",
        f"--max-num-batched-tokens {s.max_num_batched_tokens}",
        "--gpu-memory-utilization 0.9",
        *([f"--hf-overrides {_overrides(c)}"] if c.hf_overrides else []),
    ]
    line = " ".join(parts)
    if c.quantization == INT4:
        # the weights must come from an INT4 checkpoint of the model; vLLM reads its config
        line = line.replace(
            f"serve {shlex.quote(c.model)}", f"serve <AWQ/GPTQ INT4 checkpoint of {c.model}>"
        )
    return line


def _overrides(c: Config) -> str:
    """The config overrides as the JSON object vLLM's --hf-overrides and SGLang's
    --json-model-override-args take, shell-quoted; each value typed as the calculators read it
    (``model_type=llama4_text`` a string, ``num_key_value_heads=8`` a number)."""
    from ..architecture import parse_override

    return shlex.quote(json.dumps({k: parse_override(v) for k, v in c.hf_overrides}))


def _trtllm_serve(s: Screened) -> str:
    """trtllm-serve (PyTorch backend). It quantizes nothing at start-up: FP8 and INT4
    weights come from a pre-quantized (ModelOpt / AWQ) checkpoint; an FP8 KV cache is a
    kv_cache_config setting in the extra options file."""
    c = s.config
    model = (
        shlex.quote(c.model) if not c.revision else f"<local snapshot of {c.model} at {c.revision}>"
    )
    if c.quantization_flag == FP8:
        model = f"<FP8 (ModelOpt) checkpoint of {c.model}>"
    elif c.quantization == INT4:
        model = f"<INT4 AWQ checkpoint of {c.model}>"
    parts = [
        f"trtllm-serve {model}",
        "--backend pytorch",
        f"--tp_size {c.tensor_parallel_size}",
        f"--pp_size {c.pipeline_parallel_size}",
        f"--max_seq_len {s.max_model_len}",
        f"--max_batch_size {s.max_num_seqs}",
        f"--max_num_tokens {s.max_num_batched_tokens}",
        "--kv_cache_free_gpu_memory_fraction 0.9",
    ]
    if c.kv_cache_dtype == "fp8":
        parts.append(
            "--extra_llm_api_options kv-fp8.yaml  # kv-fp8.yaml: kv_cache_config: {dtype: fp8}"
        )
    return " ".join(parts)


def verify_command(s: Screened, spec: SearchSpec, design_rate_per_s: float) -> str:
    """The probe that confirms the prediction at one replica's design load."""
    inp, out = spec.input_tokens, spec.output_tokens
    parts = [
        "inferwise probe http://HOST:8000",
        f"--model {shlex.quote(s.config.model)}",
        f"--request-rate {design_rate_per_s:.3g}",
        f"--requests {VERIFY_REQUESTS}",
        f"--input-tokens {round(inp.mean)}",
        f"--output-tokens {round(out.mean)}",
    ]
    if inp.p95:
        parts.append(f"--input-distribution lognormal --input-spread {inp.cv:.2f}")
    if out.p95:
        parts.append(f"--output-distribution lognormal --output-spread {out.cv:.2f}")
    parts.append("--ignore-eos")
    for metric, slo in (
        ("ttft_ms", spec.slo_ttft_ms),
        ("itl_ms", spec.slo_itl_ms),
        ("e2e_ms", spec.slo_e2e_ms),
    ):
        if slo:
            parts.append(f"--slo {metric}={slo[max(slo, key=lambda k: float(k[1:]))]:g}")
    return " ".join(parts)
