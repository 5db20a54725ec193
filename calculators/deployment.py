"""The deployment description shared by `fit`, `predict` and `budget`.

Flag names follow vLLM's engine arguments wherever vLLM has one, so a user can
paste the flags they already serve with. Engine defaults are left as `None`
here and resolved by the engine policy, because they differ between engines
and engine versions.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

MAX_TOKENS = 1 << 30
"""A bound on any token length or budget: far above the longest context any model has
(10M tokens), low enough that arithmetic on it stays exact and fast."""
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"]
Dtype = Literal["auto", "bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32"]


def _override_text(value: Any) -> Any:
    """vLLM's --hf-overrides is a JSON object: from the CLI its values arrive as text, from
    an MCP client or a workload file as JSON numbers, booleans or objects. Each becomes the
    text the config reader parses as JSON (architecture.parse_override), so both spell the
    same override."""
    if not isinstance(value, dict):
        return value
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


MAX_HF_OVERRIDES = 64
"""Overridden config.json fields per request: a config has a few dozen fields in all."""
HfOverrides = Annotated[
    # the bound before the validator: so it reads as maxProperties in the JSON schema
    dict[str, str], Field(max_length=MAX_HF_OVERRIDES), BeforeValidator(_override_text)
]
"""config.json overrides, KEY -> value as JSON text (see :func:`_override_text`), bounded."""


class Deployment(BaseModel):
    """One replica of a model served by an engine on a set of GPUs."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description=(
            "Model: a Hugging Face id from the built-in catalog (e.g. meta-llama/Llama-3.1-8B-Instruct), "
            "or a path to a config.json or a model folder."
        ),
        min_length=1,
        max_length=4096,
    )
    revision: str | None = Field(
        default=None,
        max_length=200,
        description="Hub revision of the model (branch, tag or commit); default: main. "
        "The commit used is reported as model_revision.",
    )
    gpu: str | None = Field(
        default=None,
        description="GPU type from the catalog (e.g. h100-sxm-80gb, h200, a100-sxm-80gb, l40s, mi300x; "
        "nvidia-smi names work too). Either this or gpu_memory_gib is required.",
        max_length=200,
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="Total memory per GPU in GiB (2^30 bytes) as the runtime reports it, for a GPU not in the catalog.",
    )
    memory_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="Memory bandwidth per device in GB/s (10^9 B/s) for hardware outside the catalog "
        "(with gpu_memory_gib and tflops; e.g. a CPU host).",
    )
    tflops: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="Dense 16-bit matmul peak per device in TFLOPS, for hardware outside the catalog.",
    )
    num_gpus: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GPUs in the replica; defaults to tensor_parallel_size x pipeline_parallel_size.",
    )
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=128,
        description="Tensor-parallel degree (vLLM -tp).",
        json_schema_extra={"cli_aliases": ["-tp"]},
    )
    pipeline_parallel_size: int = Field(
        default=1,
        ge=1,
        le=128,
        description="Pipeline-parallel degree (vLLM -pp).",
        json_schema_extra={"cli_aliases": ["-pp"]},
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Fraction of each GPU's total memory the engine may use (vLLM --gpu-memory-utilization; SGLang --mem-fraction-static).",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Maximum context length in tokens (prompt + output); default: the model's maximum.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Maximum sequences running at once (vLLM --max-num-seqs); default: the engine's.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Token budget of one engine step (vLLM --max-num-batched-tokens); default: the engine's.",
    )
    hf_overrides: HfOverrides = Field(
        default_factory=dict,
        description="config.json fields to override, KEY=VALUE as vLLM's --hf-overrides, values "
        "as JSON (e.g. model_type=llama4_text); supplies facts a config lacks.",
    )
    dtype: Dtype = Field(
        default="auto", description="Weight/activation dtype; auto = the checkpoint's torch_dtype."
    )
    quantization: str | None = Field(
        default=None,
        description="Weight quantization method (fp8, awq, gptq, compressed-tensors, bitsandbytes, mxfp4, ...); "
        "default: what the checkpoint's quantization_config says.",
        max_length=100,
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default="auto", description="KV cache dtype (vLLM --kv-cache-dtype)."
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="KV cache block (page) size in tokens; default: the engine's (vLLM 16).",
    )
    enforce_eager: bool = Field(
        default=False, description="Disable CUDA graphs (vLLM --enforce-eager)."
    )
    engine: Literal["vllm", "sglang", "trtllm"] = Field(
        default="vllm",
        description="Serving engine whose memory policy, admission and efficiency factors apply "
        "(trtllm: TensorRT-LLM / NIM, KV cache from free memory, no-evict admission).",
    )
    engine_version: str | None = Field(
        default=None,
        max_length=50,
        description="Engine release (e.g. 0.11.0); default: the current stable release the rules know.",
    )
    scheduler_recv_interval: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="SGLang --scheduler-recv-interval: decode steps between the scheduler's "
        "intakes of new requests (it also takes them in right after a prompt step), so an "
        "arrival waits for the next intake. Default 1 (every step); SGLang only.",
    )

    @field_validator("model", "gpu", "quantization", "engine_version", "revision")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty or blank")
        return v

    @model_validator(mode="after")
    def _needs_gpu(self) -> Deployment:
        if self.gpu is None and self.gpu_memory_gib is None:
            raise ValueError("give gpu (a catalog id such as h100-sxm-80gb) or gpu_memory_gib")
        if self.scheduler_recv_interval is not None and self.engine != "sglang":
            raise ValueError(
                f"scheduler_recv_interval is an SGLang setting; add --engine sglang "
                f"(engine is {self.engine})"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def gpus_named(self) -> int:
        """GPUs the request names (default: one replica's), at least one replica's; more
        are data-parallel replicas, which each calculator reads in its own way."""
        from .errors import InputError

        gpus = self.num_gpus or self.world_size
        if gpus < self.world_size:
            raise InputError(
                "num_gpus",
                f"{gpus} GPUs cannot hold tensor_parallel_size x pipeline_parallel_size = "
                f"{self.world_size}",
                f">= {self.world_size}",
            )
        return gpus
