"""Every vLLM metric name a diagnosis or plan tells a user to scrape must exist.

The names below are the V1 engine's Prometheus metrics as listed in vLLM's metrics design
document (docs/design/metrics.md, "v1 Metrics"; https://docs.vllm.ai/en/latest/design/metrics/)
and the production metrics page; counters appear with and without the `_total` suffix that
the Prometheus client adds. V0-era names are accepted only where the same sentence marks them
as older, because a user on a current version would find nothing under them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from inferwise.knowledge.diagnosis import DiagnoseRequest, diagnose
from inferwise.knowledge.planning import PlanRequest, plan_experiments

ROOT = Path(__file__).resolve().parents[1]
V1_GAUGES_HISTOGRAMS = {
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "iteration_tokens_total",
    "cache_config_info",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_params_n",
    "request_params_max_tokens",
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
}
V1_COUNTERS = {
    "prefix_cache_queries",
    "prefix_cache_hits",
    "mm_cache_queries",
    "mm_cache_hits",
    "num_preemptions",
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
}
V0_ONLY = {
    "gpu_cache_usage_perc",
    "time_per_output_token_seconds",
    "num_requests_swapped",
    "gpu_prefix_cache_hit_rate",
}
NAME = re.compile(r"vllm:([a-z0-9_]+)")


def _known(name: str, sentence: str) -> bool:
    if name in V1_GAUGES_HISTOGRAMS:
        return True
    if name.removesuffix("_total") in V1_COUNTERS:
        return True
    return name in V0_ONLY and re.search(r"older|v0|legacy|deprecated", sentence, re.I) is not None


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


def _printed() -> list[str]:
    out: list[str] = []
    examples = [str(p) for p in sorted((ROOT / "examples" / "workloads").glob("*"))]
    scenarios = [
        json.dumps(json.loads(p.read_text())["workload"])
        for p in sorted((ROOT / "tests" / "scenarios").glob("*.json"))
    ]
    for wl in examples + scenarios:  # every hypothesis guide appears in some diagnosis
        out += list(_strings(diagnose(DiagnoseRequest(workload=wl, limit=24)).model_dump()))
    for wl in examples:  # plans add stage recipes (playbooks) and the baseline scrape list
        out += list(_strings(plan_experiments(PlanRequest(workload=wl)).model_dump()))
    return out


def test_every_printed_vllm_metric_exists():
    unknown = set()
    seen = set()
    for text in _printed():
        for m in NAME.finditer(text):
            seen.add(m.group(1))
            if not _known(m.group(1), text):
                unknown.add((m.group(1), text[:160]))
    assert not unknown, sorted(unknown)
    # the core signals of the issue are among what users are told to read
    assert {"num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"} <= seen
    assert {"request_queue_time_seconds", "time_to_first_token_seconds"} <= seen


def test_rule_files_name_only_existing_metrics():
    for path in sorted((ROOT / "knowledge" / "rules").glob("*.toml")):
        for line in path.read_text().splitlines():
            for m in NAME.finditer(line):
                assert _known(m.group(1), line), (path.name, m.group(1), line[:160])
