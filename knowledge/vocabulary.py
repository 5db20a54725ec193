"""The shared id vocabularies: symptoms and bottleneck hypotheses.

These ids are a contract (../shared/DESIGN.md): workload files, diagnosis,
plans, playbooks and knowledge documents all refer to them, so they are
defined once here and validated everywhere else. Extend, never rename.
Stdlib only, so any light module (input models, the playbook loader) may
import it.
"""

from __future__ import annotations

SYMPTOMS: dict[str, str] = {
    "ttft_high": "Time to first token is high",
    "ttft_normal": "Time to first token is normal",
    "itl_high": "Inter-token latency is high",
    "itl_normal": "Inter-token latency is normal",
    "both_degrade_with_concurrency": "TTFT and ITL both degrade as concurrency rises",
    "gpu_util_low": "GPU utilisation is low while latency is high",
    "latency_high": "End-to-end latency is high",
    "throughput_up_tail_violates": "Throughput rises but tail latency violates the SLO",
    "errors_under_load": "Errors or timeouts appear under load",
    "cold_start_spikes": "Latency spikes after idle periods or scale-up (cold starts)",
}
"""Symptom id -> human title."""

HYPOTHESES: dict[str, str] = {
    "queueing": "Requests wait in a queue before the engine schedules them",
    "long_prompts": "Long prompts make prefill expensive",
    "prefill_compute": "Prefill is compute-bound on the GPU",
    "prefill_interference": "Prefills of new requests stall the decode of running ones",
    "cold_start": "Cold starts: model load, compilation or scale-from-zero",
    "preprocessing": "Preprocessing (templating, retrieval, media decoding) before the engine",
    "decode_bandwidth": "Decode is bound by GPU memory bandwidth",
    "batch_contention": "Too many sequences share each decode step",
    "kv_cache_pressure": "KV cache is nearly full: preemption, recomputation or swapping",
    "kernel_efficiency": "Kernels or runtime run below the hardware's capability",
    "memory_capacity": "GPU memory capacity limits concurrency or context",
    "model_too_large": "The model is too large for the latency target on this hardware",
    "batch_policy": "The batching policy or its limits do not fit the workload",
    "admission_control": "Missing or wrong admission control and rate limiting",
    "saturation": "The deployment is saturated: offered load exceeds capacity",
    "cpu_tokenization": "CPU-bound tokenization or detokenization",
    "data_transfer": "Host-device or network data transfer on the request path",
    "synchronization": "Host-device synchronization or scheduler overhead between steps",
    "network": "Network latency or bandwidth between client, gateway and engine",
    "scheduling": "The engine scheduler orders or preempts requests poorly",
    "communication": "Inter-GPU communication (tensor/expert parallel collectives)",
    "workload_mixing": "Offline or long jobs share the deployment with interactive traffic",
    "prefix_cache_miss": "Shared prompt prefixes are not reused from the cache",
    "routing_locality": "The router ignores cache or session locality across replicas",
}
"""Hypothesis id -> human title."""

SYMPTOM_IDS: frozenset[str] = frozenset(SYMPTOMS)
HYPOTHESIS_IDS: frozenset[str] = frozenset(HYPOTHESES)


SERVING_ENGINES: tuple[str, ...] = (
    "vllm",
    "sglang",
    "tensorrt-llm",
    "tgi",
    "llama.cpp",
    "lmdeploy",
)
"""Engines a deployment runs on (a workload's ``deployment.engine`` adds ``other``)."""
OUTSIDE_ENGINE: tuple[str, ...] = ("generic", "kubernetes", "llm-d", "dynamo")
"""Where a playbook setting lives when it is not an engine flag: the gateway or router
(``generic``), the orchestration layer or a serving framework around the engine."""
