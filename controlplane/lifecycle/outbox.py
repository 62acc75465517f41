"""The lifecycle webhook outbox: one Redis stream per receiving URL, written in the same
pipeline (or Lua script) that stores the event, so an event is either kept for delivery or not
kept at all.

Deliverers (controlplane/lifecycle/webhooks.py) read it through the consumer group `deliverers`:
Redis hands each new entry to one consumer, and an entry left unacknowledged (a failed attempt,
a replica that died) is claimed again with XCLAIM, which succeeds for one replica only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from controlplane.lifecycle.models import DeadLetter, LifecycleEvent
from controlplane.store import keyspace

GROUP = "deliverers"
DEAD_MAXLEN = 10_000


def url_id(url: str) -> str:
    """A URL's name in Redis keys and logs: URLs may carry a token."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class Outbox:
    """The outbox of `urls`. The audit log's sinks use one too (kind "audit", their own
    streams: keyspace.audit_outbox and audit_dead), delivered by the same deliverer."""

    def __init__(
        self,
        redis: aioredis.Redis,
        urls: list[str],
        *,
        kind: str = "lifecycle",
        stream_of: Callable[[str], str] = keyspace.webhook_outbox,
        dead_of: Callable[[str], str] = keyspace.webhook_dead,
    ) -> None:
        self.redis = redis
        self.urls = list(urls)
        self.kind = kind
        self._stream_of = stream_of
        self._dead_of = dead_of

    def stream(self, url: str) -> str:
        return self._stream_of(url_id(url))

    def dead_stream(self, url: str) -> str:
        return self._dead_of(url_id(url))

    def streams(self) -> list[str]:
        """The stream of every URL: an event is queued by adding it to each (untrimmed)."""
        return [self.stream(url) for url in self.urls]

    async def ensure_group(self, url: str) -> None:
        """The stream and its consumer group, from the stream's start: entries written before
        the group existed are delivered too."""
        try:
            await self.redis.xgroup_create(self.stream(url), GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def pending(self) -> int:
        """Events not yet delivered (nor dead-lettered), summed over the URLs."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for url in self.urls:
                pipe.xlen(self.stream(url))
            return sum(int(n) for n in await pipe.execute())

    async def dead(self, url: str, count: int = 100) -> list[dict[str, str]]:
        """The newest dead-lettered deliveries of one URL, newest first."""
        entries: Any = await self.redis.xrevrange(self.dead_stream(url), "+", "-", count=count)
        return [
            {_text(k): _text(v) for k, v in fields.items()} | {"entry_id": _text(entry_id)}
            for entry_id, fields in entries
        ]

    async def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        """The newest `count` deliveries given up of each URL, newest first across them."""
        items: list[DeadLetter] = []
        for url in self.urls:
            for entry in await self.dead(url, count):
                items.append(
                    DeadLetter(
                        url_id=url_id(url),
                        event=LifecycleEvent.model_validate_json(entry["e"]),
                        attempts=int(entry["attempts"]),
                        error=entry["error"],
                        dead_at=datetime.fromtimestamp(int(entry["dead_at"]), UTC),
                    )
                )
        items.sort(key=lambda d: d.dead_at, reverse=True)
        return items


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
