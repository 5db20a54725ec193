"""Prometheus text parsing and the engine-name normaliser, against recorded /metrics pages."""

from __future__ import annotations

import asyncio
import contextlib
import math
from pathlib import Path

import httpx
import pytest

from inferwise.probes.prom import (
    PrometheusFormatError,
    concept_names,
    detect_engine,
    normalize,
    parse_prometheus,
    scrape_loop,
    storable,
)

DATA = Path(__file__).parent / "data" / "metrics"


def _page(name: str) -> list:
    return parse_prometheus((DATA / name).read_text())


def test_vllm_v1_page():
    samples = _page("vllm_v1.txt")
    assert detect_engine(samples) == "vllm"
    c = normalize(samples)
    assert c["requests_running"] == 48 and c["requests_waiting"] == 17
    assert c["kv_cache_usage"] == pytest.approx(0.8734)
    assert c["prefix_cache_hits"] == 764640 and c["prefix_cache_queries"] == 1.2744e6
    assert c["preemptions"] == 12
    ttft = [s for s in samples if s.family == "vllm:time_to_first_token_seconds"]
    assert {s.type for s in ttft} == {"histogram"}
    inf = [s for s in ttft if s.labels.get("le") == "+Inf"]
    assert len(inf) == 1 and inf[0].value == 1274
    assert any(
        s.name == "vllm:request_success_total" and s.labels["finished_reason"] == "length"
        for s in samples
    )


def test_vllm_v0_names_map_to_the_same_concepts():
    c = normalize(_page("vllm_v0.txt"))
    assert c["kv_cache_usage"] == pytest.approx(0.6125)
    assert c["prefix_cache_hit_rate"] == pytest.approx(0.4183)
    assert c["preemptions"] == 7 and c["requests_running"] == 31 and c["requests_waiting"] == 4
    cfg = [s for s in _page("vllm_v0.txt") if s.name == "vllm:cache_config_info"][0]
    assert cfg.labels["num_gpu_blocks"] == "27215"


def test_sglang_page():
    samples = _page("sglang.txt")
    assert detect_engine(samples) == "sglang"
    c = normalize(samples)
    assert c["requests_running"] == 162 and c["requests_waiting"] == 2826
    assert c["kv_cache_usage"] == pytest.approx(0.28)
    assert c["prefix_cache_hit_rate"] == pytest.approx(0.0075, abs=1e-4)
    assert c["generation_tokens"] == 7557572
    assert "preemptions" not in c  # not reported: absent, not zero


def test_sglang_retractions_are_preemptions():
    text = (
        "# TYPE sglang:num_retracted_requests_total counter\n"
        'sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 4.0\n'
        "# TYPE sglang:num_retracted_reqs gauge\n"
        'sglang:num_retracted_reqs{model_name="m",tp_rank="0"} 1.0\n'
    )
    assert normalize(parse_prometheus(text))["preemptions"] == 4
    older = (
        'sglang:total_retracted_reqs{model_name="m"} 9\nsglang:num_running_reqs{model_name="m"} 1\n'
    )
    assert normalize(parse_prometheus(older))["preemptions"] == 9


def test_llamacpp_page():
    samples = _page("llamacpp.txt")
    assert detect_engine(samples) == "llamacpp"
    c = normalize(samples)
    assert c["requests_running"] == 4 and c["requests_waiting"] == 3
    assert c["kv_cache_usage"] == pytest.approx(0.4375) and c["kv_cache_tokens"] == 1792
    assert c["prompt_tokens"] == 6886 and c["generation_tokens"] == 3469
    assert all(s.labels == {} for s in samples)


def test_recorded_llamacpp_page_under_load():
    """A real llama-server (llama-cpp-python 0.3.36's vendored build): 2 slots busy, 3 requests deferred."""
    samples = _page("llamacpp_recorded.txt")
    c = normalize(samples)
    assert c["requests_running"] == 2 and c["requests_waiting"] == 3
    assert "kv_cache_usage" not in c  # this build dropped the KV gauges
    assert c["prefix_cache_hits"] == 0 and c["prefix_cache_queries"] == c["prompt_tokens"] == 288
    assert {s.type for s in samples if s.name.endswith("_total")} == {"counter"}


def test_newer_llamacpp_without_kv_gauges_has_no_kv_concept():
    text = "\n".join(
        line for line in (DATA / "llamacpp.txt").read_text().splitlines() if "kv_cache" not in line
    )
    c = normalize(parse_prometheus(text))
    assert "kv_cache_usage" not in c and c["requests_running"] == 4


def test_escapes_special_values_timestamps_and_comments():
    text = (
        "# a free comment\n"
        "# HELP m A help with \\\\ and \\n escapes\n"
        "# TYPE m gauge\n"
        'm{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",comma="x,y}z"} 1.5 1700000000000\n'
        "m{} +Inf\n"
        "m -Inf\n"
        "m NaN\n"
        'm{a="1",} 2e-3\n'
        "# EOF\n"
    )
    s = parse_prometheus(text)
    assert s[0].labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "comma": "x,y}z"}
    assert s[0].value == 1.5 and s[0].timestamp_ms == 1700000000000 and s[0].type == "gauge"
    assert s[1].value == math.inf and s[2].value == -math.inf and math.isnan(s[3].value)
    assert s[4].labels == {"a": "1"} and s[4].value == pytest.approx(0.002)


def test_nan_values_do_not_enter_concepts():
    c = normalize(
        parse_prometheus('vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:num_requests_running 2\n')
    )
    assert "kv_cache_usage" not in c and c["requests_running"] == 2


def test_data_parallel_engines_are_folded():
    text = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 5\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.6\n'
    )
    c = normalize(parse_prometheus(text))
    assert c["requests_running"] == 8 and c["kv_cache_usage"] == pytest.approx(0.4)


@pytest.mark.parametrize(
    "body",
    [
        "<!doctype html><html><body>Not found</body></html>",
        '{"error": "no"}',
        "metric_without_value\n",
        'm{a="unterminated} 1\n',
        "m 12abc\n",
        "m{a=1} 2\n",
    ],
)
def test_non_prometheus_bodies_are_rejected(body):
    with pytest.raises(PrometheusFormatError):
        parse_prometheus(body)


def test_storable_drops_buckets_and_other_prefixes():
    kept = storable(_page("vllm_v1.txt"))
    names = {s.name for s in kept}
    assert "vllm:num_requests_running" in names and "vllm:time_to_first_token_seconds_sum" in names
    assert not any(
        n.endswith("_bucket") or n.endswith("_created") or n.startswith("python_") for n in names
    )
    assert "llamacpp:requests_deferred" in concept_names("llamacpp")


# ----------------------------------------------------------------- the scrape loop, against the simulator


def _collect(url: str, interval_s: float = 0.05, run_for_s: float = 0.4, **kw):
    got: list = []

    async def main():
        stop = asyncio.Event()

        async def sink(t_s, samples):
            got.append((t_s, samples))

        async with httpx.AsyncClient() as client:
            task = asyncio.create_task(scrape_loop(client, url, interval_s, sink, stop, **kw))
            await asyncio.sleep(run_for_s)
            stop.set()
            return await asyncio.wait_for(task, 5)

    return asyncio.run(main()), got


def test_scrape_loop_collects_the_simulators_metrics():
    from inferwise.probes.sim import SimServer

    with SimServer() as sim:
        report, got = _collect(sim.base_url + "/metrics")
    assert report.scrapes >= 3 and not report.stopped_early and report.engine == "vllm"
    assert report.last["requests_running"] == 0 and report.last["requests_waiting"] == 0
    times = [t for t, _ in got]
    assert times == sorted(times)
    assert all(
        s.name.startswith("vllm:") and not s.name.endswith("_bucket") for _, ss in got for s in ss
    )


def test_scrape_loop_stops_with_a_note_on_404_and_non_prometheus_bodies():
    from inferwise.probes.sim import SimServer

    with SimServer() as sim:
        report, got = _collect(sim.base_url + "/no-metrics-here")
        assert report.stopped_early and "404" in report.note and not got
        report, got = _collect(sim.base_url + "/v1/models")
        assert report.stopped_early and "not Prometheus" in report.note and not got


def test_scrape_loop_gives_up_on_a_closed_port():
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    report, got = _collect(
        f"http://127.0.0.1:{port}/metrics",
        interval_s=0.05,
        run_for_s=0.8,
        max_consecutive_failures=3,
    )
    assert (
        report.stopped_early
        and report.failures == 3
        and "failed scrapes" in report.note
        and not got
    )


# ----------------------------------------------------------------- property: what an exporter writes, we read back

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
_label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    name=_names,
    labels=st.dictionaries(_label_names, st.text(max_size=20), max_size=4),
    value=st.floats(allow_nan=False),
)
def test_exposition_round_trip(name, labels, value):
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    line = f"{name}{{{body}}} {value!r}\n" if labels else f"{name} {value!r}\n"
    (s,) = parse_prometheus(f"# TYPE {name} gauge\n" + line)
    assert s.name == name and s.labels == labels and s.value == value and s.type == "gauge"


def test_scrape_loop_counts_http_errors_in_a_row_and_a_good_page_resets_the_count():
    from types import SimpleNamespace

    good = "vllm:num_requests_running 1\n"
    pages = [(503, ""), (503, ""), (200, good), (500, ""), (503, ""), (502, ""), (200, good)]

    class Client:
        @contextlib.asynccontextmanager
        async def stream(self, method, url, timeout, headers, extensions):
            status, text = pages.pop(0)

            async def aiter_raw():
                yield text.encode()

            yield SimpleNamespace(
                status_code=status, encoding="utf-8", headers={}, aiter_raw=aiter_raw
            )

    async def main():
        got = []

        def sink(t_s, samples):
            got.append(samples)

        report = await scrape_loop(
            Client(), "http://x/metrics", 0.0, sink, asyncio.Event(), max_consecutive_failures=3
        )
        return report, got

    report, got = asyncio.run(main())
    assert len(got) == 1 and report.scrapes == 1 and report.failures == 5
    assert (
        report.stopped_early and report.note == "stopped after 3 failed scrapes in a row (HTTP 502)"
    )
    assert pages == [(200, good)]

    pages[:] = [(200, "")]
    report, got = asyncio.run(main())
    assert report.stopped_early and "empty" in report.note and not got
