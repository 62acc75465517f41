"""Conversation starts outlive the replica that runs them.

Every replica looks, at start-up and then every ADOPT_EVERY seconds, for unfinished start tasks
that no replica holds a lease on (their replica died, or handed them over as it stopped), and
resumes each from its last saved step (StartTaskRunner.recover: the lease is taken atomically,
so one replica wins). A replica that is stopping lets its own tasks and the sandbox launches
they wait for finish for as long as its shutdown allows, then hands the rest over: their leases
are dropped at once rather than left to lapse, so another replica resumes them within seconds.
"""

from __future__ import annotations

import asyncio

import structlog

from controlplane.background import stop_task
from controlplane.conversations.starter import StartTaskRunner
from controlplane.sandboxes.launcher import Launcher
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)

ADOPT_EVERY = 2.0


class StartTaskHandover:
    def __init__(self, runner: StartTaskRunner, *, interval: float = ADOPT_EVERY) -> None:
        self._runner = runner
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @classmethod
    async def started(cls, runner: StartTaskRunner) -> StartTaskHandover:
        """Resume what waits now (before serving), then keep looking in the background."""
        handover = cls(runner)
        await runner.recover()
        handover._task = asyncio.create_task(handover._loop(), name="start-task-handover")
        return handover

    async def _loop(self) -> None:
        # Ends on the flag too: a cancellation that coincides with a Redis socket timeout can
        # surface as a timeout, which this loop would otherwise take for an outage.
        while not self._stopped:
            await asyncio.sleep(self._interval)
            try:
                await self._runner.recover()
            except REDIS_DOWN as exc:
                log.warning("start_task_adoption_failed", error=str(exc))
            except Exception:
                log.exception("start_task_adoption_crashed")

    async def stop(self) -> None:
        self._stopped = True
        await stop_task(self._task)
        self._task = None

    async def drain(self, seconds: float, launcher: Launcher) -> None:
        """Stop adopting; give this replica's start tasks, then its sandbox launches, up to
        `seconds` in all to finish; hand over the tasks still running."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        await self.stop()
        await self._runner.settle(seconds)
        await launcher.settle(max(0.0, deadline - loop.time()))
        await self._runner.hand_over()
