"""How close `inferwise fit` comes to what vLLM itself logged at start-up.

Replays every case of tests/data/vllm_logs.toml and prints, per case, the
predicted and logged figures with the relative error:

* weights: computed per-GPU weights vs "Model loading took X GiB";
* KV tokens, formula only: the KV-cache memory vLLM logged ("Available KV
  cache memory") fed through our block/group/token rules, vs the logged
  "GPU KV cache size" — checks the KV rules independent of the memory model;
* available KV memory and KV tokens end to end: everything modelled (the
  GPU's total from the catalog, weights, activation peak, non-torch, CUDA
  graphs), vs the logged values; the logged total is used only where the
  log names no catalog GPU. Cases marked ``e2e_comparable = false``
  (something outside vLLM's accounting used memory) are listed with "!"
  and left out of these summaries;
* the profiled parts on their own (activation peak, non-torch memory) and
  the catalog's GPU total against the total vLLM logged;
* fit verdicts where vLLM refused to start;
* the headline, ``kv_capacity_e2e``: per case the fully modelled KV capacity,
  in tokens where vLLM logged them, else as available KV memory (tokens
  follow it block for block). Known misses (``known_miss`` in the data) are
  counted like any other case.

Then medians and the share of cases within 5 % and 10 %, for all cases and
separately for the calibration cases (the ones the engine_policy constants
were fitted on, ``split = "calibration"`` in the data) and the held-out rest;
then the same medians per vLLM minor release (:func:`release_table`); last,
the SGLang start-ups of tests/data/sglang_logs.toml (:func:`sglang_table`).

    .venv/bin/python bench/fit_accuracy.py            # the table
    .venv/bin/python bench/fit_accuracy.py --json     # machine-readable rows

The replay functions are imported by tests/test_fit_logs.py.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "data" / "vllm_logs.toml"
GiB = 1 << 30


def load_cases(path: Path = LOGS) -> list[dict[str, Any]]:
    with path.open("rb") as fh:
        return tomllib.load(fh)["case"]


def _request(case: dict[str, Any], workdir: Path, use_logged_total: bool = True, **extra: Any):
    from inferwise.calculators.fit import FitRequest

    model = case["model"]
    if "config" in case:
        folder = workdir / case["id"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(case["config"]))
        model = str(folder / "config.json")
    data: dict[str, Any] = {
        "model": model,
        "engine": "vllm",
        "engine_version": case["vllm_version"],
    }
    data.update(case.get("flags", {}))
    if case.get("hf_overrides"):
        data["hf_overrides"] = case["hf_overrides"]
    if case.get("gpu"):
        data["gpu"] = case["gpu"]
    if use_logged_total and case.get("gpu_total_gib") and not case.get("gpu"):
        data["gpu_memory_gib"] = case["gpu_total_gib"]
    if "gpu" not in data and "gpu_memory_gib" not in data:
        data["gpu_memory_gib"] = 80.0  # placeholder: only formula-only figures are used
    data.update(extra)
    return FitRequest.model_validate(data)


def _err(pred: float | None, logged: float | None) -> float | None:
    if pred is None or logged is None or logged == 0:
        return None
    return (pred - logged) / abs(logged)


def replay(case: dict[str, Any]) -> dict[str, Any]:
    """Predicted vs logged figures for one case."""
    from inferwise.calculators.fit import estimate_fit, estimate_fit_with_available

    logged = case.get("logged", {})
    row: dict[str, Any] = {
        "id": case["id"],
        "kind": case.get("kind", []),
        "source": case["source"],
        "split": case.get("split", "held-out"),
        "e2e_comparable": case.get("e2e_comparable", True),
        "release": release_of(case["vllm_version"]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        req = _request(case, Path(tmp))
        row["family"] = _family(req)
        full = estimate_fit(req) if (case.get("gpu") or case.get("gpu_total_gib")) else None
        if full is not None:
            row["weights_gib"] = (full.per_gpu.weights_gib, logged.get("weights_gib"))
            row["available_kv_gib"] = (
                round(
                    full.per_gpu.kv_cache_gib
                    if full.per_gpu.kv_cache_gib > 0
                    else _raw_available(full),
                    3,
                ),
                logged.get("available_kv_gib"),
            )
            row["kv_tokens_e2e"] = (full.kv_cache_tokens, logged.get("kv_tokens"))
            row["fits"] = (full.fits, logged.get("fits"))
            row["activation_gib"] = (full.per_gpu.activation_gib, logged.get("activation_gib"))
            row["non_torch_gib"] = (full.per_gpu.non_torch_gib, logged.get("non_torch_gib"))
        if case.get("gpu") and case.get("gpu_total_gib"):
            from inferwise.calculators.catalog import get_gpu
            from inferwise.calculators.engine_policy import runtime_total_gib

            g = get_gpu(case["gpu"])
            total, _ = runtime_total_gib(g.memory_total_gib, g.memory_total_gib_torch, g.vendor)
            row["catalog_total_gib"] = (round(total, 3), case["gpu_total_gib"])
            row["nvidia_smi_total_gib"] = (g.memory_total_gib, case["gpu_total_gib"])
        if full is None and "weights_gib" in logged:
            # No GPU named: weights alone, on a placeholder large enough to fit
            # (a named GPU keeps its own fit: MXFP4 layouts depend on it).
            from inferwise.calculators.fit import estimate_fit as _ef

            req2 = req.model_copy(update={"gpu_memory_gib": 1000.0, "gpu": None})
            row["weights_gib"] = (_ef(req2).per_gpu.weights_gib, logged.get("weights_gib"))
        avail = logged.get("available_kv_gib")
        if avail is not None and avail > 0:
            per_stage = logged.get("available_kv_gib_per_stage")
            given = [int(a * GiB) for a in per_stage] if per_stage else int(avail * GiB)
            one = _request(case, Path(tmp), concurrency=1)
            formula = estimate_fit_with_available(one, given)
            row["kv_tokens_formula"] = (formula.kv_cache_tokens, logged.get("kv_tokens"))
            row["max_concurrency_formula"] = (
                formula.max_concurrency,
                logged.get("max_concurrency"),
            )
            if "estimated_max_model_len" in logged and formula.answer is not None:
                row["estimated_max_model_len"] = (
                    formula.answer.max_context_at_concurrency,
                    logged["estimated_max_model_len"],
                )
            if "needed_kv_gib" in logged:
                row["fits_formula"] = (formula.fits, logged.get("fits"))
        # The headline figure: KV capacity fully modelled, in tokens where vLLM
        # logged tokens, else as available memory (tokens follow it block
        # for block); only start-ups that had KV memory at all.
        if "kv_tokens_e2e" in row and row["kv_tokens_e2e"][1]:
            row["kv_capacity_e2e"] = row["kv_tokens_e2e"]
        elif "available_kv_gib" in row and (row["available_kv_gib"][1] or 0) > 0:
            row["kv_capacity_e2e"] = row["available_kv_gib"]
        if "needed_kv_gib" in logged:
            one = estimate_fit_with_available(req, 1 << 50)
            need = _needed_gib(one)
            row["needed_kv_gib"] = (need, logged["needed_kv_gib"])
    return row


def _raw_available(result) -> float:
    """Negative KV memory (vLLM logs it) is clipped in per_gpu; rebuild it."""
    p = result.per_gpu
    charged = p.cuda_graph_gib if p.cuda_graph_in_budget else 0.0
    return p.usable_gib - p.weights_gib - p.activation_gib - p.non_torch_gib - charged


def _needed_gib(result) -> float:
    """KV bytes one max_model_len request needs per GPU (vLLM's start-up check)."""
    blocks_per_request = (
        result.kv_cache_blocks / result.max_concurrency if result.max_concurrency else 0
    )
    page = result.block_size * result.kv_bytes_per_token
    return round(blocks_per_request * page / GiB, 3)


MODELLED = {
    "available_kv_gib",
    "kv_tokens_e2e",
    "kv_capacity_e2e",
    "activation_gib",
    "non_torch_gib",
}
METRICS = [
    ("weights_gib", "weights: computed vs 'Model loading took'"),
    ("kv_tokens_formula", "KV tokens from the logged available memory (block/group rules only)"),
    ("max_concurrency_formula", "maximum concurrency from the logged available memory"),
    ("needed_kv_gib", "KV one max_model_len request needs (vLLM's start-up error)"),
    ("estimated_max_model_len", "longest context the logged memory allows (vLLM's estimate)"),
    ("available_kv_gib", "available KV memory, fully modelled"),
    ("kv_tokens_e2e", "KV tokens, fully modelled"),
    ("activation_gib", "profiled activation peak"),
    ("non_torch_gib", "non-torch memory"),
    (
        "nvidia_smi_total_gib",
        "catalog nvidia-smi total (memory_total_gib) vs the total vLLM logged",
    ),
    ("catalog_total_gib", "total the calculator budgets from (torch's) vs the total vLLM logged"),
    (
        "kv_capacity_e2e",
        "HEADLINE: KV capacity fully modelled (tokens where logged, else available KV GiB); "
        "target median <= 2 %, >= 80 % within 5 %, >= 90 % within 10 %",
    ),
]
"""(row key, title) in print order."""


def _stats(errs: list[float]) -> dict[str, Any]:
    return {
        "n": len(errs),
        "median_abs_error": statistics.median(errs),
        "within_5pct": sum(e <= 0.05 for e in errs) / len(errs),
        "within_10pct": sum(e <= 0.10 for e in errs) / len(errs),
    }


def _fmt_stats(label: str, s: dict[str, Any]) -> str:
    return (
        f"  -> {label:10s} n={s['n']:<3d} median |error| {s['median_abs_error']:6.2%}  "
        f"within 5%: {s['within_5pct']:4.0%}  within 10%: {s['within_10pct']:4.0%}"
    )


def table(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The per-case error table and, per metric, the summary for all cases,
    the calibration cases and the held-out cases."""
    lines = []
    summary: dict[str, Any] = {}
    for m, title in METRICS:
        errs: dict[str, list[float]] = {"all": [], "calibration": [], "held-out": []}
        body = []
        for r in rows:
            if m not in r or r[m][1] is None:
                continue
            pred, log = r[m]
            e = _err(pred, log)
            counted = r["e2e_comparable"] or m not in MODELLED
            if e is not None and counted:
                errs["all"].append(abs(e))
                errs[r["split"]].append(abs(e))
            es = f"{e:+.1%}" if e is not None else "-"
            tag = "c" if r["split"] == "calibration" else (" " if counted else "!")
            body.append(f"  {r['id']:44s}{tag} {pred:>14,.2f} {log:>14,.2f} {es:>8s}")
        if not body:
            continue
        lines.append(f"\n{m}: {title}")
        lines.append(
            f"  {'case (c = calibration, ! = not counted)':45s} {'predicted':>14s} {'logged':>14s} {'error':>8s}"
        )
        lines += body
        if errs["all"]:
            summary[m] = {k: _stats(v) for k, v in errs.items() if v}
            for k in ("all", "calibration", "held-out"):
                if k in summary[m]:
                    lines.append(_fmt_stats(k, summary[m][k]))
    verdicts = [(r["id"], *r["fits"]) for r in rows if "fits" in r and r["fits"][1] is not None]
    verdicts += [(r["id"], *r["fits_formula"]) for r in rows if "fits_formula" in r]
    if verdicts:
        agree = sum(p == lg for _, p, lg in verdicts)
        lines.append(f"\nfit verdicts where vLLM refused to start: {agree}/{len(verdicts)} agree")
        for cid, p, lg in verdicts:
            lines.append(f"  {cid:44s} predicted fits={p}  logged fits={lg}")
        summary["verdicts"] = {"n": len(verdicts), "agree": agree}
    return "\n".join(lines), summary


def release_of(version: str) -> str:
    """The minor release a case's version belongs to ("0.10.1" -> "0.10")."""
    parts = version.lstrip("v").split(".")
    return ".".join(parts[:2])


RELEASE_METRICS = ("weights_gib", "kv_tokens_formula", "available_kv_gib", "kv_capacity_e2e")
"""The metrics the per-release table breaks down."""


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split(".") if x.isdigit())


def release_table(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Per vLLM minor release: cases and median |error| of each metric of
    RELEASE_METRICS (counted as in :func:`table`)."""
    return group_table(rows, "release", sorted({r["release"] for r in rows}, key=_release_key))


def family_table(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The same per architecture family (the layout reader: llama, deepseek, qwen3_next...)."""
    return group_table(rows, "family", sorted({r["family"] for r in rows}))


def group_table(
    rows: list[dict[str, Any]], key: str, groups: list[str]
) -> tuple[str, dict[str, Any]]:
    head = f"  {key:12s} {'cases':>5s}" + "".join(f" {m:>24s}" for m in RELEASE_METRICS)
    lines = [f"\nper {key}: n, median |error| (cases whose logs show that figure)", head]
    summary: dict[str, Any] = {}
    for group in groups:
        mine = [r for r in rows if r[key] == group]
        cells, summary[group] = [], {"cases": len(mine)}
        for m in RELEASE_METRICS:
            errs = [
                abs(e)
                for r in mine
                if m in r
                and (r["e2e_comparable"] or m not in MODELLED)
                and (e := _err(*r[m])) is not None
            ]
            if errs:
                summary[group][m] = _stats(errs)
                cells.append(f"n={len(errs):<3d} {statistics.median(errs):7.2%}")
            else:
                cells.append("-")
        lines.append(f"  {group:12s} {len(mine):5d}" + "".join(f" {c:>24s}" for c in cells))
    return "\n".join(lines), summary


def _family(req: Any) -> str:
    """The architecture family of a case's model (its layout reader), or why none."""
    from inferwise.calculators.architecture import from_config
    from inferwise.calculators.catalog import load_model
    from inferwise.calculators.errors import InputError

    try:
        return from_config(load_model(req.model).config, req.hf_overrides).family
    except InputError:
        return "unreadable"


SGLANG_LOGS = ROOT / "tests" / "data" / "sglang_logs.toml"


def sglang_rows(path: Path = SGLANG_LOGS) -> list[dict[str, Any]]:
    """Predicted vs logged figures of the SGLang start-ups (tests/data/sglang_logs.toml):
    the default mem_fraction_static and the fully modelled KV pool, per its checks."""
    from inferwise.calculators import engine_policy as ep
    from inferwise.calculators.fit import FitRequest, estimate_fit

    with path.open("rb") as fh:
        cases = tomllib.load(fh)["case"]
    rows = []
    for c in cases:
        row: dict[str, Any] = {"id": c["id"], "release": c["sglang_version"], "source": c["source"]}
        tp = c["flags"].get("tensor_parallel_size", 1)
        if "default_mem_fraction" in c["checks"]:
            rules = ep.sglang_rules(c["sglang_version"])
            d = ep.sglang_defaults(rules, c["gpu_memory_mib"], tp, 1, False)
            row["mem_fraction_static"] = (d.mem_fraction_static, c["logged"]["mem_fraction_static"])
        if "kv_tokens" in c["checks"]:
            req = {"model": c["model"], "gpu": c["gpu"], "engine": "sglang"}
            req |= {"engine_version": c["sglang_version"], **c["flags"]}
            fit = estimate_fit(FitRequest.model_validate(req), with_suggestions=False)
            row["kv_tokens_e2e"] = (fit.kv_cache_tokens, c["logged"]["kv_tokens"])
        rows.append(row)
    return rows


def sglang_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"\nSGLang start-ups from {SGLANG_LOGS.relative_to(ROOT)} (all held out)"]
    lines.append(
        f"  {'case':44s} {'release':8s} {'figure':20s} {'predicted':>12s} {'logged':>12s} {'error':>8s}"
    )
    for r in rows:
        for m in ("mem_fraction_static", "kv_tokens_e2e"):
            if m in r:
                pred, log = r[m]
                e = _err(pred, log)
                lines.append(
                    f"  {r['id']:44s} {r['release']:8s} {m:20s} {pred:>12,.3f} {log:>12,.3f} {e:+8.1%}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = [replay(c) for c in load_cases()]
    text, summary = table(rows)
    per_release, summary["per_release"] = release_table(rows)
    per_family, summary["per_family"] = family_table(rows)
    sglang = sglang_rows()
    if "--json" in argv:
        out = {"rows": rows, "summary": summary, "sglang_rows": sglang}
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"{len(rows)} logged vLLM start-ups from {LOGS.relative_to(ROOT)}")
        print(text)
        print(per_release)
        print(per_family)
        print(sglang_table(sglang))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
