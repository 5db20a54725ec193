"""The search space: every replica configuration worth asking the calculators about.

A configuration is one model served one way on one GPU type: parallelism,
weight precision, KV cache dtype, context window and the two batch limits.
Dimensions exist only where the model, GPU and engine support them; a class
that is skipped is recorded with its reason (it ends up in ``rejected``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TENSOR_PARALLEL = (1, 2, 4, 8)
GPUS_PER_NODE = 8
"""Tensor parallelism stays inside one node (NVLink/xGMI); beyond it, pipeline stages."""
MAX_NUM_SEQS_LADDER: tuple[int | None, ...] = (64, 128, None, 512)
"""None = the engine release's default (what the fit resolves); the others bracket it."""
BATCHED_TOKENS_LADDER: tuple[int | None, ...] = (2048, None, 16384)
"""The chunked-prefill budget per step: small keeps ITL flat, large keeps TTFT low."""
BF16 = "bf16"
FP8 = "fp8"
INT4 = "int4"


@dataclass(frozen=True)
class Config:
    """One replica configuration (what a ``vllm serve`` line fixes)."""

    model: str
    revision: str | None
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    quantization: str
    """bf16 | fp8 | int4 | the checkpoint's own method."""
    kv_cache_dtype: str
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    from_checkpoint: bool = False
    """The weights are the checkpoint's own quantization (no --quantization flag)."""
    hf_overrides: tuple[tuple[str, str], ...] = ()
    """config.json overrides the engine is started with (vLLM's --hf-overrides)."""

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def quantization_flag(self) -> str | None:
        """The deployment's ``quantization`` field: None for the checkpoint's own."""
        if self.from_checkpoint:
            return None
        return self.quantization if self.quantization in (FP8, INT4) else None

    def label(self) -> str:
        parts = [
            self.model.rsplit("/", 1)[-1],
            self.gpu,
            f"tp{self.tensor_parallel_size}",
            *([f"pp{self.pipeline_parallel_size}"] if self.pipeline_parallel_size > 1 else []),
            self.quantization,
            f"kv-{self.kv_cache_dtype}",
            f"seqs-{self.max_num_seqs or 'default'}",
            f"mbt-{self.max_num_batched_tokens or 'default'}",
        ]
        return " ".join(parts)

    def group(self) -> tuple[Any, ...]:
        """The configurations that share one memory layout apart from the batch limits."""
        return (
            self.model,
            self.gpu,
            self.tensor_parallel_size,
            self.pipeline_parallel_size,
            self.quantization,
            self.kv_cache_dtype,
        )


@dataclass
class Rejections:
    """Configurations left out, by reason: a count and one example each (``rejected``).

    Classes skipped before any calculation and configurations ruled out later by the
    screen or the simulation land in the same tally."""

    items: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, reason: str, example: str, count: int = 1) -> None:
        entry = self.items.setdefault(reason, [0, example])
        entry[0] += count


@dataclass(frozen=True)
class ModelFacts:
    """What the search needs to know about a model before sizing it."""

    model: str
    revision: str | None
    checkpoint_quantization: str | None
    """The checkpoint's own method (fp8, awq, ...), None when it is 16-bit."""
    is_moe: bool
    num_kv_heads: int
    hf_overrides: tuple[tuple[str, str], ...] = ()
    """config.json overrides (vLLM's --hf-overrides) as sorted pairs: a frozen value."""


@dataclass(frozen=True)
class GpuFacts:
    id: str
    has_fp8: bool


def weight_options(m: ModelFacts, g: GpuFacts, skipped: Rejections) -> list[str]:
    """Weight precisions to try for this model on this GPU."""
    if m.checkpoint_quantization:
        return [m.checkpoint_quantization]
    out = [BF16]
    if g.has_fp8:
        out.append(FP8)
    else:
        skipped.add(
            "fp8 weights skipped: the GPU has no FP8 tensor cores (Hopper, Ada, Blackwell, MI300)",
            f"{m.model} {g.id} fp8",
            1,
        )
    out.append(INT4)
    return out


def kv_options(g: GpuFacts, skipped: Rejections, model: str) -> list[str]:
    if g.has_fp8:
        return ["auto", "fp8"]
    skipped.add("fp8 KV cache skipped: the GPU has no FP8 units", f"{model} {g.id} kv-fp8", 1)
    return ["auto"]


def parallel_options(max_gpus: int | None) -> list[tuple[int, int]]:
    """(tensor, pipeline) degrees: TP within a node, then two pipeline stages of a full node."""
    out = [(tp, 1) for tp in TENSOR_PARALLEL if max_gpus is None or tp <= max_gpus]
    if max_gpus is None or max_gpus >= 2 * GPUS_PER_NODE:
        out.append((GPUS_PER_NODE, 2))
    return out


def batch_options() -> list[tuple[int | None, int | None]]:
    return [(s, t) for s in MAX_NUM_SEQS_LADDER for t in BATCHED_TOKENS_LADDER]


def configurations(
    models: list[ModelFacts], gpus: list[GpuFacts], max_gpus: int | None, skipped: Rejections
) -> list[Config]:
    """Every configuration of the space, grouped so one memory layout's variants are adjacent."""
    out: list[Config] = []
    for m in models:
        if m.is_moe:
            skipped.add(
                "expert parallelism not searched: the step model shards experts as tensor "
                "parallelism does (same memory per GPU) and has no all-to-all term; measure "
                "--enable-expert-parallel against the recommended TP",
                f"{m.model} --enable-expert-parallel",
                len(gpus),
            )
        for g in gpus:
            kvs = kv_options(g, skipped, m.model)
            for quant in weight_options(m, g, skipped):
                for kv in kvs:
                    for tp, pp in parallel_options(max_gpus):
                        for seqs, mbt in batch_options():
                            out.append(
                                Config(
                                    m.model,
                                    m.revision,
                                    g.id,
                                    tp,
                                    pp,
                                    quant,
                                    kv,
                                    seqs,
                                    mbt,
                                    from_checkpoint=quant == m.checkpoint_quantization,
                                    hf_overrides=m.hf_overrides,
                                )
                            )
    if max_gpus is not None and max_gpus < 2 * GPUS_PER_NODE:
        skipped.add(
            f"pipeline parallelism over two nodes skipped: constraints.max_gpus {max_gpus} < 16",
            "tp8 pp2",
            len(models) * len(gpus),
        )
    return out
