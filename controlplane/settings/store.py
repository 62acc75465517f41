"""The encrypted per-user record in Redis, read and updated with optimistic locking."""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from controlplane.crypto import SecretBox
from controlplane.errors import Conflict
from controlplane.settings.models import UserRecord
from controlplane.store import audit, keyspace, text
from controlplane.store.streams import stored

_MAX_ATTEMPTS = 20


class UserRecordStore:
    def __init__(self, redis: aioredis.Redis, box: SecretBox) -> None:
        self._redis = redis
        self._box = box

    def _decode(self, raw: bytes | str | None) -> UserRecord:
        if raw is None:
            return UserRecord()
        return UserRecord.model_validate_json(self._box.decrypt(text(raw).encode()))

    async def get(self, user_id: str) -> UserRecord:
        """The user's record; a user with nothing stored gets the defaults (stored=False)."""
        return self._decode(await self._redis.get(keyspace.user_settings(user_id)))

    async def get_many(self, user_ids: list[str]) -> list[UserRecord]:
        """The records of `user_ids`, in their order, in one round trip (MGET)."""
        if not user_ids:
            return []
        rows = await self._redis.mget([keyspace.user_settings(u) for u in user_ids])
        return [self._decode(row) for row in rows]

    async def update(self, user_id: str, change: Callable[[UserRecord], None]) -> UserRecord:
        """Apply `change` to the current record and write it back atomically.

        `change` mutates the record in place and may raise a ControlPlaneError to abort. Concurrent
        writers are retried (WATCH/MULTI), so no update is lost. The request's audit entry is
        written with it.
        """
        key = keyspace.user_settings(user_id)
        entry = audit.entry()
        for _ in range(_MAX_ATTEMPTS):
            async with self._redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    record = self._decode(await pipe.get(key))
                    change(record)
                    record.stored = True
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    pipe.set(key, self._box.encrypt(record.model_dump_json().encode()))
                    if entry is not None:
                        entry.queue(pipe)
                    await pipe.execute()
                    stored(entry)
                    return record
                except WatchError:
                    continue
        raise Conflict("settings changed concurrently too often; retry")
