"""The engine itself, read with plain httpx: the ground the probe tests stand on.

If these fail, the probe tests below them mean nothing: the server must load
the generated model, stream one chunk per token on both APIs, run every
request to ``max_tokens``, report ``usage`` and its own ``timings``, and
expose ``llamacpp:*`` metrics.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from inferwise.probes.llamacpp import LlamaServer

pytestmark = pytest.mark.engine

MAX_TOKENS = 24


def _stream(base_url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a streaming request and return its JSON events in order (``[DONE]`` dropped)."""
    events: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=60.0) as client,
        client.stream("POST", f"{base_url}{path}", json=body) as resp,
    ):
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            events.append(json.loads(data))
    return events


def _text_of(event: dict[str, Any]) -> str:
    out = ""
    for choice in event.get("choices") or []:
        delta = choice.get("delta")
        out += (delta or {}).get("content") or choice.get("text") or ""
    return out


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "tell me a story"}]}),
        ("/v1/completions", {"prompt": "once upon a time there was"}),
    ],
)
def test_every_request_streams_one_chunk_per_token_up_to_max_tokens(
    llama_server: LlamaServer, path: str, payload: dict[str, Any]
) -> None:
    body = {
        **payload,
        "model": llama_server.alias,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = _stream(llama_server.base_url, path, body)
    text_chunks = [e for e in events if _text_of(e)]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage, "no usage in the stream"
    # the model cannot sample end-of-text: the output is exactly max_tokens long
    assert usage[-1]["completion_tokens"] == MAX_TOKENS
    assert usage[-1]["prompt_tokens"] > 0
    # every token is plain ASCII text, so it streams as its own chunk
    assert len(text_chunks) == MAX_TOKENS
    timings = [e["timings"] for e in events if e.get("timings")]
    assert timings, "llama.cpp's own timings missing from the final chunk"
    final = timings[-1]
    assert final["predicted_n"] == MAX_TOKENS
    assert final["prompt_n"] == usage[-1]["prompt_tokens"]
    for key in ("prompt_ms", "predicted_ms", "predicted_per_token_ms"):
        assert final[key] > 0


def test_a_repeated_prompt_is_prefilled_again(llama_server: LlamaServer) -> None:
    """Prompt caching is off, so two identical requests both process the whole prompt."""
    body = {
        "prompt": "the same prompt twice",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first, second = (
        [
            e["timings"]
            for e in _stream(llama_server.base_url, "/v1/completions", body)
            if e.get("timings")
        ][-1]
        for _ in range(2)
    )
    assert second["prompt_n"] == first["prompt_n"] > 0
    assert second.get("cache_n", 0) == 0


def test_health_models_and_metrics(llama_server: LlamaServer) -> None:
    base = llama_server.base_url
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    models = httpx.get(f"{base}/v1/models", timeout=5).json()
    assert llama_server.alias in [m["id"] for m in models["data"]]
    metrics = httpx.get(f"{base}/metrics", timeout=5).text
    for name in (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_total",
    ):
        assert f"\n{name} " in f"\n{metrics}", f"{name} missing from /metrics"
