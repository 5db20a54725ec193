"""The SSE parser and stream analysis on hand-built streams: framing edge cases and token timing rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferwise.probes.sse import SSESplitter, analyze_stream, interpret


def chat(content: str | None = None, role: str | None = None, **extra) -> bytes:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    doc = {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta}],
        **extra,
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def usage(prompt: int, completion: int) -> bytes:
    doc = {
        "id": "x",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def feed_all(parts: list[bytes]) -> list[bytes]:
    sp = SSESplitter()
    out = [e.data for p in parts for e in sp.feed(p)]
    tail, _ = sp.close()
    return out + [e.data for e in tail]


def test_events_split_across_reads_at_every_byte() -> None:
    stream = chat("Hello") + chat(" world") + DONE
    whole = feed_all([stream])
    assert len(whole) == 3
    for cut in range(1, len(stream)):
        assert feed_all([stream[:cut], stream[cut:]]) == whole


def test_crlf_and_cr_line_ends_and_crlf_split_between_reads() -> None:
    crlf = b'data: {"a": 1}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert feed_all([crlf]) == [b'{"a": 1}', b"[DONE]"]
    # the CR and LF of one line end arrive in different reads
    assert feed_all([b'data: {"a": 1}\r', b"\n\r", b"\n"]) == [b'{"a": 1}']
    assert feed_all([b"data: x\r\rdata: y\r\r"]) == [b"x", b"y"]


def test_multiline_data_comments_and_fields() -> None:
    raw = b': keep-alive\n\nevent: message\nid: 7\nretry: 100\ndata: {"a":\ndata: 1}\n\n'
    sp = SSESplitter()
    events = sp.feed(raw)
    assert [e.data for e in events] == [b'{"a":\n1}']
    assert events[0].event == "message"
    assert json.loads(events[0].data) == {"a": 1}
    # a comment-only block is no event at all
    assert SSESplitter().feed(b": ping\n\n") == []
    # "data:" without the space, and a last event without its blank line
    assert feed_all([b"data:{}\n\ndata: [DONE]"]) == [b"{}", b"[DONE]"]


def test_interpret_token_bearing_deltas() -> None:
    assert not interpret(chat(role="assistant")[6:]).tokens_bearing
    assert not interpret(chat("", role="assistant")[6:]).tokens_bearing
    assert interpret(chat("x")[6:]).tokens_bearing
    reasoning = {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]}
    assert interpret(json.dumps(reasoning).encode()).tokens_bearing
    tools = {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}
        ]
    }
    assert interpret(json.dumps(tools).encode()).tokens_bearing
    completion = {"choices": [{"index": 0, "text": "abc", "finish_reason": None}]}
    assert interpret(json.dumps(completion).encode()).text == "abc"
    assert interpret(b"[DONE]").done
    assert interpret(b"not json").malformed


def test_usage_chunk_with_empty_choices_gives_token_counts() -> None:
    reads = [
        (0.0, chat(role="assistant")),
        (0.1, chat("a")),
        (0.2, chat("b")),
        (0.3, usage(12, 2) + DONE),
    ]
    a = analyze_stream(reads)
    assert a.first_token_s == 0.1  # the role-only chunk at 0.0 is not a token
    assert a.chunk_times_s == [0.1, 0.2]
    assert (a.input_tokens, a.output_tokens, a.tokens_approximate) == (12, 2, False)
    assert a.saw_done


def test_counted_chunks_are_flagged_approximate_without_usage() -> None:
    a = analyze_stream([(0.1, chat("a")), (0.2, chat("b") + DONE)])
    assert a.output_tokens == 2 and a.tokens_approximate


def test_final_usage_larger_than_chunks_spreads_tokens_over_later_chunks() -> None:
    # 3 chunks but 7 tokens: the server packs several tokens per chunk
    a = analyze_stream(
        [(0.1, chat("a")), (0.2, chat("bbb")), (0.3, chat("ccc") + usage(5, 7) + DONE)]
    )
    assert sum(a.chunk_tokens) == 7 and a.chunk_tokens[0] == 1
    assert not a.tokens_approximate


def test_per_chunk_cumulative_usage_gives_tokens_per_chunk() -> None:
    reads = [
        (0.1, chat("a", usage={"prompt_tokens": 5, "completion_tokens": 1})),
        (0.2, chat("bcd", usage={"prompt_tokens": 5, "completion_tokens": 4})),
        (0.3, usage(5, 4) + DONE),
    ]
    a = analyze_stream(reads)
    assert a.chunk_tokens == [1, 3] and a.output_tokens == 4


def test_error_object_mid_stream_is_reported() -> None:
    reads = [
        (0.1, chat("a")),
        (0.2, b'data: {"error": {"message": "engine died", "code": 500}}\n\n'),
    ]
    a = analyze_stream(reads)
    assert a.error == "engine died"
    assert a.first_token_s == 0.1
    vllm_style = b'data: {"object": "error", "message": "out of memory", "code": 500}\n\n'
    assert analyze_stream([(0.1, vllm_style)]).error == "out of memory"
    named = b"event: error\ndata: overloaded\n\n"
    assert analyze_stream([(0.1, named)]).error == "overloaded"


def test_non_utf8_bytes_do_not_break_the_stream() -> None:
    bad = chat("@@").replace(b"@@", b"\xff\xfe")
    a = analyze_stream([(0.1, bad), (0.2, chat("ok") + DONE)])
    assert a.first_token_s == 0.1 and len(a.chunk_times_s) == 2 and not a.malformed


def test_malformed_data_is_flagged() -> None:
    assert analyze_stream([(0.1, chat("a")), (0.2, b"data: {broken\n\n")]).malformed
    # bytes that are no event at all (an HTML error page with status 200)
    assert analyze_stream([(0.1, b"<html>oops</html>")]).malformed


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8), st.data())
def test_any_split_of_a_stream_gives_the_same_tokens(contents: list[str], data) -> None:
    stream = b"".join(chat(c) for c in contents) + usage(3, len(contents)) + DONE
    cuts = sorted(data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=6, unique=True)))
    parts = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    reads = [(float(i), p) for i, p in enumerate(parts)]
    a = analyze_stream(reads)
    assert len(a.chunk_times_s) == len(contents)
    assert a.output_tokens == len(contents)
    assert a.text == "".join(contents)
    assert a.chunk_times_s == sorted(a.chunk_times_s)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])
def test_done_ends_without_error(line_end: bytes) -> None:
    s = (chat("a") + DONE).replace(b"\n", line_end)
    a = analyze_stream([(0.1, s)])
    assert a.saw_done and a.error is None and not a.malformed
