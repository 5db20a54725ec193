"""The probe against a real engine: token truth and timing truth.

llama.cpp reports its own view of every request in the final streamed chunk
(``timings``: ``prompt_n``, ``prompt_ms`` from slot start to the end of the
prefill, ``predicted_n``, ``predicted_ms`` from the first to the last token and
``predicted_per_token_ms`` = ``predicted_ms / (predicted_n - 1)``). The probe's
numbers must agree with that view where both measure the same interval, and
where they differ the difference must be the thing the client sees and the
server does not: HTTP and scheduling overhead, and waiting for a free slot.
"""

from __future__ import annotations

import statistics

import pytest

from inferwise.probes.llamacpp import LlamaServer

pytestmark = pytest.mark.engine

# Tolerances, stated once. The client and the server share 2 CPU cores, so a
# timestamp on either side can be late by a scheduler time slice.
# ITL: the client's mean gap over a request vs the server's predicted_per_token_ms
# (the same first-to-last-token interval, seen from both ends of the socket).
ITL_TOL_MS = 1.0
ITL_TOL_REL = 0.10
# TTFT at concurrency 1: client TTFT minus the server's prefill time is what the
# server does not time: sending and parsing the request, tokenising, the chat
# template, waking the slot, sending the first chunk and the client reading it.
TTFT_OVERHEAD_MAX_MS = 25.0
# A queued request starts its prefill when a slot frees, i.e. when another
# request ends; client-side those two instants agree within this margin. Alone the
# gaps stay under 40 ms; in a full 2-core CI run three successive hand-offs were
# seen at 62-92 ms (the client reading the ending stream late), hence 100.
SLOT_HANDOFF_TOL_MS = 100.0
# At concurrency 8 a request that got a slot at once still pays for 8 requests
# arriving together (parsing, templating on the HTTP threads); a queued one
# waits for a running request to finish, hundreds of ms here.
QUEUED_MIN_WAIT_MS = 100.0


def _client_itl_ms(rec) -> float:
    times = rec.chunk_times_s
    return (times[-1] - times[0]) * 1000.0 / (len(times) - 1)


def _itl_agrees(client_ms: float, server_ms: float) -> bool:
    return abs(client_ms - server_ms) <= ITL_TOL_MS + ITL_TOL_REL * server_ms


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_token_truth_every_request_counts_what_the_server_generated(
    llama_server: LlamaServer, probe_engine, endpoint: str
) -> None:
    result, records = probe_engine(
        llama_server, endpoint=endpoint, concurrency=2, requests=6, output_tokens=24
    )
    assert result.status == "complete" and not result.errors
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 6 and all(r.ok for r in measured)
    for rec in measured:
        timings = rec.server_timings
        assert timings, "the probe did not keep llama.cpp's timings"
        # usage.completion_tokens (the probe's count) == what the engine decoded == max_tokens
        assert rec.output_tokens == int(timings["predicted_n"]) == 24
        assert rec.input_tokens == int(timings["prompt_n"])
        assert not rec.tokens_approximate
        # one chunk per token, so the per-chunk accounting adds up too
        assert len(rec.chunk_times_s) == 24 and sum(rec.chunk_tokens) == 24
    assert result.summary.total_output_tokens == 6 * 24


def test_calibrated_prompts_hit_their_target_length(
    llama_server: LlamaServer, probe_engine
) -> None:
    """The vocabulary has common words, so the probe's calibration lands close to the target."""
    result, records = probe_engine(llama_server, requests=4, input_tokens=96, output_tokens=4)
    assert result.calibration.calibrated
    for rec in records:
        assert abs(rec.input_tokens - 96) <= 96 * 0.15, rec.input_tokens


def test_timing_truth_at_concurrency_1(llama_server: LlamaServer, probe_engine) -> None:
    result, records = probe_engine(llama_server, concurrency=1, requests=8, output_tokens=32)
    recs = [r for r in records if r.ok and not r.warmup]
    assert len(recs) == 8
    itl_pairs = [(_client_itl_ms(r), r.server_timings["predicted_per_token_ms"]) for r in recs]
    bad = [p for p in itl_pairs if not _itl_agrees(*p)]
    # a busy neighbour can hold the client back for a whole stream (it then reads every
    # chunk at once); one such request in eight is noise, more is a probe defect
    assert len(bad) <= 1, f"client vs server ITL disagree: {bad}"
    overhead = [r.ttft_ms - r.server_timings["prompt_ms"] for r in recs]
    # the client can never see the first token before the server finished the prefill
    assert min(overhead) > 0, overhead
    assert statistics.median(overhead) <= TTFT_OVERHEAD_MAX_MS, overhead
    # the headline ITL is defined per token: its mean over the run is total decode
    # time over decode steps, which is what the server's per-token times add up to
    steps = [r.output_tokens - 1 for r in recs]
    server_mean = sum(s * t for s, (_, t) in zip(steps, itl_pairs, strict=True)) / sum(steps)
    assert result.summary.itl_ms.mean == pytest.approx(server_mean, rel=ITL_TOL_REL, abs=ITL_TOL_MS)
    assert result.summary.ttft_ms.p50 == pytest.approx(
        statistics.median(r.server_timings["prompt_ms"] for r in recs), abs=TTFT_OVERHEAD_MAX_MS
    )


def test_timing_at_concurrency_8_differs_by_the_wait_for_a_slot(
    llama_server: LlamaServer, probe_engine
) -> None:
    """8 streams on 4 slots: half the requests wait, and the wait explains their extra TTFT.

    The server's ``prompt_ms`` starts when a slot takes the request, so
    ``first token - prompt_ms`` is when the slot was assigned, in client time.
    A request that waited must have waited while every slot was busy, and its
    slot must have been handed over when another request ended; ITL still
    agrees request by request.
    """
    n_slots = llama_server.n_parallel
    result, records = probe_engine(
        llama_server, concurrency=2 * n_slots, requests=16, output_tokens=24
    )
    recs = [r for r in records if r.ok and not r.warmup]
    assert len(recs) == 16
    slot_start = {r.index: r.first_token_s - r.server_timings["prompt_ms"] / 1000.0 for r in recs}

    def busy_slots(t: float) -> int:
        return sum(1 for r in recs if slot_start[r.index] <= t < r.end_s)

    ends = [r.end_s for r in recs]
    waits_ms: list[float] = []
    not_full, no_handoff = [], []
    for rec in recs:
        wait_ms = (slot_start[rec.index] - rec.start_s) * 1000.0
        assert wait_ms > -SLOT_HANDOFF_TOL_MS, wait_ms
        if wait_ms <= QUEUED_MIN_WAIT_MS:
            continue  # it got a slot at once (the rest is overhead, bounded here)
        waits_ms.append(wait_ms)
        middle = rec.start_s + wait_ms / 2000.0
        if busy_slots(middle) < n_slots:
            not_full.append((rec.index, round(wait_ms), busy_slots(middle)))
        gap_ms = min(abs(slot_start[rec.index] - e) for e in ends) * 1000.0
        if gap_ms > SLOT_HANDOFF_TOL_MS:
            no_handoff.append((rec.index, round(wait_ms), round(gap_ms)))
    # closed loop at 2x the slots: after the first wave every request queues
    assert len(waits_ms) >= len(recs) - 2 * n_slots, waits_ms
    # it queued because every slot was taken, and got the slot another request left;
    # a client read delayed on a busy machine may blur a few of these instants
    allowed = max(1, len(waits_ms) // 4)
    assert len(not_full) <= allowed, f"waited with a free slot: {not_full}"
    assert len(no_handoff) <= allowed, f"slot started when no request ended: {no_handoff}"
    # the wait is most of the difference between what the client and the server time
    extra_ms = sum(r.ttft_ms - r.server_timings["prompt_ms"] for r in recs)
    assert sum(waits_ms) >= 0.8 * extra_ms, (sum(waits_ms), extra_ms)
    pairs = [(_client_itl_ms(r), r.server_timings["predicted_per_token_ms"]) for r in recs]
    bad = [p for p in pairs if not _itl_agrees(*p)]
    assert len(bad) <= len(recs) // 4, f"client vs server ITL disagree at concurrency 8: {bad}"
    assert statistics.median(abs(c - s) / s for c, s in pairs) <= ITL_TOL_REL
