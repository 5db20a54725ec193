"""The serving levers, tried on the recommended fleet: worth it, or not, and by how much.

The search sizes fleets of plain replicas (with the workload's prefix-cache hits priced
in). On the fleet it recommends, this module asks `predict` what each lever would buy
at the fleet's own design load per replica:

* speculative decoding (the method and acceptance given, else EAGLE-3 with its
  published chat acceptance): ITL and throughput speed-ups at the design batch, and the
  replicas the throughput gain would save when the fleet is sized by throughput;
* prefix caching: the hit rate the workload states (already priced in), or a note that
  none is stated;
* prefill/decode disaggregation, for fleets of two or more replicas: the same GPUs as P
  prefill + D decode workers per pair of replicas, with the split that balances the pools.

Each answer says "not worth it" when the gain is within the model's error, so a user
does not add a drafter or a KV-transfer network for nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # pragma: no cover
    from .result import Candidate
    from .spec import SearchSpec

Lever = Literal["speculative_decoding", "prefix_caching", "disaggregation"]
MIN_GAIN = 1.05
"""A speed-up below this is within the model's error."""
DEFAULT_SPEC_METHOD = "eagle3"


class LeverVerdict(BaseModel):
    """One lever tried on the recommended fleet."""

    lever: Lever
    setting: str = Field(description="What was tried, e.g. 'eagle3 K=3' or '1:1 per 2 replicas'.")
    worth_it: bool
    effect: str = Field(description="The predicted effect in numbers, at the design load.")
    replicas_with_lever: int | None = Field(
        default=None, description="Serving replicas with the lever on, when it changes them."
    )
    how: str = Field(description="The flag or command that turns it on and checks it.")


def lever_verdicts(spec: SearchSpec, best: Candidate, config: Any) -> list[LeverVerdict]:
    """Every lever on ``best`` (its replica configuration ``config``) at its design load
    per replica."""
    base = _predict_request(spec, best, config)
    return [
        _speculative(spec, best, base),
        _prefix(spec, best, base),
        *([_disaggregation(best, base)] if best.replicas >= 2 else []),
    ]


def _predict_request(spec: SearchSpec, c: Candidate, config: Any) -> dict[str, Any]:
    from .screen import deployment_fields

    return {
        **deployment_fields(config, spec, c.max_model_len),
        "input_tokens": spec.input_tokens.p50,
        "input_tokens_p95": spec.input_tokens.p95,
        "output_tokens": spec.output_tokens.p50,
        "output_tokens_p95": spec.output_tokens.p95,
        "request_rate": c.design_rate_per_replica,
        "prefix_cache_hit_rate": spec.shared_prefix_fraction,
        "num_requests": 400,
    }


def _predict(fields: dict[str, Any]) -> Any:
    from .. import api
    from ..predict import PredictRequest

    return api.predict(PredictRequest(**fields))


def _speculative(spec: SearchSpec, c: Candidate, base: dict[str, Any]) -> LeverVerdict:
    method = spec.speculative_method or DEFAULT_SPEC_METHOD
    fields = {**base, "speculative_method": method}
    if spec.spec_acceptance_length is not None:
        fields["spec_acceptance_length"] = spec.spec_acceptance_length
        fields["num_speculative_tokens"] = spec.num_speculative_tokens or 3
    elif spec.num_speculative_tokens is not None:
        fields["num_speculative_tokens"] = spec.num_speculative_tokens
    s = _predict(fields).speculative
    worth = s.throughput_speedup >= MIN_GAIN and s.itl_speedup >= MIN_GAIN
    replicas = max(1, math.ceil(c.replicas / s.throughput_speedup)) if worth else None
    source = "given" if spec.spec_acceptance_length is not None else "published chat default"
    return LeverVerdict(
        lever="speculative_decoding",
        setting=f"{method} K={s.num_speculative_tokens} (acceptance {s.tokens_per_step:.2f} "
        f"tokens/step, {source})",
        worth_it=worth,
        effect=f"at the design batch {s.decode_batch:.0f}: ITL x{s.itl_speedup:.2f}, throughput "
        f"x{s.throughput_speedup:.2f}"
        + (
            f"; stops paying above concurrency {s.break_even_concurrency}"
            if s.break_even_concurrency
            else ""
        )
        + ("" if worth else ": not worth it at this load"),
        replicas_with_lever=replicas if replicas != c.replicas else None,
        how=f"--speculative-config with {method} (check the acceptance in vLLM's spec-decode "
        "metrics, then `inferwise predict ... --spec-acceptance-length TAU`)",
    )


def _prefix(spec: SearchSpec, c: Candidate, base: dict[str, Any]) -> LeverVerdict:
    hit = spec.shared_prefix_fraction
    if not hit:
        return LeverVerdict(
            lever="prefix_caching",
            setting="no shared prefix stated",
            worth_it=False,
            effect="nothing to gain without repeated prompt prefixes; state "
            "traffic.shared_prefix_fraction if prompts share a system prompt or documents",
            how="on by default in vLLM V1 and SGLang; measure vllm:prefix_cache_hits / queries",
        )
    pc = _predict(base).prefix_cache
    return LeverVerdict(
        lever="prefix_caching",
        setting=f"hit rate {hit:.0%} (traffic.shared_prefix_fraction)",
        worth_it=pc.ttft_speedup >= MIN_GAIN or pc.throughput_speedup >= MIN_GAIN,
        effect=f"priced in: TTFT p50 x{pc.ttft_speedup:.2f}, throughput x"
        f"{pc.throughput_speedup:.2f} against no hits (effective hit rate "
        f"{pc.effective_hit_rate:.0%})",
        how="keep prefix caching on (the default); route by prefix when replicas > 1",
    )


def _disaggregation(c: Candidate, base: dict[str, Any]) -> LeverVerdict:
    """One P:D replica pair carved out of two plain replicas' GPUs, at their load."""
    pair = {**base, "request_rate": 2 * c.design_rate_per_replica, "disaggregate": "1:1"}
    first = _predict(pair).disaggregation
    split = first.balanced_split
    d = first if split == "1:1" else _predict({**pair, "disaggregate": split}).disaggregation
    gain = f"x{d.itl_p95_gain:.2f}" if d.itl_p95_gain else "n/a"
    return LeverVerdict(
        lever="disaggregation",
        setting=f"{split} workers per 2 replicas' GPUs",
        worth_it=d.worth_it,
        effect=f"ITL p95 {gain}, TTFT p95 x{d.ttft_p95_ratio:.2f}, KV link "
        f"{d.kv_transfer_gbps_needed:.1f} Gbit/s per prefill worker; {d.break_even}",
        how=f"`inferwise predict ... --disaggregate {split} --kv-transfer-gbps G` with your fabric's rate",
    )
