"""Whatever a client sends, the simulated engine answers (2xx or a 4xx error object) and keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwise.probes.sim import SimServer

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_message = st.fixed_dictionaries(
    {},
    optional={"role": st.sampled_from(["user", "system", "assistant"]) | _json, "content": _json},
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "model": _json,
        "messages": st.lists(_message, max_size=3) | _json,
        "prompt": st.text(max_size=20) | _json,
        "max_tokens": st.integers(-2, 12) | _json,
        "min_tokens": st.integers(-2, 12) | _json,
        "stream": st.booleans() | _json,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": _json}) | _json,
        "n": st.integers(0, 3) | _json,
        "ignore_eos": _json,
    },
)


@pytest.fixture(scope="module")
def sim():
    with (
        SimServer(
            ttft_ms=0, itl_ms=0, itl_per_seq_ms=0, default_max_tokens=4, max_model_len=64
        ) as server,
        httpx.Client(base_url=server.base_url, timeout=10) as client,
    ):
        yield client


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), body=_body | _json)
def test_any_body_gets_an_answer_and_the_server_lives(sim, path, body):
    r = sim.post(path, content=json.dumps(body).encode())
    assert r.status_code in (200, 400, 404), r.text
    if r.status_code != 200:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert "usage" in r.json()
    assert sim.get("/health").status_code == 200
