"""A sandbox's compare-and-set stores the change's lifecycle event in the same Lua script
(sandboxes/store.py, `entry=`): in the global and the user's streams and every webhook URL's
outbox when the change is made, and nowhere when it is refused. Real Redis."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from controlplane.config import ServiceConfig
from controlplane.crypto import load_secret_box
from controlplane.lifecycle.models import LifecycleType
from controlplane.lifecycle.outbox import Outbox, url_id
from controlplane.lifecycle.publisher import STREAM_MAXLEN, LifecyclePublisher
from controlplane.sandboxes import naming
from controlplane.sandboxes.lifecycle import SandboxLifecycle
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace
from tests.support.records import sandbox_record

S = SandboxStatus
URLS = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]


async def bodies(redis: aioredis.Redis, key: str) -> list[dict[str, object]]:
    return [json.loads(fields[b"e"]) for _id, fields in await redis.xrange(key)]


async def test_the_event_is_stored_with_the_change_and_only_then(
    config: ServiceConfig, raw_redis: aioredis.Redis
) -> None:
    store = SandboxStore(raw_redis, load_secret_box(None, config.data_dir))
    notes = SandboxLifecycle(LifecyclePublisher(raw_redis, Outbox(raw_redis, URLS)))
    record = sandbox_record("alice", S.RUNNING)
    assert await store.create(record, 1 << 20, Limits()) == "ok"
    streams = [
        keyspace.LIFECYCLE,
        keyspace.user_lifecycle("alice"),
        *(keyspace.webhook_outbox(url_id(url)) for url in URLS),
    ]

    pending = notes.pending(LifecycleType.SANDBOX_PAUSED, record, "idle", automatic=True)
    assert pending is not None
    assert [key for key, _ in pending.entry.streams] == streams
    # The two history streams are trimmed as publish() trims them; the outboxes never are.
    assert [limit for _, limit in pending.entry.streams] == [STREAM_MAXLEN] * 2 + [None] * 2
    done = await store.transition(record, [S.RUNNING], S.PAUSED, reason="idle", entry=pending.entry)
    assert done.outcome == "ok"
    stored = await store.get(record.id)
    assert stored is not None
    assert stored.status == S.PAUSED
    assert stored.reason == "idle"
    for key in streams:
        (event,) = await bodies(raw_redis, key)
        assert event["id"] == pending.event.id
        assert event["type"] == "sandbox.paused"
        assert event["sandbox_id"] == record.id
        assert event["automatic"] is True

    # Refused (it is PAUSED now): neither the change nor its event.
    again = notes.pending(LifecycleType.SANDBOX_PAUSED, record)
    assert again is not None
    refused = await store.transition(record, [S.RUNNING], S.PAUSED, entry=again.entry)
    assert (refused.outcome, refused.previous) == ("conflict", S.PAUSED)
    for key in streams:
        assert len(await bodies(raw_redis, key)) == 1
    # A record that is gone: nothing stored either.
    await store.delete(record)
    gone = await store.transition(record, [S.PAUSED], S.RUNNING, entry=again.entry)
    assert gone.outcome == "missing"
    for key in streams:
        assert len(await bodies(raw_redis, key)) == 1


async def test_a_transition_without_an_event_or_outbox_stores_no_event(
    config: ServiceConfig, raw_redis: aioredis.Redis
) -> None:
    store = SandboxStore(raw_redis, load_secret_box(None, config.data_dir))
    record = sandbox_record("bob", S.RUNNING)
    assert await store.create(record, 0, Limits()) == "ok"
    ports = {"AGENT_SERVER": 8000}
    assert (await store.transition(record, [S.RUNNING], S.PAUSED, ports=ports)).outcome == "ok"
    stored = await store.get(record.id)
    assert stored is not None
    assert (stored.status, stored.ports) == (S.PAUSED, ports)
    assert await raw_redis.exists(keyspace.LIFECYCLE, keyspace.user_lifecycle("bob")) == 0

    # Without webhook URLs the event goes to the two streams only; a pool member has none.
    notes = SandboxLifecycle(LifecyclePublisher(raw_redis, None))
    pending = notes.pending(LifecycleType.SANDBOX_RUNNING, record)
    assert pending is not None
    assert len(pending.entry.streams) == 2
    done = await store.transition(record, [S.PAUSED], S.RUNNING, entry=pending.entry)
    assert done.outcome == "ok"
    assert len(await bodies(raw_redis, keyspace.user_lifecycle("bob"))) == 1
    assert (
        notes.pending(LifecycleType.SANDBOX_RUNNING, sandbox_record(naming.POOL_OWNER, S.RUNNING))
        is None
    )
    assert SandboxLifecycle(None).pending(LifecycleType.SANDBOX_RUNNING, record) is None
