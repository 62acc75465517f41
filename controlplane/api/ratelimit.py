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

from controlplane.errors import QuotaExceeded
from controlplane.store import keyspace

WINDOW_MS = 60_000

HIT_FUNCTION = """
local function hit(key, window_ms)
  local n = redis.call('INCR', key)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then
    redis.call('PEXPIRE', key, window_ms)
    ttl = tonumber(window_ms)
  end
  return {n, ttl}
end
"""
"""One count as a Lua function, for scripts that count along with other work (the LLM
gateway's reads); its reply is what `RateLimiter.decision` takes."""
_HIT = HIT_FUNCTION + "return hit(KEYS[1], ARGV[1])\n"


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

    def decision(self, reply: Any) -> Decision:
        count, ttl_ms = int(reply[0]), int(reply[1])
        return Decision(
            allowed=count <= self.per_minute,
            limit=self.per_minute,
            remaining=max(self.per_minute - count, 0),
            reset_after=max(math.ceil(ttl_ms / 1000), 1),
        )


def webhook_refusal(decision: Decision) -> QuotaExceeded:
    """The 429 of a sandbox past ACS_WEBHOOK_RATE_LIMIT_PER_MINUTE (the webhook middleware's,
    and the events webhook's own when it counts in its one round trip)."""
    return QuotaExceeded(
        f"rate limit of {decision.limit} webhook requests per minute for this sandbox"
        f" reached; retry in {decision.reset_after} s",
        retry_after=decision.reset_after,
    )
