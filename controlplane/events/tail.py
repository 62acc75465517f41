"""Following a conversation's event stream for as long as a reader wants, through Redis outages
and failovers (events/fanout.py shares one such read per conversation among its sockets).

Each read blocks (XREAD BLOCK) for less than the client's socket timeout, so a quiet
conversation is never mistaken for a dead Redis. A failed read (Redis away past the client's
retry window) is tried again with backoff from the last event handed out, so nothing is skipped
however long the outage lasts; the reader decides when to stop.

Nothing is repeated either: an event read from a master that then lost it (written there but
not yet replicated when Sentinel replaced it) comes again with another stream id once its
writer has stored it on the new master, and is skipped by its event id (the stream's own
deduplication key).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import redis.asyncio as aioredis
import structlog

from controlplane.events.store import EventStore, StoredEvent
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.retry import raise_if_cancelled

log = structlog.get_logger(__name__)

LONGEST_BLOCK_MS = 10_000
REMEMBERED = 1000
"""Event ids handed out that are remembered to skip a repeat."""
RETRY_FIRST, RETRY_MAX = 0.1, 2.0


def block_ms(reader: aioredis.Redis) -> int:
    """How long one XREAD may block: under the socket timeout, by a second or by half."""
    timeout = reader.connection_pool.connection_kwargs.get("socket_timeout")
    if not timeout:
        return LONGEST_BLOCK_MS
    return max(100, min(LONGEST_BLOCK_MS, int(min(timeout - 1.0, timeout / 2) * 1000)))


async def tail(
    store: EventStore,
    reader: aioredis.Redis,
    conversation_id: str,
    after: str,
    *,
    until: Callable[[], bool] = lambda: False,
) -> AsyncIterator[StoredEvent]:
    """Every event after stream id `after` ("0": all), then each new one as it is stored, until
    `until()` (asked after every read, so within a read's block of it becoming true: a reader
    that is cancelled ends too, but a cancellation that coincides with a socket timeout can be
    lost inside redis-py on Python 3.11, and this is the bound then)."""
    wait_ms = block_ms(reader)
    delay = RETRY_FIRST
    seen: dict[str, None] = {}  # insertion-ordered: the oldest goes first
    while not until():
        try:
            batch = await store.follow(reader, conversation_id, after, wait_ms)
        except REDIS_DOWN as exc:
            raise_if_cancelled()
            log.warning("event_tail_retry", conversation_id=conversation_id, error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
            continue
        delay = RETRY_FIRST
        for stream_id, event in batch:
            after = stream_id
            event_id = str(event.get("id"))
            if event_id in seen:
                continue
            seen[event_id] = None
            if len(seen) > REMEMBERED:
                del seen[next(iter(seen))]
            yield stream_id, event
