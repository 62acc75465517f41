"""No intent acknowledged before it is on a replica: Redis `WAIT` after the writes a request makes.

Redis replicates asynchronously, so a master killed right after answering a write can take the
write with it, and Sentinel then promotes a replica that never saw it. While a request that
changes something is served (`durable_writes()`, entered by a middleware for POST, PUT, PATCH
and DELETE), every write command, script call and pipeline that writes is followed, on the same
connection, by `WAIT <replicas> <timeout>`: the reply is returned only once that many replicas
hold everything the connection wrote. Fewer acknowledgements in time raise NotReplicated (503):
the write is on the master, but the request is not acknowledged. Sentinel promotes the most
up-to-date replica, so an acknowledged write survives the loss of the master.

Background loops (leases, the reconciler, webhook delivery) do not wait: what they write is
derived from what requests recorded and from the engine, and is written again after a loss.
Tasks a request starts (a sandbox launch, a conversation's start task) inherit the context and
wait too. Why WAIT rather than `min-replicas-to-write`: that setting only refuses writes while
no replica is connected; a write it accepts can still be lost in the lag it allows
(docs/architecture.md#redis-ha has the measured cost).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError

_READ_COMMANDS = """
    GET MGET GETRANGE STRLEN EXISTS TTL PTTL TYPE KEYS SCAN DBSIZE HGET HMGET HGETALL HEXISTS
    HLEN HKEYS HVALS HSCAN ZRANGE ZREVRANGE ZRANGEBYLEX ZREVRANGEBYLEX ZRANGEBYSCORE
    ZREVRANGEBYSCORE ZCARD ZCOUNT ZSCORE ZMSCORE ZRANK ZREVRANK ZSCAN SMEMBERS SISMEMBER
    SMISMEMBER SCARD SSCAN LRANGE LLEN LINDEX XRANGE XREVRANGE XLEN XREAD XINFO XPENDING
    EVALSHA_RO EVAL_RO PING ECHO INFO TIME WAIT WATCH UNWATCH MULTI DISCARD SCRIPT SELECT AUTH
    HELLO CLIENT CONFIG COMMAND READONLY PUBLISH SUBSCRIBE UNSUBSCRIBE PSUBSCRIBE PUNSUBSCRIBE
    SENTINEL
"""
READS = frozenset(_READ_COMMANDS.split())
"""Commands that change nothing a replica must hold (PUBLISH: a notification, not a record).
Anything else counts as a write: an unneeded WAIT costs one quick reply, a missed one a loss."""


WAIT_SLICE = 1.0
"""Longest single WAIT: under any sensible socket timeout (ACS_REDIS_TIMEOUT, 5 s)."""


class NotReplicated(RedisConnectionError):
    """A write that fewer replicas acknowledged than required in time (a 503, never retried:
    running the write again could apply it twice)."""


@dataclass(frozen=True)
class Replication:
    replicas: int = 0
    """Replicas that must acknowledge a request's writes; 0: no WAIT."""
    timeout: float = 10.0


_DURABLE: contextvars.ContextVar[bool] = contextvars.ContextVar("acs_durable", default=False)


@contextlib.contextmanager
def durable_writes() -> Iterator[None]:
    """Writes made inside (and in tasks started inside) wait for their replicas."""
    token = _DURABLE.set(True)
    try:
        yield
    finally:
        _DURABLE.reset(token)


@contextlib.contextmanager
def bookkeeping() -> Iterator[None]:
    """Writes made inside do not wait for replicas, even while a request's writes do: tallies
    whose loss with a master (the writes of its last moments before a failover) costs less than
    a wait on every call. The LLM gateway's rate count and usage use it, as the API's rate
    limiter and the session bookkeeping do by running outside `durable_writes`."""
    token = _DURABLE.set(False)
    try:
        yield
    finally:
        _DURABLE.reset(token)


def _is_write(args: Sequence[Any]) -> bool:
    name = args[0]
    word = (name.decode() if isinstance(name, bytes) else str(name)).split(" ", 1)[0]
    return word.upper() not in READS


class _WaitsForReplicas:
    """Mixed into the client and its pipelines: WAIT on the connection that wrote."""

    replication: Replication = Replication()

    def _must_wait(self, commands: Sequence[Sequence[Any]]) -> bool:
        return (
            self.replication.replicas > 0
            and _DURABLE.get()
            and any(_is_write(args) for args in commands)
        )

    async def _wait_replicas(self, connection: Any) -> None:
        """WAIT in slices of at most a second (under the socket timeout) until the replicas
        acknowledge or `timeout` has passed: a replica re-syncing after a failover acknowledges
        late, and asking again is safe where writing again would not be."""
        wanted = self.replication.replicas
        deadline = time.monotonic() + self.replication.timeout
        acked = 0
        while True:
            left = deadline - time.monotonic()
            slice_ms = max(1, int(min(left, WAIT_SLICE) * 1000))
            await connection.send_command("WAIT", wanted, slice_ms)
            acked = int(await connection.read_response())
            if acked >= wanted:
                return
            if time.monotonic() >= deadline:
                raise NotReplicated(
                    f"Redis: {acked} of {wanted} replicas acknowledged the write "
                    f"in {self.replication.timeout:g} s"
                )

    async def _send_command_parse_response(
        self, conn: Any, command_name: Any, *args: Any, **options: Any
    ) -> Any:
        result = await super()._send_command_parse_response(  # type: ignore[misc]
            conn, command_name, *args, **options
        )
        if self._must_wait([args]):
            await self._wait_replicas(conn)
        return result


class DurablePipeline(_WaitsForReplicas, Pipeline):  # type: ignore[misc]
    async def _execute_transaction(
        self, connection: Any, commands: Any, raise_on_error: Any
    ) -> Any:
        result = await super()._execute_transaction(connection, commands, raise_on_error)
        if self._must_wait([args for args, _options in commands]):
            await self._wait_replicas(connection)
        return result

    async def _execute_pipeline(self, connection: Any, commands: Any, raise_on_error: Any) -> Any:
        result = await super()._execute_pipeline(connection, commands, raise_on_error)
        if self._must_wait([args for args, _options in commands]):
            await self._wait_replicas(connection)
        return result


class DurableRedis(_WaitsForReplicas, aioredis.Redis):  # type: ignore[misc]
    """redis.asyncio.Redis whose writes inside durable_writes() wait for `replication`."""

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> DurablePipeline:
        pipe = DurablePipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.replication = self.replication
        return pipe
