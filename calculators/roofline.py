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

Stdlib only at module level; ``decode_step_ms_array`` imports numpy when called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .deployment import Deployment

Bound = Literal["compute", "memory-bandwidth", "communication", "overhead"]


def _maximum(a: Any, b: Any) -> Any:
    """Element-wise max of floats or numpy arrays (the step terms are either)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a if a >= b else b
    import numpy as np

    return np.maximum(a, b)


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
    dense_weight_bytes: float
    """Stored bytes of the dense matmul weights (``dense_params``), quantization included."""
    kv_bytes_per_token: float
    """KV cache bytes per token summed over all layers and all tensor-parallel ranks
    (replicated KV heads and MLA latents counted on every rank that holds them),
    so that ``/ tp`` is what one GPU reads."""
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    """Parameters of one routed expert in one layer."""
    expert_weight_bytes: float = 0.0
    """Stored bytes of one routed expert in one layer."""
    moe_layers: int = 0
    lm_head_params: float = 0.0
    """Part of ``dense_params`` that only runs for sampled tokens."""
    activation_bytes: float = 2.0
    """Bytes per activation element on the all-reduce wire (bf16)."""
    num_kv_heads: int = 0
    """For KV replication under tensor parallelism (0 = not replicated / MLA handled by caller)."""
    mla_layers: int = 0
    """Layers whose attention is multi-head latent attention (DeepSeek-V2/V3 style)."""
    block_scaled_fp8: bool = False
    """The GEMMs run block-scaled FP8 kernels (``QuantScheme.block_scaled`` on a GPU with FP8
    units): their rate is ``Efficiency.block_fp8_fraction`` of the FP8 peak."""
    replicated_params: float = 0.0
    """Matmul parameters every tensor-parallel rank holds and multiplies in full, summed over
    the ranks beyond the first (params.replicated_matmul_params): work an even split by TP
    would leave out."""
    sliding_window: int = 0
    """Tokens a sliding-window layer attends to (0: none). Its kernel reads at most this
    many cached tokens per sequence and scores at most this many keys per query, however
    long the context (FlashAttention's ``window_size``, the engines' SWA backends)."""
    sliding_share: float = 0.0
    """Share of the attention layers that are sliding-window layers: that share of
    ``kv_bytes_per_token`` and ``attn_flops_per_pair`` stops growing past the window."""
    window_is_chunk: bool = False
    """The window describes Llama 4's chunked local attention, not a sliding window: a query
    sees the keys of its own chunk of C tokens, C/2 on average once a context spans chunks,
    so those layers are timed as a window of C/2. The KV capacity is not touched by it."""

    def window_capped(self, prefill_tokens: Any, decode_seqs: Any, kv_tokens: Any, pairs: Any):
        """Cached tokens read and (query, key) pairs scored, in full-layer equivalents: the
        sliding-window layers' share is capped at the window per sequence and per query.
        Simplified from the per-sequence sum of min(context, window): the cap applies to the
        step's total (every sequence taken as past its window, the prompts in flight as one
        sequence), which is exact for gpt-oss's 128 tokens and overstates windowed reads when
        a 1,024-token window (Gemma) meets short contexts. Floats and numpy arrays alike."""
        if not self.sliding_window:
            return kv_tokens, pairs
        w, share = self.sliding_window, self.sliding_share
        seqs = decode_seqs + (prefill_tokens > 0)
        kv = kv_tokens - share * _maximum(0.0 * kv_tokens, kv_tokens - seqs * w)
        return kv, pairs - share * _maximum(0.0 * pairs, pairs - prefill_tokens * w)

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


SCALE_OUT_GB_PER_S = 50.0
"""One 400 Gb/s NIC per GPU, as DGX/HGX H100 and B200 systems ship (8 x ConnectX-7 400 Gb/s, NVIDIA
DGX H100 datasheet, 2023): 50 GB/s per direction. An assumption for any multi-node deployment."""
SCALE_OUT_FRACTION = 0.8
"""Share of the NIC's line rate an all-reduce reaches across nodes (NCCL's bus bandwidth over
400 Gb/s InfiniBand is typically 40-45 GB/s per GPU; assumed, not fitted: the fitted link_fraction
describes NVLink)."""
SCALE_OUT_LATENCY_US = 20.0
"""Added to each all-reduce that leaves the node (network hop and NIC; read, not fitted): an
8-byte all-reduce between two nodes over HDR InfiniBand takes 19-20 us in nccl-tests
(NVIDIA/nccl-tests issue 150, 2023-06, A100), and NCCL's own tuner puts a 128-byte all-reduce on
an H100 InfiniBand cluster at 25 us (NVIDIA/nccl issue 1453, 2024-09, its NCCL_DEBUG=INFO line)."""
SCALE_UP_GPUS = {"gb200": 72, "gb300": 72}
"""NVLink domain sizes other than a node of 8."""


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
    scale_up_gpus: int = 8
    """GPUs one NVLink / xGMI domain joins (an HGX or MI300X node; 72 for GB200 NVL72). A
    tensor-parallel group larger than this crosses the scale-out network."""
    scale_out_gb_per_s: float = SCALE_OUT_GB_PER_S
    """Per GPU, one direction, between nodes."""
    attention_tflops: float = 0.0
    """Dense 16-bit peak, the rate attention's score and value products run at: engines
    quantize the weights' GEMMs to FP8/FP4 but run FlashAttention-style kernels on BF16
    queries, keys and values (0: the same as ``peak_tflops``)."""


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
    eager_layer_overhead_us: float = 270.0
    """Without CUDA graphs (eager mode) the host dispatches every kernel of every layer itself
    (Python module calls, launches): per decoder layer, this long. A step then takes at least
    that dispatch time, however little work the GPU has (:meth:`StepModel.eager_floor_ms`)."""
    eager_mla_layer_overhead_us: float = 880.0
    """What an MLA layer (with its routed experts) adds to that dispatch in eager mode."""
    kv_bandwidth_fraction: float | None = None
    """Achievable fraction of bandwidth when attention reads the paged KV cache
    (scattered blocks, many small sequences); None = bandwidth_fraction."""
    per_layer_overhead_us: float = 0.0
    """Per decoder layer per step: the floor of the dozen small kernels a layer
    launches, which does not shrink with the batch (visible at small batch)."""
    moe_layer_overhead_us: float = 0.0
    """What a routed-expert layer adds to that floor where the fused-MoE path launches its
    steps (routing, token sort and alignment, two grouped GEMMs, the weighted sum) as kernels
    whose launch gaps do not hide at small batch: SGLang's on ROCm ([vendor.amd.engine.sglang])
    and, far smaller, on NVIDIA once its overlap scheduler hides the host's step work
    ([vendor.nvidia.engine.sglang]); 0 = none (vLLM: its NVIDIA MoE rows at batch 1 come within
    10 % without it, and the fit does not speak for its ROCm kernels)."""
    mla_layer_overhead_us: float = 0.0
    """What an MLA layer adds to that floor: its low-rank query and KV projections, their
    norms, the rotary part and the absorbed up-projections are each a kernel of their own,
    about twice what a grouped-query attention layer launches. 0 = none."""
    moe_compute_fraction: float | None = None
    """Achievable fraction of peak in routed-expert GEMMs (grouped GEMMs over few
    tokens per expert run further from peak than dense ones); None = compute_fraction."""
    moe_half_width: float = 0.0
    """Routed-expert GEMM ramp over the experts' width: with it set, the experts' GEMMs reach
    ``moe_compute_fraction`` x w / (w + moe_half_width) of peak, w being one expert's
    intermediate size on one tensor-parallel rank. 0 = off."""
    compute_half_tokens: float = 0.0
    """GEMM efficiency ramp: with it set, a step of T tokens reaches compute_fraction x
    T / (T + compute_half_tokens) of peak (a GEMM over few rows cannot fill the GPU, a
    prefill chunk of thousands nearly does). 0 = one fraction for every step size."""
    attn_seq_overhead_us: float = 0.0
    """Decode attention's fixed cost per sequence per layer (page-table walk, last partial
    block, split-KV reduction), so that the KV stream itself can run at the rate the
    kernels reach on long contexts. 0 = none (all in kv_bandwidth_fraction)."""
    request_overhead_ms: float = 0.0
    """Per request, outside the GPU: the API server's HTTP handling, tokenization and hand-off
    to the engine loop before the request can be scheduled. A latency every request's TTFT and
    E2E carry, not a cost of the step (it overlaps other requests' steps)."""
    request_overhead_per_rank_ms: float = 0.0
    """What each tensor-parallel rank beyond the first adds to that cost: SGLang's scheduler
    takes new requests in on rank 0 and hands them to the other ranks as pickled objects over
    a CPU process group (``broadcast_pyobj`` in its ``recv_requests``, done only when
    ``tp_size != 1``) before any rank can schedule them. Folded into ``request_overhead_ms``
    when a deployment's step model is built (:func:`for_tensor_parallel`)."""
    attention_compute_fraction: float | None = None
    """Achievable fraction of the 16-bit peak in attention's score and value products
    (FlashAttention-style kernels); None = compute_fraction. Kept apart so that a kernel
    generation's GEMM rates (data/efficiency.toml [generation.*]) do not scale it: the
    attention kernels of those releases were the FlashAttention ones of today."""
    block_fp8_fraction: float = 1.0
    """Share of the per-tensor FP8 GEMM rate that block-scaled FP8 GEMMs reach (weights
    with a scale per 128 x 128 block, activations quantized per group of 128 before each
    GEMM: DeepSeek-V3/R1, Kimi-K2, Qwen3 FP8 checkpoints). The kernels apply the scales
    inside the main loop and quantize their inputs in a kernel of their own; 1 = as fast as
    per-tensor FP8."""
    single_seq_step_factor: float = 1.0
    """A decode step of one sequence alone takes this share of what the batched terms give:
    a single sequence can run other kernels (matrix-vector) than a batch (matrix-matrix),
    and the two need not sit on one line. The host's eager dispatch floor is not scaled.
    llama.cpp's CPU backend (measured, bench/llamacpp_step_shape.py) takes about half the
    time for one sequence that the line through batches 2-8 puts there. 1 = no such
    difference (the published factors: their concurrency-1 rows fit without one); a user
    calibration with concurrency 1 and another load fits it."""
    source: str = ""

    def describe(self) -> dict[str, float]:
        own_attention = self.attention_compute_fraction  # set by an early kernel generation only
        return {
            "compute_fraction": self.compute_fraction,
            "bandwidth_fraction": self.bandwidth_fraction,
            "step_overhead_ms": self.step_overhead_ms,
            "per_seq_overhead_ms": self.per_seq_overhead_ms,
            "allreduce_latency_us": self.allreduce_latency_us,
            "link_fraction": self.link_fraction,
            "moe_compute_fraction": self.moe_fraction,
            "per_layer_overhead_us": self.per_layer_overhead_us,
            "mla_layer_overhead_us": self.mla_layer_overhead_us,
            "moe_layer_overhead_us": self.moe_layer_overhead_us,
            "kv_bandwidth_fraction": self.kv_fraction,
            "compute_half_tokens": self.compute_half_tokens,
            "attn_seq_overhead_us": self.attn_seq_overhead_us,
            "request_overhead_ms": self.request_overhead_ms,
            "single_seq_step_factor": self.single_seq_step_factor,
            "block_fp8_fraction": self.block_fp8_fraction,
            "moe_half_width": self.moe_half_width,
            **({} if own_attention is None else {"attention_compute_fraction": own_attention}),
            # a deployment's factors carry it folded into request_overhead_ms (for_tensor_parallel)
            **(
                {"request_overhead_per_rank_ms": self.request_overhead_per_rank_ms}
                if self.request_overhead_per_rank_ms
                else {}
            ),
        }

    @property
    def kv_fraction(self) -> float:
        return self.kv_bandwidth_fraction if self.kv_bandwidth_fraction else self.bandwidth_fraction

    @property
    def moe_fraction(self) -> float:
        return self.moe_compute_fraction if self.moe_compute_fraction else self.compute_fraction

    @property
    def attention_fraction(self) -> float:
        return self.attention_compute_fraction or self.compute_fraction


class DecodeLine(NamedTuple):
    """A pure-decode step of a fixed batch as a function of its KV tokens:
    ``max(c0 + c1*a, m0 + m1*a, floor) + fixed`` with ``a`` the tokens attended, which is
    the KV tokens up to ``knee`` (the batch's sliding windows full) and grows by
    ``1 - share`` per token past it. ``floor``: the eager dispatch time less ``fixed``
    (-inf with CUDA graphs)."""

    c0: float
    c1: float
    m0: float
    m1: float
    fixed: float
    floor: float
    knee: float = math.inf
    share: float = 0.0

    def attended_tokens(self, kv: Any) -> Any:
        """Tokens read in full-layer equivalents (floats or numpy arrays)."""
        if self.knee == math.inf:
            return kv
        return kv - self.share * _maximum(0.0 * kv, kv - self.knee)


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
    admission_watermark_tokens: int = 0
    """KV tokens the scheduler keeps free when it admits a new or preempted request: vLLM V0's
    block manager admits only while 1 % of the blocks stay free (``watermark=0.01``), so a
    preempted request is not re-admitted the very next step, only once that much is free."""
    reserves_future_tokens: bool = False
    """SGLang's admission: a prompt is admitted only while the KV cache also holds a share
    (new_token_ratio) of every running request's remaining output, so KV pressure queues new
    requests instead of thrashing the running ones (batching_sim.SGLANG_INIT_NEW_TOKEN_RATIO)."""
    no_admission_after_preemption: bool = False
    """vLLM V1's scheduler admits no waiting request in a step that had to preempt a running
    one (``if not preempted_reqs:`` before its waiting loop): a step short of KV starts
    nothing new, so a victim is not taken back in at once."""
    notes: tuple[str, ...] = field(default=())
    """Assumptions made while building the model (shown to the user)."""
    max_model_len: int | None = None
    """The context window as the fit resolved it (the model's own unless set)."""
    prefill_first: bool = False
    """Scheduling as SGLang's default (no --enable-mixed-chunk): waiting prompts are prefilled in
    steps of their own, up to the chunk budget, while the running decodes wait; decodes step only
    when nothing can be prefilled. vLLM V1 and TensorRT-LLM run both in one step. With equal
    lengths this keeps a closed loop in lockstep waves (a wave's decodes start on one step)."""
    prefill_eager: bool = False
    """Steps that carry prompt tokens run without CUDA graphs even where decode steps replay
    them: SGLang captures graphs for decode batches only (extend steps run eagerly unless
    ``--enable-piecewise-cuda-graph``), and vLLM's V0 engine for decode-only steps. Such a step
    lasts at least the host's dispatch of every layer (:meth:`eager_floor_ms`), which is what
    a short prompt's TTFT shows on a large model; a long prefill hides it behind the GPU work."""
    hides_host_step: bool = False
    """The host's per-step work (``step_overhead_ms``) runs while the GPU runs the previous
    step, so it bounds a step from below instead of adding to it: vLLM 0.14+ schedules
    asynchronously by default (0.14.0 release notes, vllm#27614). Set for one GPU only, with
    the published factors (see _hides_host_step)."""
    schedules_ahead: bool = False
    """vLLM 0.14+ (async scheduling on by default): the engine core schedules step N+1 as soon
    as it has launched step N (``step_with_batch_queue``, two batches in flight), so a request
    that arrives while step N runs is first scheduled in step N+2; sync scheduling takes it in
    N+1. The simulator applies it (one more step of TTFT under load); any tensor parallelism."""
    recv_interval_steps: int = 1
    """SGLang's --scheduler-recv-interval: while it decodes, the scheduler takes in new
    requests only every this many steps (a step with prompt tokens counts as the whole
    interval: SchedulerRecvSkipper weighs a decode step 1 and any other 1000), so an arrival
    waits for the next receive point. The simulator applies it."""
    kv_window_share: float = 0.0
    """Share of the KV cache's layer groups that hold a request's sliding window only: vLLM's
    hybrid KV cache manager frees a sliding-window group's blocks once they leave the window
    (0 where the engine caches those layers like full ones). :meth:`context_capacity_tokens`
    turns the reported tokens into whole-context capacity for the simulator and predict."""
    kv_reported_per_max_len: bool = False
    """How the reported KV tokens count: vLLM 0.21+ logs max concurrency x max_model_len (a
    window group charged its window plus a step's batched tokens at that length); before,
    blocks per layer group x block size."""
    reserves_whole_request: bool = False
    """Admission as TensorRT-LLM's GUARANTEED_NO_EVICT: a request starts only when its whole
    input + output fits in the KV cache, so nothing is preempted (vLLM and SGLang admit on
    the tokens in hand and preempt when they run out). The simulator applies it."""

    # ------------------------------------------------------------------ core arithmetic

    def _terms(
        self,
        prefill_tokens: Any,
        decode_seqs: Any,
        kv_tokens: Any,
        pairs: Any,
        sampled: Any,
        floors: bool = True,
    ):
        """The four time terms in ms; works on floats and on numpy arrays alike. Without
        ``floors`` the host's floors (eager dispatch, hidden step work) are left out, for
        :meth:`decode_line`, which applies them itself."""
        s, hw, e = self.shape, self.hardware, self.efficiency
        tp = self.tensor_parallel_size
        tokens = prefill_tokens + decode_seqs
        # FLOPs: matmuls for every token (LM head only for sampled ones) + attention.
        expert_params = s.moe_layers * s.experts_per_token * s.expert_params
        body_params = s.active_params - s.lm_head_params - expert_params
        flops = (
            2.0 * (body_params + s.replicated_params) * tokens + 2.0 * s.lm_head_params * sampled
        )
        kv_tokens, pairs = s.window_capped(prefill_tokens, decode_seqs, kv_tokens, pairs)
        # Attention: one (query, key) pair per prompt pair and per cached token a decode reads,
        # at the 16-bit rate whatever the weights' GEMMs run in.
        attn_flops = s.attn_flops_per_pair * (pairs + kv_tokens)
        expert_flops = 2.0 * expert_params * tokens
        peak = hw.peak_tflops * 1e12 * tp
        if s.block_scaled_fp8:
            peak = peak * e.block_fp8_fraction
        attn_peak = (hw.attention_tflops or hw.peak_tflops) * 1e12 * tp
        if e.compute_half_tokens > 0:  # few-row GEMMs run further from peak
            peak = peak * (tokens + 1e-9) / (tokens + 1e-9 + e.compute_half_tokens)
        compute_ms = (
            (flops / e.compute_fraction + expert_flops / self._moe_rate()) / peak
            + attn_flops / e.attention_fraction / attn_peak
        ) * 1e3
        flops = flops + attn_flops + expert_flops
        # Bytes: weights (dense + touched experts) + KV of the whole batch, split over TP.
        weight_bytes = s.dense_weight_bytes
        if s.replicated_params:  # replicated weights are read by every rank, not 1/tp of them
            weight_bytes = weight_bytes * (1.0 + s.replicated_params / s.dense_params)
        if s.num_experts:
            touched = s.expected_experts_touched(tokens)
            weight_bytes = weight_bytes + s.moe_layers * touched * s.expert_weight_bytes
        kv_per_gpu = s.kv_bytes_per_token / tp
        kv_bytes = kv_tokens * kv_per_gpu
        nbytes = weight_bytes / tp + kv_bytes
        bw = hw.bandwidth_gb_per_s * 1e9
        memory_ms = (weight_bytes / tp / e.bandwidth_fraction + kv_bytes / e.kv_fraction) / bw * 1e3
        # Communication moves tokens x hidden activations over the GPU link, each transfer
        # paying a fixed latency: tensor parallel does two ring all-reduces per layer,
        # pipeline parallel one hop per stage boundary.
        msg = tokens * s.hidden_size * s.activation_bytes
        comm_ms = 0.0 * tokens
        if tp > 1:
            comm_ms = 2 * s.num_layers * self._allreduce_s(msg) * 1e3
        if self.pipeline_parallel_size > 1:
            comm_ms = comm_ms + self._stage_hops_s(msg) * 1e3
        overhead = self.serial_step_overhead_ms
        layers_ms = (
            e.per_layer_overhead_us * s.num_layers
            + e.mla_layer_overhead_us * s.mla_layers
            + e.moe_layer_overhead_us * s.moe_layers
        ) * 1e-3
        overhead_ms = overhead + layers_ms + e.per_seq_overhead_ms * sampled
        if e.attn_seq_overhead_us:
            overhead_ms = overhead_ms + e.attn_seq_overhead_us * 1e-3 * decode_seqs * s.num_layers
        if e.single_seq_step_factor != 1.0:  # one sequence alone: its own kernels;
            # the GPU's time scales, not the host's eager dispatch floor below
            solo = (decode_seqs == 1) * (prefill_tokens == 0)
            scale = 1.0 + (e.single_seq_step_factor - 1.0) * solo
            compute_ms, memory_ms = compute_ms * scale, memory_ms * scale
            comm_ms, overhead_ms = comm_ms * scale, overhead_ms * scale
        if floors:
            gpu_ms = _maximum(compute_ms, memory_ms) + comm_ms + overhead_ms
            overhead_ms = overhead_ms + self._host_wait_ms(gpu_ms, prefill_tokens)
        return compute_ms, memory_ms, comm_ms, overhead_ms, flops, nbytes

    def _host_wait_ms(self, gpu_ms: Any, prefill_tokens: Any) -> Any:
        """What a step waits for the host beyond the GPU's ``gpu_ms``: its hidden step work
        where that is longer (:attr:`hides_host_step`), and without CUDA graphs the dispatch
        of every kernel (:meth:`eager_floor_ms`; with ``prefill_eager`` only on steps that
        carry prompt tokens)."""
        wait_ms = 0.0 * gpu_ms
        if self.hides_host_step:
            wait_ms = _maximum(wait_ms, self.efficiency.step_overhead_ms - gpu_ms)
        if self.enforce_eager or self.prefill_eager:
            eager_ms = _maximum(0.0 * gpu_ms, self.eager_floor_ms() - gpu_ms - wait_ms)
            if not self.enforce_eager:  # 1/0 per step
                eager_ms = eager_ms * (prefill_tokens > 0)
            wait_ms = wait_ms + eager_ms
        return wait_ms

    def _moe_rate(self) -> float:
        """The routed experts' share of peak: moe_compute_fraction, ramped down for experts
        whose intermediate size on one rank is narrow (few tiles per expert). The width comes
        from one expert's parameters as a gated MLP (gate, up and down: 3 x hidden x width),
        the layout of every MoE in the catalog."""
        e, s = self.efficiency, self.shape
        if not e.moe_half_width or not s.num_experts:
            return e.moe_fraction
        width = s.expert_params / (3.0 * s.hidden_size) / self.tensor_parallel_size
        return e.moe_fraction * width / (width + e.moe_half_width)

    def context_capacity_tokens(self, context_tokens: float) -> int:
        """The KV capacity in tokens of whole contexts, for requests that hold
        ``context_tokens`` each on average: the reported capacity, except where the engine
        frees the blocks that leave a sliding window (vLLM's hybrid KV cache manager). There
        a request holds its whole context in the full-attention share of the layer groups and
        its window (plus a block) in the rest, so more requests fit than the reported tokens
        divided by their length. The reported tokens are blocks per group before vLLM 0.21,
        and from it max concurrency x max_model_len, with each window group charged its
        window less one plus a step's batched tokens, plus a block (``blocks_per_request``).
        The share counts layers and the block is vLLM's default 16: exact for gpt-oss, a few
        per cent off where vLLM pads uneven layer groups (Gemma 3)."""
        share, window, block = self.kv_window_share, self.shape.sliding_window, 16.0
        if not share or context_tokens <= 0:
            return int(self.kv_capacity_tokens)

        def held(tokens: float, window_tokens: float) -> float:  # per-group tokens
            return (1.0 - share) * tokens + share * (min(tokens, window_tokens) + block)

        scale = context_tokens / held(context_tokens, window)
        top = self.max_model_len
        if self.kv_reported_per_max_len and top:
            scale *= held(top, window - 1 + self.max_num_batched_tokens) / top
        return int(self.kv_capacity_tokens * scale)

    def eager_floor_ms(self) -> float:
        """The host's time to dispatch one step without CUDA graphs: the scheduler's share
        plus every layer's kernels (MLA layers more). With graphs the GPU replays them and
        this floor does not apply."""
        s, e = self.shape, self.efficiency
        per_layer_us = e.eager_layer_overhead_us * s.num_layers
        return (
            e.step_overhead_ms
            + (per_layer_us + e.eager_mla_layer_overhead_us * s.mla_layers) * 1e-3
        )

    @property
    def serial_step_overhead_ms(self) -> float:
        """The host's per-step work that adds to a step's time: all of it, unless the engine
        prepares the next step while the GPU runs this one (:attr:`hides_host_step`)."""
        return 0.0 if self.hides_host_step else self.efficiency.step_overhead_ms

    def _link_rates(self) -> tuple[float, float, float]:
        """Bytes/s over NVLink (fitted fraction) and between nodes (assumed), and the fixed
        latency of one transfer inside the node, seconds."""
        hw, e = self.hardware, self.efficiency
        link = hw.link_gb_per_s * 1e9 * e.link_fraction
        net = hw.scale_out_gb_per_s * 1e9 * SCALE_OUT_FRACTION
        return link, net, e.allreduce_latency_us * 1e-6

    def _allreduce_s(self, msg: Any) -> Any:
        """One tensor-parallel all-reduce of `msg` bytes: a ring over the link plus a fixed
        latency. A group larger than one NVLink domain runs as NCCL runs it across nodes: a
        ring inside each node, then each GPU's 1/g shard between the nodes over its own NIC."""
        tp, g = self.tensor_parallel_size, self.hardware.scale_up_gpus
        link, net, latency_s = self._link_rates()
        if tp <= g:
            return latency_s + 2.0 * (tp - 1) / tp * msg / link
        nodes = math.ceil(tp / g)
        inside = 2.0 * (g - 1) / g * msg / link
        between = 2.0 * (nodes - 1) / nodes * (msg / g) / net
        return latency_s + SCALE_OUT_LATENCY_US * 1e-6 + inside + between

    def _stage_hops_s(self, msg: Any) -> Any:
        """Pipeline parallel: one activation hand-off per stage boundary; the boundaries
        between nodes go over the network."""
        pp, tp = self.pipeline_parallel_size, self.tensor_parallel_size
        link, net, latency_s = self._link_rates()
        crossing = min(pp - 1, max(0, math.ceil(tp * pp / self.hardware.scale_up_gpus) - 1))
        inside = (pp - 1 - crossing) * (latency_s + msg / link)
        between = crossing * (latency_s + SCALE_OUT_LATENCY_US * 1e-6 + msg / net)
        return inside + between

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

    def decode_line(self, decode_seqs: int) -> DecodeLine:
        """Pure-decode step time as a function of KV tokens: both roofline terms are linear
        in the tokens attended (:meth:`DecodeLine.attended_tokens`); lets the simulator time long
        runs of decode steps without calling the full model per step."""
        d = float(decode_seqs)
        c0, m0, comm, ov, _, _ = self._terms(0.0, d, 0.0, 0.0, d, floors=False)
        c1, m1, _, _, _, _ = self._terms(0.0, d, 1.0, 0.0, d, floors=False)  # below any cap
        floor = -math.inf
        if self.hides_host_step:
            floor = self.efficiency.step_overhead_ms - (comm + ov)
        if self.enforce_eager:
            floor = max(floor, self.eager_floor_ms() - (comm + ov))
        knee = d * self.shape.sliding_window if self.shape.sliding_window else math.inf
        return DecodeLine(
            c0, c1 - c0, m0, m1 - m0, comm + ov, floor, knee, self.shape.sliding_share
        )

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

    def marginal_prefill_ms(self, prompt_tokens: float) -> float:
        """What a prompt adds to a busy engine's time: its prefill less the per-step host cost
        of its chunks' steps, which the running decodes' steps pay anyway (mixed steps)."""
        chunks = max(1, math.ceil(prompt_tokens / self.max_num_batched_tokens))
        return max(0.0, self.prefill_ms(int(prompt_tokens)) - chunks * self.serial_step_overhead_ms)

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
        if efficiency is not None:
            return _build_step_model(dep, efficiency)
        from .deployment import Deployment

        # keyed by the deployment alone: predict's and budget's requests are Deployments
        # with workload fields added, which the step model does not depend on
        return _cached_step_model(dep.model_dump_json(include=set(Deployment.model_fields)))


def dense_shape(
    name: str,
    params: float,
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    vocab_size: int,
    bytes_per_param: float = 2.0,
    kv_bytes_per_element: float = 2.0,
) -> ModelShape:
    """A dense decoder from its headline numbers (for tests and quick what-ifs); the
    sizes are keywords, so a call reads which number is which."""
    embed = vocab_size * hidden_size
    return ModelShape(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        dense_params=params - embed,
        attn_flops_per_pair=2.0 * num_heads * 2 * head_dim * num_layers,
        dense_weight_bytes=(params - embed) * bytes_per_param,
        kv_bytes_per_token=2 * num_layers * num_kv_heads * head_dim * kv_bytes_per_element,
        lm_head_params=embed,
        num_kv_heads=num_kv_heads,
    )


def shape_from_architecture(
    arch: Any,
    name: str,
    scheme: Any,
    dtype_bytes: float,
    kv_bytes_per_token: float,
    tensor_parallel_size: int = 1,
) -> ModelShape:
    """Split a model into the parts the step time depends on.

    Parameter counts and stored bytes per component come from the params
    calculator (the same numbers the memory fit uses). The split matters
    because decode reads only the routed experts the batch touches, the LM
    head runs only for sampled tokens, and embeddings are looked up rather
    than multiplied.
    """
    from .params import count_parameters, replicated_matmul_params, weight_bytes

    counts = count_parameters(arch)
    wb = weight_bytes(arch, scheme, dtype_bytes, 1, 1).by_category
    h = arch.hidden_size
    lm_head = float(counts.lm_head or arch.vocab_size * h)
    lm_head_bytes = wb["lm_head"] if counts.lm_head else wb["embedding"]
    # ssm: the Mamba / DeltaNet mixers of hybrid models, read and multiplied every token
    dense = (
        counts.attention
        + counts.dense_mlp
        + counts.shared_experts
        + counts.router
        + counts.ssm
        + lm_head
    )
    dense_bytes = (
        wb["attention"]
        + wb["dense_mlp"]
        + wb["shared_experts"]
        + wb["router"]
        + wb["ssm"]
        + lm_head_bytes
    )
    mla = arch.mla
    q = arch.num_attention_heads
    if mla is not None:
        pair_flops = 2.0 * q * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)
    else:
        pair_flops = 2.0 * q * 2 * arch.head_dim
    moe = arch.moe
    moe_layers = len(moe.moe_layers) if moe is not None else 0
    sliding = arch.layers_of_kind("sliding") if arch.sliding_window else 0
    window = int(arch.sliding_window or 0) if sliding else 0
    chunked = arch.layers_of_kind("chunked") if arch.attention_chunk_size else 0
    window_is_chunk = bool(chunked) and not sliding  # no catalog model has both
    if window_is_chunk:  # timed as a window of half a chunk
        sliding, window = chunked, max(1, int(arch.attention_chunk_size) // 2)
    expert = expert_bytes = 0.0
    if moe is not None and counts.routed_experts:
        expert = counts.routed_experts / (moe.num_experts * moe_layers)
        expert_bytes = wb["routed_experts"] / (moe.num_experts * moe_layers)
    return ModelShape(
        name=name,
        num_layers=arch.num_layers,
        hidden_size=h,
        dense_params=float(dense),
        # only attention layers score token pairs (hybrids' Mamba layers do not)
        attn_flops_per_pair=pair_flops * arch.attention_layers,
        dense_weight_bytes=float(dense_bytes),
        kv_bytes_per_token=kv_bytes_per_token,
        sliding_window=window,
        sliding_share=sliding / arch.attention_layers if sliding else 0.0,
        window_is_chunk=window_is_chunk,
        num_experts=moe.num_experts if moe else 0,
        experts_per_token=moe.experts_per_token if moe else 0,
        expert_params=expert,
        expert_weight_bytes=expert_bytes,
        moe_layers=moe_layers,
        lm_head_params=lm_head,
        num_kv_heads=0 if mla is not None else arch.num_kv_heads,
        mla_layers=sum(1 for k in arch.layer_kinds if k == "mla"),
        replicated_params=replicated_matmul_params(arch, tensor_parallel_size),
    )


@lru_cache(maxsize=1024)
def _cached_step_model(dep_json: str) -> StepModel:
    """Step models are pure functions of the deployment; repeated questions about
    the same deployment (an MCP session, a rate search) reuse them."""
    from .deployment import Deployment

    return _build_step_model(Deployment.model_validate_json(dep_json), None)


def compute_dtype(scheme: Any, gpu: Any) -> tuple[str, str]:
    """The tensor-core dtype the matmuls run in, and why.

    W8A8 FP8 checkpoints run FP8 GEMMs where the GPU has FP8 units, and NVFP4
    checkpoints that quantize activations too (ModelOpt's NVFP4, compressed-tensors
    W4A4) run FP4 GEMMs where it has FP4 units (Blackwell: twice the FP8 rate);
    weight-only formats (AWQ, GPTQ, NVFP4 and MXFP4 on Hopper, bitsandbytes, FP8 on
    Ampere via Marlin, compressed-tensors W8A16 and W4A16) dequantize to 16-bit for the
    GEMM, so their FLOP rate stays BF16 while their bytes shrink. For compressed-tensors
    the checkpoint's activation dtype decides (QuantScheme.activation_dtype).
    """
    method, acts = scheme.method, scheme.activation_dtype
    fp4 = method in ("modelopt_fp4", "nvfp4") or acts == "fp4"
    if fp4 and "fp4" in gpu.dense_tflops:
        return "fp4", f"{method}: NVFP4 weights and activations run FP4 tensor-core GEMMs"
    fp8 = method in ("fp8", "modelopt", "fbgemm_fp8", "ptpc_fp8") or acts == "fp8"
    int8 = method in ("int8", "w8a8_int8") or acts == "int8"
    if fp8 and "fp8" in gpu.dense_tflops:
        return "fp8", f"{method}: FP8 weights and activations run FP8 tensor-core GEMMs"
    if int8 and "int8" in gpu.dense_tflops and not scheme.experts_only:
        return "int8", f"{method}: W8A8 INT8 GEMMs"
    if scheme.is_quantized:
        return "bf16", f"{method}: GEMMs at the BF16 rate (weights dequantized in the kernel)"
    return "bf16", "BF16/FP16 GEMMs"


def for_tensor_parallel(efficiency: Efficiency, tensor_parallel_size: int) -> Efficiency:
    """The factors of one deployment: the per-rank request cost folded into the request cost
    its TTFT and E2E carry (so every reader of ``request_overhead_ms`` sees the deployment's
    own, and folding twice changes nothing)."""
    per_rank = efficiency.request_overhead_per_rank_ms
    if not per_rank:
        return efficiency
    return replace(
        efficiency,
        request_overhead_ms=efficiency.request_overhead_ms
        + per_rank * max(0, tensor_parallel_size - 1),
        request_overhead_per_rank_ms=0.0,
    )


def _build_step_model(dep: Deployment, efficiency: Efficiency | None) -> StepModel:
    from .architecture import from_config
    from .calibration import architecture_class, kernel_generation, load_efficiency
    from .catalog import get_gpu, load_model
    from .quantization import DTYPE_BYTES, resolve_quantization

    gpu = custom_gpu(dep) if dep.gpu is None else get_gpu(dep.gpu)
    source = load_model(dep.model, revision=dep.revision)
    arch = from_config(source.config, dep.hf_overrides)
    scheme = resolve_quantization(dep.quantization, arch.quantization_config)
    dtype = dep.dtype if dep.dtype != "auto" else (arch.torch_dtype or "bfloat16")
    dtype_b = DTYPE_BYTES.get(str(dtype).lower().removeprefix("torch."), 2.0)
    cap = _capacity(dep, arch, gpu, dtype_b)
    dtype_key, why = compute_dtype(scheme, gpu)
    shape = shape_from_architecture(
        arch, source.hf_id, scheme, dtype_b, cap["kv_bytes_per_token"], dep.tensor_parallel_size
    )
    if scheme.block_scaled and dtype_key == "fp8":
        shape = replace(shape, block_scaled_fp8=True)
    hw = Hardware(
        name=gpu.id,
        peak_tflops=_peak_tflops(gpu, dtype_key),
        attention_tflops=_peak_tflops(gpu, "bf16"),
        bandwidth_gb_per_s=gpu.memory_bandwidth_gb_per_s,
        interconnect=gpu.interconnect,
        link_gb_per_s=gpu.interconnect_bandwidth_gb_per_s,
        scale_up_gpus=SCALE_UP_GPUS.get(gpu.id, 8),
    )
    generation = None  # a given efficiency (a calibration) already is the deployment's own
    if efficiency is None:
        generation = kernel_generation(
            dep.engine, dep.engine_version, gpu.vendor, architecture_class(arch)
        )
    eff = for_tensor_parallel(
        efficiency or load_efficiency(gpu, dep.engine, generation=generation),
        dep.tensor_parallel_size,
    )
    notes = [why, *arch.notes, *cap["notes"]]
    if generation is not None:
        notes.append(_generation_note(dep, generation))
    notes.extend(_multi_node_notes(dep, hw))
    if efficiency is None and "engine." + dep.engine not in eff.source and dep.engine != "vllm":
        notes.append(
            f"no published {dep.engine} measurements in the calibration set: vLLM's factors used"
        )
    notes.extend(_layout_notes(dep, gpu.interconnect, shape))
    if efficiency is None:
        notes.extend(_compute_scale_notes(gpu.id))
    ahead = _schedules_ahead(dep)
    hides_host_step = ahead and efficiency is None and _hides_host_step(dep)
    notes.extend(_async_notes(dep, eff.step_overhead_ms, ahead, hides_host_step))
    if efficiency is None and runs_async_on_one_gpu(dep):
        eff = _with_one_gpu_async(eff, notes)
    eager = dep.enforce_eager or _trtllm_eager(dep, arch, notes)
    prefill_eager = not eager and _prefill_runs_eager(dep)
    if prefill_eager:
        notes.append(
            f"{dep.engine} runs prompt (prefill) steps without CUDA graphs: such a step lasts at "
            "least the host's dispatch of every layer (data/efficiency.toml "
            "eager_layer_overhead_us), which bounds a short prompt's TTFT from below"
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
        enforce_eager=eager,
        prefill_eager=prefill_eager,
        admission_watermark_tokens=_admission_watermark(dep, int(cap["kv_cache_tokens"])),
        no_admission_after_preemption=_is_vllm_v1(dep),
        reserves_future_tokens=dep.engine == "sglang",
        notes=tuple(notes),
        max_model_len=cap["max_model_len"],
        prefill_first=_prefills_first(dep, arch, cap["max_model_len"]),
        reserves_whole_request=dep.engine == "trtllm",
        kv_window_share=_kv_window_share(dep, shape),
        kv_reported_per_max_len=dep.engine == "vllm" and _vllm_reports_per_max_len(dep),
        recv_interval_steps=dep.scheduler_recv_interval or 1,
        hides_host_step=hides_host_step,
        schedules_ahead=ahead,
    )


def _layout_notes(dep: Deployment, interconnect: str, shape: ModelShape) -> list[str]:
    """What the step model assumes of the deployment's layout and settings, in words: the PCIe
    all-reduce rate, pipeline stages, sliding windows, SGLang's receive interval, eager mode."""
    notes: list[str] = []
    if interconnect == "pcie" and dep.tensor_parallel_size > 1:
        notes.append(
            "PCIe all-reduce at NCCL's rate measured on a two-socket server (4 x A100 PCIe, every "
            "pair across the CPUs): about 5 GB/s and 23 us per call. GPUs that share PCIe switches "
            "with P2P on run 5-9x faster; nccl-tests all_reduce_perf on yours tells which"
        )
    if dep.pipeline_parallel_size > 1:
        notes.append(
            f"pipeline parallelism: up to {dep.pipeline_parallel_size} micro-batches in flight, one per "
            "stage (the engines' virtual engines), each with its share of the sequences and KV "
            "cache; a step's latency is the whole pipeline's, the stages' bubbles are not modelled"
        )
    if shape.sliding_window and shape.window_is_chunk:
        notes.append(
            f"{shape.sliding_share:.0%} of the attention layers attend within chunks of "
            f"{2 * shape.sliding_window:,} tokens: timed as reading and scoring "
            f"{shape.sliding_window:,} cached tokens per sequence (half a chunk, the mean)"
        )
    elif shape.sliding_window:
        notes.append(
            f"{shape.sliding_share:.0%} of the attention layers see a {shape.sliding_window:,}-token "
            "window: they read and score at most that many cached tokens per sequence"
        )
    if dep.scheduler_recv_interval and dep.scheduler_recv_interval > 1:
        notes.append(
            f"SGLang takes new requests in every {dep.scheduler_recv_interval} decode steps "
            "(--scheduler-recv-interval) and right after a prompt step: while it decodes, an "
            f"arrival waits about {(dep.scheduler_recv_interval - 1) / 2:g} steps before it is seen"
        )
    if dep.enforce_eager:
        notes.append(
            "no CUDA graphs (--enforce-eager): a step lasts at least the host's dispatch of every "
            "layer's kernels (data/efficiency.toml eager_layer_overhead_us)"
        )
    return notes


V0_WATERMARK = 0.01
"""vLLM V0's BlockSpaceManager default: admit while this share of the GPU blocks stays free."""


def _compute_scale_notes(gpu_id: str) -> list[str]:
    """The GPU's measured GEMM share against the fitted GPUs' (data/efficiency.toml), in words."""
    from .calibration import gpu_compute_scale

    scale = gpu_compute_scale(gpu_id)
    if scale == 1.0:
        return []
    return [
        f"{gpu_id} sustains {scale:.2f}x the share of its datasheet tensor-core peak that the GPUs "
        "the factors were fitted on do (measured plain-GEMM rates, data/efficiency.toml "
        f"[gpu.{gpu_id}]): every compute rate is scaled by it"
    ]


def _is_vllm_v1(dep: Deployment) -> bool:
    from .engine_policy import vllm_rules

    return dep.engine == "vllm" and vllm_rules(dep.engine_version).v1


def _async_notes(
    dep: Deployment, step_overhead_ms: float, ahead: bool, hides_host_step: bool
) -> list[str]:
    """What vLLM 0.14+'s async scheduling changes in the model, in words."""
    if not ahead:
        return []
    from .engine_policy import vllm_rules

    version = vllm_rules(dep.engine_version).version
    notes = [
        f"vLLM {version} schedules asynchronously (default since 0.14): each step's batch is "
        "fixed when the step before it starts, so under load a new request waits one step "
        "more for its prefill"
    ]
    if hides_host_step:
        notes.append(
            f"one GPU: the host prepares the next step while the GPU runs this one, so its "
            f"{step_overhead_ms:.2f} ms per step bounds a step instead of adding to it"
        )
    return notes


def runs_async_on_one_gpu(dep: Deployment) -> bool:
    """Whether the published factors give this deployment [engine.vllm.one_gpu_async]'s decode
    factors: vLLM 0.14+ (async scheduling) on one Ampere-or-newer NVIDIA GPU, CUDA graphs on."""
    if dep.gpu is None or dep.enforce_eager:
        return False
    from .catalog import get_gpu

    return (
        _schedules_ahead(dep) and _hides_host_step(dep) and _has_current_kernels(get_gpu(dep.gpu))
    )


def _has_current_kernels(gpu: Any) -> bool:
    """An NVIDIA GPU of the Ampere generation or newer (BF16 tensor cores): vLLM's FlashAttention
    backends and the Triton kernels torch.compile generates target these; on V100 and T4 vLLM
    falls back to Triton attention, which Triton 3.3+ no longer supports there (vllm PR 36439:
    "either hangs or runs extremely slowly")."""
    return gpu.vendor == "nvidia" and "bf16" in gpu.dense_tflops


def _with_one_gpu_async(eff: Efficiency, notes: list[str]) -> Efficiency:
    """[engine.vllm.one_gpu_async]'s decode factors in place of the 0.11-era ones, said in the
    notes: on one GPU a 0.14+ decode step replays one full CUDA graph while the host prepares
    the next step, so what is left is the weights' read and the kernels' own floor."""
    from .calibration import one_gpu_async_factors

    table = one_gpu_async_factors()
    keys = ("bandwidth_fraction", "per_layer_overhead_us")
    own = {k: float(table[k]) for k in keys if k in table}
    if not own:
        return eff
    eff = replace(
        eff, **own, source=f"{eff.source}; [engine.vllm.one_gpu_async] {table.get('source', '')}"
    )
    notes.append(
        "one GPU with vLLM 0.14+: a decode step replays one full CUDA graph while the host "
        f"prepares the next, so it reads the weights at {eff.bandwidth_fraction:.2f} of the "
        f"rated bandwidth (a measured copy rate) and pays {eff.per_layer_overhead_us:.0f} us per "
        "layer for its small kernels (fitted on vLLM 0.30 runs; data/efficiency.toml "
        "[engine.vllm.one_gpu_async]), not the 0.11-era factors"
    )
    return eff


def _schedules_ahead(dep: Deployment) -> bool:
    from .engine_policy import vllm_rules

    return dep.engine == "vllm" and vllm_rules(dep.engine_version).async_scheduling


def _hides_host_step(dep: Deployment) -> bool:
    """Whether a deployment that schedules ahead (:func:`_schedules_ahead`) also hides the
    host's step work: on one GPU only. Async scheduling prepares step N+1 on the host while
    the GPU runs step N; the published step cost was fitted on 0.11 runs, where that work
    sat between the steps. Held out, one-GPU runs of 0.14+ releases (silybench, kvcached,
    a k8s platform; vLLM 0.23-0.31) were measured that much faster, while tensor-parallel ones
    (MiniMax-M2.5 on 8 x H100, Qwen3-30B-A3B on 4 x A100; vLLM 0.20) were not: there the
    fitted step cost also carries the ranks' per-step hand-off and synchronisation, which the
    overlap does not hide. A calibration fits its own step cost and keeps it serial."""
    return dep.world_size == 1


def _prefill_runs_eager(dep: Deployment) -> bool:
    """SGLang captures CUDA graphs for decode batches only (its piecewise prefill graphs are
    opt-in, ``--enable-piecewise-cuda-graph``); vLLM's V0 engine for decode-only steps. vLLM
    V1 replays piecewise graphs around attention for mixed steps and TensorRT-LLM launches
    from C++: neither pays Python's per-kernel dispatch on a prompt step."""
    if dep.engine == "sglang":
        return True
    return dep.engine == "vllm" and not _is_vllm_v1(dep)


def _kv_window_share(dep: Deployment, shape: ModelShape) -> float:
    """The sliding-window share of the KV cache's layer groups where vLLM's hybrid manager
    (0.10+) frees their out-of-window blocks; 0 elsewhere (how the other engines' capacity
    is reported for such models is not modelled here: their window layers count as full)."""
    from .engine_policy import vllm_rules

    if not shape.sliding_window or shape.window_is_chunk or dep.engine != "vllm":
        return 0.0
    return shape.sliding_share if vllm_rules(dep.engine_version).hybrid_kv_manager else 0.0


def _vllm_reports_per_max_len(dep: Deployment) -> bool:
    """vLLM 0.21+ logs its KV cache as max concurrency x max_model_len (engine_policy)."""
    from .engine_policy import vllm_rules

    return vllm_rules(dep.engine_version).tokens_from_concurrency


def _admission_watermark(dep: Deployment, kv_tokens: int) -> int:
    """The free KV the scheduler keeps when admitting (vLLM V0's watermark; 0 elsewhere)."""
    if dep.engine != "vllm" or _is_vllm_v1(dep):
        return 0
    return int(V0_WATERMARK * kv_tokens)


def _trtllm_eager(dep: Deployment, arch: Any, notes: list[str]) -> bool:
    """TensorRT-LLM releases that serve DeepSeek-style models without CUDA graphs by default
    (engine_policy.trtllm_runs_eagerly), said in the notes."""
    from .engine_policy import trtllm_runs_eagerly

    if dep.engine != "trtllm" or not trtllm_runs_eagerly(dep.engine_version, arch):
        return False
    notes.append(
        f"TensorRT-LLM {dep.engine_version} serves this model on its PyTorch backend with CUDA "
        "graphs off by default (use_cuda_graph = False before 0.18): decode steps last at least "
        "the host's eager dispatch of every layer"
    )
    return True


def _generation_note(dep: Deployment, generation: str) -> str:
    from .calibration import generation_factors

    g = generation_factors(generation)
    return (
        f"{dep.engine} {dep.engine_version} runs without the kernels the factors were fitted "
        "on (older, or not yet on by default): "
        f"its kernel rates are {float(g['kernel_fraction']):.2f}x (data/efficiency.toml "
        f"[generation.{generation}]: {g.get('applies', '')})"
    )


def _prefills_first(dep: Deployment, arch: Any, max_model_len: int | None) -> bool:
    """SGLang's default scheduling, and vLLM's V0 engine without chunked prefill (its
    default up to 32K context, and always for MLA models): see StepModel.prefill_first."""
    if dep.engine == "sglang":
        return True
    if dep.engine != "vllm":
        return False
    from .engine_policy import v0_chunked_prefill, vllm_rules

    if vllm_rules(dep.engine_version).v1:
        return False
    return not v0_chunked_prefill(max_model_len or 0, arch.uses_mla)


def _multi_node_notes(dep: Deployment, hw: Hardware) -> list[str]:
    """What the model assumes when the GPUs do not fit in one NVLink domain."""
    tp, pp, g = dep.tensor_parallel_size, dep.pipeline_parallel_size, hw.scale_up_gpus
    if tp * pp <= g:
        return []
    net = (
        f"at an assumed {hw.scale_out_gb_per_s * SCALE_OUT_FRACTION:g} GB/s per GPU (one 400 Gb/s "
        f"NIC each) + {SCALE_OUT_LATENCY_US:g} us"
    )
    if tp > g:
        return [
            f"tensor parallel {tp} spans {math.ceil(tp / g)} nodes of {g} GPUs: each all-reduce "
            f"rings inside the node, then sends every GPU's 1/{g} shard between nodes {net}; "
            "tensor parallel within a node and pipeline parallel across nodes usually serves faster"
        ]
    return [
        f"{tp * pp} GPUs span {math.ceil(tp * pp / g)} nodes: stage hand-offs between them {net}"
    ]


def custom_gpu(dep: Deployment) -> Any:
    """Hardware outside the catalog, from the three figures the roofline needs
    (memory, bandwidth, FLOPS); its efficiency factors are the published defaults
    until a calibration replaces them."""
    from .catalog import GPU
    from .errors import InputError

    if dep.gpu_memory_gib is None or dep.memory_bandwidth_gbps is None or dep.tflops is None:
        raise InputError(
            "gpu",
            "performance prediction needs a catalog GPU, or hardware described by "
            "gpu_memory_gib, memory_bandwidth_gbps and tflops together",
            accepted="a catalog id such as h100-sxm-80gb, h200-sxm-141gb, a100-sxm-80gb, mi300x",
        )
    return GPU(
        id="custom",
        name=f"custom ({dep.memory_bandwidth_gbps:g} GB/s, {dep.tflops:g} TFLOPS)",
        vendor="custom",
        memory_gb_vendor=dep.gpu_memory_gib * 1.073741824,
        memory_total_gib=dep.gpu_memory_gib,
        memory_bandwidth_gb_per_s=dep.memory_bandwidth_gbps,
        dense_tflops={"bf16": dep.tflops, "fp16": dep.tflops},
        interconnect="pcie",
        interconnect_bandwidth_gb_per_s=32.0,
        pcie_gen=4,
        source_url="user-supplied (memory_bandwidth_gbps, tflops)",
    )


def _peak_tflops(gpu: Any, dtype_key: str) -> float:
    """The GEMM rate for ``dtype_key``; 16-bit GEMMs run at the FP16 rate on GPUs without
    BF16 units (T4, V100), where engines serve in float16."""
    from .errors import InputError

    rates = gpu.dense_tflops
    peak = rates.get(dtype_key) or rates.get("bf16") or rates.get("fp16") or 0.0
    if peak <= 0:
        raise InputError(
            "gpu", f"the catalog has no tensor-core FLOPS figure for {gpu.id}", "GPUs with one"
        )
    return float(peak)


def _capacity(dep: Deployment, arch: Any, gpu: Any, dtype_bytes: float) -> dict[str, Any]:
    """KV capacity (the fit calculator's) and KV bytes per token (all ranks)."""
    from .errors import InputError
    from .kv_cache import engine_kv_cache_dtype, kv_bytes_per_token

    kv = kv_bytes_per_token(
        arch,
        engine_kv_cache_dtype(dep.kv_cache_dtype, dep.engine, arch.quantization_config),
        dep.tensor_parallel_size,
        dep.pipeline_parallel_size,
        dtype_bytes,
    )
    from .deployment import Deployment
    from .fit import FitRequest

    fields = {k: getattr(dep, k) for k in Deployment.model_fields}
    fit = _fit_without_suggestions(FitRequest(**fields))
    notes = list(kv.notes)
    if not fit.fits and dep.engine == "vllm":
        rescued, pinned = _fit_with_open_facts(fields)
        if rescued is not None:
            fit = rescued
            notes.append(pinned)
    if not fit.fits or not fit.kv_cache_tokens:
        verdict = str(getattr(fit, "verdict", "") or "").rstrip(".")
        raise InputError(
            "model",
            "the deployment does not fit in GPU memory"
            + (f" ({verdict})" if verdict else "")
            + "; run `inferwise fit` with the same flags for options that make it fit",
        )
    return {
        "kv_cache_tokens": int(fit.kv_cache_tokens),
        "kv_bytes_per_token": float(kv.total),
        # the fit resolved them as the engine does: explicit flags, else the release's defaults
        "max_num_seqs": int(fit.max_num_seqs),
        "max_num_batched_tokens": int(fit.max_num_batched_tokens),
        "max_model_len": int(fit.max_model_len) if fit.max_model_len else None,
        "notes": notes,
    }


OPEN_FACT_PINS: tuple[dict[str, Any], ...] = (
    {"flashinfer_sampler": True},
    {"mxfp4_moe_kernel": "triton"},
    {"mxfp4_moe_kernel": "marlin"},
    {"flashinfer_sampler": True, "mxfp4_moe_kernel": "triton"},
    {"flashinfer_sampler": True, "mxfp4_moe_kernel": "marlin"},
)
"""Install facts a deployment request cannot say (the fit's ``range_because``: which sampler
and which MXFP4 MoE kernel the installed vLLM runs), in the order tried when the fit's
default choice leaves too little KV cache."""


def _fit_with_open_facts(fields: dict[str, Any]) -> tuple[Any, str]:
    """The fit under the first unsaid install fact that makes the deployment fit, and the
    assumption saying which. A deployment that runs with FlashInfer installed is a question
    predict can answer: refusing it because the conservative default (PyTorch's sampler) is
    a few MiB short would turn away a server that starts. (None, "") when no install fact
    helps: the conservative default's verdict stands."""
    from .fit import FitRequest

    for pin in OPEN_FACT_PINS:
        fit = _fit_without_suggestions(FitRequest(**fields, **pin))
        if fit.fits and fit.kv_cache_tokens:
            said = ", ".join(f"{k}={v}" for k, v in pin.items())
            return fit, (
                f"the deployment fits only with an install fact the flags leave unsaid: "
                f"assumed {said} ({fit.kv_cache_tokens:,} KV tokens); with the conservative "
                f"default vLLM would refuse to start at this max_model_len"
            )
    return None, ""


def _fit_without_suggestions(req: Any) -> Any:
    """The fit result without its what-if alternatives (most of a fit's cost)."""
    from .fit import estimate_fit

    return estimate_fit(req, with_suggestions=False)


__all__ = [
    "Bound",
    "Efficiency",
    "Hardware",
    "ModelShape",
    "StepModel",
    "StepTimes",
    "dense_shape",
]
