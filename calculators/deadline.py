"""A time budget for one computation, checked inside the loops that could run long.

Input bounds keep every simulation finite, but "finite" can still be minutes
for a pathological combination (millions of steps), and over MCP a call that
never returns holds a worker thread that other calls need. The door that runs
an operation sets a budget (``compute_budget``); the simulator's step loop and
the rate searches call :func:`check` and stop with an OperationalError when it
is spent. A context variable carries it, so concurrent calls on different
threads each have their own; code run without a budget is never stopped.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from contextvars import ContextVar

from .errors import OperationalError

_deadline: ContextVar[tuple[float, float] | None] = ContextVar("inferwise_deadline", default=None)


DEFAULT_BUDGET_S = 8.0
"""The slowest real request (a budget's rate search on a MoE model) takes ~0.3 s."""
BUDGET_ENV = "INFERWISE_COMPUTE_BUDGET_S"


def default_budget_s(default: float = DEFAULT_BUDGET_S) -> float | None:
    """The budget the doors give one operation: $INFERWISE_COMPUTE_BUDGET_S (0 = none),
    else ``default`` (the operation's own, for a search that runs many calculations).
    A bad value falls back to the default."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return None if value <= 0 else value


@contextlib.contextmanager
def compute_budget(seconds: float | None) -> Iterator[None]:
    """Run the block with `seconds` of compute budget (None: no limit)."""
    if seconds is None:
        yield
        return
    token = _deadline.set((time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def check() -> None:
    """Raise OperationalError when the current budget is spent."""
    limit = _deadline.get()
    if limit is not None and time.monotonic() > limit[0]:
        raise OperationalError(
            f"the computation ran past its time budget of {limit[1]:g} s and was stopped; "
            "fewer simulated requests (num_requests) or shorter lengths finish sooner"
        )


def remaining_s() -> float:
    """Seconds left in the current budget (infinite without one): a search stops starting
    new work before its budget would stop it in the middle."""
    limit = _deadline.get()
    return math.inf if limit is None else limit[0] - time.monotonic()
