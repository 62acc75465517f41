"""The Redis master killed (SIGKILL) under `controlplane serve` on Redis Sentinel, during
concurrent sandbox creates and conversation starts, with reads, a sandbox posting events and an
events WebSocket open: every request is answered (none fails: they wait for the new master),
every acknowledged start finishes, every acknowledged event reaches the open socket, and the
status feed subscribes again on the new master."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace
from tests.support.ha_load import Load, Traffic, call, ready_conversation, settled
from tests.support.live_server import Api, free_port
from tests.support.sentinel_cluster import MASTER_NAME, SentinelCluster
from tests.support.serve_process import Serve, launch_serve, serve_env

pytestmark = [pytest.mark.ha, pytest.mark.slow, pytest.mark.chaos]

BURST = 6  # creates and starts sent at once, twice: just before the kill, and during failover


@pytest.fixture
async def served(
    sentinel_cluster: SentinelCluster, test_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[Serve, Api]]:
    env = serve_env("", test_prefix, tmp_path / "data")
    del env["ACS_REDIS_URL"]
    env.update(
        {
            "ACS_REDIS_SENTINELS": sentinel_cluster.sentinel_addresses,
            "ACS_REDIS_SENTINEL_MASTER": MASTER_NAME,
            "ACS_MAX_RUNNING_PER_USER": "0",
            "ACS_WARM_POOL": "0",
            "ACS_START_TIMEOUT": "90",
        }
    )
    server = await launch_serve(free_port(), env)
    async with aiohttp.ClientSession() as http:
        try:
            await server.wait_healthy(http)
            async with _master(sentinel_cluster) as redis:
                key = (await ApiKeyService(redis, None).create("alice")).key
            api = Api(http, server.url, key)
            body = {"llm_model": "fake-model", "llm_base_url": "http://127.0.0.1:9/v1"}
            await api.ok("POST", "/api/settings", json=body)
            yield server, api
        except BaseException:
            print(server.logs(), sentinel_cluster.logs(), sep="\n")
            raise
        finally:
            await server.kill()


@contextlib.asynccontextmanager
async def _master(cluster: SentinelCluster) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the current master (the test's own view, not the control plane's)."""
    client = aioredis.Redis(port=cluster.master_port())
    try:
        yield client
    finally:
        await client.aclose()


async def _burst(api: Api, load: Load) -> None:
    """BURST conversation starts and sandbox creates at once (half each)."""

    async def start() -> None:
        body = await call(api, load, "POST", "/api/v1/app-conversations", json={})
        if body is not None:
            load.tasks.append(body["id"])

    async def create() -> None:
        body = await call(api, load, "POST", "/api/v1/sandboxes", json={})
        if body is not None:
            load.sandboxes.append(body["id"])

    await asyncio.gather(*(start() if n % 2 else create() for n in range(BURST)))


async def test_the_master_killed_during_creates_and_starts_loses_nothing(
    sentinel_cluster: SentinelCluster, served: tuple[Serve, Api]
) -> None:
    server, api = served
    sandbox, conversation = await ready_conversation(api)
    load = Load()
    traffic = Traffic(api, load, sandbox, conversation, starts=False)
    await asyncio.sleep(1)
    await _burst(api, load)  # their launches and start tasks are in flight at the kill
    old = sentinel_cluster.kill_master()
    killed_at = time.monotonic()
    during = asyncio.create_task(_burst(api, load))  # sent while no master answers
    failover = await asyncio.to_thread(sentinel_cluster.wait_failover, old.port)
    await during
    await asyncio.sleep(3)
    await traffic.stop()

    assert load.failures() == [], server.logs()
    assert len(load.tasks) + len(load.sandboxes) == 2 * BURST
    await settled(api, load, within=120)
    assert load.reattached == 0  # the one socket stayed open and kept delivering
    # The status feed subscribed again, on the new master.
    async with _master(sentinel_cluster) as redis:
        assert (await redis.pubsub_numsub(keyspace.SANDBOX_STATUS_CHANNEL))[0][1] >= 1
    slowest = max(o.took for o in load.outcomes if o.sent >= killed_at - 1)
    print(
        f"failover {failover:.2f} s; {len(load.outcomes)} requests, 0 failed; slowest request "
        f"around the kill {slowest:.2f} s; {2 * BURST} starts and {len(load.posted)} events kept"
    )
