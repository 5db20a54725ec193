"""`inferwise report`: reports of runs measured against the simulated engine (one run, a
sweep, several runs with the `runs compare` verdicts), the calculators' reports, the
page's self-containment, and a real browser rendering it (headless Chromium)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from inferwise.server.cli import main
from inferwise.server.reports import Report, build_report

SLO = ["--slo", "ttft_ms=60", "--slo", "e2e_ms=250"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_HTML_BYTES = 5 * 1024 * 1024


def _probe(url: str, db: str, *extra: str) -> dict:
    argv = [
        "probe",
        url,
        "--requests",
        "24",
        "--input-tokens",
        "24",
        "--output-tokens",
        "12",
        "--metrics-interval-s",
        "0.05",
        "--db",
        db,
        *SLO,
        "--json",
        *extra,
    ]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Two single runs (2 and 8 streams on 4 engine slots) and a 3-point concurrency sweep,
    all against the simulated engine on 127.0.0.1, with /metrics scraped."""
    from inferwise.probes.sim import SimServer

    db = str(tmp_path_factory.mktemp("report") / "runs.db")
    with SimServer(ttft_ms=15, itl_ms=3, max_num_seqs=4) as sim:
        a = _probe(sim.base_url, db, "--concurrency", "2", "--label", "variant=a")
        b = _probe(sim.base_url, db, "--concurrency", "8", "--label", "variant=b")
        sweep = _probe(sim.base_url, db, "--concurrency", "1", "--sweep", "1,4,12")
    return {
        "db": db,
        "a": a["run_id"],
        "b": b["run_id"],
        "sweep": [p["run_id"] for p in sweep["sweep"]],
        "sweep_result": sweep,
    }


def _self_contained(report: Report) -> None:
    """Figures inline, no external resource (src/href/url() to http), no script, < 5 MB."""
    html = report.html
    assert len(html.encode("utf-8")) < MAX_HTML_BYTES
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html, re.I)
    assert "<script" not in html.lower() and "<link" not in html.lower()
    for f in report.figures:
        assert f.png.startswith(PNG_MAGIC) and len(f.png) > 5_000, f.name
        assert f'id="fig-{f.name}"' in html
    assert html.count('src="data:image/png;base64,') == len(report.figures)


def test_one_run_shows_distributions_timeline_engine_metrics_and_client_health(runs) -> None:
    report = build_report([runs["a"]], runs["db"])
    assert report.kind == "run" and report.run_ids == [runs["a"]]
    names = [f.name for f in report.figures]
    assert names == [
        f"latency-cdf-{runs['a']}",
        f"timeline-{runs['a']}",
        f"engine-metrics-{runs['a']}",
    ]
    _self_contained(report)
    assert "Client health" in report.html and "SLO" in report.html
    # the id is a hash of the inputs: the same run gives the same id, a prefix resolves to it
    assert build_report([runs["a"][:-1]], runs["db"]).report_id == report.report_id


def test_a_sweep_point_brings_its_sweep_with_the_knee_marked(runs) -> None:
    report = build_report([runs["sweep"][-1]], runs["db"])
    assert report.kind == "sweep"
    assert all(run_id in report.html for run_id in runs["sweep"])
    names = [f.name for f in report.figures]
    assert any(n.endswith("-latency") for n in names) and any(n.endswith("-goodput") for n in names)
    assert "Knee, by the highest goodput" in report.html
    _self_contained(report)


def test_several_runs_are_overlaid_with_the_runs_compare_verdicts(runs) -> None:
    from inferwise.probes.runs import CompareRunsRequest, compare_runs

    ids = [runs["a"], runs["b"], runs["sweep"][0]]
    report = build_report(ids, runs["db"])
    assert report.kind == "runs"
    names = {f.name for f in report.figures}
    assert {"overlay-latency-cdf", "overlay-sweep-latency", "overlay-sweep-goodput"} <= names
    _self_contained(report)
    compared = compare_runs(CompareRunsRequest(run_ids=ids, db=runs["db"]))
    expected = [m.verdict for c in compared.candidates for m in c.metrics]
    shown = re.findall(r'class="(?:better|worse|noise)">([a-z ]+)</td>', report.html)
    assert shown[: len(expected)] == expected
    for cand in compared.candidates:
        assert f"{cand.run_id} vs baseline {runs['a']}" in report.html
    first = compared.candidates[0]
    # 8 streams on 4 slots queue: TTFT worse than at 2, as `runs compare` says
    assert "ttft_ms.p50" in first.worse


def test_cli_writes_the_page_and_the_pngs(runs, tmp_path, capsys) -> None:
    page, pngs = tmp_path / "r.html", tmp_path / "png"
    argv = ["report", runs["a"], "-o", str(page), "--png", str(pngs), "--db", runs["db"], "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == str(page) and page.stat().st_size == out["html_bytes"] < MAX_HTML_BYTES
    files = sorted(p.name for p in pngs.iterdir())
    assert files == sorted(f["name"] + ".png" for f in out["figures"]) and len(files) == 3
    assert all((pngs / f).read_bytes().startswith(PNG_MAGIC) for f in files)
    assert main(["runs", "show", runs["a"], "--db", runs["db"]]) == 0
    assert f"inferwise report {runs['a']}" in capsys.readouterr().out


def test_probe_output_points_to_the_report(runs) -> None:
    from inferwise.probes.runner import ProbeResult
    from inferwise.server.render import render

    res = ProbeResult.model_validate(runs["sweep_result"])
    pointer = [
        line for line in render("probe.md.j2", res).splitlines() if "inferwise report" in line
    ]
    assert pointer == [
        f"Figures in one HTML page: `inferwise report {res.run_id} -o report-{res.run_id}.html "
        f"--db {res.db_path}` (the whole sweep, knee marked)."
    ]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["report", "20990101-000000-beef", "-o", "x.html"], "unknown run"),
        (["report", "latest"], "-o FILE.html and/or --png DIR"),
        (["report", "latest", "-o", ""], "an empty path"),  # not "written: nothing", exit 0
        (["report"], "required"),
    ],
)
def test_bad_input_exits_2_with_one_line(runs, capsys, argv, needle, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--db", runs["db"]]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x.html").exists()


def test_fit_recommend_and_predict_reports() -> None:
    from inferwise.calculators.fit import FitRequest, estimate_fit
    from inferwise.calculators.predict import PredictRequest, predict_performance
    from inferwise.calculators.recommend.result import RecommendResult
    from inferwise.server.reports import fit_report, predict_report, recommend_report

    fit = fit_report(
        estimate_fit(
            FitRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100", max_model_len=8192)
        )
    )
    assert [f.name for f in fit.figures] == ["fit-memory"] and "KV cache" in fit.html
    pred = predict_performance(
        PredictRequest(
            model="meta-llama/Llama-3.1-8B-Instruct",
            gpu="h100",
            input_tokens=64,
            output_tokens=16,
            concurrency=4,
        )
    )
    p = predict_report(pred)
    assert [f.name for f in p.figures] == ["predict-latency"] and p.report_id == predict_report(
        pred
    ).report_id
    rec = RecommendResult.model_validate_json(
        (Path(__file__).parent / "data" / "report_recommend.json").read_text()
    )
    r = recommend_report(rec)
    assert [f.name for f in r.figures] == ["recommend-pareto", "recommend-cost"]
    for report in (fit, p, r):
        _self_contained(report)


def test_predict_report_sets_the_prediction_beside_a_measured_run(runs) -> None:
    from inferwise.calculators.predict import PredictRequest, predict_performance
    from inferwise.server.reports import predict_report

    pred = predict_performance(
        PredictRequest(
            model="meta-llama/Llama-3.1-8B-Instruct",
            gpu="h100",
            input_tokens=24,
            output_tokens=12,
            concurrency=2,
        )
    )
    report = predict_report(pred, run=runs["a"], db=runs["db"])
    assert "Predicted vs measured latency" in report.html and runs["a"] in report.html


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_a_real_browser_renders_the_report(runs, tmp_path) -> None:
    """Headless Chromium renders the page from file:// (no network): the screenshot is not
    blank, and the figures' own colours (matplotlib's blue and green lines, which the CSS
    never uses) are on it, so the inline PNGs were decoded and drawn.

    INFERWISE_REPORT_SCREENSHOT=path keeps a small copy of the screenshot (the README's)."""
    import numpy as np
    from PIL import Image

    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium)")
    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    page.write_text(build_report([runs["b"]], runs["db"]).html, encoding="utf-8")
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1200,2000",
        page.resolve().as_uri(),
    ]
    subprocess.run(cmd, check=False, capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    assert pixels.shape[:2] == (2000, 1200)
    non_white = (pixels.sum(axis=2) < 720).mean()
    colours = len(np.unique((pixels // 16).reshape(-1, 3), axis=0))
    assert non_white > 0.05 and colours > 20, (non_white, colours)
    for rgb in ((31, 119, 180), (44, 160, 44)):  # the timeline's waiting and streaming bars
        near = (np.abs(pixels - np.array(rgb)).sum(axis=2) < 40).sum()
        assert near > 500, (rgb, near)
    keep = os.environ.get("INFERWISE_REPORT_SCREENSHOT")
    if keep:
        small = Image.open(shot).convert("RGB").resize((600, 1000), Image.LANCZOS)
        small.quantize(colors=128).save(keep, optimize=True)


def _point(offered: float, rps: float, p95_ms: float, goodput: float | None):
    from inferwise.server.reports.sweep import LoadPoint

    lat = {
        m: {"p50": p95_ms / 2, "p95": p95_ms, "p99": p95_ms * 1.2}
        for m in ("ttft_ms", "itl_ms", "e2e_ms")
    }
    return LoadPoint(f"r{offered:g}", offered, rps, rps * 100, goodput, lat)


def test_the_knee_is_the_start_of_the_goodput_plateau_or_where_latency_outruns_throughput() -> None:
    from inferwise.server.reports.sweep import knee

    plateau = [
        _point(1, 10, 100, 10),
        _point(2, 19, 110, 19),
        _point(4, 30, 150, 29.8),
        _point(8, 31, 900, 30),
    ]
    k = knee(plateau)
    assert (k.index, k.reached) == (2, True) and "goodput" in k.rule
    no_slo = [_point(1, 10, 100, None), _point(2, 19, 120, None), _point(4, 21, 400, None)]
    k = knee(no_slo)
    assert (k.index, k.reached) == (1, True) and "P95 E2E" in k.rule
    linear = [_point(1, 10, 100, None), _point(2, 20, 101, None)]
    assert knee(linear).reached is False and knee(linear[:1]) is None


def test_a_page_past_the_figure_budget_leaves_the_last_figures_out_and_says_so() -> None:
    from inferwise.server.reports.html import FIGURE_BUDGET_BYTES, fit_page
    from inferwise.server.reports.model import Figure, Section

    big = Figure("f", "f", b"x" * (FIGURE_BUDGET_BYTES // 2))
    sections = [
        Section("a", figures=[big]),
        Section("b", figures=[big]),
        Section("c", figures=[big]),
    ]
    kept = fit_page(sections)
    assert [len(s.figures) for s in kept] == [1, 0, 0]
    assert "left out of this page" in kept[2].notes[0]


def test_a_run_whose_requests_all_failed_still_reports(tmp_path) -> None:
    from conftest import failed_records, store_run

    db = tmp_path / "runs.db"
    run_id = store_run(
        db, failed_records({"http_5xx": 5, "connect_refused": 2}, 0), config={"concurrency": 2}
    )
    report = build_report([run_id], str(db))
    assert [f.name for f in report.figures] == [f"latency-cdf-{run_id}", f"timeline-{run_id}"]
    assert "http_5xx" in report.html and "No engine metrics were scraped" in report.html
    _self_contained(report)


def test_the_mcp_tool_returns_the_figures_as_images_and_the_page_as_a_resource(
    runs, monkeypatch
) -> None:
    """render_report: PNG image content a client can show, a resource link, and the page
    read back through inferwise://reports/{id}; an unknown id is a resource error."""
    import asyncio
    import base64

    from mcp.client import Client

    from inferwise.server.mcp_server import build_server

    monkeypatch.setenv("INFERWISE_DB", runs["db"])

    async def go():
        async with Client(build_server()) as client:
            reply = await client.call_tool("render_report", {"run_ids": [runs["a"], runs["b"]]})
            link = next(c for c in reply.content if c.type == "resource_link")
            page = await client.read_resource(link.uri)
            try:
                await client.read_resource("inferwise://reports/0000000000000000")
                missing = None
            except Exception as exc:  # noqa: BLE001 - the SDK raises the server's error
                missing = str(exc)
            return reply, link, page, missing

    reply, link, page, missing = asyncio.run(go())
    assert not reply.is_error
    images = [c for c in reply.content if c.type == "image"]
    assert images and all(c.mime_type == "image/png" for c in images)
    assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    out = reply.structured_content
    assert link.uri == out["resource_uri"] == f"inferwise://reports/{out['report_id']}"
    assert out["kind"] == "runs" and len(out["figures"]) >= len(images)
    html = page.contents[0].text
    assert (
        html.lstrip().lower().startswith("<!doctype html")
        and len(html.encode()) == out["html_bytes"]
    )
    assert missing and "render it again" in missing


def test_calculator_commands_write_their_report_with_report(tmp_path, capsys) -> None:
    fit_page, pred_page = tmp_path / "fit.html", tmp_path / "predict.html"
    base = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l4"]
    assert main(["fit", *base, "--max-model-len", "8192", "--report", str(fit_page)]) == 0
    assert main(["predict", *base, "--max-model-len", "8192", "--input-tokens", "200", "--output-tokens", "20",
                 "--concurrency", "2", "--report", str(pred_page)]) == 0  # fmt: skip
    for page in (fit_page, pred_page):
        html = page.read_text()
        assert "data:image/png;base64," in html and "http://" not in html.split("<body", 1)[1]
    assert "report: " in capsys.readouterr().err
    assert main(["fit", *base, "--report", str(tmp_path / "no" / "x.html")]) == 2
