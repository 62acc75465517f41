"""Retrying Redis calls for a while, not a number of times: `RetryWindow`, the retry policy of
every client controlplane/store/failover.py makes.

A connection error, a timeout, a master not known yet or a demoted master's READONLY answer is
retried with exponential backoff (50 ms doubling to 250 ms) until `window` seconds have passed
since the call began, then raised (the API answers 503). The window belongs to the outermost
call: a reconnect inside a command's retry fails at once and the command's own loop tries again,
so nesting (command → connect) never multiplies the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import structlog
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controlplane.store.durable import NotReplicated

log = structlog.get_logger(__name__)
T = TypeVar("T")

RETRYABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,  # MasterNotFoundError and BusyLoadingError (an AOF loading) included
    RedisTimeoutError,
    ReadOnlyError,  # a demoted master, reached before Sentinel told us
    OSError,  # refused or reset while connecting
    TimeoutError,
)
NEVER_RETRIED: tuple[type[Exception], ...] = (AuthenticationError, NotReplicated)
"""A wrong password does not fix itself; a write that is not on its replicas was applied on the
master, and running it again could apply it twice."""

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "acs_redis_retry_deadline", default=None
)


class RetryWindow(Retry):
    """Retry for up to `window` seconds (the outermost call's: a reconnect inside a command's
    retry fails at once and the command's own loop tries again, so nesting never multiplies
    the wait)."""

    def __init__(self, window: float, *, base: float = 0.05, cap: float = 0.25) -> None:
        super().__init__(ExponentialBackoff(cap=cap, base=base), -1, RETRYABLE)  # type: ignore[arg-type]
        self.window = window

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryWindow) and other.window == self.window

    __hash__ = Retry.__hash__

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        outer = _DEADLINE.get()
        deadline = outer if outer is not None else time.monotonic() + self.window
        token = _DEADLINE.set(deadline) if outer is None else None
        try:
            failures = 0
            while True:
                try:
                    return await do()
                except self._supported_errors as error:
                    if isinstance(error, NEVER_RETRIED):
                        raise
                    raise_if_cancelled()
                    if is_retryable is not None and not is_retryable(error):
                        raise
                    failures += 1
                    await self._fail(fail, error, failures, with_failure_count)
                    left = deadline - time.monotonic()
                    if outer is not None or left <= 0:
                        raise
                    if failures == 1:
                        log.info("redis_retrying", error=str(error) or type(error).__name__)
                    await asyncio.sleep(min(self._backoff.compute(failures), left))
        finally:
            if token is not None:
                _DEADLINE.reset(token)

    async def _fail(
        self, fail: Callable[..., Any], error: Exception, failures: int, with_count: bool
    ) -> None:
        """redis-py's clean-up of the failed connection (a disconnect, or a pub/sub's reconnect,
        which fails too while the master is away: the loop carries on regardless)."""
        try:
            result = fail(error, failures) if with_count else fail(error)
            if asyncio.iscoroutine(result):
                await result
        except self._supported_errors as again:
            if isinstance(again, NEVER_RETRIED):
                raise


def raise_if_cancelled() -> None:
    """Raise CancelledError in a task that is being cancelled. A cancellation that coincides
    with one of redis-py's socket timeouts can surface as a TimeoutError instead; a loop that
    retried it would outlive the cancel, and its task would never end (seen in tests)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@contextlib.contextmanager
def single_attempt() -> Iterator[None]:
    """Calls inside fail at their first error (a start-up check that keeps its own count)."""
    token = _DEADLINE.set(time.monotonic())
    try:
        yield
    finally:
        _DEADLINE.reset(token)
