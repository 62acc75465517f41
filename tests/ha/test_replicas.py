"""Three `controlplane serve` replicas behind haproxy, under load: reads, conversation starts,
sandbox creates, a sandbox posting events and a browser-like client following them on the events
WebSocket. A rolling restart fails no request and loses no start; a replica killed with SIGKILL
loses no acknowledged start (another replica resumes it) and, past the moment it died, fails no
request (the balancer retries the idempotent ones it had in flight and stops sending to it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from tests.support.ha_load import Load, Traffic, ready_conversation, settled
from tests.support.live_server import Api
from tests.support.redis_server import RedisServer
from tests.support.replica_set import ReplicaSet

pytestmark = [pytest.mark.ha, pytest.mark.slow, pytest.mark.chaos]


@pytest.fixture
async def replica_set(
    own_redis: RedisServer, test_prefix: str, tmp_path: Path
) -> AsyncIterator[tuple[ReplicaSet, Api]]:
    deployment = ReplicaSet(own_redis.url, test_prefix, tmp_path)
    async with aiohttp.ClientSession() as http:
        try:
            await deployment.start(http)
            setup = aioredis.Redis.from_url(own_redis.url)
            key = (await ApiKeyService(setup, None).create("alice")).key
            await setup.aclose()
            api = Api(http, deployment.url, key)
            await api.ok(
                "POST",
                "/api/settings",
                json={"llm_model": "fake-model", "llm_base_url": "http://127.0.0.1:9/v1"},
            )
            yield deployment, api
        except BaseException:
            print(deployment.logs())
            raise
        finally:
            await deployment.stop()


async def test_a_rolling_restart_under_load_fails_no_request_and_loses_no_start(
    replica_set: tuple[ReplicaSet, Api],
) -> None:
    deployment, api = replica_set
    sandbox, conversation = await ready_conversation(api)
    load = Load()
    traffic = Traffic(api, load, sandbox, conversation)
    await asyncio.sleep(2)
    timings = [await deployment.roll(n, api.http) for n in range(deployment.size)]
    await asyncio.sleep(2)
    await traffic.stop()

    assert load.failures() == [], deployment.logs()
    await settled(api, load, within=90)
    assert load.reattached >= 1  # its replica restarted under it at least once
    requests, starts = len(load.outcomes), len(load.tasks) + len(load.sandboxes)
    assert starts >= 6
    assert requests > 300
    print(f"{requests} requests, {starts} starts, {len(load.posted)} events, 0 failed")
    print("seconds to DOWN at the balancer / to exit, per replica:", timings)
    for server in deployment.retired:
        events = [e.get("event") for e in server.events()]
        assert "draining" in events, server.logs()
        assert not any(e.get("level") == "error" for e in server.events()), server.logs()


async def test_a_replica_killed_under_load_loses_no_start(
    replica_set: tuple[ReplicaSet, Api],
) -> None:
    deployment, api = replica_set
    sandbox, conversation = await ready_conversation(api)
    load = Load()
    traffic = Traffic(api, load, sandbox, conversation)
    await asyncio.sleep(3)
    # A start and a create the replica is still carrying when it dies.
    doomed = deployment.replicas[1]
    assert doomed is not None
    direct = Api(api.http, doomed.url, api.key)
    orphan = await direct.ok("POST", "/api/v1/app-conversations", json={})
    load.tasks.append(orphan["id"])
    load.sandboxes.append((await direct.ok("POST", "/api/v1/sandboxes", json={}))["id"])
    await deployment.kill(1)
    dead_at = time.monotonic()  # SIGKILL sent and the process reaped: its sockets are closed
    await asyncio.sleep(6)
    await traffic.stop()

    # A POST the replica had in flight as it died may fail (the balancer does not replay POSTs:
    # a replay could start a second conversation); nothing else does, nor anything sent later.
    failed = load.failures()
    assert all(f.method == "POST" and f.sent <= dead_at for f in failed), (dead_at, failed)
    assert len(failed) <= 2, failed
    await settled(api, load, within=120)  # the dead replica's starts, carried on by others
    resumed = [
        e for r in deployment.replicas if r for e in r.events() if e.get("task_id") == orphan["id"]
    ]
    assert any(e["event"] == "start_task_resumed" for e in resumed), resumed
    print(
        f"{len(load.outcomes)} requests, {len(failed)} failed (in flight on the killed one), "
        f"orphaned start READY {time.monotonic() - dead_at:.1f} s after the kill at the latest"
    )
