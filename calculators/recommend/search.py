"""The deployment search: requirements in, a ranked, priced, checked set of fleets out.

Stages, cheapest first (each only sees what the one before let through):

1. models below the quality floor (plus margin) are dropped;
2. the space is enumerated (``space``): GPU x parallelism x weights x KV dtype x
   batch limits, with the context window chosen per memory layout;
3. every configuration is fitted and bounded analytically (``screen``): the
   saturation rate gives a lower bound on replicas and cost;
4. survivors are simulated in order of their cost bound (``evaluate``), class
   representatives first so every GPU and precision gets a real answer; for the
   cost objective the search stops once the next bound cannot beat the top N
   (branch and bound), so the answer is the cheapest the space holds;
5. fleets are priced (``fleet``), ranked, and the Pareto frontier drawn.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .. import deadline
from ..errors import InputError
from . import fleet
from .calibrated import calibration_assumptions, calibration_for, check_covers
from .commands import serve_command, verify_command
from .evaluate import Evaluated, evaluate
from .result import (
    Candidate,
    FleetOption,
    MixedTraffic,
    ParetoPoint,
    Predicted,
    PriceUsed,
    RecommendResult,
    Rejection,
    Searched,
    Tail,
)
from .screen import Screen, Screened
from .space import INT4, Config, GpuFacts, ModelFacts, Rejections, configurations
from .spec import SearchSpec

MAX_SIMULATED = 96
"""Simulations per search at most (each is a budget rate search, 0.05-0.5 s)."""
SOFT_TIME_LIMIT_S = 45.0
"""No new simulation starts after this; what was simulated is ranked and the cut said."""
RESERVE_S = 5.0
"""Compute budget kept for pricing, the autoscaling replay and the nearest-fit search."""


def _rejected(tally: Rejections) -> list[Rejection]:
    rows = [Rejection(reason=r, count=c, example=e) for r, (c, e) in tally.items.items()]
    return sorted(rows, key=lambda r: -r.count)


# --------------------------------------------------------------------------- inputs


def _gpu_facts(spec: SearchSpec, prices: dict[str, float], tally: Rejections) -> list[GpuFacts]:
    from ..catalog import get_gpu
    from ..prices import priced_gpus

    names = spec.gpus or priced_gpus()
    out: list[GpuFacts] = []
    for name in dict.fromkeys(names):
        g = get_gpu(name)
        if g.id not in prices:
            tally.add(f"no price for {g.id}: give --gpu-price {g.id}=USD", g.id, 1)
            continue
        out.append(GpuFacts(g.id, "fp8" in g.dense_tflops))
    return out


def _prices(spec: SearchSpec) -> tuple[dict[str, float], list[PriceUsed]]:
    from ..catalog import get_gpu
    from ..prices import price_for, priced_gpus, resolve_overrides

    overrides = resolve_overrides(spec.gpu_prices_usd_per_hour, "gpu_price")
    names = [get_gpu(n).id for n in (spec.gpus or priced_gpus())]
    used: list[PriceUsed] = []
    table: dict[str, float] = {}
    for gpu in dict.fromkeys(names):
        p = price_for(gpu, overrides)
        if p is not None:
            table[gpu] = p.usd_per_gpu_hour
            used.append(PriceUsed(gpu=gpu, usd_per_gpu_hour=p.usd_per_gpu_hour, source=p.source))
    return table, used


def _model_facts(spec: SearchSpec, tally: Rejections) -> list[ModelFacts]:
    from ..architecture import from_config
    from ..catalog import load_model
    from ..quantization import resolve_quantization

    floor = spec.quality_floor_score
    out = []
    for option in spec.models:
        if floor is not None and option.quality is not None:
            need = (
                floor * (1 + spec.quality_margin)
                if floor >= 0
                else floor * (1 - spec.quality_margin)
            )
            if option.quality < need:
                tally.add(
                    f"quality below the floor {floor:g} + {spec.quality_margin:.0%} margin "
                    f"(needs >= {need:g})",
                    f"{option.model} scored {option.quality:g}",
                )
                continue
        source = load_model(option.model, revision=option.revision)
        arch = from_config(source.config, option.hf_overrides)
        scheme = resolve_quantization(None, arch.quantization_config)
        method = scheme.method if scheme.is_quantized else None
        overrides = tuple(sorted(option.hf_overrides.items()))
        out.append(
            ModelFacts(
                option.model, option.revision, method, arch.is_moe, arch.num_kv_heads, overrides
            )
        )
    return out


# --------------------------------------------------------------------------- screening


def _screen_all(
    configs: list[Config], screen: Screen, spec: SearchSpec, tally: Rejections
) -> tuple[list[Screened], list[Screened]]:
    """The configurations that fit and may meet the constraints, and those that fit but
    already break max_gpus or the budget on their capacity bound."""
    out, over = [], []
    for cfg in configs:
        v = screen.check(cfg)
        if v.screened is None:
            tally.add(v.reason or "rejected", cfg.label() + (f" ({v.detail})" if v.detail else ""))
            continue
        s = v.screened
        total_gpus_lb = s.replicas_lower_bound * cfg.gpus_per_replica
        if spec.max_gpus is not None and total_gpus_lb > spec.max_gpus:
            tally.add(
                "over max_gpus (capacity bound: the saturation rate cannot carry the peak)",
                f"{cfg.label()} (at least {total_gpus_lb} GPUs)",
            )
            over.append(s)
            continue
        if (
            spec.budget_usd_per_hour is not None
            and s.usd_per_hour_lower_bound > spec.budget_usd_per_hour
        ):
            tally.add("over budget (capacity bound above budget_usd_per_hour)", cfg.label())
            over.append(s)
            continue
        out.append(s)
    return out, over


def _representatives(screened: list[Screened]) -> tuple[list[Screened], list[Screened]]:
    """One configuration per memory layout (the engine's default batch limits where they fit,
    else the cheapest bound), and the rest (the batch-limit variants)."""
    reps: dict[tuple[Any, ...], Screened] = {}
    for s in sorted(screened, key=_bound_key):
        key = s.config.group()
        default = s.config.max_num_seqs is None and s.config.max_num_batched_tokens is None
        if key not in reps or default:
            reps[key] = s
    chosen = set(map(id, reps.values()))
    return list(reps.values()), [s for s in screened if id(s) not in chosen]


def _bound_key(s: Screened) -> tuple[float, float]:
    return (s.usd_per_hour_lower_bound, -s.saturation_rate_per_s)


def _class_heads_first(reps: list[Screened]) -> list[Screened]:
    """Cost bound order, each (model, GPU, weights) class's cheapest bound first, so every
    GPU type and precision gets a simulated answer before the bound prunes."""
    ranked = sorted(reps, key=_bound_key)
    firsts: dict[tuple[Any, ...], Screened] = {}
    for s in ranked:
        firsts.setdefault((s.config.model, s.config.gpu, s.config.quantization), s)
    heads = list(firsts.values())
    return heads + [s for s in ranked if s not in heads]


# --------------------------------------------------------------------------- simulation

VARIANT_LAYOUTS = 3
"""Layouts whose batch-limit variants are simulated after the layouts are ranked."""


class _Simulation:
    """Simulate in bound order, keep the best fleet cost per layout, stop when nothing left can
    enter the top N (cost objective), the simulation cap or the time limit is reached."""

    def __init__(self, spec: SearchSpec, tally: Rejections, started: float, warnings: list[str]):
        self.spec, self.tally, self.started, self.warnings = spec, tally, started, warnings
        self.done: list[Evaluated] = []
        self.best: dict[tuple[Any, ...], float] = {}
        self.cut = False

    def run(self, screened: list[Screened]) -> list[Evaluated]:
        reps, variants = _representatives(screened)
        order = _class_heads_first(reps)
        heads = len({(s.config.model, s.config.gpu, s.config.quantization) for s in order})
        for i, s in enumerate(order):
            if not self._may_continue(len(order) - i):
                return self.done
            if i >= heads and self._cannot_enter_top(s):
                self.tally.add(
                    f"not simulated: its cost bound is above the {self.spec.top} cheapest "
                    "fleets found (bigger or costlier layouts)",
                    s.config.label(),
                    len(order) - i,
                )
                break
            self._evaluate(s)
        self._variants(variants)
        return self.done

    def _variants(self, variants: list[Screened]) -> None:
        ranked = sorted(self.best, key=self.best.__getitem__)[:VARIANT_LAYOUTS]
        for key in ranked:
            for s in sorted((v for v in variants if v.config.group() == key), key=_bound_key):
                if not self._may_continue(1):
                    return
                if s.usd_per_hour_lower_bound <= self.best[key]:
                    self._evaluate(s)

    def _may_continue(self, left: int) -> bool:
        late = time.monotonic() - self.started > SOFT_TIME_LIMIT_S
        if len(self.done) < MAX_SIMULATED and not late and deadline.remaining_s() >= RESERVE_S:
            return True
        if not self.cut:
            self.cut = True
            self.warnings.append(
                f"search cut after {len(self.done)} simulations (at least {left} screened "
                "configurations not simulated): the ranking is the best of those simulated"
            )
        return False

    def _cannot_enter_top(self, s: Screened) -> bool:
        top = self.spec.top
        if self.spec.objective != "cost" or len(self.best) < top:
            return False
        return s.usd_per_hour_lower_bound > sorted(self.best.values())[top - 1]

    def _evaluate(self, s: Screened) -> None:
        e = evaluate(s, self.spec)
        self.done.append(e)
        if not e.meets_slo:
            kind = (
                "no rate meets the SLO (simulated)"
                if e.max_rate_per_replica <= 0
                else "misses the SLO at its design load after adding replicas"
            )
            self.tally.add(kind, f"{s.config.label()} ({(e.reason or '').split(': ', 1)[-1]})")
            return
        over = _constraint_miss(e, self.spec)
        if over:
            self.tally.add(over, s.config.label())
            return
        usd = _fleet_replicas(e, self.spec) * s.config.gpus_per_replica * s.usd_per_gpu_hour
        key = s.config.group()
        self.best[key] = min(usd, self.best.get(key, math.inf))


def _constraint_miss(e: Evaluated, spec: SearchSpec) -> str | None:
    total = _fleet_replicas(e, spec) * e.screened.config.gpus_per_replica
    if spec.max_gpus is not None and total > spec.max_gpus:
        return "over max_gpus (simulated fleet)"
    usd = total * e.screened.usd_per_gpu_hour
    if spec.budget_usd_per_hour is not None and usd > spec.budget_usd_per_hour:
        return "over budget: the simulated fleet costs more than budget_usd_per_hour"
    return None


def _fleet_replicas(e: Evaluated, spec: SearchSpec) -> int:
    return max(e.total_replicas, spec.autoscaling.min_replicas or 0)


# --------------------------------------------------------------------------- candidates


def _tail(p: Any) -> Tail | None:
    if p is None:
        return None
    return Tail(p50=p.p50, p95=p.p95, p99=p.p99)


def _candidate(e: Evaluated, spec: SearchSpec) -> Candidate:
    s, c = e.screened, e.screened.config
    replicas = _fleet_replicas(e, spec)
    spares = e.spare_replicas
    total = replicas * c.gpus_per_replica
    costs = fleet.fixed_fleet_costs(total, s.usd_per_gpu_hour, spec, e.slo_attainment)
    design_rate = spec.peak_rate_per_s / e.replicas
    itl = _tail(e.design.itl_ms)
    replay = None
    if spec.autoscaling.enabled:
        replay = fleet.replay_day(
            spec,
            e.max_rate_per_replica,
            spares,
            replicas,
            c.gpus_per_replica,
            s.usd_per_gpu_hour,
            fleet.cold_start(s.checkpoint_bytes, spec.autoscaling.cold_start_s),
        )
    # autoscaled: the day's work is paid at the replayed GPU-hours, not the peak fleet's
    day_share = replay.usd_per_day / costs.usd_per_day if replay and costs.usd_per_day else 1.0
    notes = list(_candidate_notes(e, spec))
    return Candidate(
        model=c.model,
        quality=next((m.quality for m in spec.models if m.model == c.model), None),
        gpu=c.gpu,
        tensor_parallel_size=c.tensor_parallel_size,
        pipeline_parallel_size=c.pipeline_parallel_size,
        expert_parallel=False,
        quantization=c.quantization,
        kv_cache_dtype=c.kv_cache_dtype,
        max_model_len=s.max_model_len,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        engine=spec.engine,
        engine_version=s.engine_version,
        calibration=getattr(calibration_for(c.gpu, spec), "name", None),
        gpus_per_replica=c.gpus_per_replica,
        kv_cache_tokens=s.kv_cache_tokens,
        replicas=e.replicas,
        spare_replicas=spares,
        total_gpus=total,
        max_rate_under_slo_per_replica=e.max_rate_per_replica,
        design_rate_per_replica=design_rate,
        utilisation=min(1.0, design_rate / s.saturation_rate_per_s),
        usd_per_gpu_hour=s.usd_per_gpu_hour,
        usd_per_hour=costs.usd_per_hour,
        usd_per_million_output_tokens=costs.usd_per_million_output_tokens * day_share,
        usd_per_million_input_tokens=costs.usd_per_million_input_tokens * day_share,
        usd_per_successful_request=costs.usd_per_successful_request * day_share,
        slo_attainment=e.slo_attainment,
        gpu_hours_per_day=replay.gpu_hours_per_day if replay else costs.gpu_hours_per_day,
        usd_per_day=replay.usd_per_day if replay else costs.usd_per_day,
        output_tokens_per_s_per_gpu=design_rate * spec.output_tokens.mean / c.gpus_per_replica,
        output_tokens_per_s_per_user=1000.0 / itl.p50 if itl and itl.p50 > 0 else 0.0,
        predicted=Predicted(
            ttft_ms=_tail(e.design.ttft_ms), itl_ms=itl, e2e_ms=_tail(e.design.e2e_ms)
        ),
        meets_slo=e.meets_slo,
        autoscaling=replay,
        serve_command=serve_command(s, spec),
        verify_command=verify_command(s, spec, design_rate),
        notes=notes,
    )


def _candidate_notes(e: Evaluated, spec: SearchSpec) -> list[str]:
    c = e.screened.config
    if c.quantization == INT4:
        yield "int4 weights: a quality risk; evaluate an AWQ/GPTQ checkpoint against the floor first"
    if c.quantization == "fp8" and not c.from_checkpoint and spec.engine == "trtllm":
        yield "fp8 weights: TensorRT-LLM loads a pre-quantized checkpoint (ModelOpt); check quality"
    elif c.quantization == "fp8" and not c.from_checkpoint:
        yield "fp8 weights quantized at load time (--quantization fp8); check quality"
    if c.kv_cache_dtype == "fp8":
        yield "fp8 KV cache: check long-context quality"
    if e.screened.max_model_len < 32768 and e.screened.max_model_len == spec.context_needed:
        yield (
            f"--max-model-len {e.screened.max_model_len:,} (the workload's longest prompt + output): "
            "the model's own window does not fit"
        )
    if not e.meets_slo and e.reason:
        yield f"misses the SLO: {e.reason}"
    if e.meets_slo and e.slo_attainment < 0.9:
        yield (
            f"each target holds at its percentile, but only {e.slo_attainment:.0%} of requests "
            "meet all of them at once"
        )
    yield from _what_sizes_it(e)
    floor = _fleet_replicas(e, spec) - e.total_replicas
    if floor > 0:
        yield f"min_replicas adds {floor} replica(s) beyond the peak's need and the spares"


def _what_sizes_it(e: Evaluated) -> list[str]:
    """Which target sets the fleet size: the budget's binding stage, and whether latency
    rather than throughput caps a replica."""
    out = []
    binding, target = getattr(e.design, "binding", None), getattr(e.design, "binding_target", None)
    if binding and target:
        out.append(f"binding at the design load: the {binding} stage against {target}")
    sat = e.screened.saturation_rate_per_s
    if e.meets_slo and sat > 0 and e.max_rate_per_replica < 0.5 * sat:
        out.append(
            f"latency, not throughput, sizes the fleet: a replica carries "
            f"{e.max_rate_per_replica:.3g} req/s within the SLO, {e.max_rate_per_replica / sat:.0%} "
            "of its saturation rate; a looser target or shorter prompts cut the fleet most"
        )
    return out


def _rank_key(c: Candidate, objective: str) -> tuple[Any, ...]:
    head = (not c.meets_slo,)
    if objective == "latency":
        return (*head, c.predicted.e2e_ms.p95, c.usd_per_hour)
    if objective == "throughput_per_gpu":
        capacity = c.max_rate_under_slo_per_replica / c.gpus_per_replica
        return (*head, -capacity, c.usd_per_hour)
    return (*head, c.usd_per_hour, c.usd_per_successful_request, c.total_gpus)


def pareto_front(cands: list[Candidate]) -> list[ParetoPoint]:
    """Candidates no other beats on both output tokens/s per GPU and per user."""
    pts = [c for c in cands if c.output_tokens_per_s_per_user > 0]
    front = [
        c
        for c in pts
        if not any(
            o.output_tokens_per_s_per_gpu >= c.output_tokens_per_s_per_gpu
            and o.output_tokens_per_s_per_user >= c.output_tokens_per_s_per_user
            and (
                o.output_tokens_per_s_per_gpu > c.output_tokens_per_s_per_gpu
                or o.output_tokens_per_s_per_user > c.output_tokens_per_s_per_user
            )
            for o in pts
        )
    ]
    front.sort(key=lambda c: (-c.output_tokens_per_s_per_gpu, c.usd_per_million_output_tokens))
    seen: set[tuple[float, float]] = set()
    unique = []
    for c in front:  # batch-limit variants that simulate alike are one point
        key = (round(c.output_tokens_per_s_per_gpu, 1), round(c.output_tokens_per_s_per_user, 1))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    front = unique
    return [
        ParetoPoint(
            output_tokens_per_s_per_gpu=c.output_tokens_per_s_per_gpu,
            output_tokens_per_s_per_user=c.output_tokens_per_s_per_user,
            model=c.model,
            gpu=c.gpu,
            tensor_parallel_size=c.tensor_parallel_size,
            quantization=c.quantization,
            kv_cache_dtype=c.kv_cache_dtype,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            meets_slo=c.meets_slo,
            usd_per_million_output_tokens=c.usd_per_million_output_tokens,
        )
        for c in front
    ]


# --------------------------------------------------------------------------- the search


def _online_part(spec: SearchSpec) -> SearchSpec:
    """The online share of mixed traffic: what the SLO applies to."""
    if not spec.batch_share:
        return spec
    keep = 1.0 - spec.batch_share
    return spec.model_copy(
        update={
            "mean_rate_per_s": spec.mean_rate_per_s * keep,
            "hourly_rate_per_s": [r * keep for r in spec.hourly_rate_per_s]
            if spec.hourly_rate_per_s
            else None,
        }
    )


def recommend(spec: SearchSpec) -> RecommendResult:
    """Search, price and rank deployments for ``spec``; see the module docstring."""
    started = time.monotonic()
    tally, warnings = Rejections(), []
    online = _online_part(spec)
    prices, used = _prices(spec)
    gpus = _gpu_facts(spec, prices, tally)
    check_covers(spec, [g.id for g in gpus])
    models = _model_facts(spec, tally)
    configs = configurations(models, gpus, spec.max_gpus, tally) if models and gpus else []
    screen = Screen(online, prices)
    screened, over = _screen_all(configs, screen, online, tally)
    evaluated = _Simulation(online, tally, started, warnings).run(screened)
    if not screened and over:
        # nothing can meet the constraints: simulate the cheapest few anyway, so the answer
        # shows the closest fleets and what they would take
        closest, _ = _representatives(over)
        closest = sorted(closest, key=_bound_key)[: spec.top]
        evaluated = [evaluate(s, online) for s in closest]
    sized = [e for e in evaluated if e.design is not None and e.max_rate_per_replica > 0]
    cands = [_candidate(e, online) for e in sized]
    allowed = [(c, e) for c, e in zip(cands, sized, strict=True) if not _over_constraints(c, spec)]
    allowed.sort(key=lambda ce: _rank_key(ce[0], spec.objective))
    allowed = _best_per_layout(allowed)
    feasible = bool(allowed and allowed[0][0].meets_slo)
    top = [c for c, _ in allowed if c.meets_slo][: spec.top] or [c for c, _ in allowed][: spec.top]
    if not top:  # nothing within the constraints: the closest fleets, with what they break
        top = _closest(cands, spec)
    mixed = (
        _mixed(spec, online, allowed[0][0], allowed[0][1].screened, screened)
        if feasible and spec.batch_share
        else None
    )
    return RecommendResult(
        feasible=feasible,
        verdict=_verdict(feasible, top, spec, tally),
        recommended=top[0] if feasible else None,
        candidates=top,
        pareto=pareto_front([c for c, _ in allowed] or cands),
        rejected=_rejected(tally),
        nearest=[] if feasible else _nearest(spec, cands, tally),
        mixed_traffic=mixed,
        levers=_levers(online, allowed[0], warnings) if feasible else [],
        searched=Searched(
            configurations=len(configs),
            fitted=screen.fits,
            simulated=len(evaluated),
            elapsed_s=time.monotonic() - started,
        ),
        prices=used,
        objective=spec.objective,
        design_rate_per_s=online.peak_rate_per_s,
        mean_rate_per_s=online.daily_mean_rate_per_s,
        assumptions=_assumptions(spec),
        warnings=warnings,
    )


def _levers(
    online: SearchSpec, best: tuple[Candidate, Evaluated], warnings: list[str]
) -> list[Any]:
    """The levers tried on the recommended fleet; when they cannot be modelled for it the
    recommendation stands and a warning says why."""
    from ..errors import InputError, OperationalError
    from .levers import lever_verdicts

    try:
        return lever_verdicts(online, best[0], best[1].screened.config)
    except (InputError, OperationalError, ValueError) as exc:
        warnings.append(f"the serving levers were not evaluated on the recommended fleet: {exc}")
        return []


def _best_per_layout(
    ranked: list[tuple[Candidate, Evaluated]],
) -> list[tuple[Candidate, Evaluated]]:
    """The best-ranked batch limits of each memory layout: the list shows distinct fleets,
    not the same fleet at five max_num_seqs values (the Pareto frontier keeps them all)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for c, e in ranked:
        key = e.screened.config.group()
        if key not in seen:
            seen.add(key)
            out.append((c, e))
    return out


def _closest(cands: list[Candidate], spec: SearchSpec) -> list[Candidate]:
    ranked = sorted(cands, key=lambda c: _rank_key(c, spec.objective))[: spec.top]
    for c in ranked:
        if spec.max_gpus is not None and c.total_gpus > spec.max_gpus:
            c.notes.insert(0, f"over constraints.max_gpus ({c.total_gpus} > {spec.max_gpus})")
        if spec.budget_usd_per_hour is not None and c.usd_per_hour > spec.budget_usd_per_hour:
            c.notes.insert(
                0,
                f"over the budget (${c.usd_per_hour:,.2f}/h > ${spec.budget_usd_per_hour:,.2f}/h)",
            )
    return ranked


def _over_constraints(c: Candidate, spec: SearchSpec) -> bool:
    return bool(
        (spec.max_gpus is not None and c.total_gpus > spec.max_gpus)
        or (spec.budget_usd_per_hour is not None and c.usd_per_hour > spec.budget_usd_per_hour)
    )


def _verdict(feasible: bool, top: list[Candidate], spec: SearchSpec, tally: Rejections) -> str:
    if feasible:
        c = top[0]
        q = {"bf16": "BF16", "fp8": "FP8", "int4": "INT4"}.get(c.quantization, c.quantization)
        return (
            f"{c.replicas + c.spare_replicas} x {c.gpu} TP{c.tensor_parallel_size} {q} "
            f"({c.total_gpus} GPUs, ${c.usd_per_hour:,.2f}/h) serves {_online_part(spec).peak_rate_per_s:.3g} req/s "
            f"at peak with every target met; ${c.usd_per_successful_request * 1000:,.3f} per 1,000 "
            f"successful requests"
        )
    if top:
        broken = [n for n in top[0].notes if n.startswith("over ")]
        if top[0].meets_slo and broken:
            return (
                "no fleet within the constraints: the closest below meet every target but are "
                + "; ".join(broken)
            )
        return "no simulated fleet meets every target; the closest are listed with what they miss"
    common = _rejected(tally)[0].reason if tally.items else "nothing to search"
    return f"nothing in the search space works; most common reason: {common}"


def _nearest(spec: SearchSpec, cands: list[Candidate], tally: Rejections) -> list[str]:
    """What would make the workload feasible: relax one constraint and search the fit stage."""
    out = []
    over = [c for c in cands if c.meets_slo]
    if over:
        c = min(over, key=lambda c: c.usd_per_hour)
        out.append(
            f"{c.total_gpus} x {c.gpu} (TP{c.tensor_parallel_size} {c.quantization}, "
            f"${c.usd_per_hour:,.2f}/h) meets every target: raise max_gpus / budget_usd_per_hour to that"
        )
    relaxed = spec.model_copy(update={"gpus": [], "max_gpus": None, "budget_usd_per_hour": None})
    try:
        prices, _ = _prices(relaxed)
        gpus = _gpu_facts(relaxed, prices, Rejections())
        models = _model_facts(relaxed, Rejections())
    except InputError:
        return out
    screen = Screen(relaxed, prices)
    configs = [
        c
        for c in configurations(models, gpus, None, Rejections())
        if c.max_num_seqs is None and c.max_num_batched_tokens is None
    ]
    fits = [v.screened for v in map(screen.check, configs) if v.screened is not None]
    if fits:
        best = min(fits, key=lambda s: s.usd_per_hour_lower_bound)
        c = best.config
        pp = f" PP{c.pipeline_parallel_size}" if c.pipeline_parallel_size > 1 else ""
        gpus = best.replicas_lower_bound * c.gpus_per_replica
        out.append(
            f"the cheapest layout that fits on any priced GPU: {c.gpu} TP{c.tensor_parallel_size}{pp} "
            f"{c.quantization} weights, KV {c.kv_cache_dtype}, --max-model-len {best.max_model_len:,}; "
            f"at least {best.replicas_lower_bound} replica(s) = {gpus} GPUs, from "
            f"${best.usd_per_hour_lower_bound:,.2f}/h (a capacity bound, not simulated): run "
            f"recommend with --gpus {c.gpu} and constraints that allow it"
        )
    elif not out:
        out.append(
            "no priced GPU type fits the model even at 16 GPUs per replica with int4 weights: "
            "a smaller model, or a shorter context"
        )
    if spec.context_needed > 32768:
        out.append(
            f"a shorter context: the workload's longest prompt + output is {spec.context_needed:,} tokens"
        )
    return out


def _mixed(
    spec: SearchSpec, online: SearchSpec, best: Candidate, same: Screened, screened: list[Screened]
) -> MixedTraffic:
    """Batch work in the online fleet's headroom, or a separate offline pool: the cheaper."""
    from .evaluate import OFFLINE_UTILISATION

    batch_rate = spec.daily_mean_rate_per_s * (spec.batch_share or 0.0)
    per_replica = same.saturation_rate_per_s * OFFLINE_UTILISATION
    headroom = max(0.0, best.replicas * per_replica - online.daily_mean_rate_per_s)
    extra = max(0, math.ceil((batch_rate - headroom) / per_replica - 1e-9))
    shared_usd = best.usd_per_hour + extra * best.gpus_per_replica * best.usd_per_gpu_hour
    pool = min(
        screened,
        key=lambda s: s.usd_per_gpu_hour * s.config.gpus_per_replica / s.saturation_rate_per_s,
    )
    pool_replicas = max(
        1, math.ceil(batch_rate / (pool.saturation_rate_per_s * OFFLINE_UTILISATION))
    )
    pool_gpus = pool_replicas * pool.config.gpus_per_replica
    separate_usd = best.usd_per_hour + pool_gpus * pool.usd_per_gpu_hour
    options = [
        FleetOption(
            name="shared",
            usd_per_hour=shared_usd,
            total_gpus=best.total_gpus + extra * best.gpus_per_replica,
            detail=(
                f"batch work ({batch_rate:.3g} req/s) runs at low priority in the online fleet's "
                f"headroom ({headroom:.3g} req/s on average)"
                + (f" plus {extra} replica(s)" if extra else "")
            ),
        ),
        FleetOption(
            name="separate",
            usd_per_hour=separate_usd,
            total_gpus=best.total_gpus + pool_gpus,
            detail=f"online fleet + an offline pool of {pool_replicas} x {pool.config.label()}",
        ),
    ]
    chosen = min(options, key=lambda o: o.usd_per_hour)
    return MixedTraffic(
        batch_share=spec.batch_share or 0.0,
        chosen=chosen.name,
        reason=(
            f"{chosen.name} costs ${chosen.usd_per_hour:,.2f}/h vs "
            f"${max(o.usd_per_hour for o in options):,.2f}/h; the online fleet is simulated for the "
            "online share alone; shared assumes batch requests run at low priority and only "
            "below the online design load (e.g. vLLM --scheduling-policy priority; not simulated)"
        ),
        options=options,
    )


def _assumptions(spec: SearchSpec) -> list[str]:
    out = [
        "prices: on-demand USD per GPU-hour (see prices); a fixed fleet pays for its peak "
        "capacity all day, so per-token and per-request costs divide by an average hour's work",
        "successful request: meets every target (TTFT, mean ITL, end-to-end, each at its "
        "highest-percentile target) in the simulation at the design load (the peak)",
        "replicas = ceil(peak / max rate under the SLO per replica); spares: 1 from availability "
        "0.999 (losing one replica still carries the peak), 2 from 0.9999",
        "max_model_len: the model's maximum where it fits, else the workload's longest "
        "(p99, else p95) prompt + output, never less",
        "expert parallelism is not searched separately: the step model shards experts like "
        "tensor parallelism (same memory per GPU); measure --enable-expert-parallel on MoE models",
        "prompt and output lengths lognormal through p50 and p95, as in budget",
        "a replica is loaded to at most 90 % of its saturation rate (headroom for bursts "
        "longer than the simulated minute)",
        "latency and capacity from budget's simulation (the calibrated step model); the verify "
        "command measures what matters",
    ]
    out += calibration_assumptions(spec)
    if spec.quality_floor_score is not None:
        out.append(
            f"quality: a model passes at floor x (1 + {spec.quality_margin:g}); models without a "
            "score are kept and flagged"
        )
    if not spec.has_targets:
        out.append("no latency targets: replicas loaded to 85 % of their saturation rate")
    if spec.shared_prefix_fraction:
        out.append(
            f"traffic.shared_prefix_fraction {spec.shared_prefix_fraction:g} is priced in as the "
            "prefix-cache hit rate (one shared prefix, prefill charged for the missed tokens; "
            "vLLM and SGLang cache prefixes by default): check vllm:prefix_cache_hits / queries"
        )
    if spec.batch_share:
        out.append(
            f"the candidates serve the online share ({1 - spec.batch_share:.0%}); their per-token "
            "and per-request costs are the online traffic's (see mixed_traffic for the batch work)"
        )
    return out
