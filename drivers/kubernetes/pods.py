"""The deployment's sandbox pods, as the driver knows them: listed once, then followed by one watch
that resumes from its last resourceVersion (bookmarks keep that version fresh while nothing
changes) and lists again when the server no longer keeps it (410 Gone), every change compared with
what was known and announced.

The driver reads pods from here rather than asking the API server each time: a start waits for
its pod to run, a pause for its pod to go, the reconciler inspects the sandbox an event names; all
of these wake on the watch's events. While the watch is down (the API server does not answer) the
cache is not trusted: waits poll the API server instead, and the reconciler's sweeps (which list)
cover what the events missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import structlog

from drivers.base import EventSink, SandboxEvent
from drivers.errors import DriverError, RuntimeUnavailable
from drivers.kubernetes.api import Expired, KubeApi, pods
from drivers.kubernetes.names import sandbox_of
from drivers.kubernetes.state import terminating

log = structlog.get_logger(__name__)

Json = dict[str, Any]
T = TypeVar("T")
WATCH_SECONDS = 290
"""How long one watch request lasts before the server ends it (it is resumed at once)."""
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0
POLL_SECONDS = 0.5
"""A wait's polling interval while the watch is down."""


class _Subscription:
    def __init__(self, sinks: list[EventSink], sink: EventSink) -> None:
        self._sinks = sinks
        self._sink = sink

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._sinks.remove(self._sink)


class PodWatch:
    """`on_restart(why)`: the watch was resumed or listed again (`expired`, `broken`); the
    metric's hook. `on_deleted(pod)`: a pod of the deployment is gone (capacity freed)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        selector: str,
        *,
        on_restart: Callable[[str], None] | None = None,
        on_deleted: Callable[[Json], None] | None = None,
    ) -> None:
        self._api = api
        self._path = pods(namespace)
        self._selector = selector
        self._on_restart = on_restart
        self._on_deleted = on_deleted
        self._pods: dict[str, Json] = {}
        self._synced = False
        self._sinks: list[EventSink] = []
        self._wakers: dict[str, list[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.resource_version: str | None = None
        self.relists = 0
        self._closed = False

    @property
    def synced(self) -> bool:
        """True while the cache follows the API server."""
        return self._synced

    def get(self, sandbox_id: str) -> Json | None:
        return self._pods.get(sandbox_id)

    def all(self) -> list[Json]:
        return list(self._pods.values())

    def saw_deletion(self, pod: Json) -> None:
        """The API server's answer to the driver's own graceful DELETE of `pod` (marked with its
        deletionTimestamp), known before the watch brings the same version: the cache holds it
        at once, so a caller that returns now is not contradicted by a read of the cache.
        Events of that pod older than the deletion are then ignored (`_stale`)."""
        sandbox = sandbox_of(pod)
        if not self._synced or not sandbox or not terminating(pod):
            return
        known = self._pods.get(sandbox)
        if known is None or _uid(known) != _uid(pod):
            return  # gone from the cache already, or another pod of the sandbox now
        self._pods[sandbox] = pod
        for waker in self._wakers.get(sandbox, ()):
            if not waker.done():
                waker.set_result(None)

    def start(self) -> None:
        if self._closed:
            return  # a late caller must not start a watch nobody stops
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="kube-pod-watch")

    def subscribe(self, sink: EventSink) -> _Subscription:
        self.start()
        self._sinks.append(sink)
        return _Subscription(self._sinks, sink)

    async def until(
        self,
        sandbox_id: str,
        check: Callable[[Json | None], T | None],
        timeout: float,
        fetch: Callable[[], Awaitable[Json | None]],
    ) -> T:
        """The first non-None answer of `check` on the sandbox's pod (None: no pod), asked at
        once and at each change of the pod; `fetch()` reads the pod while the watch is down.
        Raises TimeoutError after `timeout` seconds; `check` may raise to end the wait."""
        self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pod = self._pods.get(sandbox_id) if self._synced else await fetch()
            answer = check(pod)
            if answer is not None:
                return answer
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"pod of sandbox {sandbox_id}")
            waker: asyncio.Future[None] = loop.create_future()
            wakers = self._wakers.setdefault(sandbox_id, [])
            wakers.append(waker)
            try:
                await asyncio.wait(
                    [waker], timeout=left if self._synced else min(left, POLL_SECONDS)
                )
            finally:
                with contextlib.suppress(ValueError):
                    wakers.remove(waker)
                if not wakers:
                    self._wakers.pop(sandbox_id, None)

    def _changed(self, sandbox_id: str, action: str) -> None:
        for waker in self._wakers.get(sandbox_id, ()):
            if not waker.done():
                waker.set_result(None)
        event = SandboxEvent(sandbox_id=sandbox_id, action=action)
        for sink in list(self._sinks):
            sink(event)

    def _wake_all(self) -> None:
        for wakers in self._wakers.values():
            for waker in wakers:
                if not waker.done():
                    waker.set_result(None)

    async def _run(self) -> None:
        delay = BACKOFF_FIRST
        while True:
            try:
                if self.resource_version is None:
                    self.resource_version = await self._relist()
                await self._follow()
                delay = BACKOFF_FIRST
            except Expired:
                log.info("kube_pod_watch_expired", resource_version=self.resource_version)
                self.resource_version = None
                self._restarted("expired")
            except (RuntimeUnavailable, DriverError) as exc:
                self._unsync()
                self._restarted("broken")
                log.warning("kube_pod_watch_broken", error=str(exc), retry_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
            except Exception:
                self._unsync()
                self._restarted("broken")
                log.exception("kube_pod_watch_failed")
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def _restarted(self, why: str) -> None:
        if self._on_restart is not None:
            self._on_restart(why)

    def _unsync(self) -> None:
        if self._synced:
            self._synced = False
            self._wake_all()  # waits switch to polling

    async def _relist(self) -> str:
        """List the pods again; every difference with what was known is announced."""
        listed = await self._api.list(self._path, self._selector, "list")
        fresh: dict[str, Json] = {}
        for pod in listed.get("items") or []:
            if sandbox := sandbox_of(pod):
                known = self._pods.get(sandbox)
                fresh[sandbox] = known if known is not None and _stale(pod, known) else pod
        before, self._pods = self._pods, fresh
        self._synced = True
        self.relists += 1
        for sandbox, pod in before.items():
            if sandbox not in fresh:
                self._gone(pod)
                self._changed(sandbox, "deleted")
        for sandbox, pod in fresh.items():
            old = before.get(sandbox)
            if old is None or _version(old) != _version(pod):
                self._changed(sandbox, "modified" if old is not None else "added")
        self._wake_all()
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    async def _follow(self) -> None:
        """Apply the watch's events until the server ends the stream, remembering the last
        version seen (where the next watch resumes)."""
        self._synced = True
        version = self.resource_version or ""
        stream = self._api.watch(self._path, self._selector, version, WATCH_SECONDS)
        # Closed here, whatever ends the loop: an abandoned stream would keep its connection
        # open until the garbage collector finds it, which may be after the loop has gone.
        async with contextlib.aclosing(stream) as events:
            await self._apply(events)

    async def _apply(self, events: AsyncIterator[Json]) -> None:
        async for event in events:
            kind = event.get("type")
            pod = event.get("object") or {}
            self.resource_version = _version(pod) or self.resource_version
            if kind == "BOOKMARK":
                continue
            sandbox = sandbox_of(pod)
            if not sandbox:
                continue
            if kind == "DELETED":
                if self._pods.get(sandbox, {}).get("metadata", {}).get("uid") == _uid(pod):
                    del self._pods[sandbox]
                self._gone(pod)
            else:
                known = self._pods.get(sandbox)
                if known is not None and (_stale(pod, known) or _same(pod, known)):
                    # Older than a deletion the cache holds already, or that very version (the
                    # echo of saw_deletion): nothing to wake anyone for.
                    continue
                self._pods[sandbox] = pod
            self._changed(sandbox, str(kind).lower())

    def _gone(self, pod: Json) -> None:
        if self._on_deleted is not None:
            self._on_deleted(pod)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._synced = False
        self._wake_all()


def _version(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _stale(pod: Json, known: Json) -> bool:
    """`pod` is an older version of `known`: the same pod, not yet marked for deletion where
    `known` is (a deletionTimestamp, once set, is never taken back)."""
    return _uid(pod) == _uid(known) and terminating(known) and not terminating(pod)


def _same(pod: Json, known: Json) -> bool:
    """`pod` is the version of `known` the cache holds already."""
    return _uid(pod) == _uid(known) and bool(_version(pod)) and _version(pod) == _version(known)
