"""Speculative decoding as a what-if on the per-step roofline.

With speculative decoding every decode step becomes *draft + verify*: a cheap
drafter proposes K tokens per sequence, then the target model scores all K+1
positions (the K drafts and the bonus token) in one forward pass and keeps the
accepted prefix. A sequence then emits TAU tokens per step on average (the
mean acceptance length, bonus token included, as vLLM's spec-decode metrics
report it), for the price of one draft and one verify step.

At small batch the target's step is memory-bound (weights read once), so a
verify step of K+1 tokens costs about as much as a plain decode step and the
gain is close to TAU x (plain step / (draft + verify)). As batch x (K+1) grows
the verify step turns compute-bound, costs grow with K+1 and the gain falls
below 1: that is where speculation stops paying (``break_even_concurrency``).

Drafter costs (each its own small roofline on the same GPUs and TP):

* ``ngram``: a CPU lookup over the context, a small fixed cost per step.
* ``eagle`` / ``eagle3``: K sequential forwards of a head of one decoder layer
  of the target (its attention + MLP), an input projection (2h x h for EAGLE,
  3h x h for EAGLE-3) and an LM head (the target's for EAGLE, a 32k-token one
  for EAGLE-3), with one layer of KV cache.
* ``mtp``: K sequential forwards of the model's own MTP layer (one decoder
  layer of the target, MoE included, plus its 2h x h projection, sharing the
  LM head); only for models whose config has ``num_nextn_predict_layers``.
* ``draft_model``: K sequential decode steps of the draft model's own roofline.

The memory fit charges the drafter's weights and per-token KV, so the KV cache
holds fewer tokens. Defaults for the acceptance come from published
measurements in ``data/spec_decode.toml``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from .errors import InputError
from .spec_tasks import SpecTask

SpecMethod = Literal["ngram", "eagle", "eagle3", "mtp", "draft_model"]
DEFAULT_TASK = "chat"
"""The task the published default acceptances were measured on (MT-Bench-like chat); code
and math scale it by the published task/chat ratios (``spec_task``, :mod:`.spec_tasks`)."""
MAX_SPEC_TOKENS = 16
RECOMMEND_K = range(1, 9)
"""K values the recommendation compares (vLLM users rarely go past 8)."""
LOAD_LEVELS = (1, 4, 16, 64, 256)
"""Concurrencies of the per-load recommendation (capped at max_num_seqs)."""
MIN_GAIN = 1.02
"""A speed-up below this is within the model's error: the recommendation says off."""
DATA_FILE = Path(__file__).parent / "data" / "spec_decode.toml"
GIB = float(1 << 30)


class SpeculativeFields(BaseModel):
    """The speculative-decoding flags shared by predict and budget."""

    spec_task: SpecTask = Field(
        default="chat",
        description="Task of the default acceptance: chat (measured), code or math (chat x the "
        "published median ratio).",
    )

    speculative_method: SpecMethod | None = Field(
        default=None,
        description="Speculative decoding drafter; null = off.",
    )
    num_speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SPEC_TOKENS,
        description="Draft tokens K per step; default: the best K in 1..8 at this load.",
    )
    spec_acceptance_length: float | None = Field(
        default=None,
        ge=1.0,
        description="Tokens per verify step at K, bonus included. As vLLM's mean acceptance "
        "length; in [1, K+1].",
    )
    spec_acceptance_rate: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description="Per-token acceptance. TAU = (1 - ALPHA^(K+1)) / (1 - ALPHA).",
    )
    draft_model: str | None = Field(
        default=None,
        description="For draft_model. Resolved like model.",
    )

    @model_validator(mode="after")
    def _spec_flags(self) -> SpeculativeFields:
        check_spec_flags(self)
        return self


def check_spec_flags(req: Any) -> None:
    """Flag combinations that cannot describe a speculative set-up (names the flag)."""
    method = req.speculative_method
    if method is None:
        for name in (
            "num_speculative_tokens",
            "spec_acceptance_length",
            "spec_acceptance_rate",
            "draft_model",
        ):
            if getattr(req, name) is not None:
                raise ValueError(f"{name} needs speculative_method (--speculative-method)")
        return
    if req.spec_acceptance_length is not None and req.spec_acceptance_rate is not None:
        raise ValueError("give spec_acceptance_length or spec_acceptance_rate, not both")
    k = req.num_speculative_tokens
    if req.spec_acceptance_length is not None:
        if k is None:
            raise ValueError(
                "spec_acceptance_length is measured at a K: give num_speculative_tokens too"
            )
        if req.spec_acceptance_length > k + 1:
            raise ValueError(
                f"spec_acceptance_length {req.spec_acceptance_length:g} exceeds "
                f"num_speculative_tokens + 1 = {k + 1} (at most K drafts and the bonus token)"
            )
    if method == "draft_model" and not req.draft_model:
        raise ValueError("speculative_method draft_model needs draft_model (--draft-model ID)")
    if method != "draft_model" and req.draft_model:
        raise ValueError("draft_model is only used with speculative_method draft_model")


# --------------------------------------------------------------------------- acceptance


def tau_from_alpha(alpha: float, k: int) -> float:
    """Mean tokens per verify step when each draft is accepted with probability alpha
    independently of position: 1 + alpha + ... + alpha^K."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_tau(tau: float, k: int) -> float:
    """The per-token rate whose geometric acceptance gives `tau` at `k` (bisection;
    tau_from_alpha rises monotonically in alpha)."""
    if tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0 - 1e-12
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        if tau_from_alpha(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Acceptance:
    """How many tokens a verify step emits, for any K, and where that came from.

    ``measured`` holds (K, TAU) pairs that were measured (the user's one, or a published
    table): TAU at a measured K is the measurement; elsewhere the geometric model with
    the rate fitted at the nearest measured K (or the given rate).
    """

    alpha: float
    source: str
    measured: tuple[tuple[int, float], ...] = ()

    def tau(self, k: int) -> float:
        """TAU at `k`: measured where measured; linear in K between two measured K (never
        decreasing, as long as the measurements do not); outside them the geometric
        model with the per-token rate fitted at the nearest measured K."""
        if not self.measured:
            return tau_from_alpha(self.alpha, k)
        points = sorted(self.measured)
        k_lo, t_lo = points[0]
        k_hi, t_hi = points[-1]
        if k <= k_lo:
            return tau_from_alpha(alpha_from_tau(t_lo, k_lo), k) if k < k_lo else t_lo
        if k >= k_hi:
            a = alpha_from_tau(t_hi, k_hi)
            return t_hi + tau_from_alpha(a, k) - tau_from_alpha(a, k_hi)
        for (k0, t0), (k1, t1) in zip(points, points[1:], strict=False):
            if k0 <= k <= k1:
                return t0 + (t1 - t0) * (k - k0) / (k1 - k0)
        return t_hi  # pragma: no cover - the loop covers the range


@lru_cache(maxsize=1)
def _measurements() -> tuple[dict[str, Any], ...]:
    with DATA_FILE.open("rb") as fh:
        return tuple(tomllib.load(fh).get("measurement", []))


@lru_cache(maxsize=1)
def drafter_constants() -> dict[str, float]:
    """The drafter's assumed fixed costs (data/spec_decode.toml [drafter])."""
    with DATA_FILE.open("rb") as fh:
        return dict(tomllib.load(fh)["drafter"])


def default_acceptance(method: str, task: str, k: int | None) -> Acceptance:
    """The published acceptance for method and task, at the measured K nearest to `k`."""
    for m in _measurements():
        if m["method"] == method and m["task"] == task:
            ks, taus = list(m["k"]), list(m["acceptance_length"])
            want = k if k is not None else ks[len(ks) // 2]
            i = min(range(len(ks)), key=lambda j: abs(ks[j] - want))
            alpha = alpha_from_tau(taus[i], ks[i])
            table = ", ".join(f"{t:g} at K={j}" for j, t in zip(ks, taus, strict=True))
            source = (
                f"default for {method} on {task}: measured acceptance length {table} "
                f"({m['model']}, {m['dataset']}; {m['source']}); per-token rate {alpha:.3f} "
                f"at K={ks[i]}"
            )
            return Acceptance(
                alpha=alpha, source=source, measured=tuple(zip(ks, taus, strict=True))
            )
    tasks = sorted({m["task"] for m in _measurements() if m["method"] == method})
    raise InputError(
        "spec_acceptance_length",
        f"no published acceptance for {method} on {task} in data/spec_decode.toml"
        + (f" (defaults exist for: {', '.join(tasks)})" if tasks else "")
        + "; give --spec-acceptance-length (with --num-speculative-tokens) or "
        "--spec-acceptance-rate",
    )


def resolve_acceptance(req: Any) -> Acceptance:
    """The user's acceptance (length at K, or rate), else the published default."""
    k = req.num_speculative_tokens
    if req.spec_acceptance_length is not None:
        tau = float(req.spec_acceptance_length)
        return Acceptance(
            alpha=alpha_from_tau(tau, k),
            source=f"given: acceptance length {tau:g} at K={k}",
            measured=((int(k), tau),),
        )
    if req.spec_acceptance_rate is not None:
        return Acceptance(
            alpha=float(req.spec_acceptance_rate),
            source=f"given: per-token acceptance rate {req.spec_acceptance_rate:g}",
        )
    chat = default_acceptance(req.speculative_method, DEFAULT_TASK, k)
    return for_task(chat, getattr(req, "spec_task", DEFAULT_TASK), k)


def for_task(chat: Acceptance, task: str, k: int | None) -> Acceptance:
    """The chat default scaled to ``task`` by the published median task/chat ratio (see
    :mod:`.spec_tasks`), never above K + 1 tokens per step."""
    if task == DEFAULT_TASK:
        return chat
    from .spec_tasks import task_factor

    f = task_factor(task)
    measured = tuple((kk, min(kk + 1.0, t * f.ratio)) for kk, t in chat.measured)
    at = min(measured, key=lambda m: abs(m[0] - (k or m[0])))
    return Acceptance(
        alpha=alpha_from_tau(at[1], at[0]),
        source=f"{chat.source}; {f.describe()}",
        measured=measured,
    )


# --------------------------------------------------------------------------- drafter


@dataclass(frozen=True)
class Drafter:
    """What a drafter costs per engine step and in memory.

    ``forward`` is the step model of one drafter forward (None for n-gram);
    ``steps_per_draft`` says how many sequential forwards K drafts take (K for
    all autoregressive drafters).
    """

    method: str
    forward: Any
    fixed_ms: float
    weight_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    notes: tuple[str, ...]

    def draft_ms(self, batch: int, context_tokens: float, k: int) -> float:
        """Drafting K tokens for `batch` sequences of mean context `context_tokens`."""
        if self.forward is None:
            return self.fixed_ms
        one = self.forward.step_ms(0, batch, int(batch * context_tokens))
        return self.fixed_ms + k * one


def _raw_config(dep: Any) -> dict[str, Any]:
    from .catalog import load_model

    cfg = load_model(dep.model, revision=dep.revision).config
    return dict(cfg.get("text_config") or cfg)


def _head_shape(target: Any, name: str, proj_inputs: int, lm_head_params: float) -> Any:
    """One decoder layer of the target plus an input projection and an LM head."""
    s = target.shape
    h = float(s.hidden_size)
    body = s.dense_params - s.lm_head_params
    per_layer = body / s.num_layers
    bytes_per_param = s.dense_weight_bytes / max(1.0, s.dense_params)
    proj = proj_inputs * h * h
    dense = per_layer + proj + lm_head_params
    moe_layers = 1 if s.moe_layers else 0
    return replace(
        s,
        name=name,
        num_layers=1,
        dense_params=dense,
        dense_weight_bytes=dense * bytes_per_param,
        attn_flops_per_pair=s.attn_flops_per_pair / s.num_layers,
        kv_bytes_per_token=s.kv_bytes_per_token / s.num_layers,
        moe_layers=moe_layers,
        lm_head_params=lm_head_params,
    )


def _head_forward(target: Any, shape: Any) -> Any:
    """The head's step model: the target's GPUs, TP and factors, its own per-forward floor."""
    eff = replace(
        target.efficiency, step_overhead_ms=drafter_constants()["draft_forward_overhead_ms"]
    )
    return replace(target, shape=shape, efficiency=eff, notes=(), hides_host_step=False)


def _weights_of(shape: Any) -> float:
    """Stored bytes of a head: dense weights plus its routed experts (all are held)."""
    return (
        shape.dense_weight_bytes + shape.moe_layers * shape.num_experts * shape.expert_weight_bytes
    )


def build_drafter(req: Any, target: Any) -> Drafter:
    """The drafter of `req` on the target's deployment; InputError where it does not apply."""
    method = req.speculative_method
    tp = target.tensor_parallel_size
    consts = drafter_constants()
    if method == "ngram":
        return Drafter(
            method,
            None,
            consts["ngram_cpu_ms"],
            0.0,
            0.0,
            (f"n-gram drafting: a CPU lookup, {consts['ngram_cpu_ms']:g} ms per step (assumed)",),
        )
    s = target.shape
    if method in ("eagle", "eagle3"):
        if s.moe_layers or s.num_layers < 2:
            raise InputError(
                "speculative_method",
                f"{method} heads are modelled for dense decoders (the head is one decoder layer of "
                f"the target); {req.model} is a mixture of experts, whose head MLP its config does "
                "not give",
                accepted="mtp (where the model has MTP layers), ngram or draft_model",
            )
        h = float(s.hidden_size)
        if method == "eagle":
            shape = _head_shape(target, f"{method} head", 2, s.lm_head_params)
            weights = _weights_of(shape) - s.lm_head_params * (
                s.dense_weight_bytes / max(1.0, s.dense_params)
            )
            lm = "the target's LM head (shared, not stored twice)"
        else:
            vocab = min(consts["eagle3_draft_vocab"], s.lm_head_params / h)
            shape = _head_shape(target, f"{method} head", 3, vocab * h)
            weights = _weights_of(shape)
            lm = f"its own LM head over a {vocab:,.0f}-token draft vocabulary"
        notes = (
            f"{method} head assumed: one decoder layer of the target, a {2 if method == 'eagle' else 3}h x h "
            f"input projection and {lm}; one layer of KV cache; K sequential head forwards per step "
            f"({consts['draft_forward_overhead_ms']:g} ms launch floor each, assumed)",
        )
        return Drafter(
            method,
            _head_forward(target, shape),
            0.0,
            weights / tp,
            shape.kv_bytes_per_token / tp,
            notes,
        )
    if method == "mtp":
        layers = int(_raw_config(req).get("num_nextn_predict_layers") or 0)
        if layers < 1:
            raise InputError(
                "speculative_method",
                f"mtp needs the model's multi-token-prediction layers (config "
                f"num_nextn_predict_layers); {req.model} has none",
                accepted="ngram, eagle, eagle3 or draft_model",
            )
        shape = _head_shape(target, "MTP layer", 2, s.lm_head_params)
        lm_bytes = s.lm_head_params * (s.dense_weight_bytes / max(1.0, s.dense_params))
        weights = layers * (_weights_of(shape) - lm_bytes)
        notes = (
            f"MTP drafting: the model's {layers} MTP layer(s) (one decoder layer of the target each, "
            "a 2h x h projection, the shared LM head), run K times in sequence as vLLM does; "
            "their weights and one layer of KV are charged to the memory fit",
        )
        return Drafter(
            method,
            _head_forward(target, shape),
            0.0,
            weights / tp,
            layers * shape.kv_bytes_per_token / tp,
            notes,
        )
    return _draft_model_drafter(req, target)


def _draft_model_drafter(req: Any, target: Any) -> Drafter:
    """A separate draft model on the target's GPUs and TP, its own roofline."""
    from .deployment import Deployment
    from .roofline import StepModel

    fields = {k: getattr(req, k) for k in Deployment.model_fields}
    fields.update(model=req.draft_model, revision=None, quantization=None, max_model_len=None)
    draft_vocab = _raw_config(SimpleNamespace(model=req.draft_model, revision=None)).get(
        "vocab_size"
    )
    target_vocab = _raw_config(req).get("vocab_size")
    if draft_vocab and target_vocab and draft_vocab != target_vocab:
        raise InputError(
            "draft_model",
            f"{req.draft_model} has a {draft_vocab:,}-token vocabulary and {req.model} "
            f"{target_vocab:,}: a draft model must share the target's vocabulary",
        )
    try:
        draft = StepModel.from_deployment(Deployment(**fields))
    except InputError as err:
        raise InputError("draft_model", f"draft model {req.draft_model}: {err}") from err
    ds = draft.shape
    tp = target.tensor_parallel_size
    weights = ds.dense_weight_bytes + ds.moe_layers * ds.num_experts * ds.expert_weight_bytes
    return Drafter(
        "draft_model",
        draft,
        0.0,
        weights / tp,
        ds.kv_bytes_per_token / tp,
        (
            f"draft model {req.draft_model}: K sequential decode steps of its own roofline on the "
            f"same {tp} GPU(s); embeddings not charged to memory (they are small next to the KV)",
        ),
    )


# --------------------------------------------------------------------------- step model


def verify_ms(target: Any, batch: int, context_tokens: float, k: int) -> float:
    """The target scoring K+1 positions per sequence in one forward: the KV of each
    sequence is read once, every position attends to it (K+1 query rows)."""
    kv = batch * context_tokens
    pairs = batch * k * context_tokens
    t = target.breakdown(0, batch * (k + 1), int(kv), prefill_pairs=pairs, sampled=batch * (k + 1))
    return t.total_ms


def spec_step_ms(drafter: Drafter, target: Any, batch: int, ctx: float, k: int) -> float:
    """One speculative engine step: draft K tokens, then verify K+1, plus the fixed
    bookkeeping a speculative step adds (draft-input preparation, rejection sampling)."""
    extra = drafter_constants()["spec_step_overhead_ms"]
    return drafter.draft_ms(batch, ctx, k) + verify_ms(target, batch, ctx, k) + extra


def itl_speedup(
    drafter: Drafter, target: Any, acc: Acceptance, batch: int, ctx: float, k: int
) -> float:
    """Tokens per second per sequence with speculation over without, at this batch."""
    plain = target.decode_ms(batch, ctx)
    return acc.tau(k) * plain / spec_step_ms(drafter, target, batch, ctx, k)


def kv_tokens_with_drafter(target: Any, drafter: Drafter) -> int:
    """The KV cache left once the drafter's weights are loaded and its KV shares each block.

    The fit's KV pool (tokens x target KV bytes per GPU) loses the drafter's weights,
    and what remains is split over target and drafter KV per token.
    """
    per_tok = target.shape.kv_bytes_per_token / target.tensor_parallel_size
    pool = target.kv_capacity_tokens * per_tok - drafter.weight_bytes_per_gpu
    if pool <= 0:
        raise InputError(
            "speculative_method",
            f"the drafter's weights ({drafter.weight_bytes_per_gpu / GIB:.2f} GiB per GPU) do not "
            "fit beside the model: no KV cache would be left",
        )
    return int(pool // (per_tok + drafter.kv_bytes_per_token_per_gpu))


# --------------------------------------------------------------------------- output


class SpecLevel(BaseModel):
    """The best K at one concurrency, or off."""

    concurrency: int
    recommended_k: int | None = Field(description="Best K in 1..8; null = leave speculation off.")
    itl_speedup: float = Field(description="At the recommended K (1.0 when off).")
    tokens_per_step: float


class SpeculativeResult(BaseModel):
    """What speculative decoding buys at this load, and where it stops paying."""

    method: SpecMethod
    num_speculative_tokens: int
    k_chosen_by: Literal["given", "best at this load"]
    acceptance_rate: float = Field(description="Per-token acceptance ALPHA used.")
    acceptance_source: str
    tokens_per_step: float = Field(description="TAU: tokens emitted per verify step per sequence.")
    itl_speedup: float = Field(
        description="Plain decode ITL / speculative ITL at the simulated batch."
    )
    throughput_speedup: float = Field(
        description="Decode-plus-prefill token rate at the simulated batch, speculative over plain."
    )
    break_even_concurrency: int | None = Field(
        description="Smallest batch where speculation at this K is no faster; null = pays up to max_num_seqs."
    )
    decode_batch: float
    plain_step_ms: float
    draft_ms: float
    verify_ms: float
    itl_ms_mean: float = Field(description="Mean inter-token latency with speculation, ms.")
    output_tokens_per_s: float = Field(
        description="Output tokens/s with speculation: closed loop, the plain rate x "
        "throughput_speedup; open loop below saturation, the offered load sets it (= plain)."
    )
    drafter_weight_gib_per_gpu: float
    kv_cache_tokens: int = Field(description="KV cache with the drafter's weights and KV charged.")
    recommendation: list[SpecLevel]
    notes: list[str]


def _best_k(
    drafter: Drafter, target: Any, acc: Acceptance, batch: int, ctx: float
) -> tuple[int | None, float]:
    """The K in 1..8 with the largest gain; None when no K gains MIN_GAIN."""
    gains = {k: itl_speedup(drafter, target, acc, batch, ctx, k) for k in RECOMMEND_K}
    k = max(gains, key=lambda j: gains[j])
    return (k, gains[k]) if gains[k] >= MIN_GAIN else (None, 1.0)


def break_even(drafter: Drafter, target: Any, acc: Acceptance, ctx: float, k: int) -> int | None:
    """Smallest batch at which the gain at K drops to 1 or below (doubling, then bisection:
    the gain falls with the batch once the verify step is compute-bound)."""
    top = max(1, target.max_num_seqs)
    if itl_speedup(drafter, target, acc, 1, ctx, k) <= 1.0:
        return 1
    lo, hi = 1, 2
    while hi <= top and itl_speedup(drafter, target, acc, hi, ctx, k) > 1.0:
        lo, hi = hi, hi * 2
    if hi > top:
        if itl_speedup(drafter, target, acc, top, ctx, k) > 1.0:
            return None
        hi = top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if itl_speedup(drafter, target, acc, mid, ctx, k) > 1.0:
            lo = mid
        else:
            hi = mid
    return hi


def at_load(
    req: Any,
    target: Any,
    sim: Any,
    mean_in: float,
    mean_out: float,
    plain_itl: Any,
    plain_tokens_per_s: float,
    closed_loop: bool,
) -> SpeculativeResult | None:
    """Speculation at predict's or budget's simulated load (``sim``: the simulation's result,
    ``plain_itl``: its ITL percentiles or None); None when no method is asked for."""
    if req.speculative_method is None:
        return None
    return evaluate(
        req,
        target,
        sim.mean_decode_batch,
        mean_in,
        mean_out,
        plain_itl.mean if plain_itl else None,
        plain_tokens_per_s,
        peak_kv_tokens=float(sim.peak_kv_tokens),
        closed_loop=closed_loop,
    )


def evaluate(
    req: Any,
    target: Any,
    batch: float,
    mean_in: float,
    mean_out: float,
    plain_itl_ms: float | None,
    plain_tokens_per_s: float,
    *,
    closed_loop: bool = True,
    peak_kv_tokens: float | None = None,
) -> SpeculativeResult:
    """Speculative decoding at the simulated load, plus a recommendation per load level.

    The simulation stays the plain engine's; the speculative figures scale its decode
    phase: a request's decode takes out/TAU steps of (draft + verify) instead of out
    plain steps, prefill unchanged (``throughput_speedup`` at the same batch).
    """
    drafter = build_drafter(req, target)
    acc = resolve_acceptance(req)
    ctx = mean_in + mean_out / 2.0
    b = max(1, int(round(batch)))
    off_here = False
    if req.num_speculative_tokens is not None:
        k, chosen = int(req.num_speculative_tokens), "given"
    else:
        best, _ = _best_k(drafter, target, acc, b, ctx)
        k, chosen, off_here = (best or 1), "best at this load", best is None
    tau = acc.tau(k)
    plain = target.decode_ms(b, ctx)
    draft = drafter.draft_ms(b, ctx, k) + drafter_constants()["spec_step_overhead_ms"]
    ver = verify_ms(target, b, ctx, k)
    gain = tau * plain / (draft + ver)
    thr = _throughput_gain(target, b, mean_in, mean_out, plain, (draft + ver) / tau)
    rec = _per_level(drafter, target, acc, b, ctx)
    kv_tokens = kv_tokens_with_drafter(target, drafter)
    notes = _notes(drafter, acc, target, kv_tokens, peak_kv_tokens, off_here, closed_loop)
    return SpeculativeResult(
        method=req.speculative_method,
        num_speculative_tokens=k,
        k_chosen_by=chosen,
        acceptance_rate=acc.alpha,
        acceptance_source=acc.source,
        tokens_per_step=tau,
        itl_speedup=gain,
        throughput_speedup=thr,
        break_even_concurrency=break_even(drafter, target, acc, ctx, k),
        decode_batch=float(batch),
        plain_step_ms=plain,
        draft_ms=draft,
        verify_ms=ver,
        itl_ms_mean=(plain_itl_ms / gain) if plain_itl_ms else (draft + ver) / tau,
        output_tokens_per_s=plain_tokens_per_s * thr if closed_loop else plain_tokens_per_s,
        drafter_weight_gib_per_gpu=drafter.weight_bytes_per_gpu / GIB,
        kv_cache_tokens=kv_tokens,
        recommendation=rec,
        notes=notes,
    )


def _per_level(drafter: Any, target: Any, acc: Any, batch: int, ctx: float) -> list[SpecLevel]:
    """The best K (or off) at each load level of LOAD_LEVELS and at the simulated batch."""
    levels = sorted({min(c, target.max_num_seqs) for c in LOAD_LEVELS} | {batch})
    rec = []
    for c in levels:
        kk, g = _best_k(drafter, target, acc, c, ctx)
        rec.append(
            SpecLevel(
                concurrency=c,
                recommended_k=kk,
                itl_speedup=g,
                tokens_per_step=acc.tau(kk) if kk else 1.0,
            )
        )
    return rec


def _notes(
    drafter: Any,
    acc: Any,
    target: Any,
    kv_tokens: int,
    peak_kv_tokens: float | None,
    off_here: bool,
    closed_loop: bool,
) -> list[str]:
    """What the speculative figures assume, and what the load says about them."""
    notes = [
        *drafter.notes,
        "acceptance " + acc.source,
        "TAU at an unmeasured K: linear between measured K; beyond them the geometric model "
        "(each draft accepted with the rate fitted at the nearest measured K)",
        "verify step: K+1 query tokens per sequence, each sequence's KV read once",
        "speculative ITL and throughput scale the plain simulation's decode phase at its mean batch",
    ]
    if peak_kv_tokens is not None and peak_kv_tokens > kv_tokens:
        notes.insert(
            0,
            f"this load peaks at {peak_kv_tokens:,.0f} KV tokens, more than the {kv_tokens:,} left "
            "beside the drafter: expect preemptions the plain run did not have",
        )
    if off_here:
        notes.insert(
            0, f"no K in 1..8 gains {MIN_GAIN:g}x at this load: leave speculation off (K=1 shown)"
        )
    if not closed_loop:
        notes.append(
            "open loop: the offered rate sets the output rate; throughput_speedup is the extra "
            "capacity at this batch"
        )
    if kv_tokens < target.kv_capacity_tokens * 0.999:
        notes.append(
            f"KV cache shrinks from {target.kv_capacity_tokens:,} to {kv_tokens:,} tokens "
            "with the drafter loaded"
        )
    return notes


def _throughput_gain(
    target: Any,
    batch: int,
    mean_in: float,
    mean_out: float,
    plain_ms: float,
    spec_ms_per_token: float,
) -> float:
    """A batch's turnover: out decode steps plus each member's prefill (saturation_point's
    arithmetic), with the per-token decode time replaced by the speculative one."""
    pf = target.marginal_prefill_ms(mean_in)
    plain_total = mean_out * plain_ms + batch * pf
    spec_total = mean_out * spec_ms_per_token + batch * pf
    return plain_total / spec_total if spec_total > 0 else 1.0
