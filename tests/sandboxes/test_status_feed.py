"""wait_running is woken by the status change itself, published through Redis, also on another
replica (a second store, connection and feed), not by re-reading on a timer."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from controlplane.config import ServiceConfig
from controlplane.crypto import load_secret_box
from controlplane.errors import Conflict, SandboxNotFound
from controlplane.sandboxes import naming, reads
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.reads import SandboxReads
from controlplane.sandboxes.status_feed import StatusFeed
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER

S = SandboxStatus


@pytest.fixture
async def two_replicas(
    config: ServiceConfig, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[SandboxStore, SandboxReads]]:
    """Replica A's store (it makes the changes) and replica B's reads (it waits), each with its
    own Redis connection; B re-reads on its own only every 10 minutes."""
    monkeypatch.setattr(reads, "RECHECK", 600.0)
    box = load_secret_box(None, config.data_dir)
    first, second = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    feed = StatusFeed(second)
    feed.start()
    catalog = SpecCatalog.load(config.spec_dir, config.image_tag)
    waiter = SandboxReads(config, SandboxStore(second, box), catalog, feed)
    await asyncio.sleep(0.2)  # subscribed
    yield SandboxStore(first, box), waiter
    await feed.stop()
    await first.aclose()
    await second.aclose()


async def _starting(store: SandboxStore) -> SandboxRecord:
    now = datetime.now(UTC)
    record = SandboxRecord(
        id=naming.new_sandbox_id(),
        owner="alice",
        spec_id="default",
        status=S.STARTING,
        session_api_key=secrets.token_urlsafe(16),
        created_at=now,
        updated_at=now,
        last_activity_at=now,
    )
    assert await store.create(record, 0, Limits()) == "ok"
    return record


async def test_a_waiter_on_another_replica_wakes_on_running(
    two_replicas: tuple[SandboxStore, SandboxReads],
) -> None:
    store, waiter = two_replicas
    record = await _starting(store)
    wait = asyncio.create_task(waiter.wait_running(record.id, 300))
    await asyncio.sleep(0.3)
    assert not wait.done()
    result = await store.transition(record, [S.STARTING], S.RUNNING, ports={AGENT_SERVER: 4321})
    assert result.outcome == "ok"
    running = await asyncio.wait_for(wait, 30)  # far below the 600 s re-read
    assert running.status == S.RUNNING
    assert running.ports == {AGENT_SERVER: 4321}


async def test_a_waiter_on_another_replica_hears_of_error_and_delete(
    two_replicas: tuple[SandboxStore, SandboxReads],
) -> None:
    store, waiter = two_replicas
    failed = await _starting(store)
    wait = asyncio.create_task(waiter.wait_running(failed.id, 300))
    await asyncio.sleep(0.3)
    await store.transition(failed, [S.STARTING], S.ERROR, reason="boom")
    with pytest.raises(Conflict, match="boom"):
        await asyncio.wait_for(wait, 30)

    deleted = await _starting(store)
    wait = asyncio.create_task(waiter.wait_running(deleted.id, 300))
    await asyncio.sleep(0.3)
    await store.delete(deleted)
    with pytest.raises(SandboxNotFound, match="deleted"):
        await asyncio.wait_for(wait, 30)
