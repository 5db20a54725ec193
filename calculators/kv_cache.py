"""KV cache bytes per token, per layer type and per GPU, as the engine lays it out.

The layout follows vLLM's ``vllm/v1/kv_cache_interface.py`` (0.9 - 0.2x):

* full and sliding-window attention store K and V for each KV head on the
  rank: ``2 x kv_heads_per_rank x head_dim x dtype bytes`` per token and layer
  (``AttentionSpec.real_page_size_bytes`` divided by ``block_size``);
* tensor parallelism splits KV heads; below one head per rank the heads are
  replicated, each rank holding one (``num_kv_heads = max(1, total // tp)``,
  vLLM ``LlamaAttention``/``QKVParallelLinear``);
* MLA keeps one latent of ``kv_lora_rank + qk_rope_head_dim`` values per
  token and layer, *not* split by tensor parallelism (``MLAAttentionSpec``,
  ``num_kv_heads = 1``);
* DeepSeek-V3.2 adds its indexer's key cache to every MLA layer (132 bytes
  per token, uint8 FP8 values plus scales, also not split), and under an fp8
  --kv-cache-dtype stores the latent in vLLM's 656-byte ``fp8_ds_mla`` layout;
* pipeline parallelism gives each stage its own layers; the stage with the
  most layers of the costliest kind is the most loaded.

A sliding-window or chunked (Llama 4) layer costs the same per *stored* token
as a full one; what differs is how many tokens a request keeps (the window, the
chunk), which the engine policy accounts for when it turns bytes into a token
capacity.

Hybrid models (Jamba, Nemotron-H, Granite 4.0 H, Qwen3-Next): only their
attention layers pay per token; each Mamba / Gated DeltaNet layer holds one
fixed state per sequence (:func:`ssm_state_bytes`, vLLM ``MambaSpec``), which
the engine policy places in pages of the attention page size.

Public API: :func:`kv_cache_bytes_per_element`, :func:`kv_bytes_per_token`
-> :class:`KVBytesPerToken`, :func:`ssm_state_bytes` -> :class:`SSMStateBytes`.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .architecture import ATTENTION_KINDS, STATE_KINDS, ModelArchitecture
from .errors import InputError
from .params import pp_layer_split

KV_DTYPE_BYTES = {
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
}


def kv_cache_bytes_per_element(kv_cache_dtype: str, model_dtype_bytes: float) -> float:
    """Bytes per cached value: ``auto`` follows the model's activation dtype."""
    if kv_cache_dtype == "auto":
        return model_dtype_bytes
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        raise InputError(
            "kv_cache_dtype",
            f"unknown KV cache dtype '{kv_cache_dtype}'",
            accepted="auto, " + ", ".join(KV_DTYPE_BYTES),
        ) from None


def engine_kv_cache_dtype(
    kv_cache_dtype: str, engine: str, quantization_config: dict[str, Any] | None
) -> str:
    """The KV dtype an engine runs for ``kv_cache_dtype``. TensorRT-LLM's ``auto`` is the
    checkpoint's own (its kv_cache_config docs: "uses the data type specified in the model
    checkpoint"), so a ModelOpt export with ``kv_cache_quant_algo: FP8`` caches FP8; vLLM's
    and SGLang's ``auto`` stay the model dtype whatever the checkpoint says."""
    from .quantization import modelopt_field

    if kv_cache_dtype != "auto" or engine != "trtllm" or not quantization_config:
        return kv_cache_dtype
    algo = modelopt_field(quantization_config, "kv_cache_quant_algo")
    return "fp8" if str(algo or "").upper() == "FP8" else kv_cache_dtype


def kv_heads_per_rank(arch: ModelArchitecture, tensor_parallel_size: int) -> int:
    """KV heads each tensor-parallel rank stores (replicated below one per rank)."""
    if arch.mla is not None:
        return 1
    return max(1, arch.num_kv_heads // tensor_parallel_size)


FP8_DS_MLA_BYTES_PER_TOKEN = 656
"""DeepSeek-V3.2's FP8 MLA cache entry (vLLM ``fp8_ds_mla``, MLAAttentionSpec:
``block_size * 656``): 512 FP8 latent values, 4 float32 scales, 64 bf16 RoPE values.
vLLM switches a V3.2 model to it whenever --kv-cache-dtype is an fp8 one
(DeepseekV32ForCausalLM.verify_and_update_config)."""


def mla_layer_bytes_per_token(arch: ModelArchitecture, elem: float) -> int:
    """Bytes one token costs in one MLA layer: the latent, plus V3.2's indexer key
    (its own uint8 cache in the same layer slot; vLLM gives every layer of a
    uniform-type model one tensor per layer and one block count)."""
    assert arch.mla is not None
    if arch.indexer is not None:
        latent = FP8_DS_MLA_BYTES_PER_TOKEN if elem == 1 else int(head_size_per_token(arch) * elem)
        return latent + arch.indexer.cache_bytes_per_token
    return int(head_size_per_token(arch) * elem)


def head_size_per_token(arch: ModelArchitecture) -> int:
    """Values stored per token, head and layer: K and V for attention, one latent for MLA."""
    if arch.mla is not None:
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    return 2 * arch.head_dim


@dataclass(frozen=True)
class KVBytesPerToken:
    """KV bytes one token costs.

    ``per_layer`` is per layer kind on one GPU; ``per_gpu`` sums the layers
    of the most loaded pipeline stage on one GPU (what one rank pays for a
    token kept in every layer); ``total`` sums all layers and all ranks of
    the replica (replicated KV heads counted on each rank that holds them).
    """

    per_layer: dict[str, int]
    per_gpu: int
    total: int
    layers_per_stage: tuple[dict[str, int], ...]
    """Layer counts by kind for each pipeline stage."""
    element_bytes: float
    kv_heads_per_rank: int
    notes: tuple[str, ...] = field(default=())
    state_bytes_per_layer: int = 0
    """Hybrid models: the recurrent state one sequence holds in one Mamba /
    DeltaNet layer on one GPU (vLLM ``MambaSpec.page_size_bytes`` unpadded);
    0 for attention-only models."""
    state: SSMStateBytes | None = None


@dataclass(frozen=True)
class SSMStateBytes:
    """Per-sequence state of one Mamba / Gated DeltaNet layer on one GPU, as vLLM's
    ``MambaStateShapeCalculator`` and ``MambaStateDtypeCalculator`` size it."""

    conv_shape: tuple[int, int]
    """(kernel - 1, conv channels per rank): the last inputs of the causal conv."""
    temporal_shape: tuple[int, ...]
    """Mamba-1 (channels, d_state); Mamba-2 (heads, head_dim, d_state); DeltaNet
    (value heads, value dim, key dim), per rank."""
    conv_dtype_bytes: float
    temporal_dtype_bytes: float

    @property
    def conv_bytes(self) -> int:
        return int(self.conv_shape[0] * self.conv_shape[1] * self.conv_dtype_bytes)

    @property
    def temporal_bytes(self) -> int:
        n = 1
        for d in self.temporal_shape:
            n *= d
        return int(n * self.temporal_dtype_bytes)

    @property
    def total_bytes(self) -> int:
        return self.conv_bytes + self.temporal_bytes


def _extra_groups(n_groups: int, tp: int) -> int:
    """Mamba-2 groups added so each rank holds the groups its heads read
    (``extra_groups_for_head_shards``): none when tp divides the groups."""
    return 0 if n_groups % tp == 0 else tp - n_groups


def ssm_state_bytes(
    arch: ModelArchitecture, tensor_parallel_size: int, model_dtype_bytes: float
) -> SSMStateBytes:
    """State one sequence keeps per Mamba / DeltaNet layer on one rank.

    vllm/model_executor/layers/mamba/mamba_utils.py: the conv state holds
    ``conv_kernel - 1`` inputs of every conv channel; the temporal (SSM or
    recurrent) state is heads x head_dim x state for Mamba-2, channels x state
    for Mamba-1, value heads x value dim x key dim for Gated DeltaNet; both
    split by tensor parallelism. Dtypes: ``--mamba-cache-dtype auto`` and
    ``--mamba-ssm-cache-dtype auto`` follow the model dtype, not
    ``--kv-cache-dtype`` (``MambaStateDtypeCalculator``); a config-stated
    ``mamba_ssm_cache_dtype`` sets the temporal one. Speculative tokens would
    lengthen the conv state (not modelled: no speculative decoding here).
    """
    s = arch.ssm
    if s is None:
        raise InputError("model", "this model has no state-space layers")
    tp = tensor_parallel_size
    if s.kind == "mamba2":
        groups = s.n_groups + _extra_groups(s.n_groups, tp)
        conv_dim = s.intermediate_size + 2 * groups * s.state_size
        temporal: tuple[int, ...] = (s.num_heads // tp, s.head_dim, s.state_size)
    elif s.kind == "gated_deltanet":
        conv_dim = s.conv_dim
        temporal = (s.num_heads // tp, s.head_dim, s.head_k_dim)
    else:
        conv_dim = s.intermediate_size
        temporal = (s.intermediate_size // tp, s.state_size)
    temporal_bytes = KV_DTYPE_BYTES[s.ssm_state_dtype] if s.ssm_state_dtype else model_dtype_bytes
    return SSMStateBytes(
        conv_shape=(s.conv_kernel - 1, conv_dim // tp),
        temporal_shape=temporal,
        conv_dtype_bytes=model_dtype_bytes,
        temporal_dtype_bytes=temporal_bytes,
    )


def kv_bytes_per_token(
    arch: ModelArchitecture,
    kv_cache_dtype: str,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    model_dtype_bytes: float = 2,
) -> KVBytesPerToken:
    """Per-token KV cost by layer kind, on the most loaded GPU and in total."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    elem = kv_cache_bytes_per_element(kv_cache_dtype, model_dtype_bytes)
    heads = kv_heads_per_rank(arch, tp)
    if arch.mla is not None:
        per_layer_bytes = mla_layer_bytes_per_token(arch, elem)
    else:
        per_layer_bytes = int(heads * head_size_per_token(arch) * elem)
    # only attention layers pay per token; Mamba / DeltaNet layers hold a state per sequence
    per_layer = {k: per_layer_bytes for k in sorted(set(arch.layer_kinds)) if k in ATTENTION_KINDS}
    stages: list[dict[str, int]] = []
    for r in pp_layer_split(arch.num_layers, pp):
        counts: dict[str, int] = {}
        for i in r:
            counts[arch.layer_kinds[i]] = counts.get(arch.layer_kinds[i], 0) + 1
        stages.append(counts)
    per_gpu = max(sum(per_layer.get(k, 0) * n for k, n in s.items()) for s in stages)
    total = per_layer_bytes * arch.attention_layers * tp
    notes: list[str] = []
    state = None
    if arch.is_hybrid_ssm:
        state = ssm_state_bytes(arch, tp, model_dtype_bytes)
        state_layers = sum(1 for k in arch.layer_kinds if k in STATE_KINDS)
        notes.append(
            f"{state_layers} of {arch.num_layers} layers are {arch.ssm.kind} layers "  # type: ignore[union-attr]
            f"holding a fixed state per sequence ({state.total_bytes:,} bytes per layer and GPU: "
            f"conv {state.conv_bytes:,} + recurrent {state.temporal_bytes:,}), not per-token KV"
        )
    if arch.mla is None and arch.num_kv_heads < tp:
        notes.append(
            f"{arch.num_kv_heads} KV heads < tensor parallel {tp}: each rank keeps a replica of one head"
        )
    if arch.mla is not None and tp > 1:
        notes.append("MLA latent cache is replicated on every tensor-parallel rank, not split")
    if arch.indexer is not None:
        notes.append(
            f"DeepSeek-V3.2 indexer keys: {arch.indexer.cache_bytes_per_token} bytes per token "
            "and layer (FP8 values + fp32 scales), cached next to the MLA latent"
            + (" (fp8_ds_mla layout, 656 bytes)" if elem == 1 else "")
        )
    return KVBytesPerToken(
        per_layer=per_layer,
        per_gpu=per_gpu,
        total=total,
        layers_per_stage=tuple(stages),
        element_bytes=elem,
        kv_heads_per_rank=heads,
        notes=tuple(notes),
        state_bytes_per_layer=state.total_bytes if state else 0,
        state=state,
    )
