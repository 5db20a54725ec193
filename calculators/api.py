"""The calculators as a search calls them: typed requests in, typed results out, memoised.

A deployment search (the recommender) asks fit, predict and budget about
thousands of candidates, many of them more than once (the same GPU x TP at
several batch limits, the same point from two objectives). The calculators
are deterministic given their request, so each answer is kept, keyed on the
request's JSON; catalog and config parsing are already memoised below them.

Results are returned as copies, so a caller may change what it got without
changing what the next caller gets. A model named by a local path is keyed on
the file's size and modification time too: an edited config.json is read
again. Requests that fail raise as the calculators do and are not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from threading import Lock
from typing import TYPE_CHECKING, Any, TypeVar

from .files import stat_path

if TYPE_CHECKING:
    from .budget import BudgetRequest, BudgetResult
    from .fit import FitRequest, FitResult
    from .predict import PredictRequest, PredictResult
    from .user_calibration import AppliedCalibration

MEMO_SIZE = 4096
"""Results kept per calculator: a search's working set, a few MB."""

R = TypeVar("R")


class _Memo:
    """A bounded LRU of results, shared by the threads of one process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = Lock()
        self.hits = self.misses = 0

    def get_or_compute(self, key: str, compute: Callable[[], R]) -> R:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found.model_copy(deep=True)
        result = compute()
        with self._lock:
            self.misses += 1
            self._items[key] = result
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return result.model_copy(deep=True)  # type: ignore[attr-defined]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


_FIT, _PREDICT, _BUDGET = _Memo(MEMO_SIZE), _Memo(MEMO_SIZE), _Memo(MEMO_SIZE)


def _key(req: Any, *extra: Any) -> str:
    st = stat_path(req.model)
    stamp = f"|{st.st_size}:{st.st_mtime_ns}" if st is not None else ""
    return req.model_dump_json() + stamp + "".join(f"|{e}" for e in extra)


def fit(req: FitRequest, with_suggestions: bool = True) -> FitResult:
    """``inferwise fit``, memoised."""
    from .fit import estimate_fit

    return _FIT.get_or_compute(
        _key(req, with_suggestions), lambda: estimate_fit(req, with_suggestions=with_suggestions)
    )


def predict(req: PredictRequest, calibration: AppliedCalibration | None = None) -> PredictResult:
    """``inferwise predict``, memoised (with a loaded calibration: its factors)."""
    from .predict import predict_performance

    return _PREDICT.get_or_compute(
        _key(req, _stamp(calibration)), lambda: predict_performance(req, calibration)
    )


def budget(
    req: BudgetRequest, find_max_rate: bool = True, calibration: AppliedCalibration | None = None
) -> BudgetResult:
    """``inferwise budget``, memoised (``find_max_rate=False``: the design point only)."""
    from .budget import decompose_budget

    return _BUDGET.get_or_compute(
        _key(req, find_max_rate, _stamp(calibration)),
        lambda: decompose_budget(req, find_max_rate=find_max_rate, calibration=calibration),
    )


def _stamp(calibration: AppliedCalibration | None) -> str:
    """A calibration's part of a memo key: stored again under its name, it is another one."""
    return "" if calibration is None else f"{calibration.name}@{calibration.created_at}"


def clear_memos() -> None:
    """Forget every kept result (tests and benchmarks that time the work itself)."""
    for memo in (_FIT, _PREDICT, _BUDGET):
        memo.clear()
