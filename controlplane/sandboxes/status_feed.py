"""Waking whoever waits for a sandbox's status to change, without polling.

The store's scripts publish "<sandbox id> <status>" on a Redis channel with every status change,
create and delete (controlplane.store.keyspace.SANDBOX_STATUS_CHANNEL), so a waiter on any replica
wakes; changes made in this process also wake local waiters directly. A waiter still re-reads the
record now and then, because a pub/sub message sent while the subscription is reconnecting is
lost.

The same channel relays agent servers' announcements ("<sandbox id> LISTENING", not a status):
the replica whose launcher waits for that sandbox may not be the one the webhook reached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import redis.asyncio as aioredis
import structlog

from controlplane.background import stop_task
from controlplane.store import keyspace, text
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)

LISTENING = "LISTENING"


class StatusFeed:
    def __init__(
        self,
        redis: aioredis.Redis | None = None,
        on_listening: Callable[[str], None] | None = None,
    ) -> None:
        """`on_listening(sandbox_id)`: an agent server's announcement relayed by a replica."""
        self._redis = redis
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._on_listening = on_listening
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call `listener(sandbox_id)` at every change of a sandbox, on any replica (e.g. to
        forget what a cache holds of it)."""
        self._listeners.append(listener)

    async def relay_listening(self, sandbox_id: str) -> None:
        """Tell every replica that the sandbox's agent server listens (best effort: without
        Redis only this replica knows, and the others' slow polling finds out)."""
        if self._redis is None:
            return
        try:
            await self._redis.publish(keyspace.SANDBOX_STATUS_CHANNEL, f"{sandbox_id} {LISTENING}")
        except REDIS_DOWN as exc:
            log.warning("agent_listening_not_relayed", sandbox_id=sandbox_id, error=str(exc))

    def notify(self, sandbox_id: str) -> None:
        for event in self._waiters.get(sandbox_id, ()):
            event.set()
        for listener in self._listeners:
            listener(sandbox_id)

    @contextlib.contextmanager
    def watch(self, sandbox_id: str) -> Iterator[asyncio.Event]:
        """An event set at every change of `sandbox_id` while the block runs (clear it before
        each read of the record)."""
        event = asyncio.Event()
        self._waiters.setdefault(sandbox_id, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(sandbox_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[sandbox_id]

    def start(self) -> None:
        if self._redis is not None and self._task is None:
            self._task = asyncio.create_task(self._follow(), name="sandbox-status-feed")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _follow(self) -> None:
        assert self._redis is not None
        delay = 0.2
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keyspace.SANDBOX_STATUS_CHANNEL)
                delay = 0.2
                # Wake everyone once: a change may have been missed while unsubscribed.
                for sandbox_id in list(self._waiters):
                    self.notify(sandbox_id)
                while True:
                    # A bounded wait: the client's socket timeout would break an unbounded one.
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        sandbox_id, _, status = text(message["data"]).partition(" ")
                        if status != LISTENING:
                            self.notify(sandbox_id)
                        elif self._on_listening is not None:
                            self._on_listening(sandbox_id)
            except REDIS_DOWN as exc:
                log.warning("status_feed_disconnected", error=str(exc))
            except Exception:
                log.exception("status_feed_failed")
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
