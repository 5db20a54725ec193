"""Time of one engine step of a continuous-batching server, from first principles.

An engine step (one forward pass of vLLM/SGLang) runs the new prompt tokens
being prefilled and one token for every sequence being decoded, all in one
batch. Its time on each GPU of a replica is bounded by

* compute: 2 x active parameters x tokens (the matmuls) plus the attention
  term, which grows with the context each query attends to, at an achievable
  fraction of the GPU's dense peak;
* memory: the weights read once per step (for MoE: only the experts the
  batch touches) plus the KV cache of every sequence in the batch, at an
  achievable fraction of peak bandwidth;

whichever is larger, plus the tensor-parallel all-reduces (two per layer, a
latency and a bandwidth term, not overlapped with compute in vLLM/SGLang) and
a per-step engine overhead (scheduling, kernel launches, sampling). The
achievable fractions and overheads are *calibrated* on published
measurements (see ``calibration`` and ``data/efficiency.toml``), never guessed
here.

Stable API for the simulator and the simulated engine (``inferwise sim``):

* :meth:`StepModel.from_deployment` ``(dep) -> StepModel``
* :meth:`StepModel.step_ms` ``(prefill_tokens, decode_seqs, kv_tokens) -> float``
* :attr:`StepModel.kv_capacity_tokens`, :attr:`StepModel.max_num_seqs`,
  :attr:`StepModel.max_num_batched_tokens`

Stdlib only at module level; ``step_ms_array`` imports numpy when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .deployment import Deployment

Bound = Literal["compute", "memory-bandwidth", "communication", "overhead"]


@dataclass(frozen=True)
class ModelShape:
    """The model facts the step time depends on, for the whole model (not split).

    Parameters are counted in matmul weights: embeddings are looked up, not
    multiplied, so they are excluded; the LM head is included (it runs for
    every token that is sampled).
    """

    name: str
    num_layers: int
    hidden_size: int
    dense_params: float
    """Matmul parameters every token uses: attention, dense MLPs, shared
    experts, routers, LM head."""
    attn_flops_per_pair: float
    """FLOPs per (query token, context token) pair summed over layers:
    2 x heads x (qk_dim + v_dim) x layers (QK^T and PV)."""
    bytes_per_param: float
    """Average stored bytes per weight (2 for bf16, ~1 for fp8, ~0.55 for 4-bit with scales)."""
    kv_bytes_per_token: float
    """KV cache bytes per token for the whole model (all layers, all KV heads)."""
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    """Parameters of one routed expert in one layer."""
    moe_layers: int = 0
    lm_head_params: float = 0.0
    """Part of ``dense_params`` that only runs for sampled tokens."""
    activation_bytes: float = 2.0
    """Bytes per activation element on the all-reduce wire (bf16)."""
    num_kv_heads: int = 0
    """For KV replication under tensor parallelism (0 = not replicated / MLA handled by caller)."""

    @property
    def active_params(self) -> float:
        return self.dense_params + self.moe_layers * self.experts_per_token * self.expert_params

    @property
    def total_params(self) -> float:
        return self.dense_params + self.moe_layers * self.num_experts * self.expert_params

    def expected_experts_touched(self, tokens: float) -> float:
        """Distinct routed experts one MoE layer reads for a batch of `tokens`.

        With uniform routing each token picks k of E experts, so an expert is
        missed by all tokens with probability (1 - k/E)^tokens.
        """
        if self.num_experts == 0:
            return 0.0
        return self.num_experts * (
            1.0 - (1.0 - self.experts_per_token / self.num_experts) ** tokens
        )


@dataclass(frozen=True)
class Hardware:
    """One GPU as the roofline sees it."""

    name: str
    peak_tflops: float
    """Dense peak for the dtype the matmuls run in."""
    bandwidth_gb_per_s: float
    """Vendor memory bandwidth, 10^9 B/s."""
    interconnect: str
    """nvlink | xgmi | pcie | nvlink-bridge."""
    link_gb_per_s: float
    """Per GPU, one direction, 10^9 B/s."""


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak and fixed costs: the calibrated factors."""

    compute_fraction: float
    bandwidth_fraction: float
    step_overhead_ms: float
    """Per engine step: scheduling, launches, sampling set-up (CUDA graphs on)."""
    per_seq_overhead_ms: float
    """Per sequence in the step: sampling, detokenization, bookkeeping."""
    allreduce_latency_us: float
    """Fixed cost of one small all-reduce on this interconnect."""
    link_fraction: float
    """Achievable fraction of the link bandwidth in an all-reduce."""
    eager_overhead_factor: float = 3.0
    """Multiplier on the step overhead without CUDA graphs (--enforce-eager)."""
    source: str = ""

    def describe(self) -> dict[str, float]:
        return {
            "compute_fraction": self.compute_fraction,
            "bandwidth_fraction": self.bandwidth_fraction,
            "step_overhead_ms": self.step_overhead_ms,
            "per_seq_overhead_ms": self.per_seq_overhead_ms,
            "allreduce_latency_us": self.allreduce_latency_us,
            "link_fraction": self.link_fraction,
        }


@dataclass(frozen=True)
class StepTimes:
    """One step's time split by bound; ``total_ms`` is what the step takes."""

    compute_ms: float
    memory_ms: float
    communication_ms: float
    overhead_ms: float
    total_ms: float
    flops: float
    bytes: float

    @property
    def bound(self) -> Bound:
        """The term that contributes most to this step's time."""
        parts: dict[Bound, float] = {
            "compute": self.compute_ms if self.compute_ms >= self.memory_ms else 0.0,
            "memory-bandwidth": self.memory_ms if self.memory_ms > self.compute_ms else 0.0,
            "communication": self.communication_ms,
            "overhead": self.overhead_ms,
        }
        return max(parts, key=lambda k: parts[k])


@dataclass(frozen=True)
class StepModel:
    """Per-step time of one replica, plus the engine limits that shape its batches."""

    shape: ModelShape
    hardware: Hardware
    efficiency: Efficiency
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_capacity_tokens: int = 1 << 30
    """KV cache tokens the engine can hold (from the fit calculator)."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False
    notes: tuple[str, ...] = field(default=())
    """Assumptions made while building the model (shown to the user)."""

    # ------------------------------------------------------------------ core arithmetic

    def _terms(
        self, prefill_tokens: Any, decode_seqs: Any, kv_tokens: Any, pairs: Any, sampled: Any
    ):
        """The four time terms in ms; works on floats and on numpy arrays alike."""
        s, hw, e = self.shape, self.hardware, self.efficiency
        tp = self.tensor_parallel_size
        tokens = prefill_tokens + decode_seqs
        # FLOPs: matmuls for every token (LM head only for sampled ones) + attention.
        body_params = s.active_params - s.lm_head_params
        flops = 2.0 * body_params * tokens + 2.0 * s.lm_head_params * sampled
        # Decode attention: one (query, key) pair per cached token read.
        flops = flops + s.attn_flops_per_pair * (pairs + kv_tokens)
        compute_ms = flops / tp / (hw.peak_tflops * 1e12 * e.compute_fraction) * 1e3
        # Bytes: weights (dense + touched experts) + KV of the whole batch, split over TP.
        weight_params = s.dense_params
        if s.num_experts:
            weight_params = (
                weight_params + s.moe_layers * s.expected_experts_touched(tokens) * s.expert_params
            )
        kv_per_gpu = s.kv_bytes_per_token / tp
        if s.num_kv_heads and s.num_kv_heads < tp:  # KV heads replicated, not split
            kv_per_gpu = s.kv_bytes_per_token / s.num_kv_heads
        nbytes = weight_params * s.bytes_per_param / tp + kv_tokens * kv_per_gpu
        memory_ms = nbytes / (hw.bandwidth_gb_per_s * 1e9 * e.bandwidth_fraction) * 1e3
        # Tensor parallel: two all-reduces per layer of tokens x hidden activations (ring).
        comm_ms = 0.0 * tokens
        if tp > 1:
            msg = tokens * s.hidden_size * s.activation_bytes
            ring = 2.0 * (tp - 1) / tp * msg / (hw.link_gb_per_s * 1e9 * e.link_fraction)
            comm_ms = 2 * s.num_layers * (e.allreduce_latency_us * 1e-6 + ring) * 1e3
        if self.pipeline_parallel_size > 1:
            msg = tokens * s.hidden_size * s.activation_bytes
            hop = e.allreduce_latency_us * 1e-6 + msg / (hw.link_gb_per_s * 1e9 * e.link_fraction)
            comm_ms = comm_ms + (self.pipeline_parallel_size - 1) * hop * 1e3
        overhead = e.step_overhead_ms * (e.eager_overhead_factor if self.enforce_eager else 1.0)
        overhead_ms = overhead + e.per_seq_overhead_ms * sampled
        return compute_ms, memory_ms, comm_ms, overhead_ms, flops, nbytes

    def breakdown(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_tokens: int,
        prefill_pairs: float | None = None,
        sampled: int | None = None,
    ) -> StepTimes:
        """Step time with its terms; see :meth:`step_ms` for the arguments."""
        pairs = prefill_tokens * prefill_tokens / 2.0 if prefill_pairs is None else prefill_pairs
        smp = decode_seqs + (1 if prefill_tokens else 0) if sampled is None else sampled
        c, m, comm, ov, flops, nbytes = self._terms(
            prefill_tokens, decode_seqs, kv_tokens, pairs, smp
        )
        return StepTimes(c, m, comm, ov, max(c, m) + comm + ov, flops, nbytes)

    def step_ms(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_tokens: int,
        prefill_pairs: float | None = None,
        sampled: int | None = None,
    ) -> float:
        """Milliseconds one engine step takes.

        prefill_tokens: prompt tokens computed in this step (all chunks).
        decode_seqs: sequences generating one token in this step.
        kv_tokens: tokens already in the KV cache that this step's decode
            sequences attend to (their contexts added up), plus the earlier
            chunks of prompts being prefilled.
        prefill_pairs: (query, key) pairs of the prefill attention; default
            ``prefill_tokens**2 / 2`` (one fresh prompt, causal).
        sampled: sequences that produce a token (default: decode_seqs, plus
            one if any prefill finishes here).
        """
        return self.breakdown(
            prefill_tokens, decode_seqs, kv_tokens, prefill_pairs, sampled
        ).total_ms

    def decode_step_ms_array(self, decode_seqs: int, kv_tokens: Any) -> Any:
        """Pure-decode step times for an array of KV sizes (the simulator's fast path)."""
        import numpy as np

        kv = np.asarray(kv_tokens, dtype=float)
        c, m, comm, ov, _, _ = self._terms(0.0, float(decode_seqs), kv, 0.0, float(decode_seqs))
        return np.maximum(c, m) + comm + ov

    # ------------------------------------------------------------------ conveniences

    def prefill_ms(self, prompt_tokens: int, context_tokens: int = 0) -> float:
        """One prompt prefilled alone, in chunks of ``max_num_batched_tokens``."""
        left, done, total = prompt_tokens, context_tokens, 0.0
        chunk = max(1, self.max_num_batched_tokens)
        while left > 0:
            c = min(chunk, left)
            pairs = c * (done + c / 2.0)
            total += self.step_ms(c, 0, done, prefill_pairs=pairs, sampled=1 if c == left else 0)
            done += c
            left -= c
        return total

    def decode_ms(self, batch: int, context_tokens: float) -> float:
        """One decode step of `batch` sequences whose mean context is `context_tokens`."""
        return self.step_ms(0, batch, int(batch * context_tokens))

    def with_efficiency(self, efficiency: Efficiency) -> StepModel:
        return replace(self, efficiency=efficiency)

    @classmethod
    def from_deployment(cls, dep: Deployment, efficiency: Efficiency | None = None) -> StepModel:
        """Build the step model of a deployment from the catalogs and the fit calculator.

        Efficiency factors default to the calibrated ones for this GPU and engine
        (``data/efficiency.toml``). Raises InputError for an unknown model or GPU,
        a GPU without a catalog entry (the roofline needs its peak figures), or a
        deployment that does not fit.
        """
        return _build_step_model(dep, efficiency)


def dense_shape(
    name: str,
    params: float,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    vocab_size: int,
    bytes_per_param: float = 2.0,
    kv_bytes_per_element: float = 2.0,
) -> ModelShape:
    """A dense decoder from its headline numbers (for tests and quick what-ifs)."""
    embed = vocab_size * hidden_size
    return ModelShape(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        dense_params=params - embed,
        attn_flops_per_pair=2.0 * num_heads * 2 * head_dim * num_layers,
        bytes_per_param=bytes_per_param,
        kv_bytes_per_token=2 * num_layers * num_kv_heads * head_dim * kv_bytes_per_element,
        lm_head_params=embed,
        num_kv_heads=num_kv_heads,
    )


def shape_from_architecture(
    arch: Any, name: str, bytes_per_param: float, kv_bytes_per_token: float
) -> ModelShape:
    """Split a normalised architecture into the parts the step time depends on.

    The split (dense vs routed-expert parameters, LM head) is what the
    roofline needs and a total count does not give: decode reads only the
    experts the batch touches, and the LM head runs only for sampled tokens.
    """
    h, n_layers = arch.hidden_size, arch.num_layers
    q, kv = arch.num_attention_heads, arch.num_kv_heads
    mla = arch.mla
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        q_proj = (
            h * arch.num_attention_heads * qk
            if mla.q_lora_rank is None
            else (h * mla.q_lora_rank + mla.q_lora_rank * q * qk)
        )
        attn = (
            q_proj
            + h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
            + mla.kv_lora_rank * q * (mla.qk_nope_head_dim + mla.v_head_dim)
            + q * mla.v_head_dim * h
        )
        pair_flops = 2.0 * q * (qk + mla.v_head_dim)
    else:
        attn = h * arch.q_size * 2 + 2 * h * kv * arch.head_dim
        pair_flops = 2.0 * q * 2 * arch.head_dim
    moe = arch.moe
    moe_layers = len(moe.moe_layers) if moe is not None else 0
    dense_mlp = 3 * h * arch.intermediate_size * (n_layers - moe_layers)
    shared = router = expert = 0.0
    if moe is not None:
        expert = 3.0 * h * moe.moe_intermediate_size
        shared = 3.0 * h * moe.shared_expert_intermediate_size * moe_layers
        router = h * moe.num_experts * moe_layers
    lm_head = float(arch.vocab_size * h)
    dense = attn * n_layers + dense_mlp + shared + router + lm_head
    return ModelShape(
        name=name,
        num_layers=n_layers,
        hidden_size=h,
        dense_params=float(dense),
        attn_flops_per_pair=pair_flops * n_layers,
        bytes_per_param=bytes_per_param,
        kv_bytes_per_token=kv_bytes_per_token,
        num_experts=moe.num_experts if moe else 0,
        experts_per_token=moe.experts_per_token if moe else 0,
        expert_params=expert,
        moe_layers=moe_layers,
        lm_head_params=lm_head,
        num_kv_heads=0 if mla is not None else kv,
    )


_FP8_METHODS = {"fp8", "fbgemm_fp8", "modelopt", "compressed-tensors-fp8", "ptpc_fp8", "w8a8_fp8"}
_INT8_METHODS = {"w8a8_int8", "smoothquant", "int8"}


def compute_dtype(quantization: str | None, gpu: Any) -> tuple[str, str]:
    """The tensor-core dtype the matmuls run in, and why.

    W8A8 FP8 checkpoints run FP8 GEMMs where the GPU has FP8 units; weight-only
    4-bit methods (AWQ, GPTQ, bitsandbytes) dequantize to 16-bit for the GEMM,
    so their FLOP rate stays BF16 while their bytes shrink.
    """
    q = (quantization or "").lower()
    if q in _FP8_METHODS and "fp8" in gpu.dense_tflops:
        return "fp8", "FP8 weights and activations run FP8 tensor-core GEMMs"
    if q in _INT8_METHODS and "int8" in gpu.dense_tflops:
        return "int8", "W8A8 INT8 runs INT8 tensor-core GEMMs"
    if q:
        return "bf16", f"{q}: GEMMs assumed at BF16 rate (weight-only or dequantizing kernels)"
    return "bf16", "BF16/FP16 GEMMs"


def _build_step_model(dep: Deployment, efficiency: Efficiency | None) -> StepModel:
    from .architecture import from_config
    from .calibration import load_efficiency
    from .catalog import get_gpu, load_model
    from .errors import InputError

    if dep.gpu is None:
        raise InputError(
            "gpu",
            "performance prediction needs a catalog GPU (its peak FLOPS and memory bandwidth); "
            "gpu_memory_gib alone is not enough",
            accepted="a catalog id such as h100-sxm-80gb, h200-sxm-141gb, a100-sxm-80gb, mi300x",
        )
    gpu = get_gpu(dep.gpu)
    source = load_model(dep.model)
    arch = from_config(source.config)
    cap = _capacity(dep, source, arch, gpu)
    quant = cap["quantization"]
    dtype_key, why = compute_dtype(quant, gpu)
    shape = shape_from_architecture(
        arch, source.hf_id, cap["bytes_per_param"], cap["kv_bytes_per_token"]
    )
    hw = Hardware(
        name=gpu.id,
        peak_tflops=gpu.dense_tflops.get(dtype_key, gpu.dense_tflops.get("bf16", 0.0)),
        bandwidth_gb_per_s=gpu.memory_bandwidth_gb_per_s,
        interconnect=gpu.interconnect,
        link_gb_per_s=gpu.interconnect_bandwidth_gb_per_s,
    )
    eff = efficiency or load_efficiency(gpu, dep.engine)
    notes = [why, *cap["notes"]]
    if dep.pipeline_parallel_size > 1:
        notes.append(
            "pipeline parallelism modelled as sequential stages (one micro-batch in flight): "
            "latency right, throughput pessimistic"
        )
    return StepModel(
        shape=shape,
        hardware=hw,
        efficiency=eff,
        tensor_parallel_size=dep.tensor_parallel_size,
        pipeline_parallel_size=dep.pipeline_parallel_size,
        kv_capacity_tokens=int(cap["kv_cache_tokens"]),
        max_num_seqs=int(cap["max_num_seqs"]),
        max_num_batched_tokens=int(cap["max_num_batched_tokens"]),
        enforce_eager=dep.enforce_eager,
        notes=tuple(notes),
    )


def _capacity(dep: Deployment, source: Any, arch: Any, gpu: Any) -> dict[str, Any]:
    """KV capacity, weight bytes and engine limits, from the fit calculator."""
    from .fit import FitRequest, estimate_fit

    fields = {k: getattr(dep, k) for k in type(dep).model_fields if k in FitRequest.model_fields}
    fit = estimate_fit(FitRequest(**fields))
    return _capacity_from_fit(dep, fit, arch)


def _capacity_from_fit(dep: Deployment, fit: Any, arch: Any) -> dict[str, Any]:
    """Translate the fit result into the numbers the step model needs."""
    from .errors import InputError

    if not getattr(fit, "fits", True) or not getattr(fit, "kv_cache_tokens", 0):
        raise InputError(
            "model",
            "the deployment does not fit in GPU memory (run `inferwise fit` for the details)",
        )
    tp = dep.tensor_parallel_size * dep.pipeline_parallel_size
    weight_bytes = float(fit.per_gpu.weights_gib) * 2**30 * tp
    total_params = _matmul_and_embed_params(arch)
    defaults = vllm_default_limits(dep)
    return {
        "kv_cache_tokens": int(fit.kv_cache_tokens),
        "kv_bytes_per_token": float(fit.kv_bytes_per_token),
        "bytes_per_param": weight_bytes / total_params,
        "quantization": getattr(fit, "quantization", None) or dep.quantization,
        "max_num_seqs": dep.max_num_seqs or defaults[0],
        "max_num_batched_tokens": dep.max_num_batched_tokens or defaults[1],
        "notes": [],
    }


def _matmul_and_embed_params(arch: Any) -> float:
    shape = shape_from_architecture(arch, "", 1.0, 0.0)
    embed = 0.0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size
    return shape.total_params + embed


def vllm_default_limits(dep: Deployment) -> tuple[int, int]:
    """vLLM V1's defaults for the OpenAI server: 1024 seqs / 8192 batched tokens on
    >= 70 GiB GPUs, 256 / 2048 below (vllm/engine/arg_utils.py _set_default_args)."""
    return (1024, 8192) if (dep.gpu_memory_gib or 80) >= 70 else (256, 2048)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "Bound",
    "Efficiency",
    "Hardware",
    "ModelShape",
    "StepModel",
    "StepTimes",
    "ceil_div",
    "dense_shape",
]
