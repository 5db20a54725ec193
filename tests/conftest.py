"""What the test modules share: the repository root on the import path (so ``bench`` is a
package the tests import, not files loaded by path) and builders of synthetic stored runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The tests never reach the real Hugging Face Hub: catalog ids resolve from the catalog
# (a test of the Hub path turns it back on against its stand-in Hub on 127.0.0.1), and
# every child process a test starts inherits this. Not HF_HUB_OFFLINE: huggingface_hub
# reads that once at import, so a test could not turn it off again.
os.environ["INFERWISE_HUB"] = "off"


def streamed_records(
    n: int,
    *,
    spacing_s: float,
    ttft_s: float | Any,
    tokens: int,
    itl_s: float,
    input_tokens: int,
    first_byte: bool = False,
) -> list[Any]:
    """`n` completed streamed requests, one token per chunk. `ttft_s` is a number or a
    function of the request index (to give the run a spread)."""
    from inferwise.probes.records import RequestRecord

    records = []
    for i in range(n):
        start = i * spacing_s
        ttft = ttft_s(i) if callable(ttft_s) else ttft_s
        chunks = [start + ttft + itl_s * k for k in range(tokens)]
        records.append(
            RequestRecord(
                index=i,
                ok=True,
                start_s=start,
                first_byte_s=start + 0.001 if first_byte else None,
                first_token_s=chunks[0],
                end_s=chunks[-1] + (0.001 if first_byte else 0.0),
                input_tokens=input_tokens,
                output_tokens=tokens,
                chunk_times_s=chunks,
                chunk_tokens=[1] * tokens,
            )
        )
    return records


def failed_records(errors: Mapping[str, int], first_index: int) -> list[Any]:
    """Failed requests, `errors[cls]` of each error class, indexed from `first_index`."""
    from inferwise.probes.records import RequestRecord

    return [
        RequestRecord(
            index=first_index + j * 10 + k, ok=False, error_class=cls, start_s=1.0, end_s=2.0
        )
        for j, (cls, n) in enumerate(errors.items())
        for k in range(n)
    ]


def vllm_gauges(
    running: Iterable[float], waiting: Iterable[float], kv: float
) -> list[tuple[float, str, dict[str, str], float]]:
    """One scrape per second of vLLM's queue, running and KV-usage gauges."""
    samples: list[tuple[float, str, dict[str, str], float]] = []
    for t, (r, w) in enumerate(zip(running, waiting, strict=True)):
        samples += [
            (float(t), "vllm:num_requests_running", {}, r),
            (float(t), "vllm:num_requests_waiting", {}, w),
            (float(t), "vllm:kv_cache_usage_perc", {}, kv),
            (float(t), "vllm:num_preemptions_total", {}, 0.0),
        ]
    return samples


def store_run(
    db: str | Path,
    records: list[Any],
    *,
    config: dict[str, Any],
    labels: dict[str, str] | None = None,
    samples: list[tuple[float, str, dict[str, str], float]] | None = None,
    slo: dict[str, float] | None = None,
) -> str:
    """A complete stored run of `records` (and engine metric samples), as a probe leaves it."""
    from inferwise.probes.store import RunStore
    from inferwise.probes.summary import summarize

    with RunStore(db) as store:
        run_id = store.create_run(config=config, labels=labels or {}, meta={})
        store.add_requests(run_id, records)
        if samples:
            store.add_metric_samples(run_id, samples)
        store.finish_run(run_id, "complete", summarize(records, slo=slo))
    return run_id
