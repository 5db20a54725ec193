"""Plan stages: a baseline (and, for a new service, sizing) first, then one playbook per
stage changing one variable, least complex first, and a combined validation last."""

from __future__ import annotations

from typing import Any

from inferwise.knowledge.commands import concretize
from inferwise.knowledge.diagnosis import Hypothesis
from inferwise.knowledge.evidence import Analysis
from inferwise.knowledge.plan_levers import lever_lines
from inferwise.knowledge.plan_parts import (
    Candidate,
    Stage,
    engine_of,
    fmt_value,
    peak_rate,
    probe_command,
    slo_items,
)
from inferwise.knowledge.rule_engine import load_table
from inferwise.knowledge.vocabulary import OUTSIDE_ENGINE

_ALREADY_DONE = {
    "prefix_caching": ("deployment.enable_prefix_caching", True),
    "fp8_kv_cache": ("deployment.kv_cache_dtype", "fp8"),
    "warm_pools": ("deployment.scale_to_zero", False),
    "prefix_aware_routing": ("derived.router_locality_aware", True),
}


def _applicable(a: Analysis, pb: Any) -> bool:
    """Skip playbooks that are already in place or cannot apply to this deployment."""
    done = _ALREADY_DONE.get(pb.id)
    if done and a.value(done[0]) == done[1]:
        return False
    if pb.id == "prefix_aware_routing":
        return a.value("derived.replicas") != 1
    if pb.id in ("prefix_caching", "prompt_restructuring"):
        shared = a.value("traffic.shared_prefix_fraction")
        return shared is None or shared >= 0.2
    if pb.id == "weight_quantization":
        q = a.value("deployment.quantization") or a.value("fit.quantization")
        if q and str(q).lower() not in ("none", "auto"):
            return False  # already quantized: the next step is a different format, not this one
    if pb.id == "separate_batch_traffic":
        return bool(a.value("traffic.batch_share")) or a.value("traffic.mode") == "mixed"
    if pb.id == "expert_parallelism":
        fit = a.calcs.get("fit")
        params = fit.result.parameters if fit and fit.result else None
        return params is not None and params.active_per_token < params.total
    return True


def knob_lines(pb: Any, engine: str) -> list[Any]:
    """The one setting a stage changes: the engine's flag for the playbook's variable.

    A playbook lists several knobs (per engine, and alternatives or companions); a stage that
    changed two of them would not tell which one moved the metric. So exactly one is chosen:
    the knob whose flag names the variable (deployment.max_num_batched_tokens ->
    --max-num-batched-tokens), and of a compound flag ("--a; --b") only that part. Variables
    that live outside the engine (gateway, router) take the gateway/cluster knob first."""
    from dataclasses import replace

    mine = [k for k in pb.knobs if k.engine == engine]
    outside = [k for k in pb.knobs if k.engine in OUTSIDE_ENGINE]
    var = str(pb.variable)
    flag = ""
    if var.startswith("deployment."):
        flag = "--" + var.removeprefix("deployment.").split()[0].replace("_", "-")
    # variables outside the engine (gateway, router, the application's prompt), or a deployment
    # field no engine flag names (scale_to_zero), are changed where they live
    outside_first = var.startswith(("gateway", "router", "application")) or (
        bool(flag) and not any(flag in k.flag for k in pb.knobs) and bool(outside)
    )
    candidates = (outside + mine if outside_first else mine or outside) or list(pb.knobs[:1])
    if not candidates:
        return []
    chosen = next((k for k in candidates if flag and flag in k.flag), candidates[0])
    parts = [p.strip() for p in chosen.flag.split(";") if p.strip()]
    if len(parts) > 1:
        part = next((p for p in parts if flag and flag in p), parts[0])
        chosen = replace(chosen, flag=part)
    return [chosen]


def _slo_line(a: Analysis) -> str:
    per_task = " per task" if a.workload.traffic and a.workload.traffic.agentic_steps else ""
    items = [
        f"{m.removesuffix('_ms').upper()} {k} <= {fmt_value(v, 'ms')}"
        + (per_task if m == "e2e_ms" else "")
        for m, k, v in slo_items(a.workload)
    ]
    peak = peak_rate(a)
    where = f" at the peak rate {fmt_value(peak, 'req/s')}" if peak else " at the production load"
    return ("; ".join(items) + where) if items else "the agreed latency targets (none stated yet)"


def _effects(pb: Any) -> list[str]:
    e = pb.effects
    return [
        f"TTFT: {e.ttft}",
        f"ITL: {e.itl}",
        f"Throughput: {e.throughput}",
        f"Memory: {e.memory}",
        f"Quality: {e.quality}",
    ]


def _playbook_stage(a: Analysis, pb: Any, hyp: str, url: str, engine: str) -> Stage:
    knobs = knob_lines(pb, engine)
    flags = "; ".join(f"`{k.flag}` ({k.engine})" for k in knobs)
    guide = load_table("hypotheses.toml").get(hyp, {})
    measure = [probe_command(a, url, pb.id), *(concretize(m, a, url) for m in pb.measure)]
    return Stage(
        title=pb.title,
        variable=pb.variable,
        hypothesis=hyp,
        playbook=pb.id,
        complexity=pb.complexity,
        change=f"{pb.summary} Change only {pb.variable}: {flags}."
        + (f" Note: {knobs[0].note}" if knobs and knobs[0].note else ""),
        measure=measure,
        decisive_metric=str(guide.get("decisive", "")),
        expected_tradeoffs=[*lever_lines(a, pb.id), *_effects(pb), *pb.risks],
        acceptance=[
            f"{_slo_line(a)}, compared with the baseline run (`inferwise runs compare BASELINE_RUN NEW_RUN`: the change must exceed run-to-run noise).",
            *pb.acceptance,
        ],
        rollback=pb.rollback,
    )


_ENGINE_GAUGES = {
    "vllm": "vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc, "
    "vllm:num_preemptions_total, vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total",
    "sglang": "sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage, "
    "sglang:num_retracted_requests_total, sglang:cache_hit_rate",
    "llama.cpp": "llamacpp:requests_deferred, llamacpp:requests_processing against the --parallel "
    "slot count, llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total (start llama-server "
    "with --metrics)",
}


_OTHER_GAUGES = "the engine's queue length, running requests, KV-cache usage and preemption gauges, by the names in its metrics documentation"


def _baseline_stage(a: Analysis, url: str, leading: Hypothesis | None) -> Stage:
    wl = a.workload
    dep = wl.deployment
    pinned = ", ".join(
        x
        for x in (
            f"model {dep.model}" if dep and dep.model else "model revision",
            f"engine {dep.engine} {dep.engine_version or '(pin the version)'}"
            if dep and dep.engine
            else "engine and version",
            f"GPU {dep.gpu}" if dep and dep.gpu else "GPU type and count",
            "precision, engine flags, prompt mix, output limits and load shape",
        )
    )
    measure = [
        probe_command(a, url, "baseline"),
        "Repeat the run 3 times to know the run-to-run noise; keep the engine's /metrics scraped "
        f"alongside ({_ENGINE_GAUGES.get(engine_of(wl), _OTHER_GAUGES)}).",
        "Run the product quality eval on the same deployment (the reference for every later stage).",
    ]
    if leading is not None:
        n = len(leading.how_to_prove)
        measure += [
            f"Proof of '{leading.id}' ({i}/{n}, before changing anything): {step}"
            for i, step in enumerate(leading.how_to_prove, 1)
        ]
    return Stage(
        title="Reproducible baseline" + (f" and proof of '{leading.id}'" if leading else ""),
        variable="none (measurement only)",
        hypothesis=leading.id if leading else None,
        change=f"Nothing. Pin {pinned}; warm up, then measure.",
        measure=measure,
        decisive_metric=leading.decisive_metric
        if leading
        else "TTFT/ITL/E2E percentiles and goodput at the production load",
        expected_tradeoffs=[
            "Costs GPU time only; no user impact when run against a staging replica."
        ],
        acceptance=[
            "Three repeated runs agree within a few percent on TTFT p50/p95 and ITL p50 (else find the noise source first).",
            "Every missing measurement listed above that the stage can measure is filled into the workload file.",
            *(
                [
                    f"The decisive metric ({leading.decisive_metric}) confirms or rules out '{leading.id}'."
                ]
                if leading
                else []
            ),
        ],
        rollback="Nothing to roll back.",
    )


def _budget_command(a: Analysis, model: str, gpu: str) -> str:
    """A runnable `inferwise budget` line with the workload's own SLOs, lengths and rate."""
    parts = [f"inferwise budget --model {model} --gpu {gpu} --tensor-parallel-size N"]
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    if inp and out:
        parts.append(f"--input-tokens {int(inp)} --output-tokens {int(out)}")
    p95_in = _pct_value(a, "traffic.input_tokens.p95")
    if p95_in:
        parts.append(f"--input-tokens-p95 {int(p95_in)}")
    rate = a.value("traffic.arrival_rate_rps")
    if rate:
        parts.append(f"--request-rate {rate:g}")
    ptm = a.value("traffic.peak_to_mean")
    if ptm:
        parts.append(f"--peak-to-mean {ptm:g}")
    for metric, k, v in slo_items(a.workload):
        if metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            parts.append(f"--slo-{metric.replace('_', '-')} {k}={v:g}")
    return " ".join(parts)


def _pct_value(a: Analysis, name: str) -> float | None:
    v = a.value(name)
    return float(v) if isinstance(v, (int, float)) else None


def _sizing_stage(a: Analysis, cands: list[Candidate]) -> Stage:
    wl = a.workload
    dep = wl.deployment
    model = dep.model if dep and dep.model else "<model>"
    gpus = (wl.constraints.gpus if wl.constraints and wl.constraints.gpus else None) or (
        [dep.gpu] if dep and dep.gpu else ["<gpu>"]
    )
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    ctx = a.value("derived.input_tokens_p95")
    cmds = []
    for g in gpus[:2]:
        cmds.append(
            f"inferwise fit --model {model} --gpu {g} --tensor-parallel-size N"
            + (
                f" --context-tokens {int(ctx + (out or 0))}"
                if ctx
                else " --context-tokens <p95 prompt + output>"
            )
        )
        cmds.append(
            f"inferwise predict --model {model} --gpu {g} --tensor-parallel-size N"
            + (
                f" --input-tokens {int(inp)} --output-tokens {int(out)}"
                if inp and out
                else " --input-tokens <p50> --output-tokens <p50>"
            )
            + " --concurrency 1"
        )
        cmds.append(_budget_command(a, model, g))
    fitting = [c for c in cands if c.fits]
    accept = [
        "A candidate fits with KV room for the peak concurrency and the SLO is feasible (`budget` feasible: true)."
    ]
    if wl.constraints and wl.constraints.max_gpus:
        accept.append(
            f"GPUs needed at peak (replicas x TP) <= constraints.max_gpus = {wl.constraints.max_gpus}."
        )
    allowed = [c for c in fitting if c.within_max_gpus is not False]
    if fitting and wl.slo is not None and all(c.max_rate_under_slo == 0 for c in fitting):
        accept.append(
            "Computed so far: no candidate meets the SLO even lightly loaded (max rate under the SLO is none for all); relax a target or cut per-request latency first (shorter prompts, prefix caching, a faster GPU or a smaller model)."
        )
    elif allowed:
        # the fewest GPUs that carry the peak, then the smaller TP (less communication)
        best = min(allowed, key=lambda c: (c.gpus_needed or float("inf"), c.tensor_parallel_size))
        load = (
            f", {best.replicas_needed} replica(s) = {best.gpus_needed} GPUs at the peak"
            if best.gpus_needed
            else ""
        )
        accept.append(
            f"Computed so far: {best.gpu} with TP={best.tensor_parallel_size} fits (max concurrency {fmt_value(best.max_concurrency)}{load}); confirm with the baseline."
        )
    elif fitting:
        accept.append(
            "Computed so far: every candidate that fits needs more GPUs than constraints.max_gpus at the peak; relax a constraint or lower the per-request cost (quantization, shorter prompts) first."
        )
    return Stage(
        title="Size candidate deployments (computed, before any GPU is rented)",
        variable="none (computation only)",
        change="Nothing deployed yet: compute memory fit, latency and capacity for each allowed GPU and tensor-parallel degree.",
        measure=cmds,
        decisive_metric="fit.fits, fit.max_concurrency and budget.max_rate_under_slo per candidate",
        expected_tradeoffs=[
            "Larger TP lowers ITL and raises KV room but adds communication and GPUs; more replicas add capacity at linear cost."
        ],
        acceptance=accept,
        rollback="Nothing to roll back.",
    )


def _validation_stage(a: Analysis, url: str, changes: list[Stage]) -> Stage:
    peak = peak_rate(a)
    over = peak * 1.5 if peak else None
    offline = a.value("traffic.mode") == "offline"
    combined = probe_command(a, url, "combined", rate=peak)
    where = (
        "closed loop, GPUs saturated"
        if offline
        else "at the peak rate"
        if "--request-rate" in combined
        else "at the baseline load"
    )
    measure = [
        f"{combined}   ({where})",
        # an offline job has no overload: it is run saturated by design; resumability matters
        "Kill one worker mid-job and check that the job resumes without redoing finished items."
        if offline
        else probe_command(a, url, "overload", rate=over) + "   (overload: 1.5x peak)"
        if over
        else "An overload run at 1.5x the highest rate measured.",
        "The product quality eval on the combined configuration.",
        "Cold start: restart one replica and probe with --warmup-requests 0; scale-up and rollback drills.",
    ]
    return Stage(
        title="Combined end-to-end validation",
        variable="none (all accepted changes together)",
        change="Deploy every change that passed its own stage, together, to a canary replica; changes interact (e.g. a larger token budget shrinks the KV cache), so attribution per stage does not prove the sum.",
        measure=measure,
        decisive_metric="goodput at the SLO and the tail percentiles at peak, plus the quality eval",
        expected_tradeoffs=[
            "Interactions can cancel gains measured alone; rerun the stage that regressed in isolation."
        ],
        acceptance=[
            f"{_slo_line(a)} with all changes applied.",
            "Quality eval not below the floor; error rate and cost within the acceptance criteria below.",
            "Canary metrics match the staging run before the full rollout.",
        ],
        rollback="Redeploy the pinned baseline configuration (keep its image and flags until the new one has run a full peak period).",
    )


def build_stages(
    a: Analysis,
    hyps: list[Hypothesis],
    leading: Hypothesis | None,
    url: str,
    greenfield: bool,
    cands: list[Candidate],
    max_stages: int,
) -> list[Stage]:
    from inferwise.knowledge.playbooks import playbooks_for

    engine = engine_of(a.workload)
    head: list[Stage] = []
    if greenfield:
        head.append(_sizing_stage(a, cands))
    head.append(_baseline_stage(a, url, leading))
    room = max(1, max_stages - len(head) - 1)
    order = (
        [leading, *[h for h in hyps if leading is None or h.id != leading.id]]
        if leading
        else list(hyps)
    )
    picked: list[tuple[Any, str, int]] = []
    variables: set[str] = set()
    for rank_i, h in enumerate(order[:3]):
        if h is None:
            continue
        taken = 0
        for pb in playbooks_for(h.id):
            if (
                taken >= (2 if rank_i == 0 else 1)
                or not _applicable(a, pb)
                or pb.variable in variables
            ):
                continue
            picked.append((pb, h.id, rank_i))
            variables.add(pb.variable)
            taken += 1
    picked.sort(key=lambda t: (t[0].complexity, t[2]))
    middle = [_playbook_stage(a, pb, hyp, url, engine) for pb, hyp, _ in picked[:room]]
    if not middle:
        middle.append(
            Stage(
                title="Load sweep to find the knee",
                variable="offered load (request rate or concurrency)",
                change="Raise the offered load step by step on the baseline configuration; nothing else changes.",
                measure=[_sweep_command(a, url)],
                decisive_metric="the rate where goodput stops growing and TTFT p95 crosses its target",
                expected_tradeoffs=["Overload runs fill queues; run against staging."],
                acceptance=[
                    "The knee is above the peak rate with the headroom the availability target needs."
                ],
                rollback="Nothing to roll back.",
            )
        )
    return [*head, *middle, _validation_stage(a, url, middle)]


def _sweep_command(a: Analysis, url: str) -> str:
    """A rate sweep around the workload's own rate (0.5x to 2x the peak), or a concurrency
    sweep when no rate is known."""
    import re

    cmd = probe_command(a, url, "sweep")
    peak = peak_rate(a)
    if peak and "--request-rate" in cmd:
        rates = ",".join(f"{peak * f:.3g}" for f in (0.5, 1.0, 1.5, 2.0))
        return cmd.replace("--request-rate", f"--sweep {rates} --request-rate")
    m = re.search(r"--concurrency (\d+)", cmd)
    if m:  # closed loop: double the concurrency per point from the known load
        c = int(m.group(1))
        sweep = ",".join(str(min(512, c * f)) for f in (1, 2, 4, 8))
        return cmd.replace(m.group(0), f"--sweep {sweep}")
    return cmd
