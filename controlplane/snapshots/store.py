"""Snapshot records in Redis, and the reference counts that say which blobs of the store are
still used (names in controlplane/store/keyspace.py).

A snapshot is PENDING while it is taken (not listed; the blobs it sends are recorded before
they are sent) and READY once one script has checked the quotas, counted its packs and listed
it. Nothing is ever deleted from the store by a request directly: the script that orphans a
blob (a snapshot deleted, a pack no longer used, a snapshot abandoned) records it in
STORE_DELETIONS, and the collector deletes it from the store and only then forgets it, so a
crash at any point leaves work to finish, never an orphan.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from controlplane.snapshots.models import SnapshotRecord
from controlplane.store import keyspace, text

FORKS_KEPT = 86_400
"""Seconds a fork's record of the sandboxes it started ahead of its snapshot's listing is kept
(keyspace.snapshot_forks: the collector reads it when it finds the snapshot abandoned)."""

_COMMIT = """
local user_snaps, sandbox_snaps, packs, sizes = KEYS[2], KEYS[3], KEYS[5], KEYS[6]
local id, max_count, max_bytes = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n_new, n_all, n_chunks = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local index_size, now = tonumber(ARGV[7]), ARGV[8]
if redis.call('HGET', KEYS[1], 'status') ~= 'PENDING' then return 'gone' end
local a = 9
local new_bytes = index_size
for i = 0, n_new - 1 do new_bytes = new_bytes + tonumber(ARGV[a + i * 3 + 1]) end
local used = tonumber(redis.call('GET', KEYS[8]) or '0')
if max_count >= 0 and redis.call('ZCARD', user_snaps) >= max_count then return 'count' end
if max_bytes >= 0 and used + new_bytes > max_bytes then return 'bytes' end
local reuse = a + n_new * 3
for i = 0, n_all - 1 do
  local d = ARGV[reuse + i]
  local mine = false
  for j = 0, n_new - 1 do if ARGV[a + j * 3] == d then mine = true end end
  if not mine and redis.call('HEXISTS', packs, d) == 0 then return 'stale' end
end
for i = 0, n_new - 1 do
  local d, size, chunks = ARGV[a + i * 3], ARGV[a + i * 3 + 1], ARGV[a + i * 3 + 2]
  redis.call('HSETNX', packs, d, 0)
  redis.call('HSET', sizes, d, size)
  redis.call('SET', KEYS[9] .. d, chunks)
end
for i = 0, n_all - 1 do
  local d = ARGV[reuse + i]
  redis.call('HINCRBY', packs, d, 1)
  redis.call('ZREM', KEYS[10], ARGV[reuse + n_all + n_chunks * 2] .. ' ' .. d)
end
local c = reuse + n_all
for i = 0, n_chunks - 1 do
  redis.call('HSET', KEYS[7], ARGV[c + i * 2], ARGV[c + i * 2 + 1])
end
redis.call('INCRBY', KEYS[8], new_bytes)
redis.call('HSET', KEYS[1], 'status', 'READY', 'stored', new_bytes, 'created_at', now)
redis.call('ZADD', user_snaps, 0, id)
redis.call('ZADD', sandbox_snaps, 0, id)
redis.call('ZADD', KEYS[11], 0, redis.call('HGET', KEYS[1], 'sandbox_id'))
redis.call('ZREM', KEYS[4], id)
redis.call('DEL', KEYS[12], KEYS[13])
redis.call('SREM', KEYS[14], id)
return 'ok'
"""

_NOTE_FORKS = """
if redis.call('HGET', KEYS[1], 'status') ~= 'PENDING' then return 0 end
redis.call('SADD', KEYS[2], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return 1
"""

_DELETE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'READY' then return 0 end
local user, repo, now = ARGV[1], ARGV[2], ARGV[3]
for _, d in ipairs(cjson.decode(redis.call('HGET', KEYS[1], 'packs'))) do
  if tonumber(redis.call('HINCRBY', KEYS[4], d, -1)) <= 0 then
    redis.call('HSET', KEYS[4], d, 0)
    redis.call('ZADD', KEYS[5], now, user .. ' ' .. d)
  end
end
local index = redis.call('HGET', KEYS[1], 'index_digest')
local manifest = redis.call('HGET', KEYS[1], 'manifest_digest')
redis.call('SADD', KEYS[6], repo .. ' manifest ' .. manifest, repo .. ' blob ' .. index)
redis.call('DECRBY', KEYS[7], tonumber(redis.call('HGET', KEYS[1], 'index_size') or '0'))
redis.call('ZREM', KEYS[2], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('DEL', KEYS[1])
return 1
"""

_ABANDON = """
local repo = ARGV[1]
for _, d in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local kind, digest = string.match(d, '^(%S+) (%S+)$')
  if kind ~= 'blob' or redis.call('HEXISTS', KEYS[4], digest) == 0 then
    redis.call('SADD', KEYS[5], repo .. ' ' .. d)
    redis.call('ZADD', KEYS[6], ARGV[3], repo .. ' ' .. d)
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1
"""

_COLLECT_PACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= '0' then
  redis.call('ZREM', KEYS[6], ARGV[3] .. ' ' .. ARGV[1])
  return 0
end
local size = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DECRBY', KEYS[3], size)
for id in string.gmatch(redis.call('GET', KEYS[4]) or '', '%S+') do
  local at = redis.call('HGET', KEYS[5], id)
  if at and string.sub(at, 1, #ARGV[1]) == ARGV[1] then redis.call('HDEL', KEYS[5], id) end
end
redis.call('DEL', KEYS[4])
redis.call('ZREM', KEYS[6], ARGV[3] .. ' ' .. ARGV[1])
redis.call('SADD', KEYS[7], ARGV[2] .. ' blob ' .. ARGV[1])
return 1
"""


@dataclass(frozen=True)
class NewPack:
    digest: str
    size: int
    chunks: list[str]


@dataclass(frozen=True)
class SnapshotLimits:
    """Per-user quotas; None: no limit."""

    count: int | None = None
    bytes: int | None = None


def _n(value: int | None) -> int:
    return -1 if value is None else value


class SnapshotStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._redis = redis
        self._commit = redis.register_script(_COMMIT)
        self._delete = redis.register_script(_DELETE)
        self._abandon = redis.register_script(_ABANDON)
        self._collect = redis.register_script(_COLLECT_PACK)
        self._note_forks = redis.register_script(_NOTE_FORKS)

    # -- records ------------------------------------------------------------------------------

    @staticmethod
    def encode(record: SnapshotRecord) -> dict[str, str]:
        """The record's hash fields (absent ones left out)."""
        data = record.model_dump(mode="json")
        return {
            k: json.dumps(v) if isinstance(v, list) else str(v)
            for k, v in data.items()
            if v is not None
        }

    @staticmethod
    def _decode(raw: dict[Any, Any]) -> SnapshotRecord:
        row: dict[str, Any] = {text(k): text(v) for k, v in raw.items()}
        row["packs"] = json.loads(row.get("packs") or "[]")
        return SnapshotRecord.model_validate(row)

    async def get(self, snapshot_id: str) -> SnapshotRecord | None:
        raw = await self._redis.hgetall(keyspace.snapshot(snapshot_id))
        return self._decode(raw) if raw else None

    async def get_many(self, ids: Iterable[str]) -> list[SnapshotRecord | None]:
        ids = list(ids)
        async with self._redis.pipeline(transaction=False) as pipe:
            for snapshot_id in ids:
                pipe.hgetall(keyspace.snapshot(snapshot_id))
            rows = await pipe.execute()
        return [self._decode(r) if r else None for r in rows]

    async def begin(self, record: SnapshotRecord, lease: float) -> None:
        """Record a PENDING snapshot, abandoned unless renewed within `lease` seconds."""
        async with self._redis.pipeline(transaction=True) as pipe:
            fields: dict[Any, Any] = self.encode(record)
            pipe.hset(keyspace.snapshot(record.id), mapping=fields)
            pipe.zadd(keyspace.PENDING_SNAPSHOTS, {record.id: time.time() + lease})
            await pipe.execute()

    async def renew(self, snapshot_id: str, lease: float) -> None:
        await self._redis.zadd(
            keyspace.PENDING_SNAPSHOTS, {snapshot_id: time.time() + lease}, xx=True
        )

    async def uploading(self, snapshot_id: str, kind: str, digest: str) -> None:
        """Record a blob (`kind` blob or manifest) before it is sent to the store."""
        await self._redis.sadd(keyspace.snapshot_uploads(snapshot_id), f"{kind} {digest}")

    async def fill(self, snapshot_id: str, fields: dict[str, str]) -> None:
        mapping: dict[Any, Any] = fields
        await self._redis.hset(keyspace.snapshot(snapshot_id), mapping=mapping)

    async def commit(
        self,
        record: SnapshotRecord,
        new: list[NewPack],
        chunks: dict[str, str],
        limits: SnapshotLimits,
    ) -> str:
        """READY and listed, its packs counted, its new chunks findable by later snapshots:
        "ok", or "count"/"bytes" (a quota), "stale" (a pack it reuses was collected
        meanwhile) or "gone" (no longer PENDING); nothing changes unless "ok"."""
        flat_new = [x for p in new for x in (p.digest, str(p.size), " ".join(p.chunks))]
        flat_chunks = [x for pair in chunks.items() for x in pair]
        outcome = await self._commit(
            keys=[
                keyspace.snapshot(record.id),
                keyspace.user_snapshots(record.owner),
                keyspace.sandbox_snapshots(record.sandbox_id),
                keyspace.PENDING_SNAPSHOTS,
                keyspace.user_packs(record.owner),
                keyspace.user_pack_sizes(record.owner),
                keyspace.user_chunks(record.owner),
                keyspace.user_snapshot_bytes(record.owner),
                keyspace.pack_chunks(record.owner, ""),
                keyspace.DOOMED_PACKS,
                keyspace.SNAPSHOT_SANDBOXES,
                keyspace.snapshot_uploads(record.id),
                keyspace.snapshot_forks(record.id),
                keyspace.FORKED_SNAPSHOTS,
            ],
            args=[
                record.id,
                _n(limits.count),
                _n(limits.bytes),
                len(new),
                len(record.packs),
                len(chunks),
                record.index_size,
                record.created_at.isoformat(),
                *flat_new,
                *record.packs,
                *flat_chunks,
                record.owner,
            ],
        )
        return text(outcome)

    async def abandon(self, record: SnapshotRecord, settle: float = 0.0) -> None:
        """Forget a PENDING snapshot; whatever it sent that no READY snapshot uses goes to the
        store's deletions, settling for `settle` seconds (`settling`)."""
        await self._abandon(
            keys=[
                keyspace.snapshot(record.id),
                keyspace.snapshot_uploads(record.id),
                keyspace.PENDING_SNAPSHOTS,
                keyspace.user_packs(record.owner),
                keyspace.STORE_DELETIONS,
                keyspace.STORE_SETTLING,
            ],
            args=[record.repository, record.id, time.time() + settle],
        )

    async def delete(self, record: SnapshotRecord) -> bool:
        """Unlist a READY snapshot and count its packs down (the unused ones doomed); its
        index and manifest go to the store's deletions. False: it was not READY."""
        done = await self._delete(
            keys=[
                keyspace.snapshot(record.id),
                keyspace.user_snapshots(record.owner),
                keyspace.sandbox_snapshots(record.sandbox_id),
                keyspace.user_packs(record.owner),
                keyspace.DOOMED_PACKS,
                keyspace.STORE_DELETIONS,
                keyspace.user_snapshot_bytes(record.owner),
            ],
            args=[record.owner, record.repository, time.time(), record.id],
        )
        return bool(done)

    # -- reads ----------------------------------------------------------------------------------

    async def page_ids(self, key: str, after: str | None, count: int) -> list[str]:
        """Up to `count` ids of a lexical index older than `after`, newest first."""
        start = f"({after}" if after else "+"
        raw = await self._redis.zrange(key, start, "-", desc=True, bylex=True, offset=0, num=count)
        return [text(i) for i in raw]

    async def latest(self, sandbox_id: str) -> str | None:
        ids = await self.page_ids(keyspace.sandbox_snapshots(sandbox_id), None, 1)
        return ids[0] if ids else None

    async def pack_sizes(self, owner: str, digests: list[str]) -> dict[str, int]:
        if not digests:
            return {}
        raw = await self._redis.hmget(keyspace.user_pack_sizes(owner), digests)
        return {d: int(v) for d, v in zip(digests, raw, strict=True) if v is not None}

    async def count(self, owner: str) -> int:
        return int(await self._redis.zcard(keyspace.user_snapshots(owner)))

    async def bytes_used(self, owner: str) -> int:
        return int(await self._redis.get(keyspace.user_snapshot_bytes(owner)) or 0)

    async def chunk_locations(self, owner: str, ids: list[str]) -> list[str | None]:
        """Where each chunk id is ("<pack> <offset> <length>"), None for unknown ones."""
        if not ids:
            return []
        raw = await self._redis.hmget(keyspace.user_chunks(owner), ids)
        return [text(v) if v is not None else None for v in raw]

    # -- collection -----------------------------------------------------------------------------

    async def abandoned(self, now: float) -> list[str]:
        raw = await self._redis.zrange(keyspace.PENDING_SNAPSHOTS, 0, now, byscore=True)
        return [text(i) for i in raw]

    async def note_forks(self, snapshot_id: str, sandbox_ids: Sequence[str]) -> bool:
        """Record the sandboxes a fork starts before its snapshot is listed (keyspace:
        snapshot_forks), if it is still PENDING (its commit deletes the record: a listed
        snapshot never has one, so the collector never takes one for abandoned). False: not
        recorded (listed, or abandoned, meanwhile)."""
        keys = [
            keyspace.snapshot(snapshot_id),
            keyspace.snapshot_forks(snapshot_id),
            keyspace.FORKED_SNAPSHOTS,
        ]
        args: list[str | int] = [FORKS_KEPT, snapshot_id, *sandbox_ids]
        return bool(await self._note_forks(keys=keys, args=args))

    async def forks_of(self, snapshot_id: str) -> list[str]:
        found = await self._redis.smembers(keyspace.snapshot_forks(snapshot_id))
        return sorted(text(i) for i in found)

    async def forked_ahead(self) -> list[str]:
        """The snapshots whose forks' sandboxes are recorded by note_forks (from their index:
        one read, however large the keyspace; an id whose record expired is listed until
        drop_forks)."""
        return sorted(text(i) for i in await self._redis.smembers(keyspace.FORKED_SNAPSHOTS))

    async def drop_forks(self, snapshot_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keyspace.snapshot_forks(snapshot_id))
            pipe.srem(keyspace.FORKED_SNAPSHOTS, snapshot_id)
            await pipe.execute()

    async def unlist_pending(self, snapshot_id: str) -> None:
        await self._redis.zrem(keyspace.PENDING_SNAPSHOTS, snapshot_id)

    async def doomed(self, before: float) -> list[tuple[str, str]]:
        raw = await self._redis.zrange(keyspace.DOOMED_PACKS, 0, before, byscore=True)
        return [(u, d) for u, _, d in (text(i).rpartition(" ") for i in raw)]

    async def collect_pack(self, owner: str, digest: str, repository: str) -> bool:
        """Forget a pack no snapshot uses (still so: one revived meanwhile is left); it goes
        to the store's deletions. False when it was in use again or gone."""
        done = await self._collect(
            keys=[
                keyspace.user_packs(owner),
                keyspace.user_pack_sizes(owner),
                keyspace.user_snapshot_bytes(owner),
                keyspace.pack_chunks(owner, digest),
                keyspace.user_chunks(owner),
                keyspace.DOOMED_PACKS,
                keyspace.STORE_DELETIONS,
            ],
            args=[digest, repository, owner],
        )
        return bool(done)

    async def deletions(self) -> list[tuple[str, str, str]]:
        """(repository, blob|manifest, digest) to delete from the store."""
        raw = await self._redis.smembers(keyspace.STORE_DELETIONS)
        out = []
        for item in raw:
            repo, kind, digest = text(item).split(" ")
            out.append((repo, kind, digest))
        return out

    async def settling(self) -> dict[tuple[str, str, str], float]:
        """Deletions of what an abandoned snapshot was sending: when the store can no longer
        land each (until then a "not there" is not final: the upload may still land)."""
        raw = await self._redis.zrange(keyspace.STORE_SETTLING, 0, -1, withscores=True)
        found: dict[tuple[str, str, str], float] = {}
        for item, until in cast(list[tuple[Any, float]], raw):
            repo, kind, digest = text(item).split(" ", 2)
            found[(repo, kind, digest)] = float(until)
        return found

    async def deleted(self, repository: str, kind: str, digest: str) -> None:
        entry = f"{repository} {kind} {digest}"
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(keyspace.STORE_DELETIONS, entry)
            pipe.zrem(keyspace.STORE_SETTLING, entry)
            await pipe.execute()

    async def sandboxes_page(self, after: str | None, count: int) -> list[str]:
        return await self.page_ids(keyspace.SNAPSHOT_SANDBOXES, after, count)

    async def drop_sandbox_index(self, sandbox_id: str) -> None:
        """A sandbox none of whose snapshots is left: out of the retention pass."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrem(keyspace.SNAPSHOT_SANDBOXES, sandbox_id)
            pipe.delete(keyspace.sandbox_snapshots(sandbox_id))
            pipe.hdel(keyspace.ORPHANED_SANDBOXES, sandbox_id)
            await pipe.execute()

    async def orphaned_since(self, sandbox_id: str, now: float) -> float:
        """When the retention pass first found this sandbox gone (now, the first time)."""
        await self._redis.hsetnx(keyspace.ORPHANED_SANDBOXES, sandbox_id, repr(now))
        return float(text(await self._redis.hget(keyspace.ORPHANED_SANDBOXES, sandbox_id)))

    async def sandbox_ids(self, sandbox_id: str) -> list[str]:
        """Every READY snapshot of a sandbox, oldest first."""
        raw = await self._redis.zrange(keyspace.sandbox_snapshots(sandbox_id), 0, -1)
        return [text(i) for i in raw]
