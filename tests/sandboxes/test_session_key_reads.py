"""A RUNNING sandbox's session key, as batch reads (the clients' polls) show it: the store keeps
the keys it decrypted by their encrypted form (a decryption is ~10 us, for every sandbox of
every poll), and that memory never answers for a stored key it has not decrypted itself."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from controlplane import keys
from controlplane.crypto import SecretBox
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace
from tests.support.records import RecordedSandbox, event, sandbox_record


async def test_a_changed_or_foreign_stored_key_is_decrypted_again(
    raw_redis: aioredis.Redis,
) -> None:
    box = SecretBox(Fernet.generate_key())
    store = SandboxStore(raw_redis, box)
    record = sandbox_record("keys-user", SandboxStatus.RUNNING, key="first-key")
    assert await store.create(record, 0, Limits())

    for _ in range(2):  # read again: the same key, from the store's memory
        (read,) = await store.get_many([record.id], keys=False)
        assert read is not None
        assert read.session_api_key == "first-key"

    # The stored key changes (a new token): the next read shows the new one.
    token = box.encrypt(b"second-key").decode()
    await raw_redis.hset(keyspace.sandbox(record.id), "key_enc", token)
    (read,) = await store.get_many([record.id], keys=False)
    assert read is not None
    assert read.session_api_key == "second-key"

    # A token another key made is refused, however many good reads came before.
    foreign = SecretBox(Fernet.generate_key()).encrypt(b"second-key").decode()
    await raw_redis.hset(keyspace.sandbox(record.id), "key_enc", foreign)
    with pytest.raises(ValueError, match="cannot be decrypted"):
        await store.get_many([record.id], keys=False)


async def test_a_key_the_polls_decrypted_stops_working_when_its_sandbox_is_deleted(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """The app's store still holds the plaintext it decrypted for the polls after the sandbox
    is deleted: that memory only answers reads of a stored record, never a credential check
    (each one looks the key's hash up in Redis), so the key is refused everywhere at once."""
    client, sandbox_id, cid, sandbox_key, alice = recorded
    key = sandbox_key["X-Session-API-Key"]
    for _ in range(2):  # the second read answers from the store's memory
        resp = await client.get("/api/v1/sandboxes", params={"id": sandbox_id}, headers=alice)
        assert resp.status == 200, await resp.text()
        (shown,) = await resp.json()
        assert shown["session_api_key"] == key
    paired = {"Authorization": f"Bearer {alice['X-Session-API-Key']}", **sandbox_key}
    webhook = f"/api/v1/webhooks/{sandbox_id}/events/{cid}"
    assert (await client.post(webhook, json=[event()], headers=sandbox_key)).status == 200
    assert (await client.get("/api/v1/sandboxes/search", headers=paired)).status == 200
    proxied = f"/sandboxes/{sandbox_id}/proxy/8000/health"
    resp = await client.get(proxied, headers=sandbox_key)
    assert resp.status == 404, await resp.text()  # let in: the record exposes no such port

    store = client.app[keys.SANDBOXES].store  # the one whose memory holds the key
    record = await store.get(sandbox_id)
    assert record is not None
    await store.delete(record)

    assert (await client.post(webhook, json=[event()], headers=sandbox_key)).status == 401
    resp = await client.get("/api/v1/sandboxes/search", headers=paired)
    assert resp.status == 401, await resp.text()
    resp = await client.get(proxied, headers=sandbox_key)
    assert resp.status == 401, await resp.text()
    resp = await client.get("/api/v1/sandboxes", params={"id": sandbox_id}, headers=alice)
    assert await resp.json() == [None]
    # A new sandbox of another user never gets the deleted one's key from that memory.
    other = sandbox_record("bob", SandboxStatus.RUNNING)
    assert await store.create(other, 0, Limits())
    bob = {"X-Session-API-Key": other.session_api_key}
    assert (await client.post(webhook, json=[event()], headers=bob)).status == 401
