"""A conversation's checkpoints in Redis: one hash per conversation, checkpoint id (uuid7 hex:
ordered by time) to its JSON record. Retention keeps it short (ACS_CHECKPOINT_KEEP_LAST), so
a listing reads it whole."""

from __future__ import annotations

import redis.asyncio as aioredis

from controlplane.checkpoints.models import CheckpointRecord
from controlplane.store import keyspace, text


class CheckpointStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def add(self, record: CheckpointRecord) -> None:
        key = keyspace.checkpoints(record.conversation_id)
        await self._redis.hset(key, record.id, record.model_dump_json())

    async def get(self, conversation_id: str, checkpoint_id: str) -> CheckpointRecord | None:
        raw = await self._redis.hget(keyspace.checkpoints(conversation_id), checkpoint_id)
        return None if raw is None else CheckpointRecord.model_validate_json(text(raw))

    async def all(self, conversation_id: str) -> list[CheckpointRecord]:
        """Oldest first."""
        rows = await self._redis.hgetall(keyspace.checkpoints(conversation_id))
        records = [CheckpointRecord.model_validate_json(text(v)) for v in rows.values()]
        return sorted(records, key=lambda r: r.id)

    async def remove(self, conversation_id: str, checkpoint_ids: list[str]) -> None:
        if checkpoint_ids:
            await self._redis.hdel(keyspace.checkpoints(conversation_id), *checkpoint_ids)

    async def drop(self, conversation_id: str) -> None:
        await self._redis.delete(keyspace.checkpoints(conversation_id))
