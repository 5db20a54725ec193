"""The simulated engine speaks the OpenAI streaming API the way real servers do, and never crashes."""

from __future__ import annotations

import json

import httpx
import pytest

from inferwise.probes.sim import SimConfig, SimServer
from inferwise.probes.sim_engine import CHAT_TOKENS_PER_MESSAGE, CHAT_TOKENS_REPLY_PRIMER, tokenize


@pytest.fixture(scope="module")
def sim():
    with SimServer(ttft_ms=5, itl_ms=2, max_num_seqs=8) as server:
        yield server


def _events(text: str) -> list[str]:
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]


def test_chat_stream_is_well_formed_with_usage(sim):
    body = {
        "model": "inferwise/sim",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello, world!"},
        ],
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(
        sim.base_url + "/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": "api-1"},
        timeout=10,
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    assert docs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [d for d in docs if d["choices"] and d["choices"][0]["delta"].get("content")]
    assert len(content) == 7
    finish = [d for d in docs if d["choices"] and d["choices"][0]["finish_reason"]]
    assert [d["choices"][0]["finish_reason"] for d in finish] == ["length"]
    usage_docs = [d for d in docs if "usage" in d]
    assert len(usage_docs) == 1 and usage_docs[0]["choices"] == []
    expected_prompt = (
        len(tokenize("Be brief."))
        + len(tokenize("Hello, world!"))
        + 2 * CHAT_TOKENS_PER_MESSAGE
        + CHAT_TOKENS_REPLY_PRIMER
    )
    assert usage_docs[0]["usage"] == {
        "prompt_tokens": expected_prompt,
        "completion_tokens": 7,
        "total_tokens": expected_prompt + 7,
    }
    text = "".join(d["choices"][0]["delta"]["content"] for d in content)
    assert len(tokenize(text)) == 7  # one token per word, so a client can count
    entry = sim.send_log["api-1"]
    assert sum(k for _, k in entry.chunks) == 7 and entry.prompt_tokens == expected_prompt


def test_completions_stream_and_tokens_per_chunk():
    with SimServer(ttft_ms=1, itl_ms=1, tokens_per_chunk=3) as server:
        body = {
            "prompt": "one two three four",
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=10)
        docs = [json.loads(e) for e in _events(r.text)[:-1]]
        texts = [d["choices"][0]["text"] for d in docs if d["choices"] and d["choices"][0]["text"]]
        assert [len(tokenize(t)) for t in texts] == [3, 3, 2]
        assert all(d["object"] == "text_completion" for d in docs)
        assert (
            docs[-1]["usage"]["prompt_tokens"] == 4 and docs[-1]["usage"]["completion_tokens"] == 8
        )
        # per-chunk usage counts the tokens so far
        per_chunk = [
            d["usage"]["completion_tokens"]
            for d in docs
            if d["choices"] and d["choices"][0]["text"]
        ]
        assert per_chunk == [3, 6, 8]


def test_non_streaming_answers(sim):
    r = httpx.post(
        sim.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=10,
    )
    doc = r.json()
    assert doc["object"] == "chat.completion"
    assert doc["usage"]["completion_tokens"] == 4
    assert len(tokenize(doc["choices"][0]["message"]["content"])) == 4
    r = httpx.post(
        sim.base_url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=10
    )
    assert r.json()["usage"]["prompt_tokens"] == 3


def test_min_tokens_and_ignore_eos_override_simulated_eos():
    with SimServer(ttft_ms=1, itl_ms=1, eos_mean_tokens=2, seed=3) as server:

        def run(extra):
            body = {"prompt": "x", "max_tokens": 40, **extra}
            return httpx.post(server.base_url + "/v1/completions", json=body, timeout=10).json()

        natural = [run({}) for _ in range(20)]
        assert any(d["choices"][0]["finish_reason"] == "stop" for d in natural)
        assert all(
            d["usage"]["completion_tokens"] < 40 or d["choices"][0]["finish_reason"] == "length"
            for d in natural
        )
        assert run({"ignore_eos": True})["usage"]["completion_tokens"] == 40
        assert all(run({"min_tokens": 30})["usage"]["completion_tokens"] >= 30 for _ in range(5))


@pytest.mark.parametrize(
    ("path", "payload", "status", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        ("/v1/chat/completions", b"[1, 2]", 400, None),
        ("/v1/chat/completions", json.dumps({"messages": []}).encode(), 400, "messages"),
        (
            "/v1/chat/completions",
            json.dumps({"messages": [{"content": "x"}]}).encode(),
            400,
            "messages",
        ),
        (
            "/v1/completions",
            json.dumps({"prompt": "x", "max_tokens": 0}).encode(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json.dumps({"prompt": "x", "max_tokens": "many"}).encode(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json.dumps({"prompt": "x", "max_tokens": 10**9}).encode(),
            400,
            "max_tokens",
        ),
        ("/v1/completions", json.dumps({"prompt": {"a": 1}}).encode(), 400, "prompt"),
        ("/v1/completions", json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n"),
        ("/v1/completions", json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400, "stream"),
        ("/v1/completions", b"\xff\xfe", 400, None),
        ("/v1/nothing", b"{}", 404, None),
    ],
)
def test_bad_requests_get_openai_errors_and_server_survives(sim, path, payload, status, param):
    r = httpx.post(
        sim.base_url + path,
        content=payload,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["param"] == param
    assert httpx.get(sim.base_url + "/health", timeout=5).status_code == 200


def test_get_on_completions_is_405(sim):
    assert httpx.get(sim.base_url + "/v1/completions", timeout=5).status_code == 405


def test_models_endpoint(sim):
    data = httpx.get(sim.base_url + "/v1/models", timeout=5).json()["data"]
    assert [m["id"] for m in data] == ["inferwise/sim"]


def test_config_refuses_remote_host_and_bad_fault_mix():
    from inferwise.calculators.errors import InputError

    with pytest.raises(InputError, match="loopback"):
        SimServer(host="0.0.0.0")
    with pytest.raises(ValueError, match="fault rates"):
        SimConfig(fault_429_rate=0.6, fault_503_rate=0.6)
    with pytest.raises(ValueError, match="--gpu"):
        SimConfig(model="Qwen/Qwen3-8B")


def test_model_names_are_checked_only_when_strict(sim):
    body = {"model": "gpt-9", "prompt": "x", "max_tokens": 2}
    assert httpx.post(sim.base_url + "/v1/completions", json=body, timeout=10).status_code == 200
    with SimServer(strict_model_name=True) as strict:
        r = httpx.post(strict.base_url + "/v1/completions", json=body, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        body["model"] = "inferwise/sim"
        assert (
            httpx.post(strict.base_url + "/v1/completions", json=body, timeout=10).status_code
            == 200
        )


def test_small_answers_are_not_held_back_by_nagle():
    """Headers and body go out in two writes; without TCP_NODELAY each answer waited ~40 ms for an ACK."""
    import statistics
    import time

    with (
        SimServer(ttft_ms=0, itl_ms=0, itl_per_seq_ms=0) as server,
        httpx.Client(base_url=server.base_url) as c,
    ):
        c.get("/health")
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            times.append((time.perf_counter() - t0) * 1000)
    assert statistics.median(times) < 20, times


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_inferwise_sim_command_serves_and_stops_cleanly(sig):
    import re
    import signal
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "inferwise.server",
        "sim",
        "--port",
        "0",
        "--ttft-ms",
        "5",
        "--itl-ms",
        "1",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        port = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line).group(1)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"prompt": "x", "max_tokens": 3},
            timeout=10,
        )
        assert r.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=15) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_reasoning_tokens_stream_as_reasoning_content_first():
    with SimServer(ttft_ms=1, itl_ms=1, reasoning_tokens=3) as server:
        body = {"messages": [{"role": "user", "content": "think"}], "max_tokens": 5, "stream": True}
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=10)
        deltas = [json.loads(e)["choices"][0]["delta"] for e in _events(r.text)[:-1]]
        kinds = [next(iter(d)) for d in deltas[1:] if d]
        assert kinds == ["reasoning_content"] * 3 + ["content"] * 2
        whole = httpx.post(
            server.base_url + "/v1/chat/completions", json={**body, "stream": False}, timeout=10
        )
        msg = whole.json()["choices"][0]["message"]
        assert len(tokenize(msg["reasoning_content"])) == 3 and len(tokenize(msg["content"])) == 2


def test_error_fault_sends_an_error_object_mid_stream():
    with SimServer(ttft_ms=1, itl_ms=1, fault_error_rate=1.0) as server:
        body = {"prompt": "x", "max_tokens": 8, "stream": True}
        r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=10)
        events = _events(r.text)
        assert r.status_code == 200 and events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == 500 and err["message"]
        assert 1 <= len(events) - 2 < 8  # some tokens came before the error
        r = httpx.post(
            server.base_url + "/v1/completions", json={**body, "stream": False}, timeout=10
        )
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
