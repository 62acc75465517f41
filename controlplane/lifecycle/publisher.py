"""Publishing a lifecycle event: one log line, and in one Redis pipeline the user's and the global
streams and the webhook outbox (controlplane/lifecycle/outbox.py). Publishing never fails the
operation that caused it. A write that can store the event in its own Lua script (a sandbox's
compare-and-set) takes `entry(event)` instead, so that the change and its event are stored
together or not at all."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.api.pagination import STREAM_ID, decode_cursor, encode_cursor
from controlplane.lifecycle.models import LifecycleEvent, LifecycleEventPage
from controlplane.lifecycle.outbox import Outbox
from controlplane.store import keyspace, text
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.streams import LATE_ID, StreamAdd, StreamEntry

log = structlog.get_logger("controlplane.lifecycle")

STREAM_MAXLEN = 10_000
"""Streams are trimmed (approximately) to this many events: a history, not an archive."""


class LifecyclePublisher:
    def __init__(self, redis: aioredis.Redis, outbox: Outbox | None) -> None:
        self._redis = redis
        self._outbox = outbox

    async def publish(self, *events: LifecycleEvent) -> None:
        """The events in order, in one round trip."""
        for event in events:
            self.logged(event)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for event in events:
                    self.entry(event).queue(pipe)
                await pipe.execute()
        except REDIS_DOWN as exc:
            # Neither stored nor queued for the webhooks: the log lines above are what remains.
            for event in events:
                log.warning("lifecycle_not_stored", event_id=event.id, error=str(exc))

    def entry(self, event: LifecycleEvent) -> StreamEntry:
        """The event as stored: in the global and the user's streams and the webhook outbox.
        A write that stores it itself (a sandbox's compare-and-set, sandboxes/store.py) calls
        `logged` once it has. A sandbox id of streams.LATE_ID is left for the script to fill in
        (a warm pool claim's events: the script picks the member)."""
        line = event.model_dump_json()
        if event.sandbox_id == LATE_ID:
            line = line.replace('"\\u0000"', f'"{LATE_ID}"')
        fields = ("e", line)
        adds = [
            StreamAdd(keyspace.LIFECYCLE, fields, maxlen=STREAM_MAXLEN),
            StreamAdd(keyspace.user_lifecycle(event.user_id), fields, maxlen=STREAM_MAXLEN),
        ]
        if self._outbox is not None:
            adds += [StreamAdd(key, fields) for key in self._outbox.streams()]
        return StreamEntry((tuple(adds),))

    def logged(self, event: LifecycleEvent) -> None:
        """The event's log line."""
        log.info(
            "lifecycle",
            type=event.type.value,
            sandbox_id=event.sandbox_id,
            conversation_id=event.conversation_id,
            owner=event.user_id,
            automatic=event.automatic,
            reason=event.reason,
        )

    async def page(
        self, user_id: str | None, sandbox_id: str | None, page_id: str | None, limit: int
    ) -> LifecycleEventPage:
        """Newest first; user_id None reads every user's events."""
        key = keyspace.LIFECYCLE if user_id is None else keyspace.user_lifecycle(user_id)
        after = decode_cursor(page_id, STREAM_ID)
        found: list[tuple[str, LifecycleEvent]] = []
        while len(found) <= limit:
            entries: Any = await self._redis.xrevrange(key, f"({after}" if after else "+", "-", 500)
            for sid, fields in entries:
                event = LifecycleEvent.model_validate_json(text(fields.get(b"e", fields.get("e"))))
                if sandbox_id is None or event.sandbox_id == sandbox_id:
                    found.append((text(sid), event))
            if len(entries) < 500:
                break
            after = text(entries[-1][0])
        page = found[:limit]
        next_id = encode_cursor(page[-1][0]) if len(found) > limit else None
        return LifecycleEventPage(items=[e for _sid, e in page], next_page_id=next_id)
