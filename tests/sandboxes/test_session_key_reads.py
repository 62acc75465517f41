"""A RUNNING sandbox's session key, as batch reads (the clients' polls) show it: the store keeps
the keys it decrypted by their encrypted form (a decryption is ~10 us, for every sandbox of
every poll), and that memory never answers for a stored key it has not decrypted itself."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from controlplane.crypto import SecretBox
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.store import keyspace
from tests.support.records import sandbox_record


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
