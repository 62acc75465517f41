"""Per-API-key rate limit in Redis, shared by every replica (docs/operations.md).

A fixed window of WINDOW_MS per key, started by the key's first request: one Lua script
increments the counter and, for a new window, sets its expiry, so the count and its reset are
atomic and a burst straddling a wall-clock minute is still counted in one window. Requests over
the limit are counted too but never extend the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from controlplane.store import keyspace

WINDOW_MS = 60_000

_HIT = """
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
"""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_after: int
    """Whole seconds until the window ends (at least 1): the Retry-After of a refusal."""


class RateLimiter:
    def __init__(self, redis: aioredis.Redis, per_minute: int) -> None:
        self.per_minute = per_minute
        self._hit = redis.register_script(_HIT)

    async def hit(self, key_id: str) -> Decision:
        """Count one request of `key_id` and say whether it is within the limit."""
        return self.decision(await self._hit(keys=[keyspace.rate_limit(key_id)], args=[WINDOW_MS]))

    def queue(self, pipe: Pipeline, key_id: str) -> None:
        """Count one request of `key_id` in a pipeline, so a caller that needs other reads too
        makes one round trip. Its reply goes to `decision`; run the pipeline with
        raise_on_error=False: a Redis that lost the script answers NoScriptError, and
        `decision` then counts the request with `hit` (which loads it again)."""
        pipe.evalsha(self._hit.sha, 1, keyspace.rate_limit(key_id), WINDOW_MS)

    async def decision_of(self, reply: Any, key_id: str) -> Decision:
        """The Decision for a `queue`d reply."""
        if isinstance(reply, NoScriptError):
            return await self.hit(key_id)
        if isinstance(reply, Exception):
            raise reply
        return self.decision(reply)

    def decision(self, reply: Any) -> Decision:
        count, ttl_ms = int(reply[0]), int(reply[1])
        return Decision(
            allowed=count <= self.per_minute,
            limit=self.per_minute,
            remaining=max(self.per_minute - count, 0),
            reset_after=max(math.ceil(ttl_ms / 1000), 1),
        )
