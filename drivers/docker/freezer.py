"""`docker pause`, the cgroup freezer, as everything on Docker that holds a sandbox still uses it:
the driver's pause (the API's, the idle reaper's, a warm pool's, a rewind's) and a snapshot's
freeze (files.py).

On cgroup v1 the freezer cannot stop a process in uninterruptible sleep (a direct write waiting
on a slow or throttled disk, heavy I/O on a busy host): runc retries for a moment, then thaws
the container and answers "unable to freeze". That is transient (the process is frozen as soon
as its I/O returns), so it is tried again a few times with a growing pause in between; past
that the caller is told the sandbox is busy, to retry later. (cgroup v2 freezes such a process
where it sleeps and does not fail this way.)"""

from __future__ import annotations

import asyncio

import docker
import structlog
from docker.errors import APIError, NotFound

from drivers.docker.engine import DockerEngine
from drivers.errors import DriverError, SandboxBusy

log = structlog.get_logger(__name__)

FREEZE_ATTEMPTS = 8
FREEZE_BACKOFF = 0.25
"""Seconds before the second attempt, twice that before the third, …: with runc's own tries
(about 0.3 s each), about 9 s in all before a pause gives up."""
UNABLE = "unable to freeze"


async def freeze(engine: DockerEngine, name: str) -> bool:
    """Pause container `name`; False when it was paused already (by someone else: leave it so).
    Raises SandboxBusy when the freezer still could not stop its processes after
    FREEZE_ATTEMPTS, DriverError for any other refusal (a container that does not exist),
    RuntimeUnavailable when the engine does not answer."""

    def run(client: docker.DockerClient) -> bool:
        try:
            client.api.pause(name)
        except NotFound:
            raise DriverError(f"container {name} does not exist") from None
        except APIError as exc:
            message = str(exc.explanation or exc)
            if exc.status_code == 409 and "already paused" in message:
                return False
            raise DriverError(f"Docker could not pause {name}: {message}") from None
        return True

    attempt = 0
    while True:
        try:
            return await engine.call(run, "pause")
        except DriverError as exc:
            attempt += 1
            if UNABLE not in str(exc):
                raise
            if attempt >= FREEZE_ATTEMPTS:
                raise SandboxBusy(
                    f"Docker could not pause {name}: the cgroup freezer could not stop its "
                    f"processes in {attempt} attempts (processes waiting on I/O of a busy "
                    "disk); retry in a moment"
                ) from None
            log.warning("docker_freeze_retry", container=name, attempt=attempt, error=str(exc))
            await asyncio.sleep(FREEZE_BACKOFF * attempt)
