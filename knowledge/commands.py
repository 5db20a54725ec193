"""Fill the workload's own deployment into the command recipes of the knowledge files.

The hypothesis guides and playbooks are written once for every workload, so their commands
say `inferwise predict --concurrency 1` or `inferwise fit --model M --gpu G`. Printed as is,
such a line does not run (`--model` is required) and leaves the user to look up values the
workload already states. Here the stated model, GPU, tensor-parallel degree and p50 lengths
go into each calculator command, and the endpoint into probe commands when it is known.
What the workload does not state stays a visible placeholder (MODEL, URL), never a guess.

Stdlib only (the Analysis is passed in).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

_NAMED = re.compile(
    r"\b(RATE_SWEEP|OVERLOAD_RATE|RATE|P50_PROMPT|P95_PROMPT|P50_OUTPUT|CONCURRENCY|CONTEXT)\b"
)
_CALC = re.compile(r"inferwise (fit|predict|budget)(?= (?:--|\.\.\.))(?! --model)")
_PROBE_URL = re.compile(r"(inferwise probe )URL\b")


def _command_tail(text: str, start: int) -> str:
    """The rest of the command that starts at ``start`` (up to a backtick or line end)."""
    end = text.find("`", start)
    return text[start : end if end >= 0 else len(text)]


_SHORTHAND = (
    (re.compile(r"(--request-rate )R\b(?!_)"), "RATE"),
    (re.compile(r"(--request-rate )2x_capacity\b"), "TWICE_CAPACITY"),
    (re.compile(r"(--request-rate )R_peak_x1\.5\b"), "OVERLOAD_RATE"),
    (re.compile(r"(--concurrency )[NC]\b"), "CONCURRENCY"),
)


def _num(x: float) -> str:
    """A rate as people write it: 3 significant digits, never exponent notation."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def placeholder_values(a: Any) -> dict[str, str]:
    """Values for the named placeholders of the recipes, from what the workload states or a run
    measured; a placeholder without a value stays as written."""
    out: dict[str, str] = {}
    rate, peak = a.value("traffic.arrival_rate_rps"), a.value("derived.peak_rate_rps")
    if not rate and a.run is not None:
        # a closed-loop run has no arrival rate: its achieved throughput is the rate it carried
        rate = a.value("observations.requests_per_s")
    peak = peak or rate
    if rate:
        out["RATE"] = _num(rate)
    if peak:
        out["OVERLOAD_RATE"] = _num(peak * 1.5)
        out["RATE_SWEEP"] = ",".join(_num(peak * f) for f in (0.5, 1.0, 1.5, 2.0))
    inp, out_t = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    p95 = a.value("derived.input_tokens_p95")
    if inp:
        out["P50_PROMPT"] = str(int(inp))
    if p95:
        out["P95_PROMPT"] = str(int(p95))
    if out_t:
        out["P50_OUTPUT"] = str(int(out_t))
    # "2x capacity" in an overload test means above anything the service is rated for: the
    # larger of the computed capacity and the stated peak
    rated = max(a.value("derived.capacity_rps") or 0.0, peak or 0.0)
    if rated:
        out["TWICE_CAPACITY"] = _num(2 * rated)
    conc = a.value("observations.concurrency") or a.value("traffic.concurrency")
    if conc:
        out["CONCURRENCY"] = str(max(1, round(conc)))
    if inp:
        out["CONTEXT"] = str(int(inp + (out_t or 0)))
    return out


def concretize(text: str, a: Any, url: str | None = None) -> str:
    """``text`` with the workload's deployment filled into every calculator command it holds
    and ``url`` into probe commands; other text is returned unchanged."""
    if "inferwise " not in text:
        return text
    dep = a.workload.deployment
    model = dep.model if dep is not None and dep.model else None
    gpu = dep.gpu if dep is not None and dep.gpu else None
    tp = dep.tensor_parallel_size if dep is not None else None
    overrides = dep.hf_overrides if dep is not None and dep.hf_overrides else {}
    inp, out = a.value("derived.input_tokens_p50"), a.value("derived.output_tokens_p50")
    if model:
        text = text.replace("--model M ", f"--model {shlex.quote(model)} ")
    if gpu:
        gpu = shlex.quote(gpu)
        text = text.replace("--gpu G ", f"--gpu {gpu} ").replace("--gpu G\n", f"--gpu {gpu}\n")
        if text.endswith("--gpu G"):
            text = text[: -len("G")] + gpu

    def fill(m: re.Match[str]) -> str:
        tail = _command_tail(text, m.end())
        parts = [f"inferwise {m.group(1)}", f"--model {shlex.quote(model) if model else 'MODEL'}"]
        if gpu and "--gpu" not in tail:
            parts.append(f"--gpu {gpu}")
        if tp and tp > 1 and "--tensor-parallel-size" not in tail:
            parts.append(f"--tensor-parallel-size {tp}")
        if overrides and "--hf-overrides" not in tail:
            parts.extend(f"--hf-overrides {shlex.quote(f'{k}={v}')}" for k, v in overrides.items())
        if (
            m.group(1) != "fit"
            and inp
            and out
            and "--input-tokens" not in tail
            and "--agent-steps" not in tail
        ):
            parts.append(f"--input-tokens {int(inp)} --output-tokens {int(out)}")
        return " ".join(parts)

    text = _CALC.sub(fill, text)
    values = placeholder_values(a)
    # the playbooks' shorthand: R (the rate), N/C after --concurrency, 2x_capacity
    for pattern, key in _SHORTHAND:
        if key in values:
            text = pattern.sub(lambda m, k=key: m.group(1) + values[k], text)
    text = _NAMED.sub(lambda m: values.get(m.group(1), m.group(1)), text)
    if url:
        text = _PROBE_URL.sub(lambda m: m.group(1) + shlex.quote(url), text)
    return text
