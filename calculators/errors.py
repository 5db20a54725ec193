"""Errors shared by every layer.

They live in `calculators` because that is the package every other one may
import. The front doors map them: `InputError` to exit code 2 on the CLI and to
a tool error over MCP; `OperationalError` to exit code 1.
"""

from __future__ import annotations


class InferwiseError(Exception):
    """Base class: an error whose message is fit to show a user as it is."""


class InputError(InferwiseError, ValueError):
    """Bad input the user can fix. `field` names the input (snake_case) and
    `accepted` says what would have been accepted."""

    def __init__(self, field: str, message: str, accepted: str | None = None):
        self.field = field
        self.message = message
        self.accepted = accepted
        text = f"{field}: {message}"
        if accepted:
            text += f" (accepted: {accepted})"
        super().__init__(text)


class OperationalError(InferwiseError):
    """The command ran but could not do its job (e.g. every probe request failed)."""


def classify_unexpected(exc: BaseException) -> InferwiseError:
    """The error a door reports for an exception no layer mapped.

    RecursionError, MemoryError and OverflowError come from inputs beyond what the
    calculators can represent (nesting thousands deep, numbers past a float), so they
    are the caller's to fix; anything else is a bug, said as one."""
    if isinstance(exc, RecursionError):
        return InputError("input", "an input is nested too deeply to process")
    if isinstance(exc, MemoryError):
        return InputError("input", "an input is too large to process in memory")
    if isinstance(exc, OverflowError):
        return InputError("input", f"a number is too large to compute with ({exc})")
    return OperationalError(
        f"internal error: {type(exc).__name__}: {exc} (set INFERWISE_DEBUG=1 for the "
        "traceback, and please report it)"
    )
