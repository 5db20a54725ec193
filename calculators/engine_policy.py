"""How each engine (and engine release) turns GPU memory into KV cache.

Everything here reproduces rules read in the engines' source; the comments
name the file and the release range. Where a quantity is not computed by a
rule but *measured* by the engine at start-up (vLLM profiles a dummy forward
pass), it is modelled here from the model's shapes with constants calibrated
on real start-up logs (``tests/data/vllm_logs.toml``), and said so.

vLLM (V1 engine, 0.8+), ``vllm/v1/worker/gpu_worker.py``
``determine_available_memory``::

    requested  = total_memory x gpu_memory_utilization
    available  = requested - (weights + torch_peak_increase + non_torch_increase
                              [+ cuda_graph_estimate from 0.21])

then ``vllm/v1/core/kv_cache_utils.py``: ``num_blocks = available //
page_size // layers_per_group`` per worker, the minimum over workers; KV
tokens and maximum concurrency are logged from ``num_blocks``.

vLLM 0.28-0.33, read in the released wheels (``VLLM_KNOWN_VERSIONS``):
``determine_available_memory`` keeps the formula above in every one; 0.28
adds the >= 160 GiB batch tier; 0.29 runs every model on Model Runner V2 and
measures its CUDA graphs; 0.30-0.32 change nothing modelled here (0.31 caps
allocator block splitting during the profiling run, so MoE workspaces that
grow in steps are no longer pinned and counted; not modelled, it can only
leave more KV cache than the fit says for MoE models); 0.33 profiles MRV2's
sampler with warm-up parameters and keeps GB10 on the small batch tier.
The KV-cache group, block and token-report rules of kv_cache_utils.py
(kv_cache_planning.py in 0.33) are unchanged across them.

SGLang, ``python/sglang/srt/model_executor/model_runner.py``
``profile_max_num_token``: ``rest = free_after_weights - total x (1 -
mem_fraction_static)``; ``max_total_num_tokens = rest // cell_size`` with one
token per page.

SGLang's own defaults (``mem_fraction_static``, ``chunked_prefill_size``,
``cuda_graph_max_bs``) per release and GPU memory: :func:`sglang_defaults`.

Public API: :func:`vllm_rules`, :func:`sglang_rules`, :func:`sglang_defaults`,
:func:`sglang_max_total_tokens`, :class:`KVLayout`,
:func:`kv_capacity`, :func:`activation_peak_bytes`, and the estimators for
non-torch and CUDA-graph memory. Stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from .architecture import ModelArchitecture
from .errors import InputError

GiB = 1 << 30

# --------------------------------------------------------------------------- versions

VLLM_DEFAULT_VERSION = "0.33.0"
"""The newest vLLM release (PyPI, November 2026) whose sources the rules were
checked against: every rule below that changes from 0.28 on was read in the
released wheels of 0.27.1 to 0.33.0 (vllm/v1/worker/gpu_worker.py
``determine_available_memory``, vllm/v1/worker/gpu/model_runner.py,
vllm/engine/arg_utils.py ``get_batch_defaults``, vllm/config/vllm.py
``use_v2_model_runner``, vllm/v1/core/kv_cache_utils.py); the newest release
with public start-up logs in tests/data/vllm_logs.toml is 0.29.0."""

VLLM_KNOWN_VERSIONS = (
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "0.9.0",
    "0.10.0",
    "0.11.0",
    "0.19.0",
    "0.21.0",
    "0.22.0",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.33.0",
)
"""Releases where a rule below changes (and the default). A version between
two of them uses the older one's rules; beyond the newest, the newest."""

SGLANG_DEFAULT_VERSION = "0.5.23"
"""The newest SGLang release on PyPI (October 2026); its wheel's
python/sglang/srt/arg_groups/memory_hook.py was read for the rules below."""
SGLANG_KNOWN_VERSIONS = ("0.4.0", "0.4.10", "0.5.3", "0.5.5", "0.5.10", "0.5.20", "0.5.23")
"""Releases where an SGLang rule below changes (see :func:`sglang_rules`),
each read in that release's wheel; a version between two uses the older."""


@lru_cache(maxsize=256)
def parse_version(text: str, field_name: str = "engine_version") -> tuple[int, int, int]:
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise InputError(field_name, f"cannot read engine version '{text}'", accepted="e.g. 0.11.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _nearest_known(version: tuple[int, int, int], known: tuple[str, ...]) -> str:
    older = [k for k in known if parse_version(k) <= version]
    return older[-1] if older else known[0]


@dataclass(frozen=True)
class VllmRules:
    """The accounting of one vLLM release range."""

    version: str
    """Version the user asked for (or the default)."""
    rules_from: str
    """Known release whose rules are applied."""
    v1: bool
    """V1 engine (default from 0.8.0)."""
    hybrid_kv_manager: bool
    """Sliding-window layers keep only their window (hybrid KV cache manager,
    0.10.0+); before, every layer caches the whole context."""
    group_size_heuristic: bool
    """0.11+: when the layer types are nearly balanced (max < 1.5 x min) the
    larger count is the group size (``_get_kv_cache_groups_uniform_page_size``)."""
    tokens_from_concurrency: bool
    """Logged "GPU KV cache size" = int(max_concurrency x max_model_len)
    (kv_cache_utils ``_report_kv_cache_config``). Before:
    ``num_blocks // num_groups x block_size``. 0.19.0 logs the old form
    (vllm#40691), 0.24.0 the new (noonghunna/club-3090#612)."""
    cuda_graphs_in_budget: bool
    """CUDA-graph memory is profiled and charged inside
    gpu_memory_utilization (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, default
    since 0.21.0: "CUDA graph memory profiling is enabled (default since
    v0.21.0)")."""
    sampler_bytes_per_logit: float
    """Calibrated sampler warm-up cost per logit (see SAMPLER_BYTES_PER_LOGIT)."""
    nccl_before_snapshot: bool
    """0.11+: the memory snapshot is taken after NCCL init, so NCCL buffers are
    no longer counted as non-torch growth (gpu_worker.py ``init_device``)."""
    mrv2_default: str = "none"
    """Which models run on Model Runner V2 when VLLM_USE_V2_MODEL_RUNNER is
    unset (``VllmConfig.use_v2_model_runner`` in vllm/config/vllm.py, per
    release notes): "none" before 0.22; "qwen3" in 0.22 (Qwen3ForCausalLM,
    dense and unquantized, vllm#39337, 0.22.0 notes: "MRv2 is now default for
    Qwen3 dense models"); "qwen3_llama_mistral" in 0.23-0.24
    (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = Llama, Mistral, Qwen3; still
    ``not is_moe and not is_quantized``); "dense" in 0.25-0.28 (vllm#44443,
    0.25.0 notes: "the default for all dense models"; in 0.27.1-0.28 also the
    MoE architectures of ``MRV2_LISTED_MOE_ARCHITECTURES``, read in those
    wheels' vllm/config/vllm.py); "all" from 0.29.0
    (vllm#53183, 0.29.0 notes: "the default for all models"). See
    :func:`vllm_uses_mrv2`. MRV2's profiling run samples a dummy batch without
    sampling parameters, so the fp32 logits copy and the top-k/top-p work
    never enter the profiled peak (vllm#57926): only the logits in the model
    dtype do."""
    mrv2_profiles_cuda_graphs: bool = False
    """0.29+: MRV2's ``profile_cudagraph_memory`` captures the graphs into a
    throwaway pool and measures them (vllm#53306, merged 2026-08-24, in the
    0.29.0 notes: "CUDA graph memory profiling ... used for KV cache
    auto-sizing"). Before, MRV2's method was a placeholder returning 0
    (vllm#36520 "Add dummy profile_cudagraph_memory API"; vllm/v1/worker/gpu/
    model_runner.py: ``# NOTE(woosuk): It is TBD whether we keep this API or
    not. return 0``), so ``determine_available_memory`` subtracted nothing for
    graphs on MRV2 even with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on; the
    graphs were captured afterwards, above the budget (vllm#49224).
    0.29's batch-sharded sampling (vllm/v1/worker/gpu/sample/batch_shard.py,
    ``enable_batch_sharded_sampling``) splits each step's logits over the TP
    ranks but not the profiling run's: ``_dummy_sampler_run`` samples every
    dummy request on every rank, so the profiled peak is not divided by TP."""
    hybrid_prefix_caching_default: bool = False
    """0.28+: prefix caching is on by default for hybrid Mamba / linear-attention
    models, in ``mamba_cache_mode`` "align" (vllm#50991, merged 2026-08-04: "enable
    prefix cache for hybrid model by default and change the default mode to align";
    in 0.28.0 per vllm-project/vllm-metal#645). Before, it was opt-in and a request
    held one state block per Mamba group (mode "none")."""
    batch_tier_160gib: bool = False
    """0.28+: ``EngineArgs.get_batch_defaults`` (vllm/engine/arg_utils.py)
    gives GPUs with >= 160 GiB (B200/B300, MI300X) 16384 batched tokens for
    ``vllm serve`` (before: 8192, like H100). Read in the 0.27.1 and 0.28.0
    wheels; ROCm/MAD#235 (2026-08-26: "VLLM now defaults to 16384") saw it."""
    gb10_small_tier: bool = False
    """0.33+: GB10 (DGX Spark, compute capability 12.1) stays on the 2048 /
    256 tier despite its memory (``is_gb10`` in ``get_batch_defaults``, new in
    the 0.33.0 wheel)."""
    async_scheduling: bool = False
    """0.14+: async scheduling is on by default (0.14.0 release notes, vllm#27614):
    the engine core schedules step N+1 while the GPU runs step N, which hides the
    host's per-step work behind the GPU's. The published factors were fitted on
    0.11 runs, where that work sat between the steps."""
    mrv2_profiles_sampling_params: bool = False
    """0.33+: MRV2's ``_dummy_sampler_run`` (vllm/v1/worker/gpu/model_runner.py)
    samples the dummy batch a second time with
    ``SamplingParams.for_sampler_warmup()`` (top-k 50, top-p 0.9, min-p,
    penalties, logit bias, 5 logprobs): "warmup_kernels ... pays for the fp32
    logits pipeline, so the profiled peak must too". 0.29-0.32 ran only the
    default pass (logits in the model dtype, vllm#57926). The fp32 pipeline
    then costs what V1's sampler does (SAMPLER_BYTES_PER_LOGIT "v1_019" with
    PyTorch's top-k/top-p, "flashinfer" when ``flashinfer_sampler_supported()``).
    The pass is vllm#57926's change ("Profile the sampler with the params the
    warm-up actually uses"); its patched column (Qwen2.5-0.5B, L4, FlashInfer)
    is a held-out case at 0.33.0, reproduced within 0.6 %; no 0.33 log with
    PyTorch's sampler was found, so that end stays V1's 22 B."""
    mrv2_listed_moe: bool = False
    """0.27.1-0.28: besides dense models, MRV2 is the default for the MoE
    architectures in ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``
    (vllm/config/vllm.py: DeepseekV2, GraniteMoe, Qwen2Moe, Inkling,
    KimiK3, LongcatFlashNgram; 0.28 adds DeepseekV4), read in both wheels;
    hybrid (Mamba) models not listed stay on MRV1. 0.25-0.27.0 not read."""
    notes: tuple[str, ...] = field(default=())


def _sampler_era(v: tuple[int, int, int]) -> str:
    if v < (0, 8, 0):
        return "v0"
    return "v1" if v < (0, 19, 0) else "v1_019"


@lru_cache(maxsize=64)
def vllm_rules(version: str | None) -> VllmRules:
    """The rules of a release (immutable, so one instance per version string)."""
    return _vllm_rules(version)


def _vllm_rules(version: str | None) -> VllmRules:
    requested = version or VLLM_DEFAULT_VERSION
    v = parse_version(requested)
    base = _nearest_known(v, VLLM_KNOWN_VERSIONS)
    notes: list[str] = []
    exact = any(parse_version(k) == v for k in VLLM_KNOWN_VERSIONS)
    if version is not None and not exact:
        newest = parse_version(VLLM_KNOWN_VERSIONS[-1])
        if v > newest:
            notes.append(
                f"vLLM {requested} is newer than the rules known here; used those of {base}"
            )
        elif v < parse_version(VLLM_KNOWN_VERSIONS[0]):
            notes.append(f"vLLM {requested} predates the rules known here; used those of {base}")
        else:
            notes.append(
                f"vLLM {requested}: the rules of {base} apply (no rule modelled here changes "
                "between them)"
            )
    return VllmRules(
        version=requested,
        rules_from=base,
        v1=v >= (0, 8, 0),
        hybrid_kv_manager=v >= (0, 10, 0),
        group_size_heuristic=v >= (0, 11, 0),
        tokens_from_concurrency=v >= (0, 21, 0),
        cuda_graphs_in_budget=v >= (0, 21, 0),
        nccl_before_snapshot=v >= (0, 11, 0),
        mrv2_default=_mrv2_default(v),
        mrv2_profiles_cuda_graphs=v >= (0, 29, 0),
        hybrid_prefix_caching_default=v >= (0, 28, 0),
        batch_tier_160gib=v >= (0, 28, 0),
        gb10_small_tier=v >= (0, 33, 0),
        mrv2_profiles_sampling_params=v >= (0, 33, 0),
        async_scheduling=v >= (0, 14, 0),
        mrv2_listed_moe=(0, 27, 1) <= v < (0, 29, 0),
        sampler_bytes_per_logit=SAMPLER_BYTES_PER_LOGIT[_sampler_era(v)],
        notes=tuple(notes),
    )


def _mrv2_default(v: tuple[int, int, int]) -> str:
    if v >= (0, 29, 0):
        return "all"
    if v >= (0, 25, 0):
        return "dense"
    if v >= (0, 23, 0):
        return "qwen3_llama_mistral"
    if v >= (0, 22, 0):
        return "qwen3"
    return "none"


MRV2_LISTED_MOE_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV4ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "InklingForConditionalGeneration",
        "KimiK3ForConditionalGeneration",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    }
)
"""``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` of vllm/config/vllm.py in 0.28.0
(0.27.1: the same without DeepseekV4ForCausalLM)."""

_MRV2_ARCHITECTURES = {
    "qwen3": frozenset({"Qwen3ForCausalLM"}),
    "qwen3_llama_mistral": frozenset(
        {"Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}
    ),
}


def vllm_uses_mrv2(rules: VllmRules, arch: ModelArchitecture, quantized: bool) -> bool:
    """Whether ``vllm serve`` runs this model on Model Runner V2 by default.

    Follows ``_is_default_v2_model_runner_model`` of each release (see
    ``VllmRules.mrv2_default``): the architecture allow-list of 0.22-0.24
    admits only dense, unquantized checkpoints; 0.25-0.28 every dense one
    (quantized included: vllm#49224 notes dense FP8 models moved to MRV2 with
    0.25); 0.29+ every model. Features MRV2 lacks (LoRA, some speculative
    methods, KV connectors) fall back to MRV1; they are not inputs here.
    Not settled by the sources read: later 0.23/0.24 allow-lists also name
    Qwen2MoeForCausalLM, DeepseekV2ForCausalLM and GraniteMoeForCausalLM
    (vllm#42667) next to an ``is_moe`` exclusion; MoE models are taken to
    stay on MRV1 until 0.29, except, in 0.27.1-0.28 (read in those wheels),
    the architectures of ``MRV2_LISTED_MOE_ARCHITECTURES``.
    """
    kind = rules.mrv2_default
    if kind == "all":
        return True
    dense = arch.moe is None
    if kind == "dense":
        return dense or (rules.mrv2_listed_moe and _listed_moe(rules, arch))
    allowed = _MRV2_ARCHITECTURES.get(kind)
    if allowed is None or not dense or quantized:
        return False
    return any(a in allowed for a in arch.architectures)


def _listed_moe(rules: VllmRules, arch: ModelArchitecture) -> bool:
    listed = MRV2_LISTED_MOE_ARCHITECTURES
    if parse_version(rules.rules_from) < (0, 28, 0):
        listed = listed - {"DeepseekV4ForCausalLM"}
    return any(a in listed for a in arch.architectures)


# --------------------------------------------------------------------------- defaults


def vllm_default_block_size(arch: ModelArchitecture, gpu_id: str | None) -> tuple[int, str]:
    """Tokens per KV block. 16 on CUDA (``CacheConfig``); MLA models take the
    block size their attention kernel needs: FlashMLA (Hopper) 64, CUTLASS
    MLA (Blackwell) 128 (vllm/platforms/cuda.py ``check_and_update_config``);
    DeepSeek-V3.2's sparse MLA 64 on every GPU (same function: ``use_sparse =
    hasattr(hf_config, "index_topk")`` -> "Forcing kv cache block size to 64 for
    FlashMLASparse backend")."""
    if arch.indexer is not None:
        return 64, "DeepSeek-V3.2 sparse MLA (FlashMLASparse) forces block size 64"
    if arch.mla is not None and gpu_id:
        gid = gpu_id.lower()
        if gid.startswith(("b200", "gb200", "b300", "gb300")):
            return 128, "MLA on Blackwell uses CUTLASS MLA, block size 128"
        if gid.startswith(("h100", "h200", "h800", "h20")):
            return 64, "MLA on Hopper uses FlashMLA, block size 64"
    return 16, "vLLM default block size 16"


def v0_chunked_prefill(max_model_len: int, mla: bool) -> bool:
    """Whether vLLM's V0 engine runs chunked prefill by default: above 32K context
    (arg_utils ``_set_default_args_v0``), except for MLA models, for which it forces it off
    (vllm/config.py from 0.7.1, vllm-project/vllm PR 12642: "MLA is enabled; forcing chunked
    prefill and prefix caching to be disabled"). Without it V0 schedules prefill first: waiting
    prompts whole, in steps of their own, while the running decodes wait."""
    return max_model_len > 32768 and not mla


def vllm_default_batching(
    rules: VllmRules,
    gpu_total_gib: float,
    gpu_id: str | None,
    max_model_len: int,
    mla: bool = False,
) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, why) for ``vllm serve``.

    vllm/engine/arg_utils.py ``_set_default_args`` (0.9+, usage context
    OPENAI_API_SERVER): GPUs with >= 70 GiB that are not A100: 8192 tokens,
    1024 sequences; others 2048 / 256. 0.8.x: 2048 / 256. V0: chunked prefill
    off up to 32K context, so a step holds a whole max_model_len prompt.
    From 0.28 (``get_batch_defaults``): >= 160 GiB, 16384 / 1024; from 0.33
    GB10 keeps 2048 / 256 (``VllmRules.batch_tier_160gib``, ``gb10_small_tier``).
    The memory is torch's total, as ``current_platform.get_device_total_memory``.
    """
    if not rules.v1:
        if v0_chunked_prefill(max_model_len, mla):
            return (
                2048,
                256,
                "V0 enables chunked prefill above 32K context with 2048 tokens per step",
            )
        why = "V0 turns chunked prefill off for MLA models" if mla else "V0 without chunked prefill"
        return max(max_model_len, 2048), 256, f"{why}: a step batches up to max_model_len tokens"
    if parse_version(rules.rules_from) < (0, 9, 0):
        return 2048, 256, "vLLM 0.8 serve defaults: 2048 batched tokens, 256 sequences"
    gid = (gpu_id or "").lower()
    if rules.gb10_small_tier and gid.startswith("gb10") and not gid.startswith("gb100"):
        return (
            2048,
            256,
            "vLLM serve default for GB10 (0.33+ keeps it on the small tier): 2048 batched "
            "tokens, 256 sequences",
        )
    if rules.batch_tier_160gib and gpu_total_gib >= 160:
        return (
            16384,
            1024,
            "vLLM serve default for >= 160 GiB GPUs (0.28+): 16384 batched tokens, 1024 sequences",
        )
    big = gpu_total_gib >= 70 and not gid.startswith("a100")
    if big:
        return (
            8192,
            1024,
            "vLLM serve default for >= 70 GiB GPUs (not A100): 8192 batched tokens, 1024 sequences",
        )
    return (
        2048,
        256,
        "vLLM serve default for < 70 GiB GPUs and A100: 2048 batched tokens, 256 sequences",
    )


# --------------------------------------------------------------------------- profiled memory

# Bytes per (sequence x vocabulary entry) the sampler warm-up holds at its
# peak: fp32 logits, probabilities, top-k/top-p sort values and int64 indices,
# logprobs (V1 ``_dummy_sampler_run``; V0's profile step samples its dummy
# sequences with top-k/top-p too). With vLLM's serve default of 1024
# sequences on >= 70 GiB GPUs this term dominates the activation peak for
# large vocabularies. Calibrated on start-up logs (tests/data/vllm_logs.toml):
#   V0:        Llama-3-8B peak 1.26 GiB at TP 1 *and* TP 2 (vllm#10511): not
#              sharded, 256 x 128k logits; Qwen2.5-7B-AWQ 1.42 GiB at 4096
#              tokens (vllm#13882); Qwen2.5-32B 1.26 GiB (vllm#15815)  -> ~36 B
#   V0 with chunked prefill (context > 32K): the dummy chunks are not
#              sampled; R1-Distill-Qwen-14B peaked at 0.19 GiB (vllm#13061) -> 0
#   V1 0.10-0.11: the llm-d H100 table (v0.11.0, 1024 sequences, "torch
#              peak memory increase" per model) fixes it tightly. Fitted on
#              its calibration cases only (Llama-3.1-8B 4.76, Qwen3-0.6B
#              5.56, gpt-oss-20b 7.38, Qwen3-32B TP2 5.64 GiB, each minus the
#              final hidden states): 38.27-38.40 B            -> 38.3 B.
#              The held-out cases agree (gpt-oss-120b, Qwen3-32B TP1,
#              Llama-3.3-70B-FP8 TP2 within 1 %); gemma-3-4b's 9.96 GiB
#              (vllm#21489) implies ~40 B.
#   V1 0.19+:  Qwen3.5 5.66 GiB peak with 1024 x 248k logits (vllm#50722),
#              gpt-oss-20b ~1 GiB implied at 256 sequences        -> ~22 B
#   FlashInfer's top-k/top-p sampler (``FitRequest.flashinfer_sampler``):
#              dennislee22/vLLM-benchmarking installs flashinfer-python with
#              vLLM 0.10.1; Qwen2-7B on an A100 with 256 sequences x 152,064
#              logits then peaks at ~0.42 GiB (0.55 GiB with non-torch, at two
#              utilizations), where PyTorch's sort path costs 1.4 GiB.
#              Fitted on the 0.5-utilization run (calibration)        -> 10 B
#   MRV2 (``vllm_uses_mrv2``: Qwen3 dense from 0.22, all dense from 0.25,
#              everything from 0.29): the logits in
#              the model dtype only (fit.py passes act_bytes). Qwen2.5-0.5B on
#              an L4 (vllm#57926, MRV2) leaves ~0.85 GiB for activation,
#              non-torch and CUDA graphs together, which a 22 B/logit sampler
#              (0.8 GiB alone) could not fit in. 0.33+ (vllm#57926's second
#              pass with warm-up sampling parameters): V1's costs again; the
#              PR's patched L4 run lost 22,512 tokens x 12,288 B for 256 x
#              151,936 logits, 7.1 B per logit above the 2 B logits, which
#              the FlashInfer figure (10 B in all) matches (held-out, -0.6 %).
SAMPLER_BYTES_PER_LOGIT = {
    "v0": 36.0,
    "v0_chunked": 0.0,
    "v1": 38.3,
    "v1_019": 22.0,
    "flashinfer": 10.0,
}
# Fraction of the per-token forward working set (MLP and attention
# intermediates at the model dtype) torch still holds at the peak; < 1
# because torch.compile fuses and frees intermediates.
FORWARD_WORKSET_FACTOR = 1.0


def activation_peak_bytes(
    arch: ModelArchitecture,
    act_bytes: float,
    tokens: int,
    max_num_seqs: int,
    tensor_parallel_size: int,
    v1: bool = True,
    sampler_bytes_per_logit: float | None = None,
) -> int:
    """Peak torch memory of vLLM's profiling run above the weights.

    ``profile_run`` (vllm/v1/worker/gpu_model_runner.py) runs the model on
    ``tokens`` (= max_num_batched_tokens) dummy tokens, then the sampler on
    ``min(max_num_seqs, tokens)`` dummy requests whose logits span the whole
    vocabulary in fp32. The largest live tensors are the MLP intermediates
    (gate/up output 2I and activation output I per token, per TP rank), the
    q/k/v projections, a few hidden-size buffers, and for MoE the fused-MoE
    caches (top-k copies per token) and fp32 router logits.
    """
    tp = tensor_parallel_size
    h = arch.hidden_size
    q = arch.num_attention_heads * arch.head_dim / tp
    kv = max(1, arch.num_kv_heads // tp) * arch.head_dim if arch.mla is None else 0
    if arch.mla is not None:
        m = arch.mla
        q = arch.num_attention_heads / tp * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        kv = (m.kv_lora_rank + m.qk_rope_head_dim) + arch.num_attention_heads / tp * (
            m.qk_nope_head_dim + m.v_head_dim
        )
    per_token = q + 2 * kv + 2 * h
    if arch.ssm is not None:
        # a Mamba / DeltaNet in_proj output (gate, conv input, dt) is wider than q/k/v
        s = arch.ssm
        width = s.conv_dim + (s.intermediate_size or s.num_heads * s.head_dim) + s.num_heads
        per_token = max(per_token, width / tp + 2 * h)
    mlp = arch.mlp_matrices * arch.intermediate_size / tp
    extra_fp32 = 0.0
    if arch.moe is not None:
        moe = arch.moe
        routed = moe.experts_per_token * (3 * moe.moe_intermediate_size / tp + h)
        shared = 3 * moe.shared_expert_intermediate_size / tp
        dense_layers = arch.num_layers - len(moe.moe_layers)
        mlp = max(routed + shared, mlp if dense_layers else 0)
        extra_fp32 = moe.num_experts  # router logits in fp32
    forward = tokens * ((per_token + mlp) * act_bytes + extra_fp32 * 4) * FORWARD_WORKSET_FACTOR
    reqs = min(max_num_seqs, tokens)
    per_logit = sampler_bytes_per_logit
    if per_logit is None:
        per_logit = SAMPLER_BYTES_PER_LOGIT["v1" if v1 else "v0"]
    sampler = reqs * arch.vocab_size * per_logit
    # The forward intermediates are freed before sampling; the final hidden
    # states stay alive. The logs agree: V0's peak was the same at TP 1 and 2
    # (the sampler, not the sharded MLP, set it) and grew with tokens only
    # once the forward pass exceeded it (vllm#10517).
    del v1
    return int(max(forward, tokens * h * act_bytes + sampler))


NON_TORCH_GIB = {"v0": 0.30, "v1": 0.13}
"""One GPU: V0 logged 0.25-0.35 GiB (vllm#10517, #13061, #15815); V1 0.13-0.14
on every single-GPU run of the llm-d H100 table (v0.11.0)."""
NON_TORCH_MULTI_GPU_GIB = {"before_0.11": 0.12, "0.11": 0.41}
"""Added for TP/PP > 1 under V1. 0.11+: 0.54 GiB at TP 2 (Qwen3-32B, llm-d,
calibration) minus the single-GPU 0.13; the held-out Llama-3.3-70B-FP8 TP 2
logged 0.55. Before 0.11 (0.8-0.10): Qwen2-7B on A100s with vLLM 0.10.1
left 0.67 GiB for activation and non-torch at TP 2 against 0.55 GiB on one
GPU, the same at two utilizations (dennislee22, TP 2 at 0.5: calibration);
the held-out DeepSeek-V2-Lite TP 2 x PP 2 (vllm#20665) agrees within 0.1
GiB. TP across nodes over Ray costs about 1 GiB more (not modelled)."""


def non_torch_bytes(
    rules: VllmRules, tensor_parallel_size: int, pipeline_parallel_size: int
) -> int:
    """Memory allocated outside torch during profiling: cuBLAS/cuDNN
    workspaces and, for multi-GPU replicas, NCCL and custom all-reduce
    buffers. Logged by vLLM as "non-torch forward increase memory" (V1) or
    "non_torch_memory" (V0); see the constants above for the readings."""
    base = NON_TORCH_GIB["v1" if rules.v1 else "v0"]
    if tensor_parallel_size * pipeline_parallel_size > 1 and rules.v1:
        base += NON_TORCH_MULTI_GPU_GIB["0.11" if rules.nccl_before_snapshot else "before_0.11"]
    return int(base * GiB)


TORCH_RESERVED_GIB = 0.5
"""What torch's total (``torch.cuda.mem_get_info()[1]``, the total vLLM
multiplies by gpu_memory_utilization) lacks against nvidia-smi's total on the
same NVIDIA GPU, used where the catalog has no torch reading: the median of
the six readings collected, 0.31 (RTX 4090, 23.68 vs 23.99), 0.42 (RTX 3090,
23.58 vs 24.00), 0.47 (H100 SXM, 79.18 vs 79.65), 0.57 (L40S, 44.42 vs
44.99), 0.62 (A100 40GB, 39.38 vs 40.00) and 0.75 GiB (A100 80GB, 79.25 vs
80.00). See calculators/data/gpus.toml ``memory_total_gib_torch``."""


def runtime_total_gib(
    catalog_total_gib: float, torch_total_gib: float | None, vendor: str
) -> tuple[float, str]:
    """The total vLLM sees for a catalog GPU, and where it comes from."""
    if torch_total_gib is not None:
        return torch_total_gib, "torch's total as vLLM logs it (catalog memory_total_gib_torch)"
    if vendor == "nvidia":
        return (
            catalog_total_gib - TORCH_RESERVED_GIB,
            f"nvidia-smi total less {TORCH_RESERVED_GIB} GiB the driver keeps from torch "
            "(typical gap in vLLM logs; no torch reading for this GPU)",
        )
    return catalog_total_gib, "runtime-reported total from the GPU catalog"


MXFP4_KERNEL_ALIGNMENT = {"marlin": (256, 128), "triton": (256, 64)}
"""(hidden, expert-intermediate) padding per MXFP4 MoE kernel family, as
:func:`mxfp4_alignment` reads them (``mxfp4_round_up_hidden_size_and_intermediate_size``
in vllm/model_executor/layers/fused_moe/oracle/mxfp4.py: Marlin rounds the
intermediate size to 128 and the hidden size to 256; OAI's triton_kernels
path the intermediate size to 64)."""


def mxfp4_kernel(rules: VllmRules, gpu_id: str | None) -> str:
    """The MXFP4 MoE kernel family vLLM picks by default: triton_kernels on
    Hopper from 0.11, else Marlin (see :func:`mxfp4_alignment`). Which one
    runs also depends on what is installed (triton_kernels), so the fit takes
    it as an input (``FitRequest.mxfp4_moe_kernel``) and shows the range."""
    gid = (gpu_id or "").lower()
    hopper = gid.startswith(("h100", "h200", "h800", "h20", "gh200"))
    return "triton" if hopper and parse_version(rules.rules_from) >= (0, 11, 0) else "marlin"


def mxfp4_alignment(
    rules: VllmRules, gpu_id: str | None, kernel: str | None = None
) -> tuple[int, int]:
    """(hidden, expert-intermediate) multiples vLLM pads MXFP4 expert weights
    to. The Marlin MXFP4 MoE path (Ampere, and Hopper up to 0.10) pads to
    256 / 128; from 0.11 Hopper runs the triton-kernels path, which pads the
    intermediate size only to 64 (vllm/model_executor/layers/quantization/
    mxfp4.py; gpt-oss: 3072 x 2880 instead of 3072 x 2944). The choice
    follows these readings of "Model loading took": gpt-oss-120b 65.97 GiB
    on H100 with 0.10.1 (vllm#23278) and 64.38 GiB with 0.11.0 (llm-d),
    gpt-oss-20b 13.72 GiB on A100 with 0.19 and 13.47 GiB on H100 with
    0.11.0. ``kernel`` ("marlin" or "triton") overrides the default choice.
    Not followed here: the 0.33.0 wheel's TRITON backend no longer pads the
    hidden size (only the intermediate, to 64); no 0.33 gpt-oss log was found
    to confirm it, so the 0.11 layout stays."""
    return MXFP4_KERNEL_ALIGNMENT[kernel or mxfp4_kernel(rules, gpu_id)]


TRTLLM_GRAPHS_BY_DEFAULT = (0, 18, 0)
"""The first TensorRT-LLM release treated as capturing CUDA graphs on its PyTorch backend by
default. The 0.17-era ``PyTorchConfig`` had ``use_cuda_graph: bool = False`` (and the overlap
scheduler off): DeepSeek-R1 guides of the time turned graphs on in extra_llm_api_options. Later
releases were not read one by one; they are taken as graphs on, as 1.x is."""


def trtllm_runs_eagerly(version: str | None, arch: ModelArchitecture) -> bool:
    """Whether TensorRT-LLM serves this model without CUDA graphs by default: DeepSeek-V3/R1
    (MLA + MoE) ran only on the PyTorch backend in early 2025, whose graphs were off."""
    if not version or not (arch.uses_mla and arch.is_moe):
        return False
    return parse_version(version) < TRTLLM_GRAPHS_BY_DEFAULT


def cuda_graph_bytes(arch: ModelArchitecture, layers_on_rank: int, enforce_eager: bool) -> int:
    """CUDA-graph pool for the default capture sizes (up to 512 tokens),
    piecewise per layer plus full decode graphs. vLLM's own estimates in the
    collected logs run 0.3-1.5 GiB; modelled as a fixed part plus a per-layer
    part."""
    if enforce_eager:
        return 0
    return int((0.2 + 0.02 * layers_on_rank) * GiB)


def cuda_graphs_charged(rules: VllmRules, on_mrv2: bool, enforce_eager: bool) -> bool:
    """Whether ``determine_available_memory`` subtracts a CUDA-graph estimate
    from the KV budget (vllm/v1/worker/gpu_worker.py): the estimate is applied
    by default from 0.21.0 ("CUDA graph memory profiling is enabled (default
    since v0.21.0)" in the start-up log), and only as large as the model
    runner's ``profile_cudagraph_memory()``, which MRV2 left at 0 until 0.29
    (``VllmRules.mrv2_profiles_cuda_graphs``). Eager mode captures nothing."""
    if enforce_eager or not rules.cuda_graphs_in_budget:
        return False
    return not on_mrv2 or rules.mrv2_profiles_cuda_graphs


# --------------------------------------------------------------------------- KV capacity


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVLayout:
    """The KV cache groups vLLM builds for one model and deployment.

    ``groups`` lists each KV-cache group's kind (``full``/``mla`` keep the
    whole context, ``sliding`` only its window); all groups share one page
    size (``page_bytes`` per layer) and ``group_size`` layer slots each.
    """

    groups: tuple[str, ...]
    group_size_per_stage: tuple[int, ...]
    page_bytes: int
    block_size: int
    sliding_window: int | None
    notes: tuple[str, ...] = field(default=())
    attention_chunk_size: int | None = None
    """Llama 4's chunk, when its chunked layers have groups of their own."""
    state_blocks_per_request: int = 1
    """Blocks a request holds in each Mamba group (``MambaSpec.max_memory_usage_bytes``):
    1 in mamba_cache_mode "none", 2 in "align" (the running state and the last
    block-aligned checkpoint)."""

    @property
    def num_groups(self) -> int:
        return len(self.groups)


CHUNKED_HYBRID_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"
"""vLLM turns the hybrid KV cache manager off for a model with chunked local
attention unless this is set (vllm/config/vllm.py ``__post_init__``: "There is a
latency regression when using chunked local attention with the hybrid KV cache
manager. Disabling it, by default."); its chunked layers then cache the whole
context like full ones (FullAttentionSpec records ``attention_chunk_size``)."""


def _merge_chunked(
    counts: dict[str, int], stages: tuple[dict[str, int], ...]
) -> tuple[dict[str, int], tuple[dict[str, int], ...]]:
    """Chunked layers counted as full ones, per model and per stage."""

    def merged(c: dict[str, int]) -> dict[str, int]:
        out = {k: v for k, v in c.items() if k != "chunked"}
        if c.get("chunked"):
            out["full"] = out.get("full", 0) + c["chunked"]
        return out

    return merged(counts), tuple(merged(s) for s in stages)


# --------------------------------------------------------------------------- hybrid Mamba / linear attention

VLLM_HYBRID_MIN_VERSION: dict[str, tuple[str, str]] = {
    "mamba2": (
        "0.10.0",
        "Mamba-2 hybrids on the V1 engine with the attention block size chosen automatically "
        "(vllm#20499 and its follow-up, July 2025)",
    ),
    "mamba1": ("0.10.2", "Mamba-1 layers on the V1 engine (vllm#21249, August 2025)"),
    "gated_deltanet": ("0.10.2", "Qwen3-Next's Gated DeltaNet layers (September 2025)"),
}
"""The first release whose V1 hybrid allocator this fit models, per mixer kind.
Older releases ran these models on the V0 engine, whose separate Mamba cache
(sized by max_num_seqs at model load) is not modelled."""


def check_vllm_hybrid_support(rules: VllmRules, arch: ModelArchitecture) -> None:
    """Fail closed for a release older than the hybrid rules modelled here."""
    if arch.ssm is None:
        return
    release, what = VLLM_HYBRID_MIN_VERSION[arch.ssm.kind]
    if parse_version(rules.version) < parse_version(release):
        raise InputError(
            "engine_version",
            f"vLLM {rules.version} predates the V1 hybrid KV-cache allocator for "
            f"'{arch.model_type}' ({what}); this fit models it from vLLM {release}: "
            f"pass --engine-version {release} or newer",
            accepted=f">= {release}",
        )


HYBRID_BLOCK_ALIGNMENT = 16
"""Attention block sizes vLLM picks for hybrids are multiples of 16 (FlashAttention /
FlashInfer kernels); Blackwell with head size 256 on FlashInfer needs 32
(vllm/model_executor/models/config.py ``HybridAttentionMambaModelConfig``)."""


def vllm_hybrid_block_size(
    arch: ModelArchitecture,
    attn_token_bytes: int,
    state_bytes: int,
    user_block_size: int | None,
    gpu_id: str | None,
) -> tuple[int, str]:
    """The attention block size of a hybrid model and why.

    ``HybridAttentionMambaModelConfig.verify_and_update_config`` (vLLM 0.10+,
    without prefix caching for Mamba layers): all KV-cache groups share one
    page size, so the attention block is raised to the smallest multiple of
    the kernel alignment whose page (block x per-token bytes of one attention
    layer) holds one Mamba state: ``align x cdiv(state, align x token_bytes)``;
    a larger block the user set is kept; the Mamba page is then padded to the
    attention page.
    """
    gid = (gpu_id or "").lower()
    align = HYBRID_BLOCK_ALIGNMENT
    if arch.head_dim == 256 and gid.startswith(("b200", "gb200", "b300", "gb300")):
        align = 32
    needed = align * cdiv(state_bytes, align * attn_token_bytes)
    if user_block_size is not None and user_block_size >= needed:
        return user_block_size, f"block size {user_block_size} as given (holds one Mamba state)"
    why = (
        f"attention block size raised to {needed} tokens so one attention page "
        f"({needed} x {attn_token_bytes:,} B) holds a {state_bytes:,}-byte Mamba state "
        "(vLLM: 'Setting attention block size to N tokens')"
    )
    if user_block_size is not None:
        why += f"; the --block-size {user_block_size} given is too small"
    return needed, why


def _hybrid_layout(
    arch: ModelArchitecture,
    rules: VllmRules,
    layers_per_stage: tuple[dict[str, int], ...],
    per_layer_token_bytes: int,
    block_size: int,
    state_bytes: int,
    mamba_cache_mode: str,
) -> KVLayout:
    """Attention and Mamba/DeltaNet layers in groups of one page size
    (``_get_kv_cache_groups_uniform_page_size``, kv_cache_utils.py): layers of one
    type form ``cdiv(n, group_size)`` groups, ``group_size`` = the smaller type count
    (the larger within 1.5x, 0.11+); each Mamba group holds one block per request
    in mamba_cache_mode "none" and two in "align" (``MambaSpec.max_memory_usage_bytes``).
    "align" keeps the block size of "none" (``Platform._align_hybrid_block_size``:
    only mode "all", not modelled, aligns it to the Mamba chunk size)."""
    if mamba_cache_mode not in ("none", "align"):
        raise InputError(
            "mamba_cache_mode",
            f"mamba_cache_mode '{mamba_cache_mode}' is not modelled",
            accepted="none, align",
        )
    per_state = 2 if mamba_cache_mode == "align" else 1
    page = per_layer_token_bytes * block_size
    attention = sum(1 for k in arch.layer_kinds if k in ("full", "sliding", "mla"))
    state = sum(1 for k in arch.layer_kinds if k in ("mamba", "linear"))
    smallest, largest = min(attention, state), max(attention, state)
    group_size = smallest
    if rules.group_size_heuristic and largest < smallest * 1.5:
        group_size = largest
    groups_of = {"full": cdiv(attention, group_size), "mamba": cdiv(state, group_size)}
    notes = [
        f"Mamba page padded by {100 * (page - state_bytes) / state_bytes:.2f}% to the attention "
        f"page ({page:,} B; vLLM: 'Padding mamba page size')"
        if page > state_bytes
        else f"Mamba state and attention page are both {page:,} B",
        f"{groups_of['full']} attention and {groups_of['mamba']} Mamba KV-cache group(s) of "
        f"{group_size} layers; a request holds {per_state} state block(s) per Mamba group "
        f"(mamba_cache_mode '{mamba_cache_mode}')",
    ]
    for kind, n in (("attention", attention), ("Mamba", state)):
        padding = groups_of["full" if kind == "attention" else "mamba"] * group_size - n
        if padding:
            notes.append(
                f"{padding} padding layer(s) in the {kind} groups (vLLM pads uneven groups)"
            )
    sizes = tuple(
        max(
            cdiv(sum(stage.get(k, 0) for k in ("full", "sliding", "mla")), groups_of["full"]),
            cdiv(sum(stage.get(k, 0) for k in ("mamba", "linear")), groups_of["mamba"]),
        )
        for stage in layers_per_stage
    )
    groups = ("full",) * groups_of["full"] + ("mamba",) * groups_of["mamba"]
    return KVLayout(
        groups, sizes, page, block_size, None, tuple(notes), state_blocks_per_request=per_state
    )


def vllm_kv_layout(
    arch: ModelArchitecture,
    rules: VllmRules,
    layers_per_stage: tuple[dict[str, int], ...],
    per_layer_token_bytes: int,
    block_size: int,
    chunked_hybrid: bool = False,
    state_bytes: int = 0,
    mamba_cache_mode: str = "none",
) -> KVLayout:
    """Group layers the way ``get_kv_cache_groups`` does.

    One kind of layer: one group holding every layer. Full plus sliding
    layers (Gemma 2/3, gpt-oss) with the hybrid manager: groups of
    ``group_size`` layers, ``group_size`` = the smaller type count (the
    larger when the counts are within 1.5x, 0.11+), the last group of a type
    padded. Without the hybrid manager sliding layers are cached like full
    ones. Llama 4's chunked layers are cached like full ones unless
    ``chunked_hybrid`` (``CHUNKED_HYBRID_ENV`` set), when they form groups of
    their own that keep one chunk plus the batched tokens
    (ChunkedLocalAttentionSpec).
    """
    if arch.is_hybrid_ssm:
        return _hybrid_layout(
            arch,
            rules,
            layers_per_stage,
            per_layer_token_bytes,
            block_size,
            state_bytes,
            mamba_cache_mode,
        )
    counts: dict[str, int] = {}
    for k in arch.layer_kinds:
        counts[k] = counts.get(k, 0) + 1
    notes: list[str] = []
    if counts.get("chunked") and not (chunked_hybrid and rules.hybrid_kv_manager):
        counts, layers_per_stage = _merge_chunked(counts, layers_per_stage)
        notes.append(
            f"chunked local attention layers cache the whole context: vLLM disables its "
            f"hybrid KV cache manager for them unless {CHUNKED_HYBRID_ENV}=1 (then each "
            f"keeps {arch.attention_chunk_size} tokens plus the batched ones)"
        )
    page = per_layer_token_bytes * block_size
    if len(counts) == 1 or not rules.hybrid_kv_manager:
        return _single_group_layout(arch, rules, counts, layers_per_stage, page, block_size, notes)
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = smallest
    if rules.group_size_heuristic and largest < smallest * 1.5:
        group_size = largest
    groups: list[str] = []
    groups_of: dict[str, int] = {}
    for kind in ("full", "sliding", "chunked"):
        n = counts.get(kind, 0)
        if not n:
            continue
        groups_of[kind] = cdiv(n, group_size)
        groups += [kind] * groups_of[kind]
        padding = groups_of[kind] * group_size - n
        if padding:
            notes.append(
                f"{padding} padding layer(s) in the {kind}-attention groups (vLLM pads uneven groups)"
            )
    # Layers of a type are dealt round-robin to that type's groups
    # (layers[i::num_groups]), so a stage's group holds ceil(n_stage / groups).
    sizes = tuple(
        max(cdiv(stage.get(kind, 0), groups_of[kind]) for kind in groups_of)
        for stage in layers_per_stage
    )
    return KVLayout(
        tuple(groups),
        sizes,
        page,
        block_size,
        arch.sliding_window,
        tuple(notes),
        arch.attention_chunk_size if "chunked" in groups_of else None,
    )


def _single_group_layout(
    arch: ModelArchitecture,
    rules: VllmRules,
    counts: dict[str, int],
    layers_per_stage: tuple[dict[str, int], ...],
    page: int,
    block_size: int,
    notes: list[str],
) -> KVLayout:
    """One group holding every layer: a single kind of layer, or a release
    without the hybrid KV manager (sliding layers then cache the whole context)."""
    if len(counts) > 1:
        notes.append(
            f"vLLM {rules.version} has no hybrid KV manager: sliding-window layers cache the whole context"
        )
    kind = (
        "sliding"
        if set(counts) == {"sliding"} and rules.hybrid_kv_manager
        else ("mla" if "mla" in counts else "full")
    )
    sizes = tuple(sum(s.values()) for s in layers_per_stage)
    window = arch.sliding_window if kind == "sliding" else None
    return KVLayout((kind,), sizes, page, block_size, window, tuple(notes))


def blocks_per_request(layout: KVLayout, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Blocks one request of ``max_model_len`` tokens holds across all groups
    (``max_memory_usage_bytes`` of FullAttentionSpec / SlidingWindowSpec:
    a window layer keeps ``min(window - 1 + max_num_batched_tokens, len)``
    tokens plus one block, because the window need not start on a block;
    MambaSpec: one block, the state, whatever the length)."""
    total = 0
    for kind in layout.groups:
        if kind == "mamba":
            total += layout.state_blocks_per_request
        elif kind == "sliding" and layout.sliding_window:
            tokens = min(layout.sliding_window - 1 + max_num_batched_tokens, max_model_len)
            total += cdiv(tokens, layout.block_size) + 1
        elif kind == "chunked" and layout.attention_chunk_size:
            # ChunkedLocalAttentionSpec.max_memory_usage_bytes: no extra block
            tokens = min(layout.attention_chunk_size + max_num_batched_tokens, max_model_len)
            total += cdiv(tokens, layout.block_size)
        else:
            total += cdiv(max_model_len, layout.block_size)
    return total


@dataclass(frozen=True)
class KVCapacity:
    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    """At max_model_len, as vLLM logs it (not rounded)."""
    blocks_per_request: int
    fits_one_request: bool
    needed_bytes_one_request: int
    """Per GPU, for one max_model_len request (vLLM's start-up check)."""
    estimated_max_model_len: int
    """Longest context one request can have with this memory."""


def kv_capacity(
    layout: KVLayout,
    rules: VllmRules,
    available_bytes_per_stage: list[int],
    max_model_len: int,
    max_num_batched_tokens: int,
) -> KVCapacity:
    """Blocks, logged KV tokens and maximum concurrency (kv_cache_utils.py)."""
    blocks = []
    for avail, gsize in zip(available_bytes_per_stage, layout.group_size_per_stage, strict=True):
        if gsize == 0:
            continue
        blocks.append(max(0, int(avail // layout.page_bytes // gsize)))
    num_blocks = min(blocks) if blocks else 0
    per_req = blocks_per_request(layout, max_model_len, max_num_batched_tokens)
    concurrency = num_blocks / per_req if per_req else 0.0
    if not rules.v1:
        tokens = num_blocks * layout.block_size
        concurrency = tokens / max_model_len
    elif rules.tokens_from_concurrency:
        tokens = int(concurrency * max_model_len)
    else:
        tokens = num_blocks // layout.num_groups * layout.block_size
    # Start-up check (``_check_enough_kv_cache_memory``): bytes one request
    # needs on the most constrained stage.
    worst = 0
    for avail, gsize in zip(available_bytes_per_stage, layout.group_size_per_stage, strict=True):
        need = per_req * layout.page_bytes * gsize
        worst = max(worst, need - avail)
    needed = max(per_req * layout.page_bytes * g for g in layout.group_size_per_stage)
    fits = worst <= 0 and num_blocks > 0
    return KVCapacity(
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=concurrency,
        blocks_per_request=per_req,
        fits_one_request=fits,
        needed_bytes_one_request=needed,
        estimated_max_model_len=max_len_for(
            layout, num_blocks, 1, max_model_len, max_num_batched_tokens
        ),
    )


def max_len_for(
    layout: KVLayout, num_blocks: int, concurrency: int, upper: int, max_num_batched_tokens: int
) -> int:
    """Longest context such that ``concurrency`` requests fit in ``num_blocks``
    (binary search, as vLLM's ``estimate_max_model_len``); 0 if none."""
    lo, hi, best = 1, max(1, upper), 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if concurrency * blocks_per_request(layout, mid, max_num_batched_tokens) <= num_blocks:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def max_concurrency_at(
    layout: KVLayout, num_blocks: int, context_tokens: int, max_num_batched_tokens: int
) -> int:
    """Whole requests of ``context_tokens`` that fit at once."""
    per = blocks_per_request(layout, context_tokens, max_num_batched_tokens)
    return num_blocks // per if per else 0


# --------------------------------------------------------------------------- SGLang


def sglang_default_mem_fraction(tensor_parallel_size: int) -> float:
    """SGLang's ``mem_fraction_static`` default by TP size
    (python/sglang/srt/server_args.py, 0.4.x ``__post_init__``, before the
    GPU-memory rule that the 0.4.10 wheel has; see :func:`sglang_defaults`)."""
    tp = tensor_parallel_size
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81
    if tp >= 4:
        return 0.85
    if tp >= 2:
        return 0.87
    return 0.88


@dataclass(frozen=True)
class SglangRules:
    """The defaults of one SGLang release range (see :func:`sglang_rules`)."""

    version: str
    rules_from: str
    era: str
    """"tp" (before 0.4.10): mem_fraction_static by TP size only;
    "tiered" (0.4.10-0.5.2): a reserve per GPU-memory tier; "formula" (0.5.3+):
    the reserve computed from chunked_prefill_size and cuda_graph_max_bs."""
    small_gpu_max_bs: int = 16
    """cuda_graph_max_bs for 20-35 GiB GPUs at TP < 4: 16 in 0.5.3, 24 from
    0.5.5, 48 from 0.5.20 (160 at TP >= 4; 80 before 0.5.20)."""
    small_gpu_max_bs_tp4: int = 80
    """The same at TP >= 4: 80, 160 from 0.5.20."""
    small_gpu_chunk_tokens: int = 2048
    """chunked_prefill_size for 20-35 GiB GPUs: 2048, 4096 from 0.5.20."""
    prefill_graphs_reserved: bool = False
    """0.5.10+: piecewise (prefill) CUDA graphs are on by default
    (``disable_piecewise_cuda_graph = False``; 0.5.8 had
    ``enable_piecewise_cuda_graph = False``) and the reserve adds 8 MiB per
    captured token size (non-torch memory only), 1.5 GiB for MLA models."""
    notes: tuple[str, ...] = field(default=())


@lru_cache(maxsize=64)
def sglang_rules(version: str | None) -> SglangRules:
    """SGLang's memory defaults per release, each read in that release's wheel:
    python/sglang/srt/server_args.py ``__post_init__`` (0.4.10, 0.5.1),
    ``_handle_gpu_memory_settings`` (0.5.3-0.5.13) and
    python/sglang/srt/arg_groups/memory_hook.py ``handle_gpu_memory_settings``
    (0.5.16-0.5.23). Releases not read (0.4.1-0.4.9, 0.5.2, 0.5.4, 0.5.6-0.5.9,
    0.5.11-0.5.12, 0.5.14-0.5.15, 0.5.17-0.5.19) take the older rules, said
    in the notes."""
    requested = version or SGLANG_DEFAULT_VERSION
    v = parse_version(requested)
    base = _nearest_known(v, SGLANG_KNOWN_VERSIONS)
    notes: list[str] = []
    if version is not None and requested.lstrip("v") not in SGLANG_KNOWN_VERSIONS:
        notes.append(f"no SGLang rules recorded for {requested} exactly; used those of {base}")
    if v < (0, 4, 10):
        era = "tp"
    elif v < (0, 5, 3):
        era = "tiered"
    else:
        era = "formula"
    small_bs = 48 if v >= (0, 5, 20) else (24 if v >= (0, 5, 5) else 16)
    return SglangRules(
        version=requested,
        rules_from=base,
        era=era,
        small_gpu_max_bs=small_bs,
        small_gpu_max_bs_tp4=160 if v >= (0, 5, 20) else 80,
        small_gpu_chunk_tokens=4096 if v >= (0, 5, 20) else 2048,
        prefill_graphs_reserved=v >= (0, 5, 10),
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class SglangDefaults:
    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int | None
    """None where the release leaves it to the CUDA-graph runner (not read)."""
    reserved_mib: float | None
    why: str


def _sglang_tier(rules: SglangRules, gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory (0.5.3+ tiers)."""
    if gpu_mib < 20 * 1024:  # T4, RTX 4080
        return 2048, 8
    if gpu_mib < 35 * 1024:  # A10, RTX 4090/5090
        max_bs = rules.small_gpu_max_bs if tp < 4 else rules.small_gpu_max_bs_tp4
        return rules.small_gpu_chunk_tokens, max_bs
    if gpu_mib < 60 * 1024:  # A100 40GB, L40(S)
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:  # H100, A100 80GB, H20, H200
        return 8192, 256 if tp < 4 else 512
    return 16384, 512  # B200, MI300X


def prefill_graph_token_sizes(max_tokens: int) -> list[int]:
    """Token counts SGLang captures prefill (piecewise) CUDA graphs for, up to
    ``max_tokens`` (``_generate_piecewise_cuda_graph_tokens`` 0.5.10,
    ``generate_prefill_cuda_graph_batch_sizes`` 0.5.16+: the same steps)."""
    steps = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [t for t in steps if t <= max_tokens]


def sglang_defaults(
    rules: SglangRules,
    gpu_mib: float,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    mla: bool,
) -> SglangDefaults:
    """``mem_fraction_static``, ``chunked_prefill_size`` and ``cuda_graph_max_bs``
    as ``launch_server`` sets them when the user gives none (no speculative
    decoding, no DP attention, text-only model). ``gpu_mib`` is
    ``get_device_memory_capacity``: the device's total memory in MiB."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if rules.era == "tp":
        mfs = sglang_default_mem_fraction(tp)
        return SglangDefaults(
            mfs,
            8192,
            None,
            None,
            f"SGLang {rules.rules_from} rule: mem_fraction_static {mfs} for tp={tp}",
        )
    if rules.era == "tiered":
        return _sglang_tiered(gpu_mib, tp, pp)
    chunk, max_bs = _sglang_tier(rules, gpu_mib, tp)
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + tp * pp / 8 * 1024
    graphs = ""
    if rules.prefill_graphs_reserved:
        if mla:
            reserved += 1.5 * 1024
            graphs = " + 1.5 GiB for MLA prefill CUDA graphs"
        else:
            n = len(prefill_graph_token_sizes(chunk))
            reserved += n * 8
            graphs = f" + {n} prefill CUDA-graph sizes x 8 MiB"
    floor = ""
    if gpu_mib > 60 * 1024 and reserved < 10 * 1024:
        reserved, floor = 10 * 1024, ", raised to the 10 GiB floor above 60 GiB"
    mfs = round((gpu_mib - reserved) / gpu_mib, 3)
    why = (
        f"SGLang {rules.rules_from} defaults for a {gpu_mib / 1024:.0f} GiB GPU: chunked_prefill_size "
        f"{chunk}, cuda_graph_max_bs {max_bs}; mem_fraction_static = 1 - reserve/memory = {mfs} "
        f"(reserve 512 MiB + 1.5 x {max(chunk, 2048)} + 2 x {max_bs} + {tp * pp}/8 GiB{graphs}{floor}: "
        f"{reserved / 1024:.2f} GiB)"
    )
    return SglangDefaults(mfs, chunk, max_bs, reserved, why)


def _sglang_tiered(gpu_mib: float, tp: int, pp: int) -> SglangDefaults:
    """0.4.10-0.5.2: a fixed reserve per memory tier (server_args.py
    ``__post_init__``, read in the 0.4.10 and 0.5.1 wheels)."""
    p = tp * pp
    if gpu_mib < 35 * 1024:
        reserved_gib = 2.8 + p / 10
    elif gpu_mib < 90 * 1024:
        reserved_gib = 9.5 + p / 2
    elif gpu_mib < 160 * 1024:
        reserved_gib = 12 + p / 2
    else:
        reserved_gib = 32.0
    chunk = 2048 if gpu_mib < 35 * 1024 else (8192 if gpu_mib < 160 * 1024 else 16384)
    max_bs = (8 if tp < 4 else 80) if gpu_mib < 35 * 1024 else None
    mfs = round((gpu_mib - reserved_gib * 1024) / gpu_mib, 3)
    why = (
        f"SGLang 0.4.10-0.5.2 defaults for a {gpu_mib / 1024:.0f} GiB GPU: reserve "
        f"{reserved_gib:g} GiB at tp x pp = {p}, mem_fraction_static {mfs}, chunked_prefill_size {chunk}"
    )
    return SglangDefaults(mfs, chunk, max_bs, reserved_gib * 1024, why)


SGLANG_CONTEXT_OVERHEAD_GIB = 0.6
"""CUDA context and allocator slack already used when SGLang measures free
memory after loading weights (assumed)."""


def sglang_max_total_tokens(
    total_bytes: float, weights_bytes: float, mem_fraction_static: float, cell_size: int
) -> tuple[int, float]:
    """``profile_max_num_token``: (tokens, bytes left for the KV pool)."""
    free_after_weights = total_bytes - weights_bytes - SGLANG_CONTEXT_OVERHEAD_GIB * GiB
    rest = free_after_weights - total_bytes * (1 - mem_fraction_static)
    if rest <= 0 or cell_size <= 0:
        return 0, rest
    return int(rest // cell_size), rest
