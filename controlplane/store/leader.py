"""A leader lock in Redis: at most one replica holds it; it expires if the holder dies."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.background import stop_task

log = structlog.get_logger(__name__)

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


class LeaderLoop:
    """Background work one replica at a time: `work()` every `interval` seconds while this
    replica holds `leader`; a failed pass is logged (`<name>_failed`) and the next one runs."""

    def __init__(
        self,
        name: str,
        leader: LeaderLock,
        work: Callable[[], Awaitable[Any]],
        interval: Callable[[], float],
    ) -> None:
        self._name = name
        self._leader = leader
        self._work = work
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self._name)

    async def stop(self) -> None:
        """Stop the loop and give the lock up (for another replica to take at once)."""
        await stop_task(self._task)
        self._task = None
        try:
            await self._leader.release()
        except Exception as exc:
            log.info("leader_release_failed", loop=self._name, error=str(exc))

    async def _loop(self) -> None:
        while True:
            try:
                if await self._leader.hold():
                    await self._work()
            except Exception:
                log.exception(f"{self._name}_failed")
            await asyncio.sleep(self._interval())
