"""Waking whoever waits for a sandbox's status to change, without polling.

The store's scripts publish "<sandbox id> <status>" on a Redis channel with every status change,
create and delete (controlplane.store.keyspace.SANDBOX_STATUS_CHANNEL), so a waiter on any replica
wakes; changes made in this process also wake local waiters directly.

A message published while the subscription is down is lost, and redis-py re-subscribes by itself
inside its retry (controlplane/store/retry.py) without a word to the reader. So the feed watches
the subscription's connection: from the moment it breaks until Redis confirms the subscription
again it is not `synced`, and at every confirmation it tells everyone that anything may have
changed: waiters wake, and listeners' `reset` runs (a cache must forget everything: the sandbox
proxy's addresses and grants, docs/security.md). A waiter still re-reads the record now and then.

The same channel relays agent servers' announcements ("<sandbox id> LISTENING", not a status):
the replica whose launcher waits for that sandbox may not be the one the webhook reached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import PubSub

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
        self._resets: list[Callable[[], None]] = []
        self._pubsub: PubSub | None = None
        self._confirmed = False

    def subscribe(
        self, listener: Callable[[str], None], reset: Callable[[], None] | None = None
    ) -> None:
        """Call `listener(sandbox_id)` at every change of a sandbox, on any replica (e.g. to
        forget what a cache holds of it), and `reset()` whenever changes may have been missed
        (the subscription was down: forget everything)."""
        self._listeners.append(listener)
        if reset is not None:
            self._resets.append(reset)

    @property
    def synced(self) -> bool:
        """True while every change of every replica reaches the listeners: the subscription is
        confirmed and its connection up (or there is no Redis: only this process changes
        anything). A cache must not be trusted while this is False."""
        if self._redis is None:
            return True
        connection = self._pubsub.connection if self._pubsub is not None else None
        return self._confirmed and connection is not None and connection.is_connected

    def _reconnected(self, _connection: object) -> None:
        """redis-py's connect callback: the subscription's connection was made again; until
        Redis confirms the subscription on it, messages may still be missed."""
        self._confirmed = False

    def _resync(self) -> None:
        """Redis confirmed the subscription: changes made since are heard; those made before
        may have been missed, so wake everyone and reset every listener's cache."""
        self._confirmed = True
        for sandbox_id in list(self._waiters):
            for event in self._waiters.get(sandbox_id, ()):
                event.set()
        for reset in self._resets:
            reset()

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
            pubsub = self._redis.pubsub()
            self._pubsub, self._confirmed = pubsub, False
            try:
                await pubsub.subscribe(keyspace.SANDBOX_STATUS_CHANNEL)
                assert pubsub.connection is not None
                pubsub.connection.register_connect_callback(self._reconnected)
                delay = 0.2
                while True:
                    # A bounded wait: the client's socket timeout would break an unbounded one.
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._received(message)
            except REDIS_DOWN as exc:
                log.warning("status_feed_disconnected", error=str(exc))
            except Exception:
                log.exception("status_feed_failed")
            finally:
                self._confirmed = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _received(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe":  # the first subscription, or redis-py's own re-subscription
            if not self._confirmed:
                log.info("status_feed_synced")
            self._resync()
        elif kind == "message":
            sandbox_id, _, status = text(message["data"]).partition(" ")
            if status != LISTENING:
                self.notify(sandbox_id)
            elif self._on_listening is not None:
                self._on_listening(sandbox_id)
