"""Who carries a sandbox's pending intent (a start, resume or delete) to completion.

The replica acting on an intent holds a short lease in Redis (controlplane.store.keyspace.
sandbox_lease) and renews it while it works, all its leases in one pipeline per second. When the
holder dies, the lease expires within LEASE_TTL seconds and the next reconcile sweep, on any
replica, claims it and finishes the work. Holding is best effort: during a Redis outage a lease
may lapse and a second replica may act too, which is safe because every step is idempotent and
every status change a compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import redis.asyncio as aioredis
import structlog

from controlplane.background import stop_task
from controlplane.store import keyspace
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)

LEASE_TTL = 3.0
RENEW_EVERY = 1.0

_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class IntentLeases:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self.token = secrets.token_hex(16)
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)
        self._held: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def claim(self, sandbox_id: str) -> bool:
        """Take the lease unless another live replica holds it. Raises on Redis errors."""
        ok = bool(
            await self._claim(
                keys=[keyspace.sandbox_lease(sandbox_id)], args=[self.token, int(LEASE_TTL * 1000)]
            )
        )
        if ok:
            self.hold(sandbox_id)
        return ok

    def hold(self, sandbox_id: str) -> None:
        """Keep (or take, at the next renewal) the lease until release(): for an intent this
        replica has just recorded itself, after winning its compare-and-set."""
        self._held.add(sandbox_id)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renew_loop(), name="intent-leases")

    async def release(self, sandbox_id: str) -> None:
        self._held.discard(sandbox_id)
        with contextlib.suppress(*REDIS_DOWN):  # it expires by itself
            await self._release(keys=[keyspace.sandbox_lease(sandbox_id)], args=[self.token])

    async def close(self) -> None:
        await stop_task(self._task)
        for sandbox_id in list(self._held):
            with contextlib.suppress(Exception):
                await self.release(sandbox_id)

    async def _renew_loop(self) -> None:
        while self._held:
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for sandbox_id in list(self._held):
                        # Unconditional: this replica won the intent's compare-and-set.
                        pipe.set(
                            keyspace.sandbox_lease(sandbox_id), self.token, px=int(LEASE_TTL * 1000)
                        )
                    await pipe.execute()
            except REDIS_DOWN as exc:
                log.warning("intent_leases_not_renewed", error=str(exc))
            except Exception:
                log.exception("intent_leases_failed")
            await asyncio.sleep(RENEW_EVERY)
