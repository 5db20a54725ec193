"""Load shapes: Poisson/gamma schedule statistics, absolute timing (late sends are measured, not
re-timed), closed-loop concurrency, bounds; and the workload's lengths, datasets and calibration."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

import pytest
from scipy import stats

from inferwise.calculators.errors import InputError
from inferwise.probes.health import LoopLagSampler, busy_wait
from inferwise.probes.loadgen import arrival_schedule, closed_loop, open_loop
from inferwise.probes.prompts import LengthSpec, Workload, fit_calibration, load_dataset
from inferwise.probes.records import RequestRecord


def test_poisson_schedule_has_exponential_gaps_at_the_rate() -> None:
    sched = arrival_schedule(20.0, 1.0, count=4000, seed=3)
    gaps = [b - a for a, b in zip([0.0, *sched], sched, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    # coefficient of variation 1 for exponential gaps; KS test against Exp(rate)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.07)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 20)).pvalue > 0.001
    assert sched == sorted(sched)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_the_mean_and_changes_the_spread(burstiness: float) -> None:
    sched = arrival_schedule(10.0, burstiness, count=4000, seed=1)
    gaps = [b - a for a, b in zip([0.0, *sched], sched, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.08)
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(1 / burstiness**0.5, rel=0.1)


def test_schedule_bounds_and_seed() -> None:
    assert len(arrival_schedule(5.0, count=7)) == 7
    by_time = arrival_schedule(100.0, duration_s=2.0, seed=2)
    assert by_time[-1] <= 2.0 and 150 < len(by_time) < 250
    assert arrival_schedule(5.0, count=10, seed=4) == arrival_schedule(5.0, count=10, seed=4)
    assert arrival_schedule(float("inf"), count=3, start_s=1.5) == [1.5, 1.5, 1.5]


def _fake_send(duration_s: float, in_flight: list[int], peak: list[int]):
    async def send(i: int, scheduled: float | None, warmup: bool) -> RequestRecord:
        start = time.monotonic()
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(duration_s)
        in_flight[0] -= 1
        return RequestRecord(
            index=i,
            ok=True,
            warmup=warmup,
            scheduled_s=scheduled,
            start_s=start,
            end_s=time.monotonic(),
        )

    return send


def test_closed_loop_keeps_concurrency_and_count() -> None:
    in_flight, peak, got = [0], [0], []

    async def on_record(r: RequestRecord) -> None:
        got.append(r.index)

    asyncio.run(
        closed_loop(
            _fake_send(0.01, in_flight, peak),
            on_record,
            concurrency=4,
            first_index=2,
            count=20,
            deadline=None,
        )
    )
    assert sorted(got) == list(range(2, 22))
    assert peak[0] == 4


def test_closed_loop_stops_at_the_deadline() -> None:
    in_flight, peak, got = [0], [0], []

    async def on_record(r: RequestRecord) -> None:
        got.append(r)

    t0 = time.monotonic()
    asyncio.run(
        closed_loop(
            _fake_send(0.02, in_flight, peak),
            on_record,
            concurrency=2,
            first_index=0,
            count=None,
            deadline=t0 + 0.2,
        )
    )
    assert time.monotonic() - t0 < 0.5
    assert 4 <= len(got) <= 24


def test_open_loop_sends_on_the_absolute_schedule_and_records_lateness() -> None:
    """A client stall delays the sends due during it, and only those: the schedule is
    not shifted, and each late send shows its delay."""
    records: list[RequestRecord] = []

    async def on_record(r: RequestRecord) -> None:
        records.append(r)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        origin = loop.time()
        sched = [0.05 * k for k in range(1, 11)]  # every 50 ms
        loop.call_at(origin + 0.12, busy_wait, 0.25)  # the client freezes from 120 to 370 ms

        async def send(i: int, scheduled: float | None, warmup: bool) -> RequestRecord:
            return RequestRecord(
                index=i,
                ok=True,
                scheduled_s=scheduled,
                start_s=loop.time() - origin,
                end_s=loop.time() - origin,
            )

        await open_loop(
            send,
            on_record,
            schedule=sched,
            origin=origin,
            first_index=0,
            max_in_flight=10,
            deadline=None,
        )

    asyncio.run(main())
    delays = {r.index: r.schedule_delay_ms for r in records}
    assert len(delays) == 10
    # generous margins: the machine running the tests may be busy
    assert delays[0] < 60 and delays[1] < 60
    assert delays[2] > 160  # due at 150 ms, sent at ~370 ms
    assert (
        delays[8] < 60 and delays[9] < 60
    )  # due at 450/500 ms: back on time, not pushed back by ~220 ms
    for r in records:
        assert r.scheduled_s == pytest.approx(0.05 * (r.index + 1))


def test_open_loop_stream_cap_makes_sends_late() -> None:
    records: list[RequestRecord] = []

    async def on_record(r: RequestRecord) -> None:
        records.append(r)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        origin = loop.time()

        async def send(i: int, scheduled: float | None, warmup: bool) -> RequestRecord:
            start = loop.time() - origin
            await asyncio.sleep(0.3)
            return RequestRecord(
                index=i, ok=True, scheduled_s=scheduled, start_s=start, end_s=loop.time() - origin
            )

        await open_loop(
            send,
            on_record,
            schedule=[0.0] * 4,
            origin=origin,
            first_index=0,
            max_in_flight=2,
            deadline=None,
        )

    asyncio.run(main())
    late = sorted(r.schedule_delay_ms for r in records)
    assert late[0] < 100 and late[1] < 100 and late[2] > 250


def test_loop_lag_sampler_sees_a_blocked_loop() -> None:
    async def main() -> list[float]:
        s = LoopLagSampler(0.005)
        s.start()
        await asyncio.sleep(0.05)
        busy_wait(0.1)
        await asyncio.sleep(0.05)
        return s.stop()

    samples = asyncio.run(main())
    assert max(samples) > 80
    assert statistics.median(samples) < 50


# ----------------------------------------------------------------------------- workload


@pytest.mark.parametrize("dist", ["uniform", "normal", "lognormal"])
def test_length_distributions_have_the_asked_mean_and_spread(dist: str) -> None:
    spec = LengthSpec(1000, dist, 0.3)  # type: ignore[arg-type]
    rng = random.Random(0)
    xs = [spec.sample(rng) for _ in range(5000)]
    assert statistics.mean(xs) == pytest.approx(1000, rel=0.03)
    expected_sd = 0.3 * 1000 / (3**0.5) if dist == "uniform" else 300
    assert statistics.pstdev(xs) == pytest.approx(expected_sd, rel=0.1)
    assert min(xs) >= 1
    assert LengthSpec(50).sample(rng) == 50


def test_shared_prefix_fraction_and_unique_prompts() -> None:
    w = Workload(
        input_len=LengthSpec(200), output_len=LengthSpec(10), shared_prefix_fraction=0.5, seed=1
    )
    a, b = w.item(0).text.split(), w.item(1).text.split()
    assert len(a) == 200 and a[:100] == b[:100] and a[100:] != b[100:]
    none = Workload(input_len=LengthSpec(200), output_len=None, seed=1)
    assert none.item(0).text.split()[:20] != none.item(1).text.split()[:20]
    assert w.item(3) == w.item(3)  # deterministic


def test_calibration_maps_target_tokens_to_words() -> None:
    a, b = fit_calibration([(64, 64 * 1.2 + 9), (512, 512 * 1.2 + 9)])
    assert (a, b) == pytest.approx((9.0, 1.2))
    w = Workload(input_len=LengthSpec(609), output_len=None)
    w.calibrate(a, b)
    assert len(w.item(0).text.split()) == 500


def test_dataset_rows_prompts_and_lengths(tmp_path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"prompt": "Why is the sky blue?", "output_tokens": 40},
                {
                    "messages": [
                        {"role": "system", "content": "s"},
                        {"role": "user", "content": "Hi!"},
                    ]
                },
                {"input_tokens": 30, "output_tokens": 7},
            ]
        )
        + "\n"
    )
    rows = load_dataset(str(p))
    w = Workload(input_len=LengthSpec(100), output_len=LengthSpec(16), dataset=rows)
    assert (w.item(0).text, w.item(0).max_tokens) == ("Why is the sky blue?", 40)
    assert w.item(1).text == "Hi!" and w.item(1).max_tokens == 16
    assert w.item(1).messages and w.item(1).messages[0]["role"] == "system"  # sent whole to chat
    assert len(w.item(2).text.split()) == 30 and w.item(2).max_tokens == 7
    assert w.item(3).text == w.item(0).text  # cycles


@pytest.mark.parametrize("content", ["not json\n", '{"foo": 1}\n', '{"input_tokens": -3}\n', ""])
def test_bad_dataset_is_an_input_error(tmp_path, content: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(InputError) as err:
        load_dataset(str(p))
    assert err.value.field == "dataset"
    with pytest.raises(InputError):
        load_dataset(str(tmp_path / "missing.jsonl"))


def test_a_new_salt_changes_the_text_but_not_the_lengths() -> None:
    """A rerun must not find its prompts in the server's prefix cache; the load stays the same."""
    w = Workload(
        input_len=LengthSpec(300, "lognormal", 0.5),
        output_len=LengthSpec(50, "uniform", 0.5),
        shared_prefix_fraction=0.5,
        seed=7,
    )
    before = [w.item(i) for i in range(5)]
    w.new_salt()
    after = [w.item(i) for i in range(5)]
    assert [len(a.text.split()) for a in before] == [len(b.text.split()) for b in after]
    assert [a.max_tokens for a in before] == [b.max_tokens for b in after]
    assert all(a.text != b.text for a, b in zip(before, after, strict=True))
    # within one salt, the shared prefix is shared
    w0, w1 = after[0].text.split(), after[1].text.split()
    k = min(round(len(w0) * 0.5), round(len(w1) * 0.5))
    assert k > 50 and w0[:k] == w1[:k]
