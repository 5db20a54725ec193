"""Is the measuring client keeping up? Event-loop lag, sampled while the probe runs.

A timer asks to run every `interval_s`; how late it actually runs is the time
any stream's bytes may have waited before being stamped. When that lag grows,
measured TTFT and ITL include the client's own queueing, and the summary says
so (:func:`inferwise.probes.summary.client_health`). The sampler costs one
timer callback per interval, nothing per chunk.
"""

from __future__ import annotations

import asyncio
import time


class LoopLagSampler:
    """Collects lag samples (ms) of the running event loop between start() and stop()."""

    def __init__(self, interval_s: float = 0.01, max_samples: int = 200_000) -> None:
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.samples_ms: list[float] = []
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self.interval_s
        self._handle = loop.call_at(self._due, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        if len(self.samples_ms) < self.max_samples:
            self.samples_ms.append(max(0.0, (now - self._due) * 1000.0))
        self._due = now + self.interval_s
        self._handle = loop.call_at(self._due, self._tick, loop)

    def stop(self) -> list[float]:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        return self.samples_ms


def busy_wait(seconds: float) -> None:
    """Block the loop on purpose (tests use it to show the sampler sees a saturated client)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
