"""The idle reaper: pauses idle sandboxes, spares busy ones, survives restarts, acts once across
replicas; retention deletes long-paused sandboxes. Real Docker and Redis."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.store import keyspace
from controlplane.store.leader import LeaderLock
from tests.support.sandbox_helpers import lifecycle, start, start_running, wait_status
from tests.support.types import Client, ClientFactory

Headers = Any


async def backdate(raw_redis: aioredis.Redis, sandbox_id: str, seconds: int, field: str) -> None:
    old = datetime.now(UTC) - timedelta(seconds=seconds)
    await raw_redis.hset(keyspace.sandbox(sandbox_id), field, old.isoformat())


async def make_busy(raw_redis: aioredis.Redis, sandbox_id: str, owner: str) -> None:
    """A conversation in the sandbox whose agent is running (as its webhooks would say)."""
    await ConversationStore(raw_redis).save(
        AppConversationInfo(
            id="f" * 32,
            created_by_user_id=owner,
            sandbox_id=sandbox_id,
            execution_status=ExecutionStatus.RUNNING,
        )
    )


async def test_idle_sandbox_paused_busy_one_spared(
    make_sandbox_client: ClientFactory, user_headers: Headers, raw_redis: aioredis.Redis
) -> None:
    client: Client = await make_sandbox_client(reaper_interval=3600.0)
    alice = await user_headers("alice")
    resp = await client.post("/api/settings", json={"sandbox_idle_timeout": 60}, headers=alice)
    assert resp.status == 200
    idle = (await start(client, alice))["id"]
    busy = (await start(client, alice))["id"]
    fresh = (await start(client, alice))["id"]
    for sandbox_id in (idle, busy, fresh):
        await wait_status(client, alice, sandbox_id, "RUNNING")
    await backdate(raw_redis, idle, 120, "last_activity_at")
    await backdate(raw_redis, busy, 120, "last_activity_at")
    await make_busy(raw_redis, busy, "alice")

    paused, retired = await client.app[keys.REAPER].sweep()

    assert (paused, retired) == ([idle], [])
    body = await wait_status(client, alice, idle, "PAUSED", within=1)
    assert body["reason"].startswith("paused after 1")
    assert "timeout 60 s" in body["reason"]
    spared = await wait_status(client, alice, busy, "RUNNING", within=1)
    age = datetime.now(UTC) - datetime.fromisoformat(spared["last_activity_at"])
    assert age < timedelta(seconds=10), "a running agent counts as activity"
    await wait_status(client, alice, fresh, "RUNNING", within=1)

    events = await lifecycle(client, alice, sandbox_id=idle)
    assert events[0]["type"] == "sandbox.paused"
    assert events[0]["automatic"] is True
    assert "idle" in events[0]["reason"]
    assert [e["type"] for e in events][-2:] == ["sandbox.running", "sandbox.created"]


async def test_zero_timeout_disables_and_global_overrides(
    make_sandbox_client: ClientFactory, user_headers: Headers, raw_redis: aioredis.Redis
) -> None:
    client: Client = await make_sandbox_client(reaper_interval=3600.0)
    alice = await user_headers("alice")
    await client.post("/api/settings", json={"sandbox_idle_timeout": 0}, headers=alice)
    sandbox_id = (await start_running(client, alice))["id"]
    await backdate(raw_redis, sandbox_id, 10 * 86400, "last_activity_at")
    assert await client.app[keys.REAPER].sweep() == ([], [])
    await client.close()

    # ACS_IDLE_TIMEOUT overrides the user's 0; the reaper's first pass runs at start-up.
    forced: Client = await make_sandbox_client(reaper_interval=3600.0, idle_timeout=30)
    body = await wait_status(forced, alice, sandbox_id, "PAUSED", within=10)
    assert "timeout 30 s" in body["reason"]


async def test_deadline_survives_a_restart(
    make_sandbox_client: ClientFactory, user_headers: Headers, raw_redis: aioredis.Redis
) -> None:
    first: Client = await make_sandbox_client(reaper_interval=3600.0)
    alice = await user_headers("alice")
    await first.post("/api/settings", json={"sandbox_idle_timeout": 60}, headers=alice)
    sandbox_id = (await start_running(first, alice))["id"]
    await backdate(raw_redis, sandbox_id, 120, "last_activity_at")
    await first.close()

    # A new process, whose reaper runs on its own every 0.3 s: the deadline is in Redis.
    second: Client = await make_sandbox_client(reaper_interval=0.3)
    body = await wait_status(second, alice, sandbox_id, "PAUSED", within=15)
    assert "idle" in body["reason"]


async def test_two_replicas_pause_once(
    make_sandbox_client: ClientFactory, user_headers: Headers, raw_redis: aioredis.Redis
) -> None:
    one: Client = await make_sandbox_client(reaper_interval=3600.0)
    alice = await user_headers("alice")
    await one.post("/api/settings", json={"sandbox_idle_timeout": 60}, headers=alice)
    ids = [(await start(one, alice))["id"] for _ in range(2)]
    for sandbox_id in ids:
        await wait_status(one, alice, sandbox_id, "RUNNING")
    await one.close()
    for sandbox_id in ids:
        await backdate(raw_redis, sandbox_id, 120, "last_activity_at")

    replicas: list[Client] = [await make_sandbox_client(reaper_interval=0.2) for _ in range(2)]
    for sandbox_id in ids:
        await wait_status(replicas[0], alice, sandbox_id, "PAUSED", within=15)
    await asyncio.sleep(1.0)  # several more reaper rounds on both replicas
    events = await lifecycle(replicas[1], alice)
    pauses = [e for e in events if e["type"] == "sandbox.paused"]
    assert sorted(e["sandbox_id"] for e in pauses) == sorted(ids)
    assert all(e["automatic"] for e in pauses)


async def test_leader_lock_is_exclusive_and_expires(raw_redis: aioredis.Redis) -> None:
    a = LeaderLock(raw_redis, "acs:leader:test", ttl_seconds=0.5)
    b = LeaderLock(raw_redis, "acs:leader:test", ttl_seconds=0.5)
    assert await a.hold()
    assert not await b.hold()
    assert await a.hold(), "the holder renews"
    await a.release()
    assert await b.hold()
    deadline = time.monotonic() + 5
    while not await a.hold():  # b stops renewing: its lock expires
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert not await b.hold()


async def test_retention_deletes_long_paused_sandboxes(
    make_sandbox_client: ClientFactory, user_headers: Headers, raw_redis: aioredis.Redis
) -> None:
    client: Client = await make_sandbox_client(
        reaper_interval=3600.0,
        paused_retention=3600,
    )
    alice = await user_headers("alice")
    old = (await start(client, alice))["id"]
    recent = (await start(client, alice))["id"]
    for sandbox_id in (old, recent):
        await wait_status(client, alice, sandbox_id, "RUNNING")
        resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/pause", headers=alice)
        assert resp.status == 200
    await backdate(raw_redis, old, 7200, "updated_at")

    assert await client.app[keys.REAPER].sweep() == ([], [old])
    assert (await client.get(f"/api/v1/sandboxes/{old}", headers=alice)).status == 404
    await wait_status(client, alice, recent, "PAUSED", within=1)
    (deleted,) = [
        e for e in await lifecycle(client, alice, sandbox_id=old) if e["type"] == "sandbox.deleted"
    ]
    assert deleted["automatic"] is True
    assert "retention" in deleted["reason"]


pytestmark = pytest.mark.usefixtures("sandbox_images")
