"""Stopping the app's background tasks for certain, so that closing the app always ends.

A single `task.cancel()` followed by awaiting the task is not enough: a cancellation that lands
in a library call racing its own completion can be swallowed (seen on Python 3.11 with redis-py
and `asyncio.wait_for`: the task took it for a failed call and carried on with its loop, and the
app's close waited for it forever). So a task that has not ended a few seconds after its
cancellation is cancelled again until it has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

log = structlog.get_logger(__name__)

GRACE_SECONDS = 3.0
RETRY_SECONDS = 0.1
WITHIN_SECONDS = 10.0


async def stop_tasks(
    tasks: Iterable[asyncio.Task[Any] | None],
    *,
    grace: float = GRACE_SECONDS,
    within: float = WITHIN_SECONDS,
) -> None:
    """Cancel `tasks` and wait until each has ended. One cancellation first, with `grace`
    seconds to act on it (a task's clean-up, such as releasing what it holds, is not cut
    short); a task still running then is cancelled again every 0.1 s. One still running after
    `within` seconds is logged and left behind: the caller's close must end. What the tasks
    raised is retrieved (never reported as unretrieved) and not raised here."""
    given = [task for task in tasks if task is not None]
    pending = {task for task in given if not task.done()}
    loop = asyncio.get_running_loop()
    started = loop.time()
    for task in pending:
        task.cancel()
    if pending:
        _done, pending = await asyncio.wait(pending, timeout=min(grace, within))
    while pending:
        if loop.time() - started >= within:
            log.error("background_tasks_did_not_stop", tasks=sorted(t.get_name() for t in pending))
            return
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=RETRY_SECONDS)
    for task in given:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: its loop logged what mattered


async def stop_task(
    task: asyncio.Task[Any] | None,
    *,
    grace: float = GRACE_SECONDS,
    within: float = WITHIN_SECONDS,
) -> None:
    """`stop_tasks` for one task."""
    await stop_tasks([task], grace=grace, within=within)
