"""Memory fit: will model M serve on GPUs G with these engine settings?

Per GPU: weights, the engine's profiled activation peak, non-torch memory,
CUDA-graph memory, KV cache and headroom, following the allocation policy of
the named engine and release (``engine_policy``); then the KV cache in tokens
and the maximum concurrency exactly as vLLM logs them at start-up ("GPU KV
cache size: N tokens", "Maximum concurrency for L tokens per request: X"),
answers for the user's own context length and concurrency, and recomputed
alternatives that would make it fit or fit more.

A deployment that does not fit is a result (``fits: false``), not an error.
Only input the user can fix raises ``InputError``.

Registry entry points: :class:`FitRequest`, :class:`FitResult`,
:func:`estimate_fit`. Module level imports: stdlib, pydantic and light
project modules only (the MCP server imports this at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .deployment import MAX_TOKENS, Deployment
from .errors import InputError

if TYPE_CHECKING:
    from .architecture import ModelArchitecture
    from .catalog import GPU, ModelSource
    from .engine_policy import KVCapacity, KVLayout, SglangDefaults, SglangRules, VllmRules
    from .kv_cache import KVBytesPerToken
    from .params import ParamCounts, WeightBytes
    from .quantization import QuantScheme

GiB = 1 << 30

Provenance = Literal["measured", "computed", "assumed"]


LlamaCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
"""llama-server's --cache-type-k/-v values (common/arg.cpp)."""
LLAMACPP_ONLY = (
    "ctx_size",
    "parallel",
    "kv_unified",
    "cache_type_k",
    "cache_type_v",
    "ubatch_size",
)


class FitRequest(Deployment):
    """A deployment plus the question the user is asking of it."""

    model_config = ConfigDict(extra="forbid")

    context_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Context length per request to check, in tokens (prompt + output); "
        "default: max_model_len. Answers: does it fit at --concurrency, and the largest concurrency at this length.",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Requests in flight at once to check; answers: does it fit at --context-tokens, "
        "and the largest context per request at this concurrency.",
    )
    engine: Literal["vllm", "sglang", "trtllm", "llama.cpp"] = Field(
        default="vllm",
        description="Serving engine whose memory policy applies; llama.cpp reads a GGUF file "
        "(--model PATH.gguf or REPO:QUANT).",
    )
    ctx_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="llama.cpp -c: KV cells for all slots together; default: the training "
        "context, shortened by llama-server's --fit step to what fits.",
        json_schema_extra={"cli_aliases": ["-c"]},
    )
    parallel: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="llama.cpp -np slots; default: auto (4, sharing one unified cache).",
        json_schema_extra={"cli_aliases": ["-np"]},
    )
    kv_unified: bool | None = Field(
        default=None,
        description="llama.cpp --kv-unified: all slots share one KV pool; default: on when "
        "--parallel is unset.",
    )
    cache_type_k: LlamaCacheType | None = Field(
        default=None,
        description="llama.cpp --cache-type-k (-ctk); default f16.",
        json_schema_extra={"cli_aliases": ["-ctk"]},
    )
    cache_type_v: LlamaCacheType | None = Field(
        default=None,
        description="llama.cpp --cache-type-v (-ctv); default f16; quantized V needs flash attention.",
        json_schema_extra={"cli_aliases": ["-ctv"]},
    )
    ubatch_size: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="llama.cpp -ub physical batch; sizes the compute buffer; default 512.",
        json_schema_extra={"cli_aliases": ["-ub"]},
    )
    flash_attn: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="llama.cpp -fa; auto is on for CUDA GPUs. Off adds attention scores over "
        "the whole context to the compute buffer.",
    )
    swa_full: bool = Field(
        default=False, description="llama.cpp --swa-full: full-size cache for window layers."
    )
    mamba_cache_mode: Literal["none", "align"] | None = Field(
        default=None,
        description="Hybrid Mamba/linear-attention models: vLLM --mamba-cache-mode (align: prefix "
        "caching, two state blocks per request). Default: the release's, none before 0.28, align from 0.28.",
    )
    limit_mm_per_prompt: dict[str, Annotated[int, Field(ge=0, le=1_000_000)]] | None = Field(
        default=None,
        description="Multimodal items per prompt (vLLM --limit-mm-per-prompt); image=0,video=0 "
        "serves a vision-language model text-only. It skips the vision encoder's start-up "
        "profiling. Default: vLLM's (V1: 999 per modality, V0: 1).",
    )
    mm_processor_kwargs: dict[str, int] = Field(
        default_factory=dict,
        description="Limits of the largest profiled image (vLLM --mm-processor-kwargs). "
        "Keys: max_pixels (Qwen2/2.5/3-VL), max_dynamic_patch (InternVL), num_crops "
        "(Phi-3.5-vision).",
    )
    flashinfer_sampler: bool | None = Field(
        default=None,
        description="vLLM samples top-k/top-p with FlashInfer's kernels (FlashInfer installed and "
        "VLLM_USE_FLASHINFER_SAMPLER not 0; the default of 0.9-0.11.0 when FlashInfer is installed). "
        "Its start-up profiling peak is far below PyTorch's sort path, which leaves more KV cache. "
        "Default: PyTorch's path, the conservative choice.",
    )
    chunked_local_attn_hybrid: bool = Field(
        default=False,
        description="VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (vLLM 0.10+). Llama 4's "
        "chunked local-attention layers then keep one chunk plus the batched tokens instead of "
        "the whole context. Default: unset, whole context.",
    )
    mxfp4_moe_kernel: Literal["marlin", "triton"] | None = Field(
        default=None,
        description="MXFP4 MoE kernel vLLM runs (gpt-oss). Marlin pads expert weights to "
        "256/128, OAI's triton_kernels the intermediate size to 64; it depends on what is "
        "installed. Default: triton_kernels on Hopper from vLLM 0.11, else Marlin, and the fit "
        "shows the KV range between the two.",
    )


class PerGpuMemory(BaseModel):
    """Memory of the most constrained GPU, GiB (2^30 bytes)."""

    total_gib: float = Field(description="Total memory the runtime reports.")
    usable_gib: float = Field(
        description="total x gpu_memory_utilization: what the engine may use."
    )
    weights_gib: float
    activation_gib: float = Field(
        description="Peak of the engine's profiling forward pass and sampler warm-up."
    )
    non_torch_gib: float = Field(description="cuBLAS/NCCL and other allocations outside torch.")
    cuda_graph_gib: float = Field(
        description="CUDA-graph pool; inside usable only where the engine charges it."
    )
    cuda_graph_in_budget: bool
    kv_cache_gib: float = Field(
        description="Memory left for the KV cache (vLLM 'Available KV cache memory')."
    )
    headroom_gib: float = Field(
        description="total - usable, less CUDA graphs when charged outside the budget: what the engine leaves free."
    )


class ParameterCounts(BaseModel):
    total: int
    active_per_token: int
    by_component: dict[str, int]


class QuestionAnswer(BaseModel):
    """The answer to --context-tokens / --concurrency."""

    context_tokens: int
    concurrency: int
    fits: bool = Field(
        description="concurrency requests of context_tokens fit in the KV cache at once."
    )
    max_concurrency_at_context: int = Field(
        description="Whole requests of context_tokens that fit at once."
    )
    max_context_at_concurrency: int = Field(
        description="Longest context per request (tokens, up to max_model_len) with `concurrency` requests at once."
    )


class Quantity(BaseModel):
    name: str
    provenance: Provenance
    detail: str


class Suggestion(BaseModel):
    """A recomputed alternative deployment."""

    change: str
    flags: str = Field(description="Flags to add or change, as for `inferwise fit` / `vllm serve`.")
    fits: bool
    kv_cache_tokens: int
    max_concurrency: float
    num_gpus: int
    kv_cache_gib: float
    cost: str = Field(
        description="What it costs: quality risk, more GPUs, shorter requests, less headroom."
    )

    @classmethod
    def of(cls, change: str, flags: str, alt: FitResult, cost: str) -> Suggestion:
        """The alternative ``alt`` as a suggestion: it fits when the deployment fits and, if
        the user asked a question, answers it."""
        return cls(
            change=change,
            flags=flags,
            fits=alt.fits if alt.answer is None else alt.fits and alt.answer.fits,
            kv_cache_tokens=alt.kv_cache_tokens,
            max_concurrency=alt.max_concurrency,
            num_gpus=alt.num_gpus,
            kv_cache_gib=alt.per_gpu.kv_cache_gib,
            cost=cost,
        )


class FitResult(BaseModel):
    """Memory fit of one replica (see DESIGN.md `inferwise fit`)."""

    model: str
    model_source: Literal["catalog", "hub", "path"] = Field(
        default="catalog", description="Where config.json came from."
    )
    model_revision: str | None = Field(
        default=None, description="The Hub commit the config was read at (model_source hub)."
    )
    gpu: str
    engine: str
    engine_version: str
    engine_rules_version: str = Field(description="Release whose accounting rules were applied.")
    fits: bool
    verdict: str = Field(description="One sentence: fits or not, and why.")
    num_gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str
    parameters: ParameterCounts
    weights_bytes_total: int = Field(
        description="All weights of the model in their storage format, bytes."
    )
    checkpoint_bytes: int | None = Field(
        default=None, description="Measured checkpoint size when known, bytes."
    )
    per_gpu: PerGpuMemory
    kv_bytes_per_token: int = Field(
        description="KV bytes one token costs on the most loaded GPU (all its layers)."
    )
    kv_bytes_per_token_total: int = Field(
        description="KV bytes one token costs across all GPUs of the replica."
    )
    kv_bytes_per_token_per_layer: dict[str, int] = Field(description="Per layer kind, on one GPU.")
    kv_cache_blocks: int
    kv_cache_tokens: int = Field(description="As vLLM logs 'GPU KV cache size: N tokens'.")
    max_concurrency: float = Field(
        description="As vLLM logs 'Maximum concurrency for max_model_len tokens per request'."
    )
    estimated_max_model_len: int | None = Field(
        default=None,
        description="When one request of max_model_len does not fit: the longest context that "
        "does (vLLM's 'estimated maximum model length'); null otherwise.",
    )
    answer: QuestionAnswer | None = None
    kv_cache_tokens_range: tuple[int, int] | None = Field(
        default=None,
        description="(low, high) KV-cache tokens over the install facts the request leaves "
        "unsaid (see range_because: sampler kernels, MXFP4 MoE kernels); kv_cache_tokens lies "
        "within. Null when nothing is open or nothing changes.",
    )
    max_concurrency_range: tuple[float, float] | None = Field(
        default=None, description="Maximum concurrency at the two ends of kv_cache_tokens_range."
    )
    kv_cache_gib_range: tuple[float, float] | None = Field(
        default=None,
        description="KV-cache memory per GPU (GiB) at the two ends of kv_cache_tokens_range.",
    )
    range_because: str | None = Field(
        default=None,
        description="Which install facts the range spans: each with the choice the reported "
        "figures assume and the other one.",
    )
    quantities: list[Quantity] = Field(
        description="Which figures are measured, computed or assumed."
    )
    assumptions: list[str]
    warnings: list[str]
    suggestions: list[Suggestion]


# --------------------------------------------------------------------------- helpers


def _gib(x: float) -> float:
    return round(x / GiB, 3)


def _resolve_dtype(
    req_dtype: str, config_dtype: str | None, assumptions: list[str]
) -> tuple[str, float]:
    from .quantization import dtype_bytes

    if req_dtype != "auto":
        name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}.get(
            req_dtype, req_dtype
        )
        return name, dtype_bytes(name)
    if not config_dtype:
        return "bfloat16", 2
    name = config_dtype.lower().removeprefix("torch.")
    if name in ("float32", "float"):
        assumptions.append("checkpoint is float32; vLLM's dtype=auto serves it as bfloat16")
        return "bfloat16", 2
    return name, dtype_bytes(name)


def _check_parallelism(req: FitRequest, arch) -> None:
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    heads = arch.num_attention_heads
    if heads % tp:
        raise InputError(
            "tensor_parallel_size",
            f"{tp} does not divide the model's {heads} attention heads (vLLM requires it)",
            accepted=", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0 and d <= 128),
        )
    ssm = arch.ssm
    if ssm is not None:
        for name, n in (("state-space heads", ssm.num_heads), ("key heads", ssm.num_k_heads)):
            if n and n % tp:
                raise InputError(
                    "tensor_parallel_size",
                    f"{tp} does not divide the model's {n} {name} (vLLM shards them evenly)",
                )
    kv = arch.num_kv_heads
    if arch.mla is None and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        raise InputError(
            "tensor_parallel_size",
            f"{tp} and the model's {kv} KV heads must divide one another (vLLM QKVParallelLinear)",
        )
    if pp > arch.num_layers:
        raise InputError(
            "pipeline_parallel_size",
            f"{pp} stages for {arch.num_layers} layers",
            accepted=f"1..{arch.num_layers}",
        )


def estimate_fit(req: FitRequest, with_suggestions: bool = True) -> FitResult:
    """Compute the memory fit; see the module docstring.

    ``with_suggestions=False`` skips the recomputed alternatives (most of the
    cost), for callers that need only the capacity, such as the predictor.
    """
    return _estimate(req, with_suggestions=with_suggestions)


def estimate_fit_with_available(req: FitRequest, available_kv_bytes: int | list[int]) -> FitResult:
    """The fit with the KV-cache memory given instead of modelled.

    vLLM logs "Available KV cache memory"; feeding that number in checks the
    block, grouping and token rules on their own, independent of the
    activation / non-torch memory model (used by the log regression tests).
    One number applies to every pipeline stage; a list gives each stage its
    own (with PP the stages log different figures and the smallest block
    count wins).
    """
    return _estimate(req, with_suggestions=False, available_override=available_kv_bytes)


@dataclass
class _Notes:
    """What a fit says beside its numbers, gathered by every step."""

    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    quantities: list[Quantity] = field(default_factory=list)


@dataclass
class _Replica:
    """One replica as every engine's fit starts from it: the model, the GPU and the
    request's shape, each read and checked once."""

    req: FitRequest
    source: ModelSource
    arch: ModelArchitecture
    gpu: GPU | None
    gpu_label: str
    total_gib: float
    num_gpus: int
    dtype_name: str
    act_bytes: float
    scheme: QuantScheme
    wb: WeightBytes
    counts: ParamCounts
    kvb: KVBytesPerToken
    kv_dtype_name: str
    max_model_len: int
    notes: _Notes

    @property
    def total(self) -> float:
        """Memory per GPU, bytes."""
        return self.total_gib * GiB

    @property
    def gpu_id(self) -> str | None:
        return self.gpu.id if self.gpu else None


@dataclass(frozen=True)
class _VllmLimits:
    rules: VllmRules
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class _StageMemory:
    """Per pipeline stage: what is left for the KV cache, and the charges before it."""

    usable: float
    avail: list[int]
    acts: list[int]
    non_torch: int
    graphs: int
    graphs_in_budget: bool
    open_facts: tuple[_OpenFact, ...] = ()
    """Install facts the request leaves unsaid that change the KV memory."""


def _estimate(
    req: FitRequest,
    with_suggestions: bool,
    available_override: int | list[int] | None = None,
    resolved: tuple[ModelSource, ModelArchitecture] | None = None,
) -> FitResult:
    """The fit. ``resolved`` is the (source, architecture) of ``req.model``
    already read, passed by ``_suggestions`` for alternatives that keep the
    model and its overrides, so they do not read and normalise it again."""
    _check_engine_fields(req)
    if req.engine == "llama.cpp":
        from .llamacpp_fit import estimate_llamacpp

        return estimate_llamacpp(req, with_suggestions)
    replica = _replica(req, resolved)
    if req.engine == "trtllm":
        from .trtllm_fit import estimate_trtllm

        return estimate_trtllm(replica)
    if req.engine == "sglang":
        if replica.arch.is_hybrid_ssm:
            raise InputError(
                "engine",
                f"SGLang's hybrid Mamba / linear-attention memory pools (mamba cache sized by "
                f"--max-mamba-cache-size and --mamba-full-memory-ratio) are not modelled for "
                f"'{replica.arch.model_type}'; use --engine vllm",
                accepted="vllm",
            )
        return _sglang(replica)
    result = _vllm(replica, available_override)
    if with_suggestions:
        result.suggestions = _suggestions(
            req, result, replica.source, replica.arch, replica.scheme, replica.gpu
        )
    return result


def _check_engine_fields(req: FitRequest) -> None:
    """Flags of one engine given to another are an error, not silently ignored."""
    given = req.model_fields_set
    if req.engine != "llama.cpp" and req.model.strip().lower().endswith(".gguf"):
        raise InputError(
            "model",
            f"is a GGUF file: add --engine llama.cpp ({req.engine}'s GGUF loading is not modelled)",
        )
    if req.engine != "llama.cpp":
        stray = [f for f in LLAMACPP_ONLY if getattr(req, f) is not None]
        stray += ["flash_attn"] if req.flash_attn != "auto" else []
        stray += ["swa_full"] if req.swa_full else []
        if stray:
            raise InputError(
                stray[0], f"is a llama.cpp setting; add --engine llama.cpp (engine is {req.engine})"
            )
        return
    vllm_only = (
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "flashinfer_sampler",
        "mxfp4_moe_kernel",
    )
    changed = {
        "kv_cache_dtype": req.kv_cache_dtype != "auto",
        "gpu_memory_utilization": req.gpu_memory_utilization != 0.9,
        "enforce_eager": req.enforce_eager,
        "quantization": req.quantization is not None,
        "dtype": req.dtype != "auto",
        "limit_mm_per_prompt": req.limit_mm_per_prompt is not None,
        "mamba_cache_mode": req.mamba_cache_mode is not None,
        "chunked_local_attn_hybrid": req.chunked_local_attn_hybrid,
        "hf_overrides": bool(req.hf_overrides),
    }
    for name, is_set in changed.items():
        if is_set:
            twin = {"kv_cache_dtype": "--cache-type-k/-v (-ctk/-ctv)"}.get(name)
            raise InputError(
                name,
                "is not a llama.cpp setting (its GGUF file fixes the weights)"
                + (f"; use {twin}" if twin else ""),
            )
    for name in vllm_only:
        if name in given and getattr(req, name) is not None:
            twin = {"max_model_len": "--ctx-size (-c)", "max_num_seqs": "--parallel (-np)"}
            raise InputError(
                name,
                f"is not a llama.cpp setting; use {twin.get(name, 'the llama.cpp flags')}",
            )


# --------------------------------------------------------------------------- the replica


def _replica(req: FitRequest, resolved: tuple[ModelSource, ModelArchitecture] | None) -> _Replica:
    """Read the model, the GPU and the parallel layout; size the weights and the KV cost."""
    from .kv_cache import engine_kv_cache_dtype, kv_bytes_per_token
    from .params import count_parameters
    from .quantization import resolve_quantization

    notes = _Notes()
    source, arch = resolved or _read_model(req)
    if source.resolution:
        notes.assumptions.append(source.resolution)
    notes.assumptions += list(arch.notes)
    _check_parallelism(req, arch)
    gpu, total_gib = _gpu_memory(req, notes)
    num_gpus = _replica_gpus(req, notes)
    dtype_name, act_bytes = _resolve_dtype(req.dtype, arch.torch_dtype, notes.assumptions)
    scheme = resolve_quantization(req.quantization, arch.quantization_config)
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    kv_dtype = engine_kv_cache_dtype(req.kv_cache_dtype, req.engine, arch.quantization_config)
    kvb = kv_bytes_per_token(arch, kv_dtype, tp, pp, act_bytes)
    replica = _Replica(
        req=req,
        source=source,
        arch=arch,
        gpu=gpu,
        gpu_label=gpu.id if gpu else f"custom-{total_gib:g}gib",
        total_gib=total_gib,
        num_gpus=num_gpus,
        dtype_name=dtype_name,
        act_bytes=act_bytes,
        scheme=scheme,
        wb=None,  # type: ignore[arg-type]  # set by _weights, next
        counts=count_parameters(arch),
        kvb=kvb,
        kv_dtype_name=_kv_dtype_name(req.kv_cache_dtype, kv_dtype, dtype_name),
        max_model_len=0,
        notes=notes,
    )
    replica.wb = _weights(replica)
    notes.assumptions += list(kvb.notes)
    replica.max_model_len = _max_model_len(req, arch, notes)
    return replica


def _kv_dtype_name(asked: str, runs: str, model_dtype: str) -> str:
    """How the KV dtype is shown: the flag, and under ``auto`` what it resolved to."""
    if asked != "auto":
        return asked
    if runs != "auto":
        return f"auto ({runs}: the checkpoint's kv_cache_quant_algo, as TensorRT-LLM reads it)"
    return f"auto ({model_dtype})"


def _read_model(req: FitRequest) -> tuple[ModelSource, ModelArchitecture]:
    from .architecture import from_config
    from .catalog import load_model

    # fresh=False: the config is only read here, never changed; no copy needed
    source = load_model(req.model, fresh=False, revision=req.revision)
    return source, from_config(source.config, req.hf_overrides)


def _gpu_memory(req: FitRequest, notes: _Notes) -> tuple[GPU | None, float]:
    """The catalog GPU (if named) and the memory per GPU the runtime reports, GiB."""
    from . import engine_policy as ep
    from .catalog import get_gpu

    gpu = get_gpu(req.gpu) if req.gpu else None
    if req.gpu_memory_gib is not None:
        total_gib = float(req.gpu_memory_gib)
        if gpu is not None:
            notes.warnings.append(
                f"--gpu-memory-gib {total_gib:g} overrides the catalog's {gpu.memory_total_gib:g} GiB for {gpu.id}"
            )
        notes.quantities.append(
            Quantity(name="total_gib", provenance="measured", detail="given by --gpu-memory-gib")
        )
        return gpu, total_gib
    if gpu is None:  # the request model requires gpu or gpu_memory_gib
        raise InputError("gpu", "give gpu (a catalog id) or gpu_memory_gib")
    total_gib, how = ep.runtime_total_gib(
        gpu.memory_total_gib, gpu.memory_total_gib_torch, gpu.vendor
    )
    measured = gpu.memory_total_gib_torch or gpu.vendor != "nvidia"
    notes.quantities.append(
        Quantity(
            name="total_gib",
            provenance="measured" if measured else "assumed",
            detail=f"{gpu.name}: {total_gib:.2f} GiB, {how} ({gpu.source_url})",
        )
    )
    return gpu, total_gib


def _replica_gpus(req: FitRequest, notes: _Notes) -> int:
    """GPUs the request names (default: one replica's); more than a replica is data parallel."""
    world = req.world_size
    num_gpus = req.gpus_named()
    if num_gpus > world:
        if num_gpus % world:
            notes.warnings.append(
                f"{num_gpus} GPUs is not a multiple of the replica size {world}; some would idle"
            )
        notes.warnings.append(
            f"this fit is for one replica of {world} GPU(s); {num_gpus // world} replicas fit on {num_gpus} GPUs "
            "(data parallel), each with the KV cache below"
        )
    return num_gpus


def _weights(r: _Replica) -> WeightBytes:
    """Weight bytes per GPU as the engine shards them, checked against the checkpoint."""
    from . import engine_policy as ep
    from .params import weight_bytes

    req, scheme = r.req, r.scheme
    alignment = (256, 128)
    if req.engine == "vllm":
        rules = ep.vllm_rules(req.engine_version)
        alignment = ep.mxfp4_alignment(rules, r.gpu_id, req.mxfp4_moe_kernel)
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    loaded = _loaded_architecture(r)
    wb = weight_bytes(loaded, scheme, r.act_bytes, tp, pp, mxfp4_alignment=alignment)
    r.notes.assumptions += list(wb.notes)
    if _headers_apply(r):
        return _measured_weights(r, wb, with_encoders=loaded.vision is not None)
    what = scheme.description if scheme.is_quantized else r.dtype_name
    r.notes.quantities.append(
        Quantity(
            name="weights_gib",
            provenance="computed",
            detail=f"{r.counts.total:,} parameters from config.json; {what}; "
            "split per module as vLLM shards it",
        )
    )
    if r.source.checkpoint_bytes:
        _check_against_checkpoint(r)
    return wb


def _headers_apply(r: _Replica) -> bool:
    """The checkpoint's own tensors are what the engine holds: served in the format it is
    stored in (no load-time quantization or dtype cast), without kernel repacking (MXFP4
    padding) and with a tensor table read from its headers."""
    if r.source.tensors is None or r.req.quantization is not None or r.req.dtype != "auto":
        return False
    stored = (r.arch.torch_dtype or "").lower().removeprefix("torch.")
    if r.scheme.method == "mxfp4" or stored in ("float32", "float"):
        return False
    from .checkpoint_tensors import missing_layers

    gaps = missing_layers(r.source.tensors, r.arch.num_layers)
    if gaps:
        r.notes.warnings.append(
            f"the checkpoint's tensors lack {len(gaps)} of the config's {r.arch.num_layers} "
            f"layers (first: {gaps[0]}): an incomplete download? weights from config.json"
        )
        return False
    return True


def _measured_weights(r: _Replica, computed: WeightBytes, with_encoders: bool) -> WeightBytes:
    """Weights per GPU from the safetensors headers, sharded per tensor as vLLM does; the
    config arithmetic is kept as the check beside it. ``with_encoders`` False: a text-only
    deployment that builds no vision tower leaves its tensors unloaded."""
    from dataclasses import replace

    from .checkpoint_tensors import per_stage_bytes

    table = r.source.tensors
    assert table is not None
    if not with_encoders:
        table = table.without_encoders()
    tp, pp = r.req.tensor_parallel_size, r.req.pipeline_parallel_size
    stages = per_stage_bytes(table, r.arch, tp, pp)
    diff = (computed.total_bytes - table.total_bytes) / max(1, table.total_bytes)
    by_dtype = ", ".join(f"{n:,} {d}" for d, n in table.parameters_by_dtype().items())
    r.notes.quantities.append(
        Quantity(
            name="weights_gib",
            provenance="measured",
            detail=f"measured from the checkpoint's headers: {len(table.tensors):,} tensors, "
            f"{table.total_bytes / GiB:.2f} GiB ({by_dtype}), split per tensor as vLLM shards "
            f"it (config.json arithmetic: {diff:+.1%})",
        )
    )
    if abs(diff) > 0.03:
        r.notes.warnings.append(
            f"config.json arithmetic ({computed.total_bytes / GiB:.2f} GiB) differs from the "
            f"checkpoint's tensors ({table.total_bytes / GiB:.2f} GiB) by {diff:+.1%}; the "
            "measured tensors are used"
        )
    return replace(
        computed,
        total_bytes=table.total_bytes,
        per_gpu_bytes=max(stages),
        per_stage_bytes=stages,
    )


LANGUAGE_ONLY_FROM = (0, 10, 1)
"""vllm#22299 (merged 2025-08-06, in 0.10.1; #22224 did LLaVA first): with every
modality's --limit-mm-per-prompt at 0 these models build no vision tower or
projector ("implicit language-model-only mode"), so their weights are not loaded."""
LANGUAGE_ONLY_FAMILIES = frozenset(
    {"llava", "llava_next", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"}
)
"""Model types whose vLLM classes guard the tower on get_limit_per_prompt (read in their
vllm/model_executor/models/*.py); others load it whatever the limits."""


def _loaded_architecture(r: _Replica) -> ModelArchitecture:
    """The architecture whose weights vLLM loads: without the vision tower where a
    text-only deployment skips it (vLLM only; SGLang loads the checkpoint)."""
    import dataclasses

    from . import engine_policy as ep
    from . import vision

    req, arch = r.req, r.arch
    limits = req.limit_mm_per_prompt
    if arch.vision is None or not limits:
        return arch
    if any(limits.get(m, 1) for m in vision.modalities(arch.vision.family or arch.model_type)):
        return arch
    if req.engine != "vllm":
        return arch
    version = ep.parse_version(req.engine_version or ep.VLLM_DEFAULT_VERSION)
    if arch.model_type in LANGUAGE_ONLY_FAMILIES and version >= LANGUAGE_ONLY_FROM:
        r.notes.assumptions.append(
            "text-only: vLLM builds no vision tower or projector when every modality's limit is 0 "
            f"(vllm#22299, 0.10.1+); their {r.counts.vision:,} parameters are not loaded"
        )
        return dataclasses.replace(arch, vision=None)
    r.notes.assumptions.append(
        "text-only, but the vision tower's weights are still loaded "
        + (
            f"(vLLM {'.'.join(map(str, version))} predates the language-model-only mode of 0.10.1)"
            if arch.model_type in LANGUAGE_ONLY_FAMILIES
            else f"(vLLM's '{arch.model_type}' class builds it whatever the limits)"
        )
    )
    return arch


def _check_against_checkpoint(r: _Replica) -> None:
    from .params import weight_bytes

    on_disk = weight_bytes(r.arch, r.scheme, r.act_bytes, 1, 1, runtime_layout=False).total_bytes
    checkpoint = r.source.checkpoint_bytes or 1
    diff = (on_disk - checkpoint) / checkpoint
    r.notes.quantities.append(
        Quantity(
            name="checkpoint_bytes",
            provenance="measured",
            detail=f"{checkpoint / GiB:.2f} GiB on disk; computed weights differ by {diff:+.1%}",
        )
    )
    if abs(diff) > 0.03:
        r.notes.warnings.append(
            f"computed weights ({on_disk / GiB:.2f} GiB) differ from the checkpoint "
            f"({checkpoint / GiB:.2f} GiB) by {diff:+.1%}; extra tensors (e.g. MTP layers) "
            "or a different format"
        )


def _max_model_len(req: FitRequest, arch: ModelArchitecture, notes: _Notes) -> int:
    model_max = arch.max_position_embeddings
    if req.max_model_len is not None and req.max_model_len > model_max:
        raise InputError(
            "max_model_len",
            f"{req.max_model_len} exceeds the model's maximum context {model_max} "
            "(vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
            accepted=f"1..{model_max}",
        )
    if req.max_model_len is None:
        notes.assumptions.append(
            f"max_model_len = the model's maximum, {model_max:,} tokens (the engine's default)"
        )
    return req.max_model_len or model_max


# --------------------------------------------------------------------------- vLLM


def _vllm(r: _Replica, available_override: int | list[int] | None) -> FitResult:
    """vLLM's accounting: profiled peak, non-torch and CUDA-graph memory per stage, then
    its block rules on what is left (kv_cache_utils.py)."""
    from . import engine_policy as ep

    limits = _vllm_limits(r)
    mem = _vllm_memory(r, limits, available_override)
    stages = r.kvb.layers_per_stage
    layout = ep.vllm_kv_layout(
        r.arch,
        limits.rules,
        stages,
        r.kvb.per_layer[next(iter(r.kvb.per_layer))],
        limits.block_size,
        chunked_hybrid=r.req.chunked_local_attn_hybrid,
        state_bytes=r.kvb.state_bytes_per_layer,
        mamba_cache_mode=_mamba_cache_mode(r, limits.rules),
    )
    r.notes.assumptions += list(layout.notes)
    cap = ep.kv_capacity(
        layout, limits.rules, mem.avail, r.max_model_len, limits.max_num_batched_tokens
    )
    pp = r.req.pipeline_parallel_size
    # The most constrained stage is the one reported per GPU.
    worst = min(range(pp), key=lambda s: mem.avail[s] / max(1, layout.group_size_per_stage[s]))
    has_room = mem.avail[worst] > 0
    fits, verdict = _vllm_verdict(r, mem, cap, worst)
    ranges = _vllm_ranges(r, limits, layout, mem, cap, worst) if has_room else {}
    answer = None
    if r.req.context_tokens is not None or r.req.concurrency is not None:
        answer = _vllm_answer(r, limits, layout, cap, fits, has_room)
    return _result(
        r,
        engine="vllm",
        engine_version=limits.rules.version,
        engine_rules_version=limits.rules.rules_from,
        fits=fits,
        verdict=verdict,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_num_seqs=limits.max_num_seqs,
        block_size=limits.block_size,
        per_gpu=_vllm_per_gpu(r, mem, worst),
        kv_cache_blocks=cap.num_blocks,
        kv_cache_tokens=cap.kv_cache_tokens if has_room else 0,
        max_concurrency=round(cap.max_concurrency, 4) if has_room else 0.0,
        estimated_max_model_len=cap.estimated_max_model_len
        if has_room and not cap.fits_one_request
        else None,
        answer=answer,
        **ranges,
    )


def _mamba_cache_mode(r: _Replica, rules: VllmRules) -> str:
    """How many state blocks a request holds: given, or the release's default."""
    if not r.arch.is_hybrid_ssm:
        return "none"
    if r.req.mamba_cache_mode is not None:
        return r.req.mamba_cache_mode
    if rules.hybrid_prefix_caching_default:
        r.notes.assumptions.append(
            f"vLLM {rules.version} enables prefix caching for hybrid models by default "
            "(mamba_cache_mode align, vllm#50991): two state blocks per request and Mamba group; "
            "--mamba-cache-mode none (--no-enable-prefix-caching) holds one"
        )
        return "align"
    r.notes.assumptions.append(
        f"vLLM {rules.version} keeps prefix caching off for hybrid models unless asked "
        "(mamba_cache_mode none): one state block per request and Mamba group"
    )
    return "none"


def _vllm_ranges(
    r: _Replica,
    limits: _VllmLimits,
    layout: KVLayout,
    mem: _StageMemory,
    cap: KVCapacity,
    worst: int,
) -> dict[str, Any]:
    """The KV capacity over every combination of the open install facts
    (sampler, MXFP4 MoE kernel): the figures reported are one corner, the
    range spans the lowest and highest."""
    from itertools import product

    from . import engine_policy as ep

    if not mem.open_facts:
        return {}
    corners = []
    for picks in product((False, True), repeat=len(mem.open_facts)):
        avail = list(mem.avail)
        for pick, (_, _, _, gain) in zip(picks, mem.open_facts, strict=True):
            if pick:
                avail = [a + g for a, g in zip(avail, gain, strict=True)]
        c = (
            cap
            if not any(picks)
            else ep.kv_capacity(
                layout, limits.rules, avail, r.max_model_len, limits.max_num_batched_tokens
            )
        )
        corners.append((c.kv_cache_tokens, c.max_concurrency, max(0, avail[worst])))
    low, high = min(corners), max(corners)
    if low[0] == high[0]:
        return {}
    because = "; ".join(
        f"{what}: {chosen} (reported) or {other}" for what, chosen, other, _ in mem.open_facts
    )
    r.notes.assumptions.append(
        f"KV cache between {low[0]:,} and {high[0]:,} tokens over install facts the request "
        f"leaves unsaid ({because}); say --flashinfer-sampler / --mxfp4-moe-kernel to pin them"
    )
    return {
        "kv_cache_tokens_range": (low[0], high[0]),
        "max_concurrency_range": (round(low[1], 4), round(high[1], 4)),
        "kv_cache_gib_range": (_gib(low[2]), _gib(high[2])),
        "range_because": because,
    }


def _vllm_limits(r: _Replica) -> _VllmLimits:
    """The release's rules and the batching limits: given, or the engine's defaults."""
    from . import engine_policy as ep

    req, notes = r.req, r.notes
    rules = ep.vllm_rules(req.engine_version)
    notes.warnings += list(rules.notes)
    if req.engine_version is None:
        notes.assumptions.append(
            f"vLLM {rules.version} accounting (the newest release the rules know)"
        )
    block_size = req.block_size
    if r.arch.is_hybrid_ssm:
        ep.check_vllm_hybrid_support(rules, r.arch)
        token_bytes = r.kvb.per_layer[next(iter(r.kvb.per_layer))]
        block_size, why = ep.vllm_hybrid_block_size(
            r.arch, token_bytes, r.kvb.state_bytes_per_layer, req.block_size, r.gpu_id
        )
        notes.assumptions.append(why)
    elif block_size is None:
        block_size, why = ep.vllm_default_block_size(r.arch, r.gpu_id)
        notes.assumptions.append(why)
    mnbt_default, seqs_default, why = ep.vllm_default_batching(
        rules, r.total_gib, r.gpu_id, r.max_model_len, r.arch.uses_mla
    )
    mnbt = req.max_num_batched_tokens or mnbt_default
    if req.max_num_batched_tokens is None or req.max_num_seqs is None:
        notes.assumptions.append(why)
    if (
        not rules.v1
        and mnbt < r.max_model_len
        and not ep.v0_chunked_prefill(r.max_model_len, r.arch.uses_mla)
    ):
        raise InputError(
            "max_num_batched_tokens",
            f"{mnbt} is smaller than max_model_len {r.max_model_len}; the V0 engine without chunked "
            "prefill needs a whole prompt per step",
        )
    seqs = req.max_num_seqs or seqs_default
    if mnbt < seqs:
        # vLLM's SchedulerConfig refuses to start on this (_verify_args)
        raise InputError(
            "max_num_batched_tokens",
            f"{mnbt} is below max_num_seqs {seqs}; vLLM refuses to start unless "
            "max_num_batched_tokens >= max_num_seqs (raise it or lower max_num_seqs)",
        )
    return _VllmLimits(rules, block_size, mnbt, seqs)


def _sampler_bytes_per_logit(r: _Replica, limits: _VllmLimits, on_mrv2: bool) -> float:
    """Bytes per logit the sampler warm-up holds in the profiling run, and why."""
    from . import engine_policy as ep

    rules, notes = limits.rules, r.notes
    cost = rules.sampler_bytes_per_logit
    if not rules.v1 and r.max_model_len > 32768:
        cost = ep.SAMPLER_BYTES_PER_LOGIT["v0_chunked"]
    if on_mrv2 and not rules.mrv2_profiles_sampling_params:
        # MRV2 profiles no top-k/top-p at all, so the sampler kind does not matter
        notes.assumptions.append(
            f"vLLM {rules.version} runs this model on Model Runner V2, whose profiling run holds "
            "only the logits in the model dtype for the sampler (no fp32 copy, vllm#57926)"
        )
        return r.act_bytes
    if on_mrv2:
        notes.assumptions.append(
            f"vLLM {rules.version} runs this model on Model Runner V2, whose profiling run "
            "samples the dummy batch again with warm-up sampling parameters (fp32 logits, "
            "top-k/top-p, logprobs; 0.33+, vllm#57926): costed like V1's sampler"
        )
    if r.req.flashinfer_sampler and rules.v1:
        cost = ep.SAMPLER_BYTES_PER_LOGIT["flashinfer"]
        notes.assumptions.append(
            f"sampler warm-up profiled with FlashInfer's top-k/top-p kernels ({cost:g} B per logit)"
        )
    elif rules.v1 and cost > r.act_bytes:
        requests = min(limits.max_num_seqs, limits.max_num_batched_tokens)
        sampler_gib = requests * r.arch.vocab_size * cost / GiB
        notes.assumptions.append(
            f"sampler warm-up profiled with PyTorch's top-k/top-p ({cost:g} B per logit, "
            f"{sampler_gib:.2f} GiB); where FlashInfer's sampling kernels run instead "
            "(installed and enabled; --flashinfer-sampler), the peak is smaller and the KV cache "
            "up to that much larger"
        )
    return cost


def _vllm_memory(
    r: _Replica, limits: _VllmLimits, available_override: int | list[int] | None
) -> _StageMemory:
    """Memory left for the KV cache on each pipeline stage (or the logged figure given)."""
    from . import engine_policy as ep

    req, rules, arch = r.req, limits.rules, r.arch
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    mnbt, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
    usable = r.total * req.gpu_memory_utilization
    on_mrv2 = rules.v1 and ep.vllm_uses_mrv2(rules, arch, r.scheme.is_quantized)
    sampler_cost = _sampler_bytes_per_logit(r, limits, on_mrv2)
    act_last = ep.activation_peak_bytes(arch, r.act_bytes, mnbt, seqs, tp, rules.v1, sampler_cost)
    act_other = ep.activation_peak_bytes(arch, r.act_bytes, mnbt, 0, tp, rules.v1)
    non_torch = ep.non_torch_bytes(rules, tp, pp)
    layers_on_rank = max(sum(s.values()) for s in r.kvb.layers_per_stage)
    graphs = ep.cuda_graph_bytes(arch, layers_on_rank, req.enforce_eager)
    graphs_in_budget = ep.cuda_graphs_charged(rules, on_mrv2, req.enforce_eager)
    if graphs and rules.cuda_graphs_in_budget and not graphs_in_budget:
        r.notes.warnings.append(
            f"vLLM {rules.version} runs this model on Model Runner V2, whose CUDA-graph memory "
            "estimate is 0 before 0.29 (vllm#49224): the KV cache takes the whole budget and the "
            f"graphs (~{graphs / GiB:.2f} GiB) are captured afterwards, from the memory above "
            "--gpu-memory-utilization"
        )
    charged = graphs if graphs_in_budget else 0
    acts = [act_last if s == pp - 1 else act_other for s in range(pp)]
    encoder = _mm_encoder_profile(r, limits)
    if encoder is not None:
        # the tower runs on the first stage; its outputs stay cached through the text dummy run
        peak, outputs = encoder
        acts[0] = max(peak, acts[0] + outputs)
    avail = [
        int(usable - r.wb.per_stage_bytes[s] - acts[s] - non_torch - charged) for s in range(pp)
    ]
    if isinstance(available_override, list):
        if len(available_override) != pp:
            raise InputError(
                "pipeline_parallel_size",
                f"{len(available_override)} per-stage KV memories given for {pp} stages",
            )
        avail = list(available_override)
    elif available_override is not None:
        avail = [available_override] * pp
    r.notes.quantities += _vllm_quantities(r, limits, graphs_in_budget)
    open_facts: list[_OpenFact] = []
    if available_override is None:
        if _sampler_kind_matters(r, limits, on_mrv2):
            act_fi = ep.activation_peak_bytes(
                arch,
                r.act_bytes,
                mnbt,
                seqs,
                tp,
                rules.v1,
                ep.SAMPLER_BYTES_PER_LOGIT["flashinfer"],
            )
            gain = [acts[s] - act_fi if s == pp - 1 else 0 for s in range(pp)]
            open_facts.append(("sampler", "PyTorch's top-k/top-p", "FlashInfer's", gain))
        open_facts += _moe_kernel_fact(r, limits)
    return _StageMemory(usable, avail, acts, non_torch, graphs, graphs_in_budget, tuple(open_facts))


_OpenFact = tuple[str, str, str, list[int]]
"""(what, the choice the figures assume, the other choice, bytes per stage the
other choice adds to the KV memory; negative where it takes)."""


def _moe_kernel_fact(r: _Replica, limits: _VllmLimits) -> list[_OpenFact]:
    """The MXFP4 MoE kernel (Marlin or triton_kernels) where the request leaves
    it unsaid: the other kernel's padding changes the expert weights."""
    from . import engine_policy as ep
    from .params import weight_bytes

    if r.req.mxfp4_moe_kernel is not None or r.arch.moe is None or r.scheme.method != "mxfp4":
        return []
    chosen = ep.mxfp4_kernel(limits.rules, r.gpu_id)
    other = "marlin" if chosen == "triton" else "triton"
    tp, pp = r.req.tensor_parallel_size, r.req.pipeline_parallel_size
    alt = weight_bytes(
        r.arch, r.scheme, r.act_bytes, tp, pp, mxfp4_alignment=ep.MXFP4_KERNEL_ALIGNMENT[other]
    )
    gain = [int(w - a) for w, a in zip(r.wb.per_stage_bytes, alt.per_stage_bytes, strict=True)]
    names = {"marlin": "Marlin MoE kernels", "triton": "triton_kernels MoE"}
    return [("MXFP4 MoE kernel", names[chosen], names[other], gain)]


def _sampler_kind_matters(r: _Replica, limits: _VllmLimits, on_mrv2: bool) -> bool:
    """Whether FlashInfer's sampler or PyTorch's changes the profiled peak and
    the request does not say which runs: an install fact the logs cannot show
    (FlashInfer installed, VLLM_USE_FLASHINFER_SAMPLER, more than 16 SMs;
    vllm/v1/sample/ops/topk_topp_sampler.py ``flashinfer_sampler_supported``)."""
    rules = limits.rules
    if r.req.flashinfer_sampler is not None or not rules.v1:
        return False
    return not on_mrv2 or rules.mrv2_profiles_sampling_params


def _mm_limits(r: _Replica, rules: VllmRules) -> dict[str, int]:
    """Items per prompt by modality as vLLM resolves them (V1 default 999, V0 1)."""
    from . import vision

    default = 999 if rules.v1 else 1
    given = r.req.limit_mm_per_prompt or {}
    v = r.arch.vision
    known = vision.modalities(v.family or r.arch.model_type) if v else ("image", "video")
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InputError(
            "limit_mm_per_prompt",
            f"modality {', '.join(unknown)} is not modelled",
            accepted=", ".join(known),
        )
    limits = {m: given.get(m, default) for m in known}
    limits.setdefault("video", 0)
    return limits


def _mm_profiled_limits(r: _Replica, limits: _VllmLimits) -> dict[str, int] | None:
    """The limits vLLM profiles with, or None where no encoder profile is charged
    (no tower, text-only serving, or a tower whose profiling is not modelled)."""
    v, notes, req = r.arch.vision, r.notes, r.req
    if v is None:
        if req.limit_mm_per_prompt or req.mm_processor_kwargs:
            notes.warnings.append(
                "limit_mm_per_prompt / mm_processor_kwargs ignored: the model has no vision tower"
            )
        return None
    mm_limits = _mm_limits(r, limits.rules)
    if mm_limits["image"] == 0 and mm_limits["video"] == 0:
        notes.assumptions.append(
            "text-only serving (every modality's limit_mm_per_prompt 0): vLLM skips the vision "
            "encoder's profiling and the encoder cache"
        )
        return None
    if not v.family:
        notes.warnings.append(
            f"vLLM profiles the '{v.model_type}' vision encoder at start-up; that peak is not "
            'modelled here (pass limit_mm_per_prompt {"image": 0, "video": 0} for text-only serving)'
        )
        return None
    if mm_limits["image"] == 0:
        raise InputError(
            "limit_mm_per_prompt",
            "video profiling (image=0 with video enabled) is not modelled; set video=0 as well "
            "for text-only serving, or leave images enabled",
        )
    return mm_limits


def _mm_encoder_profile(r: _Replica, limits: _VllmLimits) -> tuple[int, int] | None:
    """(encoder peak, encoder outputs) of vLLM's multimodal profiling, bytes per GPU,
    or None for a text-only model or deployment. Says in the assumptions what it charged."""
    from . import vision

    mm_limits = _mm_profiled_limits(r, limits)
    if mm_limits is None:
        return None
    v, req = r.arch.vision, r.req
    assert v is not None  # _mm_profiled_limits returns None without a tower
    tokens, patches, how = vision.max_image_shape(
        v.family, dict(v.image_facts), req.mm_processor_kwargs
    )
    budget, items = vision.mm_profile_items(
        tokens,
        limits.max_num_batched_tokens,
        limits.max_num_seqs,
        mm_limits["image"],
        limits.rules.v1,
    )
    layout = v.layout or vision.TowerLayout(  # SigLIP/CLIP read by the generic path
        0, 0, v.hidden_size, v.intermediate_size, v.num_layers, v.gated_mlp,
        v.num_channels * v.patch_size**2, 1,
    )  # fmt: skip
    peak = vision.encoder_peak_bytes(layout, items * patches, r.act_bytes, req.tensor_parallel_size)
    outputs = int(items * tokens * r.arch.hidden_size * r.act_bytes)
    _mm_notes(r, limits, mm_limits, (budget, items, tokens, patches, how), peak, outputs)
    return peak, outputs


def _mm_notes(
    r: _Replica,
    limits: _VllmLimits,
    mm_limits: dict[str, int],
    shape: tuple[int, int, int, int, str],
    peak: int,
    outputs: int,
) -> None:
    """What the encoder profile charged, in the assumptions and quantities."""
    budget, items, tokens, patches, how = shape
    notes = r.notes
    notes.assumptions.append(
        f"vision encoder profiling: encoder budget {budget:,} tokens = max(max_num_batched_tokens, "
        f"{tokens:,} tokens per image: {how}), {items} dummy image(s) of {patches:,} patches; "
        f"modelled encoder peak {peak / GiB:.2f} GiB (a shape model, no log separates it) and "
        f"{outputs / GiB:.2f} GiB of encoder outputs held through the text model's dummy run; "
        "lower it with limit_mm_per_prompt or mm_processor_kwargs, or image=0,video=0 for text-only"
    )
    notes.quantities.append(
        Quantity(
            name="vision_encoder_profile_gib",
            provenance="assumed",
            detail=f"{max(peak, outputs) / GiB:.2f} GiB peak of the vision encoder's profiling run "
            "(vllm/v1/worker/gpu_model_runner.py profile_run, encoder_cache_manager.py compute_encoder_budget)",
        )
    )
    if mm_limits["video"] > 0 and not limits.rules.v1:
        notes.warnings.append(
            "vLLM V0 also encodes a dummy video in each profiling sequence; it is not modelled, "
            "so the profiled peak is underestimated (set video=0 to match)"
        )
    elif mm_limits["video"] > 0:
        notes.assumptions.append(
            "vLLM profiles the modality with the most tokens per item; images are taken to be it "
            "(true at the default limits; with few images per prompt the video dummy can be larger)"
        )


def _vllm_quantities(r: _Replica, limits: _VllmLimits, graphs_in_budget: bool) -> list[Quantity]:
    mnbt, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
    if graphs_in_budget:
        where = " (charged inside the budget from vLLM 0.21)"
    elif limits.rules.cuda_graphs_in_budget and not r.req.enforce_eager:
        where = " (outside the budget: Model Runner V2 estimates 0 before vLLM 0.29)"
    else:
        where = " (outside the budget before vLLM 0.21)"
    return [
        Quantity(
            name="activation_gib",
            provenance="assumed",
            detail=f"modelled peak of vLLM's profiling run ({mnbt:,} tokens, sampler for "
            f"{min(seqs, mnbt):,} requests x {r.arch.vocab_size:,} vocabulary), calibrated on public start-up logs",
        ),
        Quantity(
            name="non_torch_gib",
            provenance="assumed",
            detail="typical value from public start-up logs",
        ),
        Quantity(
            name="cuda_graph_gib", provenance="assumed", detail="estimated CUDA-graph pool" + where
        ),
        Quantity(
            name="kv_cache_tokens",
            provenance="computed",
            detail="vLLM's block rules (kv_cache_utils.py) applied to the memory left for the KV cache",
        ),
    ]


def _vllm_per_gpu(r: _Replica, mem: _StageMemory, worst: int) -> PerGpuMemory:
    total = r.total
    headroom = total - mem.usable - (0 if mem.graphs_in_budget else mem.graphs)
    if headroom < 0:
        r.notes.warnings.append(
            f"CUDA graphs (~{mem.graphs / GiB:.2f} GiB) do not fit in the {(total - mem.usable) / GiB:.2f} GiB the "
            "utilization leaves free: capture may run out of memory; lower --gpu-memory-utilization or use --enforce-eager"
        )
    return PerGpuMemory(
        total_gib=_gib(total),
        usable_gib=_gib(mem.usable),
        weights_gib=_gib(r.wb.per_stage_bytes[worst]),
        activation_gib=_gib(mem.acts[worst]),
        non_torch_gib=_gib(mem.non_torch),
        cuda_graph_gib=_gib(mem.graphs),
        cuda_graph_in_budget=mem.graphs_in_budget,
        kv_cache_gib=_gib(max(0, mem.avail[worst])),
        headroom_gib=_gib(max(0.0, headroom)),
    )


def _vllm_verdict(r: _Replica, mem: _StageMemory, cap: KVCapacity, worst: int) -> tuple[bool, str]:
    """Fits or not, in one sentence, with vLLM's own start-up error as a warning."""
    usable, weights, max_len = mem.usable, r.wb.per_stage_bytes[worst], r.max_model_len
    kv_gib = max(0, mem.avail[worst]) / GiB
    if mem.avail[worst] <= 0:
        need = usable - mem.avail[worst]
        if weights > usable:
            verdict = (
                f"Does not fit: weights need {weights / GiB:.2f} GiB per GPU but only "
                f"{usable / GiB:.2f} GiB are usable (gpu_memory_utilization {r.req.gpu_memory_utilization:g})."
            )
        else:
            verdict = (
                f"Does not fit: weights, activations and runtime memory need {need / GiB:.2f} GiB per GPU, "
                f"more than the {usable / GiB:.2f} GiB usable; no memory is left for the KV cache."
            )
        r.notes.warnings.append(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine. (vLLM's start-up error)"
        )
        return False, verdict
    if not cap.fits_one_request:
        est, needed_gib = cap.estimated_max_model_len, cap.needed_bytes_one_request / GiB
        r.notes.warnings.append(
            f"To serve at least one request with the models's max seq len ({max_len}), "
            f"({needed_gib:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({kv_gib:.2f} GiB). Based on the available memory, the "
            f"estimated maximum model length is {est}. Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine. (vLLM's start-up error)"
        )
        return False, (
            f"Does not fit at max_model_len {max_len:,}: one such request needs "
            f"{needed_gib:.2f} GiB of KV cache per GPU, more than the "
            f"{kv_gib:.2f} GiB available; the longest context that fits is {est:,} tokens."
        )
    return True, (
        f"Fits: {cap.kv_cache_tokens:,} KV-cache tokens, {cap.max_concurrency:.2f} concurrent "
        f"requests of {max_len:,} tokens."
    )


def _vllm_answer(
    r: _Replica,
    limits: _VllmLimits,
    layout: KVLayout,
    cap: KVCapacity,
    fits: bool,
    has_room: bool,
) -> QuestionAnswer:
    """The user's own question: this context at this concurrency."""
    from . import engine_policy as ep

    req, max_len, mnbt = r.req, r.max_model_len, limits.max_num_batched_tokens
    ctx = req.context_tokens or max_len
    conc = req.concurrency or 1
    at_ctx = (
        ep.max_concurrency_at(layout, cap.num_blocks, ctx, mnbt)
        if ctx <= max_len and (fits or cap.num_blocks)
        else 0  # a request longer than max_model_len is rejected, however much KV is free
    )
    at_conc = ep.max_len_for(layout, cap.num_blocks, conc, max_len, mnbt)
    if ctx > max_len:
        r.notes.warnings.append(
            f"--context-tokens {ctx:,} exceeds max_model_len {max_len:,}; raise --max-model-len"
        )
    if conc > limits.max_num_seqs:
        r.notes.warnings.append(
            f"--concurrency {conc} exceeds max_num_seqs {limits.max_num_seqs}: the engine queues the rest"
        )
    return QuestionAnswer(
        context_tokens=ctx,
        concurrency=conc,
        fits=ctx <= max_len and at_ctx >= conc and has_room,
        max_concurrency_at_context=at_ctx,
        max_context_at_concurrency=at_conc,
    )


# --------------------------------------------------------------------------- SGLang


def _sglang(r: _Replica) -> FitResult:
    """SGLang: whole pages (page_size), KV pool = free memory after weights minus
    the share mem_fraction_static leaves out (model_runner.profile_max_num_token)."""
    from . import engine_policy as ep

    req, notes, max_len = r.req, r.notes, r.max_model_len
    rules, defaults, mfs = _sglang_settings(r)
    weights = max(r.wb.per_stage_bytes)
    tokens, rest = ep.sglang_max_total_tokens(r.total, weights, mfs, r.kvb.per_gpu)
    page = req.block_size or 1
    tokens = tokens // page * page  # pool_configurator.py: whole pages only
    if req.block_size is None:
        notes.assumptions.append(
            "SGLang page_size 1 (FlashAttention-3 / FlashInfer backends); FlashMLA, TRT-LLM MLA "
            "and TRT-LLM MHA backends force 64 (arg_groups/overrides.py): pass --block-size"
        )
    notes.assumptions.append(
        f"SGLang: {ep.SGLANG_CONTEXT_OVERHEAD_GIB} GiB CUDA context before the free-memory measurement (assumed)"
    )
    notes.quantities.append(
        Quantity(
            name="kv_cache_tokens", provenance="computed", detail="SGLang profile_max_num_token"
        )
    )
    fits, conc, verdict = token_pool_verdict(tokens, max_len, "the KV pool")
    usable = r.total * mfs
    per_gpu = PerGpuMemory(
        total_gib=_gib(r.total),
        usable_gib=_gib(usable),
        weights_gib=_gib(weights),
        activation_gib=_gib(max(0.0, r.total * (1 - mfs))),
        non_torch_gib=ep.SGLANG_CONTEXT_OVERHEAD_GIB,
        cuda_graph_gib=0.0,
        cuda_graph_in_budget=False,
        kv_cache_gib=_gib(max(0.0, rest)),
        headroom_gib=_gib(r.total - usable),
    )
    answer = token_pool_answer(req, tokens, max_len)
    return _result(
        r,
        engine="sglang",
        engine_version=rules.version,
        engine_rules_version=rules.rules_from,
        fits=fits,
        verdict=verdict,
        max_num_batched_tokens=req.max_num_batched_tokens or defaults.chunked_prefill_size,
        max_num_seqs=req.max_num_seqs or 4096,
        block_size=page,
        per_gpu=per_gpu,
        kv_cache_blocks=tokens,
        kv_cache_tokens=tokens,
        max_concurrency=round(conc, 4),
        estimated_max_model_len=None,
        answer=answer,
    )


def _sglang_settings(r: _Replica) -> tuple[SglangRules, SglangDefaults, float]:
    """The release's rules, its defaults for this GPU, and the static fraction in force
    (the request's --gpu-memory-utilization, which stands for --mem-fraction-static)."""
    from . import engine_policy as ep

    req, notes = r.req, r.notes
    rules = ep.sglang_rules(req.engine_version)
    notes.warnings += list(rules.notes)
    mla = r.arch.mla is not None
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    defaults = ep.sglang_defaults(rules, _sglang_device_mib(r), tp, pp, mla)
    if "gpu_memory_utilization" in req.model_fields_set:
        return rules, defaults, req.gpu_memory_utilization
    notes.assumptions.append(defaults.why)
    return rules, defaults, defaults.mem_fraction_static


def token_pool_verdict(tokens: int, max_len: int, pool: str) -> tuple[bool, float, str]:
    """(fits, whole requests of max_len, verdict) for a pool of KV tokens that must hold
    one request of max_len (SGLang's and TensorRT-LLM's check at start-up)."""
    fits = tokens >= max_len
    conc = tokens / max_len if max_len else 0.0
    verdict = (
        f"Fits: {tokens:,} KV-cache tokens ({conc:.2f} requests of {max_len:,} tokens)."
        if fits
        else f"Does not fit: {pool} holds {tokens:,} tokens, fewer than one request of {max_len:,}."
    )
    return fits, conc, verdict


def token_pool_answer(req: FitRequest, tokens: int, max_len: int) -> QuestionAnswer | None:
    """The user's own question against a pool of KV tokens (SGLang's one token per slot,
    TensorRT-LLM's blocks already counted in whole)."""
    if req.context_tokens is None and req.concurrency is None:
        return None
    ctx = req.context_tokens or max_len
    c = req.concurrency or 1
    return QuestionAnswer(
        context_tokens=ctx,
        concurrency=c,
        fits=ctx <= max_len and tokens >= ctx * c,
        max_concurrency_at_context=tokens // ctx if ctx <= max_len else 0,
        max_context_at_concurrency=min(max_len, tokens // c),
    )


def _sglang_device_mib(r: _Replica) -> float:
    """What SGLang's ``get_device_memory_capacity`` reads: the device's total
    (nvidia-smi's on NVIDIA, the catalog's memory_total_gib), in MiB."""
    if r.gpu is not None and r.req.gpu_memory_gib is None:
        return r.gpu.memory_total_gib * 1024
    return r.total_gib * 1024


# --------------------------------------------------------------------------- the result


def _result(r: _Replica, **engine_figures: Any) -> FitResult:
    """The FitResult: the replica's facts plus what the engine's accounting found."""
    counts = r.counts
    return FitResult(
        model=r.source.hf_id,
        model_source=r.source.origin,
        model_revision=r.source.revision,
        gpu=r.gpu_label,
        num_gpus=r.num_gpus,
        tensor_parallel_size=r.req.tensor_parallel_size,
        pipeline_parallel_size=r.req.pipeline_parallel_size,
        max_model_len=r.max_model_len,
        dtype=r.dtype_name,
        kv_cache_dtype=r.kv_dtype_name,
        quantization=r.scheme.description if r.scheme.is_quantized else "none",
        parameters=ParameterCounts(
            total=counts.total,
            active_per_token=counts.active_per_token,
            by_component={
                k: v for k, v in counts.as_dict().items() if k not in ("total", "active_per_token")
            },
        ),
        weights_bytes_total=r.wb.total_bytes,
        checkpoint_bytes=r.source.checkpoint_bytes,
        kv_bytes_per_token=r.kvb.per_gpu,
        kv_bytes_per_token_total=r.kvb.total,
        kv_bytes_per_token_per_layer=r.kvb.per_layer,
        quantities=r.notes.quantities,
        assumptions=r.notes.assumptions,
        warnings=r.notes.warnings,
        suggestions=[],
        **engine_figures,
    )


_Option = tuple[str, str, dict[str, Any], str]
"""(change in words, the flags, the request fields it changes, its cost)."""


def _suggestions(req: FitRequest, base: FitResult, source, arch, scheme, gpu) -> list[Suggestion]:
    """Recompute the deployment with one change at a time.

    No option changes the model or its overrides, so each reuses the
    source and architecture the request already resolved.
    """
    options = [
        *_memory_options(req, arch, scheme),
        *_context_options(base),
        *_gpu_options(req, gpu),
    ]
    out: list[Suggestion] = []
    for change, flags, update, cost in options:
        data = req.model_dump(exclude_unset=True)
        data.update(update)
        data = {k: v for k, v in data.items() if v is not None}
        try:
            alt = _estimate(
                FitRequest.model_validate(data), with_suggestions=False, resolved=(source, arch)
            )
        except (InputError, ValueError):
            continue
        out.append(Suggestion.of(change, flags, alt, cost))
    return out


def _memory_options(req: FitRequest, arch: ModelArchitecture, scheme: QuantScheme) -> list[_Option]:
    """Levers on the same GPUs: KV dtype, more tensor parallelism, FP8 weights, utilization."""
    options: list[_Option] = []
    if req.kv_cache_dtype in ("auto", "bfloat16", "float16"):
        options.append(
            (
                "FP8 KV cache",
                "--kv-cache-dtype fp8",
                {"kv_cache_dtype": "fp8"},
                "about 2x the KV tokens; small accuracy risk (validate on your evals), FP8 attention kernels needed",
            )
        )
    tp2 = req.tensor_parallel_size * 2
    if arch.num_attention_heads % tp2 == 0 and tp2 <= 8:
        extra = (tp2 - req.tensor_parallel_size) * req.pipeline_parallel_size
        options.append(
            (
                f"tensor parallel {tp2}",
                f"--tensor-parallel-size {tp2}",
                {"tensor_parallel_size": tp2, "num_gpus": None},
                f"{extra} more GPU(s) per replica; all-reduce traffic each layer (fast with NVLink)",
            )
        )
    if not scheme.is_quantized and req.quantization is None:
        options.append(
            (
                "FP8 weights",
                "--quantization fp8",
                {"quantization": "fp8"},
                "half the weight memory; small quality risk; full speed needs FP8 tensor cores (Ada, Hopper, Blackwell)",
            )
        )
    if req.gpu_memory_utilization < 0.95:
        options.append(
            (
                "higher memory utilization",
                "--gpu-memory-utilization 0.95",
                {"gpu_memory_utilization": 0.95},
                "less headroom: out-of-memory risk if anything else uses the GPU",
            )
        )
    return options


def _context_options(base: FitResult) -> list[_Option]:
    """The context the user's question needs when it is longer than max_model_len; else a
    shorter one: the longest that fits the user's concurrency, or one request."""
    answer = base.answer
    if answer is not None and answer.context_tokens > base.max_model_len:
        longer = answer.context_tokens
        return [
            (
                f"max_model_len {longer:,}",
                f"--max-model-len {longer}",
                {"max_model_len": longer},
                f"admits requests of {longer:,} tokens; each can hold more of the KV cache",
            )
        ]
    if answer is not None and not answer.fits and answer.max_context_at_concurrency > 0:
        shorter = answer.max_context_at_concurrency
        update: dict[str, Any] = {"max_model_len": shorter, "context_tokens": shorter}
    elif not base.fits and base.estimated_max_model_len:
        shorter = base.estimated_max_model_len
        update = {"max_model_len": shorter}
    else:
        return []
    return [
        (
            f"max_model_len {shorter:,}",
            f"--max-model-len {shorter}",
            update,
            f"requests longer than {shorter:,} tokens are rejected",
        )
    ]


def _gpu_options(req: FitRequest, gpu: GPU | None) -> list[_Option]:
    """The next larger GPU of the same vendor."""
    from .catalog import list_gpus

    if gpu is None or req.gpu_memory_gib is not None:
        return []
    bigger = sorted(
        (
            g
            for g in list_gpus()
            if g.memory_total_gib > gpu.memory_total_gib * 1.1 and g.vendor == gpu.vendor
        ),
        key=lambda g: g.memory_total_gib,
    )
    if not bigger:
        return []
    g = bigger[0]
    return [
        (
            f"bigger GPU ({g.name})",
            f"--gpu {g.id}",
            {"gpu": g.id},
            f"{g.memory_total_gib:.0f} GiB instead of {gpu.memory_total_gib:.0f} GiB per GPU; different hardware and price",
        )
    ]
