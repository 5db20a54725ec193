"""The continuous-batching simulation against closed forms and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from step_models import toy_8b

from inferwise.calculators.batching_sim import (
    load_stats,
    lognormal_lengths,
    pipeline_lane,
    poisson_arrivals_ms,
    simulate,
    weighted_summary,
)

model = toy_8b


def test_single_request_ttft_is_its_prefill_and_e2e_adds_each_decode_step():
    m = model()
    res = simulate(m, [1000], [50], concurrency=1)
    assert res.ttft_ms[0] == pytest.approx(m.prefill_ms(1000))
    # Decode step j attends to the prompt and the j tokens already cached.
    decode = sum(m.step_ms(0, 1, 1000 + j) for j in range(49))
    assert res.e2e_ms[0] == pytest.approx(m.prefill_ms(1000) + decode)
    assert res.tpot_ms[0] == pytest.approx(decode / 49)
    assert res.queue_ms[0] == 0


def test_long_prompt_prefills_in_chunks():
    m = model(max_num_batched_tokens=2048)
    res = simulate(m, [5000], [2], concurrency=1)
    assert res.ttft_ms[0] == pytest.approx(m.prefill_ms(5000))
    assert res.steps == 3 + 1  # three prefill chunks, one decode step


def test_light_poisson_load_ttft_is_about_the_prefill_time():
    m = model()
    arr = poisson_arrivals_ms(300, rate_per_s=0.2, seed=3)  # a request every 5 s; each lasts ~1 s
    res = simulate(m, np.full(300, 800), np.full(300, 100), arrival_ms=arr)
    assert np.mean(res.ttft_ms) == pytest.approx(m.prefill_ms(800), rel=0.1)
    assert np.median(res.queue_ms) == 0


def test_more_load_never_lowers_queueing():
    m = model(max_num_seqs=32)
    inp, out = np.full(400, 1500), np.full(400, 300)
    waits = []
    for rate in (1, 2, 4, 8, 16, 32):
        res = simulate(m, inp, out, arrival_ms=poisson_arrivals_ms(400, rate, seed=7))
        waits.append(float(np.mean(res.queue_ms)))
    assert waits == sorted(waits)
    assert waits[-1] > 10 * max(waits[0], 1.0)


def test_concurrency_raises_throughput_until_the_batch_is_full():
    m = model(max_num_seqs=16)
    tput = []
    for c in (1, 4, 16, 64):
        res = simulate(m, np.full(20 * c, 500), np.full(20 * c, 200), concurrency=c)
        tput.append(load_stats(res, c).output_tokens_per_s)
    assert tput[0] < tput[1] < tput[2]
    assert tput[3] == pytest.approx(tput[2], rel=0.15)  # capped by max_num_seqs


def test_max_num_seqs_and_kv_capacity_bound_the_running_batch():
    m = model(max_num_seqs=8)
    res = simulate(m, np.full(100, 200), np.full(100, 50))
    assert res.max_running <= 8
    tight = model(kv_capacity_tokens=20_000)
    res = simulate(tight, np.full(100, 1500), np.full(100, 500))
    assert res.peak_kv_tokens <= 20_000
    assert res.max_running <= 20_000 // 1500 + 1
    assert res.completed == 100


def test_freed_sliding_window_blocks_let_more_requests_run():
    """vLLM's hybrid KV manager reports tokens per layer group and frees what leaves a
    sliding window: with half the layers windowed at 128 tokens, a 1,500 + 500-token request
    holds about half the reported tokens its context would, so nearly twice as many run."""
    from dataclasses import replace

    tight = model(kv_capacity_tokens=20_000)
    windowed = replace(
        tight,
        shape=replace(tight.shape, sliding_window=128, sliding_share=0.5),
        kv_window_share=0.5,
    )
    inp, out = np.full(100, 1500), np.full(100, 500)
    full, swa = simulate(tight, inp, out), simulate(windowed, inp, out)
    assert swa.completed == full.completed == 100
    assert 1.6 * full.max_running <= swa.max_running <= 2 * (20_000 // 1500 + 1)


@pytest.mark.parametrize("every", [10, 40])
@pytest.mark.parametrize("prefill_first", [True, False])
def test_sglangs_receive_interval_makes_arrivals_wait_half_an_interval_of_decode_steps(
    every, prefill_first
):
    """SGLang --scheduler-recv-interval N: while decoding, new requests are taken in every N
    steps, so an arrival lands on average (N - 1) / 2 decode steps before the next intake
    (desynchronised clients: output lengths vary); with SGLang's prefill-only steps as
    with mixed ones."""
    out = np.random.default_rng(0).integers(100, 500, 600)
    ttft = {}
    for n in (1, every):
        m = model(recv_interval_steps=n, prefill_first=prefill_first)
        res = simulate(m, np.full(600, 200), out, concurrency=8)
        ttft[n] = float(np.nanmean(load_stats(res).ttft_ms))
    step_ms = model().decode_ms(8, 500)
    assert ttft[every] - ttft[1] == pytest.approx((every - 1) / 2 * step_ms, rel=0.25)


def test_scheduling_ahead_costs_an_arrival_one_more_step_under_load():
    """vLLM's async scheduling fixes step N+1's batch when step N starts, so a request that
    arrives during step N runs its prefill in step N+2: one more decode step of TTFT than
    sync scheduling. An idle engine schedules an arrival at once either way."""
    out = np.random.default_rng(0).integers(100, 500, 600)
    ttft = {}
    for ahead in (False, True):
        m = model(schedules_ahead=ahead)
        res = simulate(m, np.full(600, 200), out, concurrency=8)
        ttft[ahead] = float(np.nanmean(load_stats(res).ttft_ms))
        alone = simulate(m, [1000], [50], concurrency=1)
        assert alone.ttft_ms[0] == pytest.approx(m.prefill_ms(1000))
    step_ms = model().decode_ms(8, 500)
    assert ttft[True] - ttft[False] == pytest.approx(step_ms, rel=0.25)


@pytest.mark.parametrize("context", [2_000, 20_000])
def test_window_capacity_is_the_same_whichever_way_vllm_reports_the_kv_cache(context):
    """One pool of blocks (gpt-oss's layout: a full and a 128-token window group) reported
    as vLLM 0.20 does (blocks per group) and as 0.21 does (max concurrency x max_model_len):
    both turn into the same whole-context capacity, within 1 % of counting the blocks a
    request of that context holds (its context in the full group, its window and one block
    in the other), and nearly twice the reported tokens divided by the context before 0.21."""
    from dataclasses import replace

    from inferwise.calculators import engine_policy as ep

    layout = ep.KVLayout(("full", "sliding"), (18,), 1000, 16, 128)
    per_stage, top, batched = [10**12], 131_072, 8192
    old = ep.kv_capacity(layout, ep.vllm_rules("0.20.0"), per_stage, top, batched)
    new = ep.kv_capacity(layout, ep.vllm_rules("0.21.0"), per_stage, top, batched)
    base = model(max_model_len=top, max_num_batched_tokens=batched)
    windowed = replace(
        base,
        shape=replace(base.shape, sliding_window=128, sliding_share=0.5),
        kv_window_share=0.5,
    )
    before = replace(windowed, kv_capacity_tokens=old.kv_cache_tokens)
    after = replace(windowed, kv_capacity_tokens=new.kv_cache_tokens, kv_reported_per_max_len=True)
    blocks_held = -(-context // 16) + (128 // 16 + 1)
    truth = old.num_blocks / blocks_held * context
    assert before.context_capacity_tokens(context) == pytest.approx(truth, rel=0.01)
    assert after.context_capacity_tokens(context) == pytest.approx(truth, rel=0.01)
    assert before.context_capacity_tokens(context) > 1.8 * old.kv_cache_tokens


def test_a_decode_block_waits_for_the_receive_point_after_an_arrival():
    """An arrival already past, 3 decode steps into a receive interval of 10: the block runs
    the 7 steps to the next receive point and stops there (both the short and the long path)."""
    from inferwise.calculators.batching_sim import _decode_block

    line = model().decode_line(8)
    for k in (30, 200):
        times, end = _decode_block(line, 100.0, 8_000, 8, k, 50.0, every=10, since_recv=3)
        assert len(times) == 7 and end == pytest.approx(100.0 + times.sum())


def test_kv_exhaustion_preempts_and_still_completes_every_request():
    # Admission reserves the prompt only; outputs grow until the cache is full.
    m = model(kv_capacity_tokens=12_000)
    res = simulate(m, np.full(60, 500), np.full(60, 2000))
    assert res.preemptions > 0
    assert res.completed == 60
    assert np.all(res.e2e_ms >= res.ttft_ms)


def test_an_admission_watermark_stops_the_preempt_readmit_ping_pong():
    """vLLM V0 (prefill-first) admits a request only while 1 % of the KV blocks stay free: a
    request preempted for room is not re-admitted the next step, so the same KV-bound load
    preempts far less (and still completes). Without a watermark a victim is back, its prompt
    recomputed, as soon as its prompt fits, and preempted again a step later."""
    inp, out = np.full(200, 3000), np.full(200, 3000)
    v0 = {"kv_capacity_tokens": 100_000, "prefill_first": True, "max_num_batched_tokens": 32768}
    bare = simulate(model(**v0), inp, out, concurrency=64)
    kept = simulate(model(**v0, admission_watermark_tokens=1_000), inp, out, concurrency=64)
    assert kept.completed == bare.completed == 200
    assert kept.preemptions < bare.preemptions / 5
    assert kept.output_tokens.sum() / kept.duration_ms > bare.output_tokens.sum() / bare.duration_ms


def test_a_preempted_request_continues_its_output_and_its_wait_is_one_gap():
    """Recompute preemption re-runs the prompt and the tokens generated so far, then the
    request goes on from there: the token gaps of the run add up to exactly the requested
    outputs (one gap per token after the first), the resumed token's gap spanning the
    recompute, however often requests were preempted."""
    inp, out = np.full(200, 3000), np.full(200, 3000)
    m = model(kv_capacity_tokens=100_000, prefill_first=True, max_num_batched_tokens=32768)
    res = simulate(m, inp, out, concurrency=64)
    assert res.preemptions > 1000 and res.completed == 200
    assert np.sum(res.itl_weights) == np.sum(out - 1)
    assert np.max(res.itl_values) > 10 * np.median(res.itl_values)  # the recompute stalls


def test_sglangs_admission_reserves_running_outputs_and_queues_instead_of_thrashing():
    """SGLang admits a prompt only while the cache also holds new_token_ratio x the running
    requests' remaining outputs (0.7, decaying to 0.098, raised on a retract): under KV
    pressure new requests wait and the running ones are rarely preempted."""
    inp, out = np.full(200, 3000), np.full(200, 3000)
    sglang = {"kv_capacity_tokens": 100_000, "prefill_first": True, "max_num_batched_tokens": 8192}
    greedy = simulate(model(**sglang), inp, out, concurrency=64)
    reserving = simulate(model(**sglang, reserves_future_tokens=True), inp, out, concurrency=64)
    assert reserving.completed == greedy.completed == 200
    assert reserving.preemptions < greedy.preemptions / 5
    assert np.sum(reserving.itl_weights) == np.sum(out - 1)
    # the work goes into new tokens, not into recomputing preempted ones
    assert reserving.duration_ms < 0.5 * greedy.duration_ms


def test_a_step_that_preempts_admits_nothing_new_under_vllm_v1():
    """vLLM V1 skips its waiting queue in a step that had to preempt: no request is admitted
    in such a step (the victim waits at least one step), and every request still completes."""
    from inferwise.calculators.batching_sim import _StepLoop

    class Watched(_StepLoop):
        admitted_while_preempting = 0
        preempting_steps = 0

        def _schedule_chunks(self, admit: bool = True):
            before = len(self.order)
            chunks = super()._schedule_chunks(admit)
            if not admit:
                self.preempting_steps += 1
                self.admitted_while_preempting += len(self.order) - before
            return chunks

    inp, out = [3000] * 300, [3000] * 300
    m = model(kv_capacity_tokens=100_000, no_admission_after_preemption=True)
    loop = Watched(m, inp, out, [0.0] * 64, True)
    loop.run(2_000_000)
    assert loop.preempt > 0 and loop.preempting_steps > 0 and loop.finished == 300
    assert loop.admitted_while_preempting == 0


def test_a_prompt_larger_than_the_whole_cache_is_rejected_not_hung():
    m = model(kv_capacity_tokens=1_000)
    res = simulate(m, [5000, 100], [10, 10])
    assert res.rejected == 1 and res.completed == 1


def test_offline_batch_beats_one_at_a_time_on_throughput():
    m = model()
    inp, out = np.full(200, 1000), np.full(200, 200)
    offline = load_stats(simulate(m, inp, out))
    serial = load_stats(simulate(m, inp, out, concurrency=1), 1)
    assert offline.output_tokens_per_s > 5 * serial.output_tokens_per_s


def test_closed_loop_throughput_follows_littles_law():
    m = model()
    res = simulate(m, np.full(400, 600), np.full(400, 150), concurrency=20)
    stats = load_stats(res, 20)
    assert stats.requests_per_s == pytest.approx(20 / (np.mean(stats.e2e_ms) / 1e3))
    assert len(stats.e2e_ms) == 400 - 2 * 20


def test_itl_sample_has_one_gap_per_generated_token_after_the_first():
    m = model()
    out = np.array([5, 17, 40])
    res = simulate(m, [100, 300, 900], out)
    assert res.itl_weights.sum() == (out - 1).sum()


def test_gamma_arrivals_have_the_requested_mean_rate():
    for burst in (0.25, 1.0, 4.0):
        arr = poisson_arrivals_ms(20_000, 10.0, burstiness=burst, seed=1)
        assert arr[-1] / 1e3 == pytest.approx(2000, rel=0.05)
    gaps_bursty = np.diff(poisson_arrivals_ms(5000, 10.0, 0.25, seed=1))
    gaps_smooth = np.diff(poisson_arrivals_ms(5000, 10.0, 4.0, seed=1))
    assert gaps_bursty.std() > 2 * gaps_smooth.std()


def test_lognormal_lengths_hit_the_given_median_and_p95():
    x = lognormal_lengths(1500, 6000, 50_000, seed=2)
    assert np.median(x) == pytest.approx(1500, rel=0.03)
    assert np.percentile(x, 95) == pytest.approx(6000, rel=0.05)
    assert np.all(lognormal_lengths(300, None, 10) == 300)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 500), st.integers(1, 50)), min_size=1, max_size=40),
    st.sampled_from([0, 5, 50, 90, 95, 99, 100]),
)
def test_weighted_percentiles_equal_percentiles_of_the_expanded_sample(pairs, q):
    v = np.array([p[0] for p in pairs])
    w = np.array([p[1] for p in pairs])
    mean, (got,) = weighted_summary(v, w, (q,))
    full = np.repeat(v, w)
    assert got == pytest.approx(np.percentile(full, q), rel=1e-9, abs=1e-9)
    assert mean == pytest.approx(full.mean())


ADMISSION_RULES = [
    {},  # vLLM V1 without its guard, as the step loop ran before
    {"no_admission_after_preemption": True},  # vLLM V1
    {"prefill_first": True, "admission_watermark_tokens": 400},  # vLLM V0
    {"prefill_first": True, "reserves_future_tokens": True},  # SGLang
]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    conc=st.integers(1, 12),
    seqs=st.integers(1, 16),
    cap=st.integers(3_000, 20_000),
    seed=st.integers(0, 1000),
    rule=st.sampled_from(ADMISSION_RULES),
)
def test_every_request_finishes_in_order_of_its_events(n, conc, seqs, cap, seed, rule):
    """Under every engine's admission rule, even with a cache barely larger than a prompt,
    every request completes or is rejected (none waits forever behind a reserve)."""
    rng = np.random.default_rng(seed)
    inp = rng.integers(1, 2_000, n)
    out = rng.integers(1, 3_000, n)
    res = simulate(
        model(kv_capacity_tokens=cap, max_num_seqs=seqs, max_num_batched_tokens=1024, **rule),
        inp,
        out,
        concurrency=conc,
    )
    done = ~np.isnan(res.e2e_ms)
    assert res.completed + res.rejected == n
    assert np.all(res.ttft_ms[done] > 0)
    assert np.all(res.e2e_ms[done] >= res.ttft_ms[done] - 1e-9)
    assert np.all(res.queue_ms[done] <= res.ttft_ms[done] + 1e-9)
    assert res.max_running <= seqs


def test_staggered_clients_do_not_move_in_lock_step():
    m = model()
    inp, out = np.full(400, 2000), np.full(400, 200)
    lock = simulate(m, inp, out, concurrency=16)
    spread = simulate(m, inp, out, concurrency=16, stagger_ms=3000.0)
    assert np.all(lock.arrival_ms[:16] == 0)
    assert spread.arrival_ms[15] == pytest.approx(3000.0 * 15 / 16)
    # Lock-step waves prefill 16 prompts at once; spread clients prefill one at a time.
    assert np.median(spread.ttft_ms) < np.median(lock.ttft_ms)


def test_simulate_load_picks_the_load_shape_from_its_arguments():
    from inferwise.calculators.batching_sim import (
        load_stats,
        poisson_arrivals_ms,
        simulate,
        simulate_load,
    )

    m = model()
    inp, out = np.full(40, 300), np.full(40, 50)
    offline = simulate(m, inp, out)
    for kw in ({}, {"rate_per_s": float("inf")}):
        res, stats = simulate_load(m, inp, out, **kw)
        assert np.array_equal(res.e2e_ms, offline.e2e_ms)
    res, stats = simulate_load(m, inp, out, concurrency=4)
    assert res.max_running == 4
    assert stats.requests_per_s == load_stats(res, 4).requests_per_s  # closed loop: Little's law
    res, _ = simulate_load(m, inp, out, rate_per_s=2.0, burstiness=0.5, seed=7)
    assert np.array_equal(res.arrival_ms, poisson_arrivals_ms(40, 2.0, 0.5, seed=7))


def test_budget_per_request_arrays_cover_the_requests_load_stats_kept():
    """A closed loop with rejected requests (prompts larger than the KV cache): the budget's
    per-request arrays are exactly the requests the load statistics cover."""
    from inferwise.calculators.batching_sim import simulate_load
    from inferwise.calculators.budget import BudgetRequest, _client_metrics, _Costs

    m = model(kv_capacity_tokens=5000)
    inp = np.full(40, 300)
    inp[[10, 20]] = 6000  # can never fit: rejected
    out = np.full(40, 20)
    res, stats = simulate_load(m, inp, out, concurrency=4)
    assert np.isnan(res.e2e_ms[[10, 20]]).all()
    assert int(stats.kept.sum()) == len(stats.e2e_ms) == 40 - 2 * 4 - 2
    costs = _Costs(BudgetRequest(model="m", gpu="h100"))
    metrics = _client_metrics(stats, res, costs)
    assert np.array_equal(metrics["queue"], stats.queue_ms)
    assert not np.isnan(metrics["e2e"]).any()


def test_request_overhead_delays_the_first_token_but_is_not_queueing():
    """The API server's per-request cost (HTTP, tokenization) is latency before the engine
    sees the request: every TTFT and E2E carries it, the queue does not, and a closed-loop
    client that waits for it sends fewer requests per second."""
    from dataclasses import replace

    plain = model()
    slow = replace(plain, efficiency=replace(plain.efficiency, request_overhead_ms=40.0))
    a = simulate(plain, np.full(20, 1000), np.full(20, 50), concurrency=1)
    b = simulate(slow, np.full(20, 1000), np.full(20, 50), concurrency=1)
    assert b.ttft_ms == pytest.approx(a.ttft_ms + 40.0)
    assert b.e2e_ms == pytest.approx(a.e2e_ms + 40.0)
    assert np.all(b.queue_ms == 0) and np.all(a.queue_ms == 0)
    assert b.duration_ms == pytest.approx(a.duration_ms + 20 * 40.0)
    # open loop: the arrivals are the client's; the engine sees each 40 ms later
    arr = poisson_arrivals_ms(50, rate_per_s=0.5, seed=1)
    c = simulate(slow, np.full(50, 800), np.full(50, 20), arrival_ms=arr)
    assert c.arrival_ms == pytest.approx(arr)
    assert np.median(c.ttft_ms) == pytest.approx(slow.prefill_ms(800) + 40.0, rel=0.02)


def test_prefill_first_pauses_the_decodes_and_their_next_token_waits_for_it():
    """SGLang's default: a newcomer's prompt runs in a step of its own, the running decode
    gets no token in it, and its interval to the next token spans that step."""
    m = model(prefill_first=True, max_num_batched_tokens=2048)
    # request 0 alone decodes; request 1 arrives while it does
    res = simulate(m, [100, 4000], [40, 2], arrival_ms=[0.0, 50.0])
    prefill_alone = m.prefill_ms(4000)  # two prefill-only chunks, no decode in them
    assert res.ttft_ms[1] <= prefill_alone + m.decode_ms(1, 140) + 1e-6
    # request 0's intervals: one of them holds the whole prefill of request 1
    assert max(res.itl_values) >= prefill_alone
    # every interval of request 0 counted once, the stall included: they add up to its decode
    n0 = 39
    assert res.tpot_ms[0] * n0 == pytest.approx(res.e2e_ms[0] - res.ttft_ms[0])
    mixed = simulate(model(max_num_batched_tokens=2048), [100, 4000], [40, 2], [0.0, 50.0])
    assert max(mixed.itl_values) < prefill_alone  # mixed steps: a token in every chunk step


def test_prefill_first_keeps_equal_length_closed_loops_in_waves():
    """With equal lengths a prefill-first engine starts a wave's decodes on one step, so
    the whole wave comes back together and each request waits for the wave's prefill: TTFT
    grows with the concurrency. Mixed steps stagger the wave by chunk and it spreads out."""

    def ttft(c: int, first: bool) -> float:
        m = model(prefill_first=first, max_num_batched_tokens=2048)
        n = 6 * c
        res = simulate(m, [1024] * n, [64] * n, concurrency=c)
        return float(np.mean(res.ttft_ms[c:]))  # the opening burst left out

    assert ttft(16, True) > 2.5 * ttft(4, True)
    assert ttft(16, False) < 2 * ttft(4, False)


def test_whole_run_statistics_count_the_opening_wave_and_the_wall_clock():
    """whole_run: every request over the wall-clock duration (a benchmark's report);
    otherwise the closed loop's ramps are left out and throughput follows Little's law."""
    from inferwise.calculators.batching_sim import simulate_load

    model = toy_8b()
    inp, out = np.full(120, 2000), np.full(120, 100)
    res, whole = simulate_load(model, inp, out, concurrency=32, whole_run=True)
    _, steady = simulate_load(model, inp, out, concurrency=32)
    assert len(whole.ttft_ms) == 120 and len(steady.ttft_ms) == 120 - 2 * 32
    assert whole.output_tokens_per_s == pytest.approx(out.sum() / (res.duration_ms / 1e3), rel=1e-9)
    first_wave = res.ttft_ms[:32].mean()
    assert first_wave > res.ttft_ms[32:-32].mean()
    assert whole.ttft_ms.mean() > steady.ttft_ms.mean()


def test_pipeline_stages_each_carry_a_micro_batch():
    """With pipeline parallelism the engines keep one micro-batch per stage in flight (vLLM's
    virtual engines, each with a share of the sequences and KV cache): the deployment carries
    pp times the throughput of one lane whose steps take the whole pipeline's latency, at that
    lane's per-token latency. (MLPerf v5.0 Llama-3.1-405B on 8 x H200 at TP 4 x PP 2: 560 output
    tokens/s published, 244 predicted with one micro-batch in flight, 485 with two.)"""
    from dataclasses import replace

    two = replace(model(), pipeline_parallel_size=2)
    lane = replace(pipeline_lane(two, 2), pipeline_parallel_size=1)
    inp, out = np.full(400, 1000), np.full(400, 200)
    piped = simulate(two, inp, out)
    # one lane's step time without the stage hops: a lower bound on each lane's steps
    alone = simulate(lane, inp[::2], out[::2])
    assert piped.completed == 400
    assert piped.output_tokens_per_s == pytest.approx(2 * alone.output_tokens_per_s, rel=0.1)
    assert np.nanmedian(piped.tpot_ms) == pytest.approx(np.nanmedian(alone.tpot_ms), rel=0.1)
    # every request keeps its own lengths and is placed back at its index
    assert (piped.input_tokens == inp).all() and not np.isnan(piped.e2e_ms).any()
    closed = simulate(two, inp, out, concurrency=64)
    assert closed.max_running <= 64 and closed.completed == 400
