"""A leader lock in Redis: at most one replica holds it; it expires if the holder dies."""

from __future__ import annotations

import secrets

import redis.asyncio as aioredis

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeaderLock:
    """`hold()` takes the lock or extends it; only the token that set it can extend or free it."""

    def __init__(self, redis: aioredis.Redis, key: str, ttl_seconds: float) -> None:
        self._key = key
        self._ttl_ms = int(ttl_seconds * 1000)
        self.token = secrets.token_hex(16)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def hold(self) -> bool:
        """True when this process is the leader for the next ttl."""
        return bool(await self._renew(keys=[self._key], args=[self.token, self._ttl_ms]))

    async def release(self) -> None:
        await self._release(keys=[self._key], args=[self.token])
