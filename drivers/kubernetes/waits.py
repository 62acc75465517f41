"""Waiting on a sandbox's pod: until a new one runs (or why it cannot), until a deleted one has
gone, until a stopping one has stopped and is cleared away. Each wait wakes on the pod watch's
events (pods.py) and reads the API server instead while the watch is down (resources.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog

from drivers.base import RunState
from drivers.errors import DriverError, ImageMissing
from drivers.kubernetes.capacity import Capacity
from drivers.kubernetes.names import sandbox_of, uid_of
from drivers.kubernetes.pods import PodWatch
from drivers.kubernetes.resources import Resources
from drivers.kubernetes.settings import KubernetesSettings
from drivers.kubernetes.state import (
    capacity_verdict,
    image_failure,
    parse_time,
    state_of,
    terminating,
)

log = structlog.get_logger(__name__)

Json = dict[str, Any]
T = TypeVar("T")
GONE_WITHIN = 30.0
"""Seconds a deleted pod has to go (or change) before the operation fails."""
STOP_SLACK = 2.0
"""Seconds beyond a stopping pod's grace period before it is removed anyway."""


def stopped(pod: Json) -> bool:
    """The pod's container no longer runs (or never will)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
    return bool(states) and all(not s.get("running") for s in states)


def booting_or_running(pod: Json) -> bool:
    """A pod a start may wait for rather than replace."""
    status = state_of(pod, None).status
    return not terminating(pod) and status in (RunState.RUNNING, RunState.CREATED)


class PodWaits:
    """`capacity` hears of the starts that no node can run."""

    def __init__(
        self,
        watch: PodWatch,
        resources: Resources,
        capacity: Capacity,
        settings: KubernetesSettings,
    ) -> None:
        self._watch = watch
        self._resources = resources
        self._capacity = capacity
        self._settings = settings

    async def pod(self, sandbox_id: str) -> Json | None:
        """The sandbox's pod: the watch's while it follows the API server, else read."""
        if self._watch.synced:
            return self._watch.get(sandbox_id)
        return await self._resources.read_pod(sandbox_id)

    async def running(self, sandbox_id: str) -> Json:
        """The sandbox's new pod, once it runs (and has an address, unless a Service is the
        endpoint). Raises ImageMissing, or DriverError with the reason it cannot run: gone,
        being deleted, dead, exited at once, no node for it past ACS_KUBE_SCHEDULE_TIMEOUT (the
        verdict is left with the capacity), or not running within ACS_KUBE_POD_START_TIMEOUT."""
        settings = self._settings
        started = time.monotonic()
        seen = False

        def check(pod: Json | None) -> Json | None:
            nonlocal seen
            if pod is None:
                if seen:
                    raise DriverError(f"the pod of sandbox {sandbox_id} vanished while starting")
                return None
            seen = True
            if terminating(pod):
                raise DriverError(f"the pod of sandbox {sandbox_id} is being deleted")
            if pulled := image_failure(pod):
                raise ImageMissing(pulled)
            state = state_of(pod, None)
            if state.status == RunState.DEAD:
                raise DriverError(state.error or "the pod failed")
            if state.status == RunState.EXITED:
                raise DriverError(f"the agent server exited at once (exit code {state.exit_code})")
            verdict = capacity_verdict(pod)
            if verdict and time.monotonic() - started > settings.kube_schedule_timeout:
                self._capacity.refused(pod, verdict)
                raise DriverError(f"no node can run the sandbox: {verdict}")
            addressed = settings.kube_endpoint == "service" or (pod.get("status") or {}).get(
                "podIP"
            )
            return pod if state.status == RunState.RUNNING and addressed else None

        try:
            return await self._until(sandbox_id, check, settings.kube_pod_start_timeout)
        except TimeoutError:
            found = await self.pod(sandbox_id)
            why = (state_of(found, None).error if found else None) or "still not running"
            raise DriverError(
                f"the pod of sandbox {sandbox_id} did not start within "
                f"{settings.kube_pod_start_timeout:g} s: {why}"
            ) from None

    async def changed(self, sandbox_id: str, done: Callable[[Json | None], bool]) -> None:
        """Until `done(pod)` (None: no pod) is true. Raises DriverError after GONE_WITHIN."""
        try:
            await self._until(sandbox_id, lambda p: True if done(p) else None, GONE_WITHIN)
        except TimeoutError:
            raise DriverError(f"the pod of sandbox {sandbox_id} did not change in time") from None

    async def stopping(self, sandbox_id: str, answer: Json | None) -> None:
        """After a graceful DELETE of the sandbox's pod (`answer`: the API server's), until the
        pod is marked for deletion or gone."""
        if answer is not None and terminating(answer) and self._watch.synced:
            # The answer is the pod marked for deletion: the cache takes it now rather than
            # when the watch brings it (one wake-up less on the way to the caller's answer).
            self._watch.saw_deletion(answer)
            if (cached := self._watch.get(sandbox_id)) is None or terminating(cached):
                return
        await self.changed(sandbox_id, lambda p: p is None or terminating(p))

    async def cleared(self, pod: Json) -> None:
        """Let a stopping pod end (its grace period at most), then remove it for good, so that
        its name is free and no two pods of a sandbox share its workspace."""
        sandbox_id = sandbox_of(pod)
        deadline = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
        left = STOP_SLACK + (
            (deadline - datetime.now(UTC)).total_seconds() if deadline is not None else 0.0
        )
        if not stopped(pod) and left > 0:
            try:
                await self._until(
                    sandbox_id, lambda p: True if p is None or stopped(p) else None, left
                )
            except TimeoutError:
                node = str((pod.get("spec") or {}).get("nodeName") or "")
                log.warning("kube_pod_stop_overdue", sandbox_id=sandbox_id, node=node)
        uid = uid_of(pod)
        await self._resources.delete_pod(sandbox_id, "start", grace=0, uid=uid)
        await self.changed(sandbox_id, lambda p: p is None or uid_of(p) != uid)

    async def _until(
        self, sandbox_id: str, check: Callable[[Json | None], T | None], timeout: float
    ) -> T:
        return await self._watch.until(
            sandbox_id, check, timeout, lambda: self._resources.read_pod(sandbox_id)
        )
