"""Stopping background tasks for certain (controlplane/background.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from controlplane.background import stop_task, stop_tasks
from drivers.docker.engine import SLOW, DockerEngine


async def swallows_one_cancellation(rounds: list[int]) -> None:
    """A loop whose first cancellation is lost, as in a library call racing its completion."""
    swallowed = False
    while True:
        rounds.append(1)
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True  # carried on, as if a call had just failed


async def test_a_swallowed_cancellation_is_repeated() -> None:
    rounds: list[int] = []
    task = asyncio.create_task(swallows_one_cancellation(rounds))
    await asyncio.sleep(0.01)
    # One cancel and an await of the task would wait here forever.
    await asyncio.wait_for(stop_task(task, grace=0.2), 5)
    assert task.cancelled()
    count = len(rounds)
    await asyncio.sleep(0.2)
    assert len(rounds) == count, "the loop ran on after its stop"


async def test_a_task_that_never_stops_is_left_after_the_limit() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    started = time.monotonic()
    await stop_tasks([task], grace=0.2, within=0.5)
    assert 0.5 <= time.monotonic() - started < 2
    assert not task.done()
    released.set()  # the test's own loop ends it
    await asyncio.wait_for(task, 1)


async def test_errors_are_retrieved_not_raised() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop_tasks([failed, None])
    assert isinstance(failed.exception(), ValueError)


async def test_an_engine_call_outlives_repeated_cancellations(docker_client: object) -> None:
    """A delete cancels the launch and then removes what it made: the engine call in a thread
    must have finished by the time the launch's cancellation ends, however often it is
    cancelled (stop_tasks repeats cancellations), or the removal runs before the volume or
    container exists and leaks it."""
    engine = DockerEngine()
    finished: list[float] = []

    def slow(_client: object) -> None:
        time.sleep(0.5)
        finished.append(time.monotonic())

    task = asyncio.create_task(engine.call(slow, lane=SLOW))
    await asyncio.sleep(0.05)
    while not task.done():
        task.cancel()
        await asyncio.sleep(0.02)
    ended = time.monotonic()
    assert task.cancelled()
    assert finished, "the cancellation ended before the engine call"
    assert finished[0] <= ended
    await engine.close()
