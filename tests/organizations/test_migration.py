"""An existing deployment moving to organizations: records written the old way (API keys with
no organization and no per-user index, a sandbox record with no organization, a conversation),
then the new code starts: every user and key is a member of the default organization (admin
keys' users its owners), nothing owned is lost or changes owner, and a second start changes
nothing. The migration's lock is its holder's: a replica whose lock expired as it worked leaves
the one another replica took."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.crypto import hash_api_key, load_secret_box
from controlplane.organizations import migration
from controlplane.organizations.roles import Role
from controlplane.organizations.service import OrganizationService
from controlplane.organizations.store import OrganizationStore
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import SandboxStore
from controlplane.store import keyspace
from tests.support.types import ClientFactory


async def old_key(redis: aioredis.Redis, user: str, *, admin: bool) -> str:
    """A key as the code before organizations stored it: its hash and the global index only."""
    key_id = uuid.uuid4().hex[:12]
    key = f"acs_{key_id}_{'x' * 43}"
    now = datetime.now(UTC)
    await redis.hset(
        keyspace.api_key(key_id),
        mapping={
            "user_id": user,
            "is_admin": "1" if admin else "0",
            "hash": hash_api_key(key),
            "created_at": now.isoformat(),
        },
    )
    await redis.zadd(keyspace.API_KEYS, {key_id: now.timestamp()})
    return key


async def old_sandbox(redis: aioredis.Redis, data_dir: Path, owner: str) -> str:
    """A PAUSED sandbox record as the old store wrote it: no `org` field, no organization index."""
    record = SandboxRecord.starting("0" * 10 + uuid.uuid4().hex[:12], owner, "default")
    record = record.model_copy(update={"status": SandboxStatus.PAUSED})
    fields = SandboxStore(redis, load_secret_box(None, data_dir)).encode(record)
    del fields["org"]
    await redis.hset(
        keyspace.sandbox(record.id), items=[part for pair in fields.items() for part in pair]
    )
    await redis.zadd(keyspace.ALL_SANDBOXES, {record.id: 0})
    await redis.zadd(keyspace.user_sandboxes(owner), {record.id: 0})
    await redis.set(keyspace.sandbox_by_key(hash_api_key(record.session_api_key)), record.id)
    return record.id


async def test_an_old_deployment_becomes_the_default_organization(
    make_client: ClientFactory, raw_redis: aioredis.Redis, tmp_path: Path
) -> None:
    keys = {
        "alice": await old_key(raw_redis, "alice", admin=False),
        "root": await old_key(raw_redis, "root", admin=True),
    }
    sandbox = await old_sandbox(raw_redis, tmp_path / "data", "alice")
    await old_sandbox(raw_redis, tmp_path / "data", "carl")  # whose key was revoked since
    conversation = uuid.uuid4().hex
    await ConversationStore(raw_redis).create(
        AppConversationInfo(id=conversation, created_by_user_id="alice", sandbox_id=sandbox)
    )
    before = await raw_redis.hgetall(keyspace.sandbox(sandbox))

    client = await make_client(with_sandboxes=False)
    alice = {"X-Session-API-Key": keys["alice"]}
    root = {"X-Session-API-Key": keys["root"]}

    async def ok(path: str, who: dict[str, str]) -> Any:
        async with client.get(path, headers=who) as response:
            body = await response.json()
            assert response.status == 200, (path, body)
            return body

    assert await raw_redis.sismember(keyspace.MIGRATIONS, "organizations-v1")
    alice_orgs = await ok("/api/organizations", alice)
    assert [(o["id"], o["role"]) for o in alice_orgs["items"]] == [("deployment", "member")]
    root_orgs = await ok("/api/organizations", root)
    assert ("deployment", "owner") in [(o["id"], o["role"]) for o in root_orgs["items"]]
    members = await ok("/api/organizations/deployment/members", root)
    assert {m["user_id"]: m["role"] for m in members["items"]} == {
        "alice": "member",
        "carl": "member",
        "root": "owner",
    }
    # Keys: still valid, now listed (and revocable) by their owner.
    listed = await ok("/api/v1/keys", alice)
    assert [k["key_id"] for k in listed["items"]] == [keys["alice"].split("_")[1]]
    assert listed["items"][0]["org_id"] is None  # made before organizations: the default one

    # The records: untouched, still alice's.
    assert await raw_redis.hgetall(keyspace.sandbox(sandbox)) == before
    stored = await ConversationStore(raw_redis).get(conversation)
    assert stored is not None
    assert stored.created_by_user_id == "alice"

    # A second start applies nothing again and changes nothing.
    snapshot = {
        name: await raw_redis.hgetall(name)
        for name in (keyspace.user_orgs("alice"), keyspace.org_members("deployment"))
    }
    await make_client(with_sandboxes=False)
    for name, row in snapshot.items():
        assert await raw_redis.hgetall(name) == row


async def test_old_records_read_as_the_default_organizations_and_their_owners(
    make_sandbox_client: ClientFactory, raw_redis: aioredis.Redis, tmp_path: Path
) -> None:
    alice_key = await old_key(raw_redis, "alice", admin=False)
    root_key = await old_key(raw_redis, "root", admin=True)
    sandbox = await old_sandbox(raw_redis, tmp_path / "data", "alice")
    client = await make_sandbox_client()

    async with client.get(
        f"/api/v1/sandboxes/{sandbox}", headers={"X-Session-API-Key": alice_key}
    ) as response:
        own = await response.json()
        assert response.status == 200, own
    assert own["created_by_user_id"] == "alice"
    assert own["org_id"] == "deployment"
    async with client.get(
        "/api/v1/sandboxes/search?all_users=true", headers={"X-Session-API-Key": root_key}
    ) as response:
        listed = await response.json()
    assert [s["id"] for s in listed["items"]] == [sandbox]


async def test_a_late_release_leaves_the_lock_another_replica_took(
    raw_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A's lock expires while it reads the old records and replica B takes it: A stops
    (B does the same work) and its release, in its `finally`, must not free B's lock (a third
    replica would run the migration beside B)."""
    await old_key(raw_redis, "alice", admin=False)
    organizations = OrganizationService(OrganizationStore(raw_redis), "deployment")
    b_token = "replica-b"
    read_owners = migration._sandbox_owners

    async def while_a_reads(redis: aioredis.Redis) -> set[str]:
        owners = await read_owners(redis)
        assert await raw_redis.pexpire(keyspace.MIGRATIONS_LOCK, 1)  # A's TTL goes by
        await asyncio.sleep(0.05)
        assert await raw_redis.set(keyspace.MIGRATIONS_LOCK, b_token, nx=True, px=120_000)
        return owners

    monkeypatch.setattr(migration, "_sandbox_owners", while_a_reads)
    applied = await migration.migrate(raw_redis, organizations)
    assert await raw_redis.get(keyspace.MIGRATIONS_LOCK) == b_token.encode()
    assert applied is False
    assert not await raw_redis.sismember(keyspace.MIGRATIONS, migration.NAME)

    # With the lock free again, the migration runs to its end and frees its own lock.
    await raw_redis.delete(keyspace.MIGRATIONS_LOCK)
    monkeypatch.setattr(migration, "_sandbox_owners", read_owners)
    assert await migration.migrate(raw_redis, organizations) is True
    assert await raw_redis.get(keyspace.MIGRATIONS_LOCK) is None
    assert await organizations.store.members("deployment") == {"alice": Role.MEMBER}
