"""`inferwise calibrate`, `calibrations list|show|delete`, `--calibration` in predict/budget,
`runs import` and `explain`: on the benchmark-file fixtures of tests/data/bench_results
(vLLM, guidellm and AIPerf layouts, numbers from a known truth: see make_fixtures.py)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from inferwise.calculators.bench_files import read_bench_file
from inferwise.calculators.errors import InputError
from inferwise.calculators.user_calibration import measured_values, simulate_point
from inferwise.server.cli import main

DATA = Path(__file__).parent / "data" / "bench_results"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEP = ["--model", MODEL, "--gpu", "h100-sxm-80gb"]


@pytest.fixture
def db(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "runs.db"
    monkeypatch.setenv("INFERWISE_DB", str(path))
    return path


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _calibrations(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        have = conn.execute("SELECT name FROM sqlite_master WHERE name='calibrations'").fetchone()
        return conn.execute("SELECT count(*) FROM calibrations").fetchone()[0] if have else 0


# --------------------------------------------------------------------------- file readers


def test_vllm_result_reads_summary_and_per_request_lists_in_ms() -> None:
    (p,) = read_bench_file(DATA / "vllm_c1.json")
    raw = json.loads((DATA / "vllm_c1.json").read_text())
    assert p.tool == "vllm-bench" and p.model == MODEL and p.concurrency == 1
    assert p.num_requests == raw["completed"]
    assert p.input_tokens_mean == pytest.approx(raw["total_input_tokens"] / raw["completed"])
    assert p.ttft_ms == raw["mean_ttft_ms"] and p.itl_ms == raw["mean_itl_ms"]
    assert p.output_tokens_per_s == raw["output_throughput"]
    # ttfts and itls are seconds in the file, milliseconds here
    assert p.ttfts_ms[0] == pytest.approx(raw["ttfts"][0] * 1e3)
    assert p.itls_ms[0][0] == pytest.approx(raw["itls"][0][0] * 1e3)
    assert p.input_lens == raw["input_lens"]


def test_guidellm_report_gives_one_point_per_benchmark_with_its_strategy() -> None:
    points = read_bench_file(DATA / "guidellm_report.json")
    assert [p.concurrency for p in points] == [1, 16, 32]
    raw = json.loads((DATA / "guidellm_report.json").read_text())["benchmarks"][1]["metrics"]
    # request_latency is in seconds in guidellm's report
    assert points[1].e2e_ms == pytest.approx(raw["request_latency"]["successful"]["mean"] * 1e3)
    assert points[1].ttft_ms == raw["time_to_first_token_ms"]["successful"]["mean"]


def test_aiperf_export_reads_metric_objects_and_loadgen() -> None:
    (p,) = read_bench_file(DATA / "aiperf_c8.json")
    raw = json.loads((DATA / "aiperf_c8.json").read_text())
    assert p.tool == "aiperf" and p.concurrency == 8 and p.model == MODEL
    assert p.ttft_ms == raw["time_to_first_token"]["avg"]
    assert p.output_tokens_per_s == raw["output_token_throughput"]["avg"]


def test_a_rate_run_of_vllm_is_open_loop(tmp_path) -> None:
    raw = json.loads((DATA / "vllm_c4.json").read_text())
    raw.update(max_concurrency=None, request_rate=2.5)
    f = tmp_path / "rate.json"
    f.write_text(json.dumps(raw))
    (p,) = read_bench_file(f)
    assert p.concurrency is None and p.request_rate == 2.5 and p.load_label == "2.5 req/s"


def test_unknown_format_is_refused_by_name(tmp_path) -> None:
    f = tmp_path / "other.json"
    f.write_text(json.dumps({"latency": 3}))
    with pytest.raises(InputError, match="unknown benchmark file format") as exc:
        read_bench_file(f)
    assert exc.value.field == "from_file"


@pytest.mark.parametrize(
    ("field", "value"),
    [("mean_itl_ms", 1e12), ("mean_ttft_ms", -5.0), ("output_throughput", -1.0)],
)
def test_a_value_no_benchmark_produces_is_refused_naming_the_field(tmp_path, field, value) -> None:
    """An ITL of 10^12 ms or a negative TTFT would be fitted and stored (calibrate, runs
    import) and carried into every later prediction: refused, naming the file and field.
    NaN, the tools' own marker for a value they did not measure, stays a missing value."""
    raw = json.loads((DATA / "vllm_c4.json").read_text())
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({**raw, field: value}))
    with pytest.raises(InputError) as exc:
        read_bench_file(f)
    name = {"mean_itl_ms": "itl_ms", "mean_ttft_ms": "ttft_ms"}.get(field, "output_tokens_per_s")
    assert exc.value.field == "from_file" and f"{name} = " in exc.value.message
    f.write_text(json.dumps({**raw, "mean_ttft_ms": float("nan")}))
    (p,) = read_bench_file(f)
    assert p.ttft_ms is None


# --------------------------------------------------------------------------- the fit


def test_calibrating_on_two_low_loads_predicts_higher_loads(db, capsys) -> None:
    """The fixtures' truth is 0.6 x compute, 0.7 x bandwidth, 2 x step overhead and a 25 ms
    per-request cost of the published factors: calibrated on concurrency 1 and 4, the
    predictions at 8 to 64 land within 15 % and beat the published factors everywhere."""
    out = _json(
        capsys,
        ["calibrate", "--name", "h100", *DEP, "--from-file",
         str(DATA / "vllm_c1.json"), str(DATA / "vllm_c4.json")],
    )  # fmt: skip
    assert out["rms_log_error_calibrated"] < out["rms_log_error_published"] / 5
    assert {"compute_fraction", "bandwidth_fraction"} <= set(out["fitted"])
    # two loads fitted within a probe's noise without it: the per-sequence cost stays published
    assert "third load" in out["held"]["per_seq_overhead_ms"]
    # one sequence steps on the batches' line here (as on GPUs): the factor is held at 1 and
    # the concurrency-1 ITL draws the line
    assert "within 0.85" in out["held"]["single_seq_step_factor"]
    assert out["factors"]["efficiency"]["single_seq_step_factor"] == 1.0
    assert [p["load"] for p in out["points"]] == ["concurrency 1", "concurrency 4"]
    assert set(out["residual_spread"]) == {"ttft_ms", "itl_ms", "output_tokens_per_s"}
    assert [p["source"] for p in out["provenance"]][0].endswith("vllm_c1.json")
    held = [
        *read_bench_file(DATA / "guidellm_report.json")[1:],
        *read_bench_file(DATA / "aiperf_c8.json"),
        *read_bench_file(DATA / "aiperf_c64.json"),
    ]
    published, calibrated = _models(out)
    for p in held:
        cal = simulate_point(calibrated, p)
        pub = simulate_point(published, p)
        for name, measured in measured_values(p).items():
            err_cal = abs(math.log(cal[name] / measured))
            assert err_cal < math.log(1.15), (p.load_label, name, cal[name], measured)
            assert err_cal < abs(math.log(pub[name] / measured)), (p.load_label, name)
    # predict --calibration applies the same factors (its closed loop leaves the ramp out,
    # which changes TTFT at high load, not the ITL of the steady state)
    args = [
        "predict",
        *DEP,
        "--concurrency",
        "16",
        "--input-tokens",
        "1000",
        "--output-tokens",
        "200",
    ]
    pred = _json(capsys, [*args, "--calibration", "h100"])
    c16 = held[0]
    assert abs(math.log(pred["itl_ms"]["mean"] / c16.itl_ms)) < math.log(1.15)
    assert pred["calibration"]["name"] == "h100"
    assert pred["calibration"]["residual_spread"]["itl_ms"]["p10"] > 0.9
    assert any("calibration 'h100'" in a for a in pred["assumptions"])
    assert pred["ttft_ms"]["mean"] > _json(capsys, args)["ttft_ms"]["mean"]  # + 25 ms per request


def _models(out: dict) -> tuple:
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import CalibratedFactors, calibrated_efficiency

    dep = Deployment(model=MODEL, gpu="h100-sxm-80gb")
    published = StepModel.from_deployment(dep)
    eff = calibrated_efficiency(published.efficiency, CalibratedFactors(**out["factors"]))
    return published, StepModel.from_deployment(dep, eff)


def test_one_load_warns_and_holds_what_it_cannot_identify(db, capsys) -> None:
    out = _json(
        capsys, ["calibrate", "--name", "one", *DEP, "--from-file", str(DATA / "vllm_c1.json")]
    )
    assert any("at one load" in w for w in out["warnings"])
    assert out["held"] and not set(out["held"]) & set(out["fitted"])
    assert len(out["fitted"]) <= 3  # three values (TTFT, ITL, throughput) fit at most three


def test_bad_inputs_exit_2_and_store_nothing(db, capsys, tmp_path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"latency": 3}))
    cases = [
        (["--from-file", str(other)], "unknown benchmark file format"),
        (["--from-file", str(DATA / "vllm_c1.json"), str(tmp_path / "missing.json")], "no such"),
        ([], "no measurements given"),
    ]
    for extra, message in cases:
        assert main(["calibrate", "--name", "bad", *DEP, *extra]) == 2
        assert message in capsys.readouterr().err
    # a run of another model than --model
    mistral = ["--model", "mistralai/Mistral-7B-Instruct-v0.3", "--gpu", "h100"]
    assert (
        main(["calibrate", "--name", "bad", *mistral, "--from-file", str(DATA / "vllm_c1.json")])
        == 2
    )
    err = capsys.readouterr().err
    assert "measured model 'meta-llama/Llama-3.1-8B-Instruct'" in err
    # fewer values than a fit needs: a summary with only a TTFT
    raw = json.loads((DATA / "vllm_c4.json").read_text())
    for k in ("mean_itl_ms", "mean_tpot_ms", "output_throughput"):
        raw.pop(k)
    thin = tmp_path / "thin.json"
    thin.write_text(json.dumps(raw))
    assert main(["calibrate", "--name", "bad", *DEP, "--from-file", str(thin)]) == 2
    assert "needs at least 2" in capsys.readouterr().err
    assert (
        main(["calibrate", "--name", "../x", *DEP, "--from-file", str(DATA / "vllm_c1.json")]) == 2
    )
    assert _calibrations(db) == 0


def test_a_calibration_stored_before_a_factor_existed_still_shows(db, capsys) -> None:
    """Calibrations stored before single_seq_step_factor was added lack it: they show, and
    predict with them, as 1 (no single-sequence difference)."""
    import sqlite3

    argv = ["calibrate", "--name", "old", *DEP, "--from-file", str(DATA / "vllm_c1.json")]
    assert main([*argv, str(DATA / "vllm_c4.json")]) == 0
    capsys.readouterr()
    with sqlite3.connect(db) as con:
        (body,) = con.execute("SELECT body FROM calibrations WHERE name = 'old'").fetchone()
        stored = json.loads(body)
        for part in ("factors", "published"):
            stored[part]["efficiency"].pop("single_seq_step_factor")
        con.execute("UPDATE calibrations SET body = ? WHERE name = 'old'", (json.dumps(stored),))
    assert main(["calibrations", "show", "old"]) == 0
    assert "| single_seq_step_factor | 1.0000 | 1.0000 |" in capsys.readouterr().out
    assert main(["predict", *DEP, "--calibration", "old"]) == 0


def test_calibrations_list_show_delete(db, capsys) -> None:
    assert (
        main(["calibrate", "--name", "a", *DEP, "--from-file", str(DATA / "guidellm_report.json")])
        == 0
    )
    capsys.readouterr()
    rows = _json(capsys, ["calibrations", "list"])["calibrations"]
    assert [r["name"] for r in rows] == ["a"] and rows[0]["sources"] == 3
    shown = _json(capsys, ["calibrations", "show", "a"])
    assert len(shown["points"]) == 3 and shown["deployment"]["model"] == MODEL
    assert main(["calibrations", "delete", "a"]) == 0
    capsys.readouterr()
    assert main(["calibrations", "show", "a"]) == 2
    assert "no calibration named 'a'" in capsys.readouterr().err
    assert main(["predict", *DEP, "--calibration", "a"]) == 2


def test_budget_uses_the_calibration(db, capsys) -> None:
    assert main(["calibrate", "--name", "b", *DEP, "--from-file", str(DATA / "vllm_c1.json"),
                 str(DATA / "vllm_c4.json")]) == 0  # fmt: skip
    capsys.readouterr()
    args = ["budget", *DEP, "--slo-e2e-ms", "p95=20000", "--request-rate", "1",
            "--input-tokens", "1000", "--output-tokens", "200"]  # fmt: skip
    cal = _json(capsys, [*args, "--calibration", "b"])
    pub = _json(capsys, args)
    assert any("calibration 'b'" in a for a in cal["assumptions"])
    assert cal["itl_ms"]["p50"] > 1.2 * pub["itl_ms"]["p50"]  # the truth decodes slower
    # the fitted per-request cost replaces the published front end in preprocessing
    stored = _json(capsys, ["calibrations", "show", "b"])
    fitted = stored["factors"]["request_overhead_ms"]
    front_end = _models(stored)[0].efficiency.request_overhead_ms  # the published one
    pre = {r["name"]: r["predicted_ms"] for r in cal["components"]}["preprocessing"]
    pub_pre = {r["name"]: r["predicted_ms"] for r in pub["components"]}["preprocessing"]
    assert fitted > 15.0 and pre - pub_pre == pytest.approx(fitted - front_end, abs=0.01)


# --------------------------------------------------------------------------- hardware outside the catalog


def test_custom_hardware_needs_all_three_figures(db, capsys) -> None:
    hw = ["--model", MODEL, "--gpu-memory-gib", "80", "--memory-bandwidth-gbps", "2000"]
    assert main(["predict", *hw, "--concurrency", "1"]) == 2
    assert "memory_bandwidth_gbps and tflops" in capsys.readouterr().err
    slow = _json(capsys, ["predict", *hw, "--tflops", "400", "--concurrency", "1"])
    fast = _json(capsys, ["predict", *hw[:-1], "4000", "--tflops", "400", "--concurrency", "1"])
    assert slow["gpu"] == "custom"
    # decode at batch 1 streams the weights: twice the bandwidth, half the memory time
    # (the fixed per-step costs stay)
    assert slow["step"]["memory_ms"] / fast["step"]["memory_ms"] == pytest.approx(2.0, rel=0.05)
    assert slow["itl_ms"]["mean"] > fast["itl_ms"]["mean"]


# --------------------------------------------------------------------------- runs import, explain


def test_runs_import_stores_each_load_level(db, capsys) -> None:
    out = _json(
        capsys, ["runs", "import", str(DATA / "guidellm_report.json"), "--label", "gpu=h100"]
    )
    assert [r["load"] for r in out["runs"]] == ["concurrency 1", "concurrency 16", "concurrency 32"]
    listed = _json(capsys, ["runs", "list"])["runs"]
    assert {r["labels"]["source"] for r in listed} == {"guidellm"}
    assert all(r["labels"]["gpu"] == "h100" for r in listed)
    shown = _json(capsys, ["runs", "show", out["runs"][1]["run_id"]])
    assert shown["summary"]["ttft_ms"]["mean"] == pytest.approx(
        read_bench_file(DATA / "guidellm_report.json")[1].ttft_ms
    )
    detailed = _json(capsys, ["runs", "import", str(DATA / "vllm_c1.json")])
    assert detailed["runs"][0]["request_rows"] == 12
    rows = _json(capsys, ["runs", "show", detailed["runs"][0]["run_id"]])
    assert rows["summary"]["completed"] == 12
    assert main(["runs", "import", str(DATA / "make_fixtures.py")]) == 2
    assert len(_json(capsys, ["runs", "list"])["runs"]) == 4


def test_imported_runs_calibrate_and_explain(db, capsys) -> None:
    ids = [
        r["run_id"]
        for r in _json(capsys, ["runs", "import", str(DATA / "guidellm_report.json")])["runs"]
    ]
    out = _json(capsys, ["calibrate", "--name", "r", *DEP, "--run", ids[0], ids[1]])
    assert [p["source"] for p in out["provenance"]] == [f"run:{ids[0]}", f"run:{ids[1]}"]
    ex = _json(capsys, ["explain", ids[2], "--gpu", "h100"])
    assert ex["load"] == "concurrency 32" and ex["measured"]["ttft_ms"] > 0
    causes = {p["cause"] for p in ex["attribution"]}
    assert {"decode", "prefill", "queueing"} <= causes
    # the truth decodes slower than the published factors: the decode gap is positive
    decode = next(p for p in ex["attribution"] if p["cause"] == "decode")
    assert decode["ms"] > 0 and ex["gap_pct"]["itl_ms"] > 10
    calibrated = _json(capsys, ["explain", ids[2], "--calibration", "r"])
    assert abs(calibrated["gap_pct"]["itl_ms"]) < abs(ex["gap_pct"]["itl_ms"])
    assert main(["explain", ids[2]]) == 2  # no deployment: named
    assert "explain needs the deployment" in capsys.readouterr().err


def test_explain_names_outputs_that_stopped_early(db, capsys, tmp_path) -> None:
    from inferwise.probes.store import RunStore

    ids = [
        r["run_id"] for r in _json(capsys, ["runs", "import", str(DATA / "vllm_c4.json")])["runs"]
    ]
    with RunStore(db) as store:  # the run asked for 400 tokens and got 200
        store._conn.execute(
            "UPDATE runs SET config = json_set(config, '$.output_tokens', 400) WHERE run_id = ?",
            (ids[0],),
        )
        store._conn.commit()
    ex = _json(capsys, ["explain", ids[0], "--gpu", "h100"])
    mismatch = [p for p in ex["attribution"] if p["cause"] == "workload_mismatch"]
    assert mismatch and "stopped early" in mismatch[0]["evidence"][0]


def test_diagnose_and_plan_with_a_run(db, capsys, tmp_path) -> None:
    ids = [
        r["run_id"] for r in _json(capsys, ["runs", "import", str(DATA / "vllm_c4.json")])["runs"]
    ]
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"deployment": {"model": MODEL, "gpu": "h100-sxm-80gb"}}))
    diag = _json(capsys, ["diagnose", "--run", ids[0], "--workload", str(wl)])
    assert diag["explain"]["run_id"] == ids[0]
    plan = _json(capsys, ["plan", "--run", ids[0], "--workload", str(wl)])
    assert any(f"calibrated from run {ids[0]}" in a for a in plan["assumptions"])


# --------------------------------------------------------------------------- intervals and recommend


def _calibrate_c1_c4(capsys, name: str = "h100") -> None:
    assert main(["calibrate", "--name", name, *DEP, "--from-file", str(DATA / "vllm_c1.json"),
                 str(DATA / "vllm_c4.json")]) == 0  # fmt: skip
    capsys.readouterr()


def test_calibrated_intervals_are_its_residuals_and_widen_beyond_its_loads(db, capsys) -> None:
    """At a load it measured, a calibrated prediction's interval is its residuals' (at least
    the +-10 % a repeated probe moves); beyond, it widens to what calibrated predictions
    missed by on published sweeps, and the fixture's truth at concurrency 16 lies inside."""
    _calibrate_c1_c4(capsys)
    args = ["predict", *DEP, "--input-tokens", "1000", "--output-tokens", "200"]
    at4 = _json(capsys, [*args, "--concurrency", "4", "--calibration", "h100"])["intervals"]
    pub4 = _json(capsys, [*args, "--concurrency", "4"])["intervals"]
    for metric in ("ttft_ms", "itl_ms", "e2e_ms", "output_tokens_per_s"):
        cal, pub = at4[metric], pub4[metric]
        assert cal["regime"] == "calibration h100"
        assert cal["ratio_p10"] <= 0.9 and cal["ratio_p90"] >= 1.1
        assert cal["ratio_p90"] / cal["ratio_p10"] < pub["ratio_p90"] / pub["ratio_p10"], metric
    assert "at a load it measured" in at4["basis"]
    pred16 = _json(capsys, [*args, "--concurrency", "16", "--calibration", "h100"])
    at16 = pred16["intervals"]
    assert at16["itl_ms"]["regime"] == "calibration h100 (extrapolated load)"
    assert at16["itl_ms"]["ratio_p90"] > at4["itl_ms"]["ratio_p90"]
    truth = read_bench_file(DATA / "guidellm_report.json")[1]  # concurrency 16
    assert truth.concurrency == 16
    assert at16["itl_ms"]["low"] <= truth.itl_ms <= at16["itl_ms"]["high"]
    # an offline batch is no load the two closed-loop runs measured
    offline = _json(capsys, [*args, "--request-rate", "inf", "--calibration", "h100"])
    assert offline["intervals"]["ttft_ms"]["regime"].endswith("(extrapolated load)")


def test_budget_intervals_follow_the_calibration(db, capsys) -> None:
    _calibrate_c1_c4(capsys, "b")
    args = ["budget", *DEP, "--slo-e2e-ms", "p95=20000", "--request-rate", "1",
            "--input-tokens", "1000", "--output-tokens", "200", "--calibration", "b"]  # fmt: skip
    out = _json(capsys, args)["intervals"]
    assert out["ttft_ms"]["regime"].startswith("calibration b")
    assert out["output_tokens_per_s"] is None  # a budget predicts latencies


def test_recommend_uses_the_calibration_on_its_gpu_only(db, capsys) -> None:
    """Candidates on the calibrated GPU carry its name and its factors (the fixture's truth
    decodes slower than the published factors say); other GPUs keep the published ones."""
    _calibrate_c1_c4(capsys)
    args = ["recommend", "--model", MODEL, "--request-rate", "5", "--input-tokens", "1000",
            "--output-tokens", "200", "--slo-ttft-ms", "p95=800", "--top", "10"]  # fmt: skip
    cal = _json(capsys, [*args, "--gpus", "h100", "--calibration", "h100"])
    pub = _json(capsys, [*args, "--gpus", "h100"])
    assert cal["candidates"] and {c["calibration"] for c in cal["candidates"]} == {"h100"}
    assert all(c["calibration"] is None for c in pub["candidates"])
    assert any("calibration 'h100'" in a for a in cal["assumptions"])
    key = lambda c: (c["tensor_parallel_size"], c["quantization"], c["kv_cache_dtype"])  # noqa: E731
    pub_by = {key(c): c for c in pub["candidates"]}
    same = [(c, pub_by[key(c)]) for c in cal["candidates"] if key(c) in pub_by]
    assert any(c["tensor_parallel_size"] == 1 for c, _ in same)
    for c, p in same:
        if c["tensor_parallel_size"] == 1:  # the parallelism the fixture measured
            # its truth decodes over twice as slow as the published one-GPU H100 factors say
            assert c["predicted"]["itl_ms"]["p50"] > 1.5 * p["predicted"]["itl_ms"]["p50"]
    mixed = _json(capsys, [*args, "--gpus", "h100,l40s", "--calibration", "h100"])
    for c in mixed["candidates"]:
        assert c["calibration"] == ("h100" if c["gpu"] == "h100-sxm-80gb" else None), c["gpu"]
    # a calibration for a GPU the search leaves out is a mistake, named
    assert main([*args, "--gpus", "l40s", "--calibration", "h100"]) == 2
    assert "--calibration" in capsys.readouterr().err


def test_uniform_length_spread_keeps_the_means_and_desynchronises_a_closed_loop() -> None:
    """sglang.bench_serving's random dataset draws lengths from 1 to the given length;
    summarised as means, the spread is what keeps closed-loop clients from arriving in
    lockstep waves, so a summary point can say how its lengths were spread."""
    import numpy as np

    from inferwise.calculators.bench_files import MeasuredPoint
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import point_lengths

    base = dict(
        source="t", tool="vllm-bench", concurrency=32, num_requests=320,
        input_tokens_mean=2000.0, output_tokens_mean=300.0,
    )  # fmt: skip
    fixed = MeasuredPoint(**base)
    spread = MeasuredPoint(**base, length_spread="uniform")
    inp, out = point_lengths(spread)
    assert abs(inp.mean() / 2000 - 1) < 0.08 and abs(out.mean() / 300 - 1) < 0.08
    assert inp.min() >= 1 and inp.max() <= 2 * 2000 and np.ptp(out) > 400  # never past L
    assert len(set(point_lengths(fixed)[0].tolist())) == 1
    model = StepModel.from_deployment(Deployment(model=MODEL, gpu="h100-sxm-80gb"))
    ttft_fixed = simulate_point(model, fixed)["ttft_ms"]
    ttft_spread = simulate_point(model, spread)["ttft_ms"]
    assert ttft_spread < 0.8 * ttft_fixed  # waves no longer prefill together
    with pytest.raises(ValueError):
        MeasuredPoint(**base, length_spread="normal")


def test_a_rate_is_fitted_before_a_fixed_cost_that_explains_the_same_points() -> None:
    """SGLang's Qwen3-Coder-480B on 8x B200 (SGLang cookbook, tests/data/calibration_sweeps.toml):
    ITL grows from 9.9 ms alone to 20.5 ms at 16 clients because more experts are read per
    step. A per-sequence cost explains those two points as well as the bandwidth fraction
    does, but extrapolates them linearly: the fit takes the rate, and its ITL at 64 clients
    stays within 25 % of the measured 33.5 ms."""
    from bench.calibrate_accuracy import DEPLOYMENT, load_series, points_of
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import calibrated_efficiency, fit_deployment

    series = next(s for s in load_series() if s["id"] == "sglang-b200x8-qwen3-coder-480b-fp8")
    dep = Deployment(**{k: v for k, v in series.items() if k in DEPLOYMENT})
    published = StepModel.from_deployment(dep)
    points = points_of(series)
    fit = fit_deployment(
        lambda e: StepModel.from_deployment(dep, e), published.efficiency, points[:2]
    )
    assert "bandwidth_fraction" in fit.fitted and "per_seq_overhead_ms" not in fit.fitted
    calibrated = StepModel.from_deployment(
        dep, calibrated_efficiency(published.efficiency, fit.factors)
    )
    c64 = points[-1]
    assert c64.concurrency == 64
    itl = simulate_point(calibrated, c64)["itl_ms"]
    assert abs(itl / measured_values(c64)["itl_ms"] - 1) <= 0.25


def test_a_single_sequence_off_the_batched_line_is_its_own_factor() -> None:
    """llama.cpp's CPU backend steps one sequence in about half the time the line through
    batches 2-8 gives (bench/llamacpp_step_shape.py). Measured at concurrency 1 and 2 on a
    deployment that behaves so, the fit must read the 1 -> 2 jump as the single-sequence
    factor, not as a per-sequence slope, and so predict concurrency 8 from the line."""
    from dataclasses import replace

    from inferwise.calculators.bench_files import MeasuredPoint
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import calibrated_efficiency, fit_deployment

    dep = Deployment(model=MODEL, gpu="l4", max_num_seqs=8, max_model_len=4096)
    published = StepModel.from_deployment(dep)
    truth_eff = replace(published.efficiency, step_overhead_ms=6.0, single_seq_step_factor=0.5)
    truth = StepModel.from_deployment(dep, truth_eff)

    def measured(concurrency: int) -> MeasuredPoint:
        base = MeasuredPoint(
            source=f"c{concurrency}", tool="vllm-bench", concurrency=concurrency,
            num_requests=12 * concurrency, input_tokens_mean=200.0, output_tokens_mean=64.0,
        )  # fmt: skip
        return base.model_copy(update=simulate_point(truth, base))

    fit = fit_deployment(
        lambda e: StepModel.from_deployment(dep, e),
        published.efficiency,
        [measured(1), measured(2)],
    )
    assert "single_seq_step_factor" in fit.fitted
    assert "per_seq_overhead_ms" not in fit.fitted
    factor = fit.factors.efficiency["single_seq_step_factor"]
    assert 0.4 <= factor <= 0.6
    calibrated = StepModel.from_deployment(
        dep, calibrated_efficiency(published.efficiency, fit.factors)
    )
    c8 = measured(8)
    itl = simulate_point(calibrated, c8)["itl_ms"]
    assert abs(itl / measured_values(c8)["itl_ms"] - 1) <= 0.10
    assert any("single sequence" in w for w in fit.warnings)


def test_the_single_sequence_factor_scales_only_a_lone_decode_step() -> None:
    from dataclasses import replace

    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel

    dep = Deployment(model=MODEL, gpu="h100-sxm-80gb")
    base = StepModel.from_deployment(dep)
    half = base.with_efficiency(replace(base.efficiency, single_seq_step_factor=0.5))
    assert half.step_ms(0, 1, 1000) == pytest.approx(0.5 * base.step_ms(0, 1, 1000))
    assert half.step_ms(0, 2, 2000) == pytest.approx(base.step_ms(0, 2, 2000))
    assert half.step_ms(500, 1, 1000) == pytest.approx(base.step_ms(500, 1, 1000))
    line = half.decode_line(1)
    assert line.fixed == pytest.approx(0.5 * base.decode_line(1).fixed)
    # without CUDA graphs the host's dispatch floor stays: the simulator's decode line and
    # the step model agree on it
    eager = replace(half, enforce_eager=True)
    line = eager.decode_line(1)
    from_line = max(line.c0 + line.c1 * 1000, line.m0 + line.m1 * 1000, line.floor) + line.fixed
    assert from_line == pytest.approx(eager.step_ms(0, 1, 1000))
    assert eager.step_ms(0, 1, 1000) >= eager.eager_floor_ms()


def test_a_calibrated_compute_rate_carries_an_early_generations_attention_rate_with_it() -> None:
    """Under an early kernel generation (DeepSeek-R1 with vLLM 0.8.4) attention keeps its own
    rate beside the scaled GEMM rate. A user calibration that moves the compute rate must
    move that one in proportion and store it, as every other deployment's attention (which
    follows compute_fraction) moves with it; otherwise the calibrated model would price the
    same measured prefill differently in the two cases."""
    from inferwise.calculators.deployment import Deployment
    from inferwise.calculators.roofline import StepModel
    from inferwise.calculators.user_calibration import (
        CalibratedFactors,
        _efficiency_at,
        calibrated_efficiency,
    )

    early = Deployment(
        model="deepseek-ai/DeepSeek-R1", gpu="h200", tensor_parallel_size=8, engine_version="0.8.4"
    )
    start = StepModel.from_deployment(early).efficiency
    assert start.attention_compute_fraction is not None
    moved = _efficiency_at(start, {"compute_fraction": 1.5 * start.compute_fraction})
    ratio = moved.attention_fraction / start.attention_fraction
    assert ratio == pytest.approx(1.5)
    stored = CalibratedFactors(efficiency=moved.describe(), request_overhead_ms=0.0)
    assert calibrated_efficiency(start, stored).attention_fraction == pytest.approx(
        moved.attention_fraction
    )
    today = StepModel.from_deployment(Deployment(model=MODEL, gpu="h100-sxm-80gb")).efficiency
    assert "attention_compute_fraction" not in today.describe()
    halved = _efficiency_at(today, {"compute_fraction": 0.5 * today.compute_fraction})
    assert halved.attention_fraction == pytest.approx(0.5 * today.compute_fraction)
