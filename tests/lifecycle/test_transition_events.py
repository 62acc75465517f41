"""A sandbox's compare-and-set stores the change's lifecycle event in the same Lua script
(sandboxes/store.py, `entry=`): in the global and the user's streams and every webhook URL's
outbox when the change is made, and nowhere when it is refused; a record's create and delete
take their event the same way. Real Redis; the last test runs a sandbox on real Docker: every
event of its life is stored by the change it reports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.config import ServiceConfig
from controlplane.crypto import load_secret_box
from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.outbox import Outbox, url_id
from controlplane.lifecycle.publisher import STREAM_MAXLEN, LifecyclePublisher
from controlplane.sandboxes import naming
from controlplane.sandboxes.lifecycle import SandboxLifecycle
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace
from tests.support.records import sandbox_record
from tests.support.sandbox_helpers import OwnDocker, lifecycle, start_running, wait_status
from tests.support.types import ClientFactory

S = SandboxStatus
URLS = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
SEPARATE_NEVER = {
    LifecycleType.SANDBOX_CREATED,
    LifecycleType.SANDBOX_RUNNING,
    LifecycleType.SANDBOX_PAUSED,
    LifecycleType.SANDBOX_RESUMED,
    LifecycleType.SANDBOX_DELETED,
}
"""Events stored only by the change they report (the exceptions: a warm pool claim's, and a
Docker resume's, published once the engine has unpaused the container)."""


async def bodies(redis: aioredis.Redis, key: str) -> list[dict[str, object]]:
    # Any, as the control plane reads streams: redis-py types a reply of XRANGE as maybe None.
    entries: Any = await redis.xrange(key)
    return [json.loads(fields[b"e"]) for _id, fields in entries]


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
    (adds,) = pending.entry.groups
    assert [add.key for add in adds] == streams
    # The two history streams are trimmed as publish() trims them; the outboxes never are.
    assert [add.maxlen for add in adds] == [STREAM_MAXLEN] * 2 + [None] * 2
    done = await store.transition(record, [S.RUNNING], S.PAUSED, reason="idle", entry=pending.entry)
    assert done.outcome == "ok"
    stored = await store.get(record.id)
    assert stored is not None
    assert stored.status == S.PAUSED
    assert stored.reason == "idle"
    assert pending.event is not None
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
    (adds,) = pending.entry.groups
    assert len(adds) == 2
    done = await store.transition(record, [S.PAUSED], S.RUNNING, entry=pending.entry)
    assert done.outcome == "ok"
    assert len(await bodies(raw_redis, keyspace.user_lifecycle("bob"))) == 1
    assert (
        notes.pending(LifecycleType.SANDBOX_RUNNING, sandbox_record(naming.POOL_OWNER, S.RUNNING))
        is None
    )
    assert SandboxLifecycle(None).pending(LifecycleType.SANDBOX_RUNNING, record) is None


async def test_a_create_and_a_delete_store_their_events_with_them(
    config: ServiceConfig, raw_redis: aioredis.Redis
) -> None:
    store = SandboxStore(raw_redis, load_secret_box(None, config.data_dir))
    notes = SandboxLifecycle(LifecyclePublisher(raw_redis, Outbox(raw_redis, URLS[:1])))
    outbox = keyspace.webhook_outbox(url_id(URLS[0]))
    record = sandbox_record("carol", S.STARTING)
    created = notes.pending(LifecycleType.SANDBOX_CREATED, record)
    assert created is not None
    # Refused by a cap: neither the record nor its event.
    full = await store.create(record, 0, Limits(running=0), entry=created.entry)
    assert full == "running"
    assert await store.get(record.id) is None
    assert await raw_redis.exists(keyspace.user_lifecycle("carol"), outbox) == 0
    assert await store.create(record, 0, Limits(), entry=created.entry) == "ok"
    stored = await store.get(record.id)
    assert stored is not None
    assert stored.status == S.STARTING
    assert await store.id_for_key(record.session_api_key) == record.id
    deleted = notes.pending(LifecycleType.SANDBOX_DELETED, record, "retention", automatic=True)
    assert deleted is not None
    await store.delete(record, entry=deleted.entry)
    assert await store.get(record.id) is None
    assert created.event is not None
    assert deleted.event is not None
    for key in (keyspace.LIFECYCLE, keyspace.user_lifecycle("carol"), outbox):
        events = await bodies(raw_redis, key)
        assert [(e["type"], e["id"]) for e in events] == [
            ("sandbox.created", created.event.id),
            ("sandbox.deleted", deleted.event.id),
        ]
        assert events[1]["reason"] == "retention"


async def test_every_event_of_a_sandbox_is_stored_by_its_change(
    make_sandbox_client: ClientFactory,
    user_headers: Callable[..., Awaitable[dict[str, str]]],
    own_docker: OwnDocker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Created, running, a change the reconciler saw (a container stopped outside: PAUSED), a
    resume (to STARTING), running again, deleted: each event is stored with its change, never
    by the publisher's own write, which a crash between the two could skip."""
    publish = LifecyclePublisher.publish

    async def publish_others(self: LifecyclePublisher, event: LifecycleEvent) -> None:
        assert event.type not in SEPARATE_NEVER, f"{event.type} published on its own"
        await publish(self, event)

    monkeypatch.setattr(LifecyclePublisher, "publish", publish_others)
    client = await make_sandbox_client(reconcile_interval=1.0)
    alice = await user_headers("alice")
    sandbox_id = (await start_running(client, alice))["id"]
    container = own_docker.container(sandbox_id)
    await asyncio.to_thread(container.stop, timeout=2)
    await wait_status(client, alice, sandbox_id, "PAUSED", within=30)
    resp = await client.post(f"/api/v1/sandboxes/{sandbox_id}/resume", headers=alice)
    assert resp.status == 200, await resp.text()
    await wait_status(client, alice, sandbox_id, "RUNNING", within=90)
    assert (await client.delete(f"/api/v1/sandboxes/{sandbox_id}", headers=alice)).status == 200

    items = await lifecycle(client, alice, sandbox_id=sandbox_id)
    seen = [(item["type"], item["automatic"]) for item in reversed(items)]
    assert seen == [
        ("sandbox.created", False),
        ("sandbox.running", False),
        ("sandbox.paused", True),
        ("sandbox.resumed", False),
        ("sandbox.running", False),
        ("sandbox.deleted", False),
    ], seen
    assert "stopped outside the control plane" in items[3]["reason"]
