"""An index migration: every stored record of a kind put in its indexes, once per deployment.

Used by the start tasks' indexes (conversations/task_index.py) and the conversations' own
(conversations/indexes.py): records written before their indexes existed are indexed at start,
in the background, by one replica at a time (a lock held while it works; the others go on at
once, each index covering a user's records on demand until this is done), in batches, and the
migration is marked applied in `acs:migrations` when the walk is through. Safe to run again and
beside any write: each batch's indexing never undoes a newer write (the callers' scripts)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
import structlog
from pydantic import BaseModel

from controlplane.store import keyspace, text
from controlplane.store.leader import LeaderLock
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)

RecordT = TypeVar("RecordT", bound=BaseModel)

LOCK_TTL = 120
BATCH = 500
"""Records read per round trip by a migration."""


@dataclass(frozen=True)
class IndexMigration:
    name: str
    """Its name in `acs:migrations` (and in its lock's key)."""
    prefix: str
    """The records' keys: this prefix and the record's id."""
    index: Callable[[list[str]], Awaitable[object]]
    """Puts the records of these ids in their indexes (a record gone or newer is left alone)."""
    counted: str
    """What the applied log line calls the records ("tasks", "conversations")."""
    skip_nested: bool = False
    """Skip keys below a record's (an id holding ":"): they are not records."""

    async def run(self, redis: aioredis.Redis) -> bool:
        """The walk, unless applied or another replica is at it. True when this call applied
        it."""
        if await redis.sismember(keyspace.MIGRATIONS, self.name):
            return False
        lock = LeaderLock(redis, f"{keyspace.MIGRATIONS_LOCK}:{self.name}", LOCK_TTL)
        if not await lock.hold():
            return False  # another replica is at it
        try:
            batch: list[str] = []
            done = 0
            async for key in redis.scan_iter(match=self.prefix + "*", count=BATCH):
                record_id = text(key).removeprefix(self.prefix)
                if self.skip_nested and ":" in record_id:
                    continue
                batch.append(record_id)
                if len(batch) >= BATCH:
                    if not await lock.hold():
                        log.warning("migration_lock_lost", name=self.name, done=done)
                        return False
                    await self.index(batch)
                    done, batch = done + len(batch), []
            await self.index(batch)
            await redis.sadd(keyspace.MIGRATIONS, self.name)
            log.info("migration_applied", name=self.name, **{self.counted: done + len(batch)})
            return True
        finally:
            await lock.release()


async def retried(migrate: Callable[[], Awaitable[bool]], event: str, retry: float) -> None:
    """`migrate()` until it has run through or another replica has (every replica starts it);
    a failed try is logged (`<event>_interrupted` when Redis went away, `<event>_failed`
    otherwise: a read-only replica, or a bug) and tried again after `retry` seconds."""
    while True:
        try:
            await migrate()
        except REDIS_DOWN as exc:
            log.warning(f"{event}_interrupted", error=str(exc))
        except Exception:
            log.exception(f"{event}_failed")
        else:
            return
        await asyncio.sleep(retry)


def as_read(row: Any, model: type[RecordT]) -> tuple[RecordT, str] | None:
    """A stored record (JSON) as `model`, with its `updated_at` as the JSON holds it (what the
    index scripts compare to decide that nothing wrote it since); None when there is none or it
    does not decode."""
    if not row:
        return None
    try:
        data = json.loads(row)
        stored_at = data["updated_at"]
        record = model.model_validate(data)
    except (ValueError, KeyError, TypeError):
        return None
    return (record, stored_at) if isinstance(stored_at, str) else None
