"""Trace files read into arrivals and lengths: the four formats, the window, the time scale,
bad rows named, and what a workload file measures from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwise.calculators.bounds import MAX_PEAK_TO_MEAN
from inferwise.calculators.errors import InputError
from inferwise.calculators.trace_stats import trace_stats
from inferwise.calculators.traces import TraceWindow, load_trace, shared_prefix_fraction

DATA = Path(__file__).parent / "data" / "traces"


def test_each_format_reads_its_published_columns() -> None:
    mc = load_trace(str(DATA / "mooncake.jsonl"))  # guessed from the first line
    assert mc.format == "mooncake"
    assert mc.arrival_s == [0.0, 0.0, 0.25, 0.5, 1.2, 1.5]  # timestamps are milliseconds
    assert mc.input_tokens[:2] == [1100, 1300] and mc.output_tokens[:2] == [12, 8]
    assert mc.hash_ids is not None and mc.hash_ids[1] == [0, 1, 3]

    bg = load_trace(str(DATA / "burstgpt.csv"), "burstgpt")
    assert bg.arrival_s == [0.0, 1.0, 3.0, 3.0, 6.0]  # seconds; the failed row is skipped
    assert bg.skipped_rows == 1 and bg.rows[0] == 2 and bg.rows[1] == 4
    assert bg.input_tokens[0] == 472 and bg.output_tokens[-1] == 64

    az = load_trace(str(DATA / "azure.csv"))
    assert az.format == "azure"
    assert az.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-5)
    assert az.input_tokens == [374, 396, 879, 91, 1240]
    assert az.first_epoch_s is not None

    pl = load_trace(str(DATA / "plain.jsonl"))
    assert pl.format == "jsonl" and pl.arrival_s == [0.0, 0.1, 0.15, 0.4]
    assert pl.hash_ids is None


def test_window_is_cut_in_trace_time_then_rebased_and_scaled() -> None:
    t = load_trace(
        str(DATA / "mooncake.jsonl"), window=TraceWindow(start_s=0.2, duration_s=1.0, time_scale=2)
    )
    assert t.rows == [3, 4, 5]  # 0.25, 0.5, 1.2 s lie in [0.2, 1.2]
    assert t.arrival_s == pytest.approx([0.025, 0.15, 0.5])  # (t - 0.2) / 2
    capped = load_trace(str(DATA / "mooncake.jsonl"), window=TraceWindow(max_requests=2))
    assert len(capped) == 2 and capped.total_rows == 6


def test_shared_prefix_fraction_counts_the_blocks_an_earlier_request_sent() -> None:
    t = load_trace(str(DATA / "mooncake.jsonl"))
    # hits: [0,1] of row 2 (1024), [0] of row 3 (512), all of row 4 (1100), row 6 (700)
    assert shared_prefix_fraction(t) == pytest.approx(3336 / 5100)


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("name", "text", "fmt", "field", "words"),
    [
        (
            "back.jsonl",
            '{"timestamp": 0, "input_tokens": 5, "output_tokens": 1}\n'
            '{"timestamp": 2, "input_tokens": 5, "output_tokens": 1}\n'
            '{"timestamp": 1, "input_tokens": 5, "output_tokens": 1}\n',
            None,
            "trace",
            "row 3: timestamp goes back in time",
        ),
        (
            "neg.jsonl",
            '{"timestamp": -1, "input_tokens": 5, "output_tokens": 1}\n',
            None,
            "trace",
            "row 1: timestamp = -1 is negative",
        ),
        (
            "cols.csv",
            "Timestamp,Model,Request tokens\n1,ChatGPT,20\n",
            "burstgpt",
            "trace",
            "row 1: the burstgpt header lacks the column(s) Response tokens",
        ),
        (
            "nolen.jsonl",
            '{"timestamp": 0, "input_length": 5, "hash_ids": []}\n',
            "mooncake",
            "trace",
            "row 1: output_length is missing",
        ),
        (
            "hash.jsonl",
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}\n',
            "mooncake",
            "trace",
            "row 1: 3 hash_ids of 512 tokens are more than input_length 600 holds",
        ),
        (
            "az.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n",
            "azure",
            "trace",
            "row 2: TIMESTAMP = 'yesterday' is not a date-time",
        ),
        ("what.txt", "hello\n", None, "trace_format", "cannot tell the format"),
        (
            "far.jsonl",
            '{"timestamp": 5, "input_tokens": 9, "output_tokens": 1}\n'
            '{"timestamp": 1e300, "input_tokens": 9, "output_tokens": 1}\n',
            "jsonl",
            "trace",
            "row 2: timestamp = 1e+300 is out of range",
        ),
    ],
)
def test_bad_rows_are_named(tmp_path, name, text, fmt, field, words) -> None:
    with pytest.raises(InputError) as e:
        load_trace(_write(tmp_path, name, text), fmt)
    assert e.value.field == field
    assert words in e.value.message


def test_an_empty_window_and_an_overlong_request_are_refused() -> None:
    with pytest.raises(InputError, match="holds no request; the trace spans 1.5 s"):
        load_trace(str(DATA / "mooncake.jsonl"), window=TraceWindow(start_s=100))
    t = load_trace(str(DATA / "mooncake.jsonl"))
    with pytest.raises(InputError, match="row 2: input 1300 \\+ output 8 tokens = 1308"):
        t.check_context(1200)


def test_stats_peak_burstiness_and_lengths(tmp_path) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    poisson = np.cumsum(rng.exponential(0.5, 3000))  # 2 req/s for ~25 minutes
    regular = np.arange(3000) * 0.5
    for arr, lo, hi in ((poisson, 0.85, 1.15), (regular, 50, 100)):
        lines = [
            json.dumps({"timestamp": float(t), "input_tokens": 100 + i % 7, "output_tokens": 9})
            for i, t in enumerate(arr)
        ]
        s = trace_stats(load_trace(_write(tmp_path, "p.jsonl", "\n".join(lines) + "\n")))
        assert lo <= s.burstiness <= hi
        assert s.mean_rate_rps == pytest.approx(2.0, rel=0.06)
        assert s.peak_window_s == 60 and s.peak_to_mean >= 1
        assert s.input_tokens.max == 106 and s.output_tokens.p50 == 9
        assert s.hourly_rate_rps is None  # under a day


def test_a_day_long_trace_gives_its_hourly_profile(tmp_path) -> None:
    lines = []
    for h in range(24):  # hour h carries (h + 1) * 36 requests: (h + 1) / 100 req/s
        n = (h + 1) * 36
        lines += [
            json.dumps(
                {"timestamp": h * 3600 + i * 3600 / n, "input_tokens": 9, "output_tokens": 1}
            )
            for i in range(n)
        ]
    lines.append(json.dumps({"timestamp": 86_400.0, "input_tokens": 9, "output_tokens": 1}))
    s = trace_stats(load_trace(_write(tmp_path, "day.jsonl", "\n".join(lines) + "\n")))
    assert s.hourly_rate_rps is not None and len(s.hourly_rate_rps) == 24
    assert s.hourly_rate_rps[0] == pytest.approx(0.01, rel=0.6)  # hour 0 also holds the last row
    assert s.hourly_rate_rps[23] == pytest.approx(0.24, rel=0.01)
    assert s.peak_to_mean > 1.5  # the evening minute against the day's mean


def test_a_peak_is_only_measured_over_time_and_stays_in_the_accepted_range(tmp_path) -> None:
    """Arrivals at one instant have no rate: peak_to_mean 1, not 1 / a millisecond window;
    a day whose busiest minute is far above its mean is held at the most that budget and
    recommend accept, said in the notes, so a written workload file is always usable."""
    one = json.dumps({"timestamp": 5.0, "input_tokens": 100, "output_tokens": 9}) + "\n"
    s = trace_stats(load_trace(_write(tmp_path, "one.jsonl", one)))
    assert s.peak_to_mean == 1.0 and any("one instant" in n for n in s.notes)
    spike = [
        {"timestamp": 30.0 + i * 0.01, "input_tokens": 9, "output_tokens": 1} for i in range(500)
    ]
    spike.append({"timestamp": 86_400.0, "input_tokens": 9, "output_tokens": 1})
    text = "\n".join(json.dumps(r) for r in spike) + "\n"
    s = trace_stats(load_trace(_write(tmp_path, "spike.jsonl", text)))
    assert s.peak_to_mean == MAX_PEAK_TO_MEAN and any("held at" in n for n in s.notes)


def test_file_size_and_row_count_are_bounded(tmp_path, monkeypatch) -> None:
    from inferwise.calculators import traces

    path = str(DATA / "plain.jsonl")
    monkeypatch.setattr(traces, "MAX_TRACE_ROWS", 3)
    with pytest.raises(InputError, match="more than 3 requests in the window"):
        load_trace(path)
    assert len(load_trace(path, window=TraceWindow(max_requests=3))) == 3  # a cap fits
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 100)
    with pytest.raises(InputError, match="the limit is 0 MiB"):
        load_trace(path)


def test_a_device_is_named_as_no_regular_file() -> None:
    with pytest.raises(InputError, match="no regular file at /dev/zero"):
        load_trace("/dev/zero")
