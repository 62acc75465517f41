"""The Redis connection pools: bounded, and waiting for a connection rather than failing.

redis-py's default pool raises "Too many connections" (a ConnectionError) the moment its limit
is reached, and that error looks like an outage: a burst of a hundred sandbox creates was
answered 503 "Redis is unreachable" while Redis was up (issue 30). These pools hold at most
ACS_REDIS_MAX_CONNECTIONS connections and make a caller wait up to ACS_REDIS_POOL_TIMEOUT
seconds for one to be released (redis-py's BlockingConnectionPool). A wait that runs out raises
StoreBusy: this replica is busy, Redis is not down (unless the connections it waited for
were held by attempts to connect: then it is the outage, and is reported as one). StoreBusy is
a ConnectionError still, so the background loops that retry through an outage retry through it
too; what reports (the errors middleware, /ready, /metrics) tells the two apart.

redis-py's SentinelConnectionPool does not wait (it is a plain ConnectionPool); the Sentinel
pool here is the same class with BlockingConnectionPool's get_connection and release beneath it,
so that the Sentinel-managed connections (found at each connect) are handed out the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.event import AsyncAfterConnectionReleasedEvent
from redis.exceptions import ConnectionError as RedisConnectionError


class StoreBusy(RedisConnectionError):
    """Every connection of this replica's Redis pool stayed in use for the whole wait: the
    request is answered 503 `store_busy` with Retry-After, never as Redis being unreachable."""

    code = "store_busy"
    retry_after = 1


class _WaitsBounded:
    """BlockingConnectionPool.get_connection, its wait's time-out raised as StoreBusy.

    redis-py raises ConnectionError("No connection available.") from the asyncio.TimeoutError of
    that wait, and only there: connecting the connection it hands out (a real outage) happens
    after the wait, outside its time-out, and raises its own errors.
    tests/store/test_pool_burst.py holds redis-py to this."""

    max_connections: int
    timeout: float | None
    _in_use_connections: set[Any]
    _available_connections: list[Any]
    _condition: asyncio.Condition
    _in_maintenance: bool

    def _uncontended(self) -> bool:
        """Nobody waits for a connection and none of redis-py's own bookkeeping is under way:
        handing one out or taking one back needs no lock (the loop runs one task at a time, and
        the fast paths below do not await between their check and their change)."""
        condition = self._condition
        return not (condition.locked() or condition._waiters or self._in_maintenance)

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        if self._available_connections and self._uncontended():
            # Every command checks a connection out and back in. BlockingConnectionPool takes
            # its condition's lock, a time-out and two observability records each way even
            # when a free connection is there: ~23 us of CPU of a ~115 us GET (measured). With
            # a free connection and nobody waiting, hand it out as ConnectionPool would; any
            # waiter sends everyone through the queue in order.
            connection = self._available_connections.pop()
            self._in_use_connections.add(connection)
            try:
                await self.ensure_connection(connection)  # type: ignore[attr-defined]
            except BaseException:
                await self.release(connection)
                raise
            return connection
        try:
            return await super().get_connection()  # type: ignore[misc]
        except RedisConnectionError as exc:
            if isinstance(exc, StoreBusy) or not isinstance(exc.__cause__, asyncio.TimeoutError):
                raise
            if any(not conn.is_connected for conn in self._in_use_connections):
                # The connections were held by attempts to connect: Redis does not answer, and
                # this caller is told what the ones holding them will be told.
                raise RedisConnectionError(
                    f"Redis does not answer: the pool's {self.max_connections} connections "
                    f"are still trying to connect after {self.timeout:g} s"
                ) from None
            raise StoreBusy(
                f"all {self.max_connections} Redis connections of this replica stayed in use "
                f"for {self.timeout:g} s"
            ) from None

    async def release(self, connection: Any) -> None:
        if not self._uncontended() or connection.should_reconnect():
            await super().release(connection)  # type: ignore[misc]
            return
        # Nobody to wake: back on the free list as ConnectionPool.release does, without its
        # locks and observability records; the re-authentication hook (streaming credential
        # providers) still runs.
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)
        await self._event_dispatcher.dispatch_async(  # type: ignore[attr-defined]
            AsyncAfterConnectionReleasedEvent(connection)  # type: ignore[no-untyped-call]
        )


class BoundedPool(_WaitsBounded, BlockingConnectionPool):
    """A URL's Redis (TCP, TLS or a unix socket)."""


class BoundedSentinelPool(_WaitsBounded, SentinelConnectionPool, BlockingConnectionPool):
    """The master the Sentinels name: SentinelConnectionPool over BlockingConnectionPool."""
