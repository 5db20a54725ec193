"""What one probe request leaves behind, and the metrics defined on it.

Times are seconds on the client's monotonic clock, relative to the run's start,
so that a record is self-contained and rows from an interrupted run stay
comparable. Every user-facing metric is derived here, once, from these
timestamps:

* TTFT: first token-bearing delta minus request start (a role-only or empty
  first chunk is not a token).
* ITL: a chunk carrying k tokens after a gap g contributes k gaps of g/k.
* TPOT: (E2E - TTFT) / (output tokens - 1).
* E2E: end minus request start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ErrorClass = Literal[
    "connect_refused",
    "dns",
    "tls",
    "connect_timeout",
    "read_timeout",
    "total_timeout",
    "http_4xx",
    "http_429",
    "http_5xx",
    "stream_cut",
    "malformed_sse",
    "stalled",
    "server_error_event",
    "cancelled",
    "over_limit",
    "worker_lost",
    "other",
]


class RequestRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, description="Position in the run's schedule.")
    ok: bool
    error_class: ErrorClass | None = None
    error_message: str | None = Field(default=None, description="Never contains the API key.")
    http_status: int | None = None
    warmup: bool = False
    scheduled_s: float | None = Field(
        default=None, description="When the schedule said to send (open loop)."
    )
    start_s: float = Field(description="When the request was sent.")
    first_byte_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    tokens_approximate: bool = Field(
        default=False,
        description="True when token counts came from counting chunks, not from usage.",
    )
    chunk_times_s: list[float] = Field(
        default_factory=list, description="Arrival of every token-bearing chunk."
    )
    chunk_tokens: list[int] = Field(
        default_factory=list, description="Tokens carried by each chunk."
    )
    server_timings: dict[str, float] | None = Field(
        default=None,
        description="The engine's own timings when it reports them (llama.cpp `timings`).",
    )
    prompt_text: str | None = None
    output_text: str | None = None
    output_sha256: str | None = Field(
        default=None,
        description="Hash of the output text, stored always (the text only with --store-text): "
        "what `runs consistency` compares.",
    )
    prompt_id: str | None = Field(
        default=None,
        description="The dataset row's id (or prompt hash): pairs prompts across runs.",
    )
    grader: str | None = Field(default=None, description="The row's grader, when it has one.")
    correct: bool | None = Field(
        default=None, description="Whether the output passed its grader (None: not graded)."
    )

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_s is None:
            return None
        return (self.first_token_s - self.start_s) * 1000.0

    @property
    def e2e_ms(self) -> float | None:
        if self.end_s is None:
            return None
        return (self.end_s - self.start_s) * 1000.0

    @property
    def schedule_delay_ms(self) -> float | None:
        """How late the client sent the request against its schedule (client health)."""
        if self.scheduled_s is None:
            return None
        return (self.start_s - self.scheduled_s) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        if (
            self.ttft_ms is None
            or self.e2e_ms is None
            or not self.output_tokens
            or self.output_tokens < 2
        ):
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)

    def itl_ms(self) -> list[float]:
        """Per-token inter-token latencies: a chunk of k tokens after gap g gives k gaps of g/k."""
        out: list[float] = []
        times = self.chunk_times_s
        for i in range(1, len(times)):
            k = self.chunk_tokens[i] if i < len(self.chunk_tokens) else 1
            k = max(k, 1)
            gap_ms = (times[i] - times[i - 1]) * 1000.0
            out.extend([gap_ms / k] * k)
        return out

    def chunk_gaps_ms(self) -> list[float]:
        """Raw gaps between token-bearing chunks, reported beside tokens per chunk."""
        times = self.chunk_times_s
        return [(times[i] - times[i - 1]) * 1000.0 for i in range(1, len(times))]


class ErrorClassCount(BaseModel):
    """Failed requests of one error class, as the probe and `runs show` report them."""

    model_config = ConfigDict(extra="forbid")

    error_class: str
    count: int
    examples: list[str] = Field(
        default_factory=list, description="Up to three distinct messages (secrets removed)."
    )


def error_counts(records: Iterable[RequestRecord]) -> list[ErrorClassCount]:
    return [
        ErrorClassCount(error_class=c, count=n, examples=ex) for c, n, ex in error_classes(records)
    ]


def error_classes(records: Iterable[RequestRecord]) -> list[tuple[str, int, list[str]]]:
    """The failed requests among `records` as (error class, count, up to three distinct
    messages), most frequent first: what the probe and `runs show` both report."""
    counts: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    for r in records:
        if r.ok:
            continue
        cls = r.error_class or "other"
        counts[cls] = counts.get(cls, 0) + 1
        seen = examples.setdefault(cls, [])
        if r.error_message and r.error_message not in seen and len(seen) < 3:
            seen.append(r.error_message)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties keep first-seen order
    return [(cls, n, examples[cls]) for cls, n in ranked]
