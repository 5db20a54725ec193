"""Acceptance criteria built from the workload's own numbers, and the facts to verify with
the official pages they came from."""

from __future__ import annotations

from inferwise.knowledge.evidence import Analysis
from inferwise.knowledge.plan_parts import (
    ENGINE_DOCS,
    METRICS_DOCS,
    AcceptanceCriteria,
    FactToVerify,
    Stage,
    engine_of,
    fmt_value,
    peak_rate,
    slo_items,
)
from inferwise.knowledge.plan_stages import knob_lines
from inferwise.knowledge.quality_gate import baseline_quality_line


def acceptance_criteria(a: Analysis, stages: list[Stage]) -> AcceptanceCriteria:
    wl = a.workload
    quality: list[str] = []
    floor = wl.product.quality_floor if wl.product else None
    risky = [s.title for s in stages if s.playbook and _quality_effect(s.playbook)]
    if floor:
        quality.append(
            f"Quality floor: {floor}; measured on the product's eval set after every stage that can change outputs."
        )
    else:
        quality.append(
            "No quality floor stated (product.quality_floor): define the eval set and minimum score before stage 1; no speed change ships without it."
        )
    measured = baseline_quality_line(a)
    if measured:
        quality.append(measured)
    if risky:
        quality.append(
            "Stages that can change outputs and need the eval: " + "; ".join(risky) + "."
        )
    quality.append(
        "Stages that claim no quality effect (caching, scheduling, routing) keep greedy outputs identical on a fixed regression prompt set."
    )

    tail: list[str] = []
    steps = wl.traffic.agentic_steps if wl.traffic else None
    for m, k, v in slo_items(wl):
        if steps and m == "e2e_ms":
            tail.append(
                f"E2E {k} <= {fmt_value(v, 'ms')} per task of {steps} LLM and tool calls, measured on recorded tasks (tool latency and retries included) and budgeted with `inferwise budget --agent-steps`."
            )
            continue
        tail.append(
            f"{m.removesuffix('_ms').upper()} {k} <= {fmt_value(v, 'ms')}, measured client-side by `inferwise probe` with the production prompt mix."
        )
    peak = peak_rate(a)
    if a.value("traffic.mode") == "offline" and peak:
        tail.insert(
            0,
            f"Offline: sustained throughput >= {peak:g} req/s ({peak * 3600:,.0f} requests per hour) with the GPUs saturated; per-request latency matters only through the job's completion time.",
        )
    elif peak and tail:
        tail.append(
            f"All of the above hold at the peak rate of {fmt_value(peak, 'req/s')} (mean {fmt_value(a.value('traffic.arrival_rate_rps'), 'req/s')} x peak_to_mean {a.value('traffic.peak_to_mean') or 1:g}), not only at the mean."
        )
    if tail:
        tail.append(
            "Goodput (requests meeting every target per second) not below the baseline; compare p99 too, not only p95."
        )
    else:
        tail.append(
            "No latency SLO stated (slo.ttft_ms, slo.itl_ms, slo.e2e_ms): agree the targets first; until then report p50/p95/p99 against the baseline."
        )

    rel: list[str] = []
    if wl.slo and wl.slo.availability:
        downtime = (1 - wl.slo.availability) * 30 * 24 * 60
        rel.append(
            f"Availability >= {wl.slo.availability:g} ({downtime:.0f} min of downtime per 30 days); survive the loss of one replica at peak."
        )
    if wl.slo and wl.slo.error_rate is not None:
        rel.append(
            f"Error rate <= {wl.slo.error_rate:.2%} "
            + ("over the whole job" if a.value("traffic.mode") == "offline" else "at peak")
            + " (failed / all requests, by class)."
        )
    else:
        rel.append("Error rate at peak stated and met (slo.error_rate is missing).")
    over = f"{peak * 1.5:,.1f} req/s" if peak else "1.5x the peak"
    if a.value("traffic.mode") == "offline":
        rel.append(
            "Failed items are retried a bounded number of times and then listed; after a worker or replica loss the job resumes without redoing finished items."
        )
    else:
        rel.append(
            f"Overload at {over}: bounded queue, fast HTTP 429 rejections instead of timeouts, recovery within a minute after the burst; client retries capped."
        )
    if wl.deployment and wl.deployment.scale_to_zero:
        rel.append(
            "Cold start from zero measured and within the TTFT target for the first request, or a minimum of one warm replica kept."
        )
    rel.append("Rollback to the pinned baseline rehearsed once before the rollout.")

    sec: list[str] = []
    c = wl.constraints
    if c and c.data_residency:
        sec.append(
            f"Data residency '{c.data_residency}': GPUs, logs, run stores and any KV offload tier stay in {c.data_residency} regions."
        )
    if c and c.privacy:
        sec.append(f"Privacy: {c.privacy}.")
    if c and c.license:
        sec.append(
            f"Model license '{c.license}' permits this use; recorded with the model revision."
        )
    elif wl.deployment and wl.deployment.model:
        sec.append(
            f"The license of {wl.deployment.model} checked against the product's use (constraints.license is not stated)."
        )
    if a.value("traffic.shared_prefix_fraction") or any(
        s.playbook in ("prefix_caching", "prefix_aware_routing", "kv_offload") for s in stages
    ):
        sec.append(
            "Prefix/KV cache reuse never crosses tenants: shared prefixes hold no tenant data, or the cache is salted per tenant."
        )
    sec.append(
        "Prompts and outputs are not logged or stored by probes (store_text off); API keys come from environment variables, never images or logs."
    )

    cost: list[str] = []
    if c and c.budget_usd_per_hour is not None:
        cost.append(
            f"Serving cost <= {c.budget_usd_per_hour:g} USD/h at peak capacity, including idle and redundant replicas."
        )
        tps = a.value("observations.output_tokens_per_s")
        if tps:
            per_m = c.budget_usd_per_hour / (tps * 3600 / 1e6)
            cost.append(
                f"At the measured {tps:,.0f} output tokens/s that budget is {per_m:,.2f} USD per million output tokens; a change must not raise it."
            )
        else:
            cost.append(
                "Cost per million output tokens (budget / measured output tokens per hour) reported for the baseline and every stage."
            )
    else:
        cost.append(
            "No budget stated (constraints.budget_usd_per_hour): report GPU-hours per 1,000 successful requests for each stage."
        )
    if c and c.max_gpus:
        cost.append(f"At most {c.max_gpus} GPUs in total (constraints.max_gpus).")
    cost.append("Compare cost per successful request at the SLO (goodput), not per raw token.")
    return AcceptanceCriteria(
        quality=quality, tail_latency=tail, reliability=rel, security=sec, cost=cost
    )


def _quality_effect(playbook_id: str) -> bool:
    from inferwise.knowledge.playbooks import get_playbook

    q = get_playbook(playbook_id).effects.quality.strip().lower()
    return not (q.startswith("0") or q in ("none", ""))


# --------------------------------------------------------------------------- facts


def facts_to_verify(a: Analysis, stages: list[Stage]) -> list[FactToVerify]:
    from inferwise.knowledge.playbooks import get_playbook
    from inferwise.knowledge.sizing import model_source_url

    out: list[FactToVerify] = []
    seen: set[tuple[str, str]] = set()

    def add(claim: str, url: str) -> None:
        if url and (claim, url) not in seen:
            seen.add((claim, url))
            out.append(FactToVerify(claim=claim, source_url=url))

    g = a.gpu
    if g is not None:
        add(
            f"{g.name}: {g.memory_gb_vendor:g} GB memory, {g.memory_bandwidth_gb_per_s:,.0f} GB/s memory bandwidth, "
            f"{g.interconnect} at {g.interconnect_bandwidth_gb_per_s:g} GB/s per direction (vendor figures).",
            g.source_url,
        )
    dep = a.workload.deployment
    if dep and dep.model:
        url = model_source_url(dep.model)
        if url and url.startswith("https://huggingface.co/"):
            add(
                f"{dep.model}: license, intended use and recommended serving settings (model card).",
                f"https://huggingface.co/{dep.model}",
            )
        if url and url.startswith("http"):
            add(
                f"{dep.model} architecture (layers, KV heads, context length) as in its config.json; check the model card for license and recommended settings.",
                url,
            )
    engine = engine_of(a.workload)
    version = dep.engine_version if dep and dep.engine_version else "the deployed version"
    if engine in ENGINE_DOCS:
        add(
            f"{engine} defaults (chunked prefill, prefix caching, max-num-seqs, token budget) for {version}; they change between releases.",
            ENGINE_DOCS[engine],
        )
    if engine in METRICS_DOCS:
        add(
            f"{engine} metric names used in this plan (queue, running, KV usage, preemptions, prefix-cache hits) for {version}.",
            METRICS_DOCS[engine],
        )
    for s in stages:
        if not s.playbook:
            continue
        pb = get_playbook(s.playbook)
        for k in knob_lines(pb, engine):
            add(f"{k.engine} `{k.flag}`: {k.note or pb.summary}", k.doc)
    return out
