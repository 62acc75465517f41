"""Turning exceptions into one-line reasons for events and logs."""

from __future__ import annotations


def describe_error(exc: BaseException) -> str:
    """A one-line reason, unwrapping the exception groups of anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(e) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
