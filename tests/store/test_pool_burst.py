"""A burst of requests past the Redis pool, against a real redis-server (issue 30): requests wait
for a connection within ACS_REDIS_POOL_TIMEOUT and succeed; one that cannot get a connection in
time is answered 503 `store_busy` with Retry-After, never as Redis being unreachable; and Redis
really stopped is still the outage's 503.

The pool is made small (2 connections) and held full on purpose: two of the app's own
connections block in BLPOP for a set time, as a crowd of slow commands would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from controlplane import keys
from controlplane.auth.service import ApiKeyService
from controlplane.store.pool import BoundedPool, StoreBusy
from tests.support.log_capture import capture_logs
from tests.support.redis_server import RedisServer
from tests.support.types import Client

POOL = 2
BURST = 60


@pytest.fixture
async def user_key(own_redis: RedisServer) -> dict[str, str]:
    setup = aioredis.Redis.from_url(own_redis.url)
    key = (await ApiKeyService(setup, None).create("burst-user")).key
    await setup.aclose()
    return {"X-Session-API-Key": key}


def _pool(client: Client) -> BoundedPool:
    pool = client.app[keys.REDIS].connection_pool
    assert isinstance(pool, BoundedPool)
    return pool


def _held(pool: BoundedPool) -> int:
    """Connections the pool has made (idle or in use): never more than its size."""
    return len(pool._available_connections) + len(pool._in_use_connections)


async def _hold_the_pool(client: Client, seconds: float) -> list[asyncio.Future[Any]]:
    """Every connection of the app's pool blocked in a BLPOP for `seconds`."""
    redis = client.app[keys.REDIS]
    holds: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(redis.blpop([f"burst:never:{n}"], timeout=seconds))
        for n in range(POOL)
    ]
    await _until_in_use(_pool(client), POOL)
    return holds


async def _until_in_use(pool: BoundedPool, count: int) -> None:
    for _ in range(500):
        if len(pool._in_use_connections) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} connections never in use")


async def test_redis_pys_plain_pool_fails_this_burst(own_redis: RedisServer) -> None:
    """The flaw the bounded pool removes: redis-py's default pool refuses a burst past its
    size with "Too many connections", a ConnectionError an outage also raises."""
    plain = aioredis.Redis.from_url(own_redis.url, max_connections=POOL)
    try:
        results = await asyncio.gather(
            *(plain.blpop([f"burst:plain:{n}"], timeout=0.2) for n in range(POOL + 1)),
            return_exceptions=True,
        )
    finally:
        await plain.aclose()
    refused = [r for r in results if isinstance(r, RedisConnectionError)]
    assert refused, results
    assert "Too many connections" in str(refused[0])


async def test_a_burst_past_the_pool_waits_and_every_request_succeeds(
    own_redis: RedisServer, make_client: Callable[..., Any], user_key: dict[str, str]
) -> None:
    client: Client = await make_client(
        redis_url=own_redis.url, redis_max_connections=POOL, redis_pool_timeout=5.0
    )
    assert (await client.get("/api/settings", headers=user_key)).status == 200
    pool = _pool(client)

    with capture_logs("info") as logs:
        holds = await _hold_the_pool(client, 0.5)
        started = time.monotonic()
        answers = await asyncio.gather(
            *(client.get("/api/settings", headers=user_key) for _ in range(BURST))
        )
        took = time.monotonic() - started
        await asyncio.gather(*holds)
        # and a burst with nothing held: each request's commands queue for the two connections
        more = await asyncio.gather(
            *(client.get("/api/settings", headers=user_key) for _ in range(BURST))
        )

    statuses = [a.status for a in answers + more]
    assert statuses == [200] * (2 * BURST), statuses
    assert took >= 0.4, f"the burst did not wait for the pool ({took:.2f} s)"
    assert _held(pool) <= POOL
    assert logs.events("store_busy") == []
    assert logs.events("redis_unavailable") == []


async def test_a_wait_past_the_bound_is_busy_not_an_outage(
    own_redis: RedisServer,
    make_client: Callable[..., Any],
    user_key: dict[str, str],
    admin_headers: dict[str, str],
) -> None:
    client: Client = await make_client(
        redis_url=own_redis.url, redis_max_connections=POOL, redis_pool_timeout=0.3
    )
    assert (await client.get("/api/settings", headers=user_key)).status == 200

    with capture_logs("info") as logs:
        holds = await _hold_the_pool(client, 2.0)
        started = time.monotonic()
        busy = await client.get("/api/settings", headers=user_key)
        took = time.monotonic() - started
        body = await busy.json()
        ready = await client.get("/ready")
        ready_body = await ready.json()
        await asyncio.gather(*holds)

    assert busy.status == 503
    assert busy.headers["Retry-After"] == "1"
    assert set(body) == {"detail"}
    assert "busy" in body["detail"]
    assert "unreachable" not in body["detail"]
    assert 0.3 <= took < 2.0, f"answered after {took:.2f} s"
    # Redis answers all along: readiness does not call it down.
    assert ready.status == 200, ready_body
    assert ready_body["redis"] is True
    busy_lines = logs.events("store_busy")
    assert busy_lines
    assert busy_lines[0]["code"] == "store_busy"
    assert logs.events("redis_unavailable") == []

    # The holds are over: the same request succeeds, and the metric counted the busy answer.
    assert (await client.get("/api/settings", headers=user_key)).status == 200
    metrics = await (await client.get("/metrics", headers=admin_headers)).text()
    name = "acs_redis_pool_busy_total"
    counted = [line for line in metrics.splitlines() if line.startswith(name)]
    assert counted
    assert float(counted[0].split()[-1]) >= 1


async def test_the_pool_wait_alone_raises_store_busy(own_redis: RedisServer) -> None:
    """redis-py's blocking pool raises ConnectionError("No connection available.") from its
    wait's time-out; the pool turns that (and only that) into StoreBusy."""
    pool = BoundedPool.from_url(own_redis.url, max_connections=1, timeout=0.1)
    client = aioredis.Redis.from_pool(pool)
    try:
        hold: asyncio.Future[Any] = asyncio.ensure_future(client.blpop(["burst:alone"], timeout=1))
        await _until_in_use(pool, 1)
        with pytest.raises(StoreBusy):
            await client.get("burst:other")
        assert await hold is None
        assert await client.get("burst:other") is None
    finally:
        await client.aclose()


async def test_a_stopped_redis_is_still_the_outage(
    own_redis: RedisServer, make_client: Callable[..., Any], user_key: dict[str, str]
) -> None:
    client: Client = await make_client(
        redis_url=own_redis.url,
        redis_max_connections=POOL,
        redis_pool_timeout=0.3,
        redis_retry_window=0.5,
    )
    assert (await client.get("/api/settings", headers=user_key)).status == 200
    own_redis.stop()
    with capture_logs("info") as logs:
        answers = await asyncio.gather(
            *(client.get("/api/settings", headers=user_key) for _ in range(10))
        )
        ready = await client.get("/ready")
        ready_body = await ready.json()
        bodies = [await a.json() for a in answers]
    assert [a.status for a in answers] == [503] * 10
    assert all("Redis is unreachable" in b["detail"] for b in bodies), bodies
    assert all("Retry-After" not in a.headers for a in answers)
    assert ready.status == 503
    assert ready_body["redis"] is False
    assert logs.events("redis_unavailable")
    assert logs.events("store_busy") == []
    own_redis.start()
    assert (await client.get("/api/settings", headers=user_key)).status == 200


async def test_a_released_connection_goes_to_who_waited_first(own_redis: RedisServer) -> None:
    """Commands check a free connection out without the pool's lock when nobody waits; while
    anyone waits, a newcomer queues behind them and a release wakes the first in line."""
    pool = BoundedPool.from_url(own_redis.url, max_connections=1, timeout=5)
    order: list[int] = []

    async def command(index: int) -> None:
        connection = await pool.get_connection()
        order.append(index)
        await connection.send_command("PING")
        assert await connection.read_response() in (b"PONG", "PONG")
        await pool.release(connection)

    try:
        held = await pool.get_connection()
        queued = [asyncio.create_task(command(i)) for i in range(5)]
        await asyncio.sleep(0.05)
        assert order == []
        await pool.release(held)
        late = asyncio.create_task(command(99))  # while the five still wait their turn
        await asyncio.gather(*queued, late)
        assert order == [0, 1, 2, 3, 4, 99]
        # Nobody waits now: the free connection is handed out and taken back at once.
        await command(100)
        assert (len(pool._available_connections), len(pool._in_use_connections)) == (1, 0)
    finally:
        await pool.disconnect()
