"""The per-organization audit indexes for the entries written before them (issue 29).

A deployment upgraded from a version before the per-organization user and target indexes
(keyspace.audit_org_user, audit_org_target) has entries in the log (`acs:audit`) and in the
older indexes only, which an organization's search (controlplane/audit/search.py) never reads.
This backfill gives every entry in the log the per-organization index entries it would have
had, as AuditLog.adds makes them. It runs at start on every replica, in the background (the
service serves meanwhile; until it is done an organization's search misses the older
entries), once per deployment (`audit-org-indexes-v1` in `acs:migrations`), and again on
demand (`controlplane audit backfill`, after a rolling upgrade during which replicas of the
previous version kept writing).

- **One replica at a time**, under a LeaderLock renewed at every batch; the others wait and
  take over, where it stopped, if its holder dies. Each batch's writes and the progress they
  make are one script that checks the progress it started from, so two workers (a holder that
  lost its lock) never write a batch twice.
- **Bounded batches** (BATCH entries of the log, oldest first, up to the newest entry when it
  began, `high`), then one key at a time: Redis is never blocked for long.
- **Target indexes** are sorted sets: the entry's member is added (ZADD: adding it twice is
  adding it once).
- **User indexes** are streams, which take an id only above their last: an index written to
  since the upgrade cannot take older ids. So each is rebuilt in a staging stream from the log
  (every entry up to `high`), then one script appends the index's own entries past `high`
  (written meanwhile) to it and puts it in place (RENAME): every entry once, in order, and none
  written during the backfill lost.
- Entries past the retention are left out; every index written expires as the live ones do,
  one retention after its newest entry (never sooner than it already would).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.store import keyspace, text
from controlplane.store.audit import org_index_keys
from controlplane.store.audit_event import AuditRecord
from controlplane.store.leader import LeaderLock
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.streams import lex_member

log = structlog.get_logger(__name__)

NAME = "audit-org-indexes-v1"
BATCH = 200
LOCK_TTL = 60.0
RETRY = 15.0
"""Seconds a replica waits before looking again while another runs the backfill."""
PROGRESS_EVERY = 125
"""Batches between two progress lines in the log (25,000 entries)."""
_START = "0-0"

# Sets an index's expiry to at least `at` (ms): the one it has if later (GT), `at` for a key
# that has none yet (GT alone would leave a key without expiry as it is: never expiring).
_EXPIRE_AT_LEAST = """
local function expire_at_least(key, at)
  if redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, at)
  else
    redis.call('PEXPIREAT', key, at, 'GT')
  end
end
"""

# KEYS: the progress hash, the staged set, the additions' keys, then each key once; ARGV: the
# progress the batch starts from, the one it ends at, how many additions, each addition's kind
# ('x': an entry of a staging stream, 'z': a member of a target index) and id, then each key's
# expiry and, for a staging stream, the index it stages ('' for none).
_BATCH = (
    _EXPIRE_AT_LEAST
    + """
if redis.call('HGET', KEYS[1], 'at') ~= ARGV[1] then return 0 end
local n = tonumber(ARGV[3])
for i = 1, n do
  local kind, id = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  if kind == 'x' then
    redis.call('XADD', KEYS[2 + i], id, 'r', '')
  else
    redis.call('ZADD', KEYS[2 + i], 0, id)
  end
end
for k = 3 + n, #KEYS do
  local a = 4 + 2 * n + 2 * (k - 3 - n)
  expire_at_least(KEYS[k], ARGV[a])
  if ARGV[a + 1] ~= '' then redis.call('SADD', KEYS[2], ARGV[a + 1]) end
end
redis.call('HSET', KEYS[1], 'at', ARGV[2])
return 1
"""
)


# KEYS: the index, its staging stream, the staged set; ARGV: high, the index's name. Returns
# how many of the index's own entries (past high) were carried over, -1 for nothing staged.
_SWAP = """
local carried = -1
if redis.call('EXISTS', KEYS[2]) == 1 then
  local tail = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+')
  for _, item in ipairs(tail) do redis.call('XADD', KEYS[2], item[1], 'r', '') end
  local kept = redis.call('PTTL', KEYS[1])
  redis.call('RENAME', KEYS[2], KEYS[1])
  if kept > redis.call('PTTL', KEYS[1]) then redis.call('PEXPIRE', KEYS[1], kept) end
  carried = #tail
end
redis.call('SREM', KEYS[3], ARGV[2])
return carried
"""


@dataclass
class Backfilled:
    """What one run did."""

    entries: int = 0
    """Entries of the log read."""
    user_entries: int = 0
    """Entries added to per-organization user indexes (as rebuilt)."""
    target_entries: int = 0
    """Entries added to per-organization target indexes."""
    indexes: int = 0
    """Per-organization user indexes put in place."""
    skipped: bool = False
    """Nothing to do: done before."""


class AuditBackfill:
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        retention: float,
        batch: int = BATCH,
        lock_ttl: float = LOCK_TTL,
    ) -> None:
        """`retention`: ACS_AUDIT_RETENTION (seconds), as the audit log's writer has it."""
        self._redis = redis
        self._retention_ms = int(retention * 1000)
        self._batch = batch
        self._lock = LeaderLock(redis, keyspace.AUDIT_BACKFILL_LOCK, lock_ttl)
        self._write = redis.register_script(_BATCH)
        self._swap = redis.register_script(_SWAP)

    async def done(self) -> bool:
        return bool(await self._redis.sismember(keyspace.MIGRATIONS, NAME))

    async def run(self, *, again: bool = False) -> Backfilled | None:
        """Backfill to the end unless done before (`again`: even then; a run begun again and
        cut short is finished too). None when another replica holds the lock (or takes it over
        meanwhile): it carries on."""
        if (
            not again
            and await self.done()
            and not await self._redis.exists(keyspace.AUDIT_BACKFILL)
        ):
            return Backfilled(skipped=True)
        if not await self._lock.hold():
            return None
        try:
            return await self._run(again=again)
        finally:
            await self._lock.release()

    async def _run(self, *, again: bool) -> Backfilled | None:
        high, at = await self._progress(again=again)
        result = Backfilled()
        if high is not None:
            log.info("audit_backfill_started", name=NAME, high=high, resumed_after=at)
            if not await self._read_log(high, at, result):
                return None
            if not await self._put_in_place(high, result):
                return None
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(keyspace.MIGRATIONS, NAME)
            pipe.delete(keyspace.AUDIT_BACKFILL)
            await pipe.execute()
        log.info(
            "audit_backfill_done",
            name=NAME,
            entries=result.entries,
            user_index_entries=result.user_entries,
            target_index_entries=result.target_entries,
            user_indexes=result.indexes,
        )
        return result

    async def _progress(self, *, again: bool) -> tuple[str | None, str]:
        """(high, at) of the run in progress, else of a new one (high None: an empty log)."""
        if not again:
            high, at = await self._redis.hmget(keyspace.AUDIT_BACKFILL, ["high", "at"])
            if high is not None and at is not None:
                return text(high), text(at)
        await self._drop_staged()  # what a run begun afresh left, if any
        newest = await self._redis.xrevrange(keyspace.AUDIT, count=1)
        if not newest:
            return None, _START
        high = text(newest[0][0])
        await self._redis.hset(keyspace.AUDIT_BACKFILL, mapping={"high": high, "at": _START})
        return high, _START

    async def _drop_staged(self) -> None:
        while staged := await self._redis.spop(keyspace.AUDIT_BACKFILL_STAGED, 100):
            await self._redis.delete(*(keyspace.audit_backfill_stage(text(i)) for i in staged))

    async def _read_log(self, high: str, at: str, result: Backfilled) -> bool:
        """Every entry after `at` up to `high` into the indexes, a batch at a time. False when
        the lock (or the progress) went to another replica."""
        batches = 0
        while True:
            if not await self._lock.hold():
                return False
            rows = await self._redis.xrange(
                keyspace.AUDIT, min=f"({at}", max=high, count=self._batch
            )
            if not rows:
                return True
            last = text(rows[-1][0])
            keys, args = self._additions(rows, result)
            if not await self._write(
                keys=[keyspace.AUDIT_BACKFILL, keyspace.AUDIT_BACKFILL_STAGED, *keys],
                args=[at, last, *args],
            ):
                log.warning("audit_backfill_taken_over", at=at)
                return False
            result.entries += len(rows)
            at = last
            batches += 1
            if batches % PROGRESS_EVERY == 0:
                log.info("audit_backfill_progress", at=at, high=high, entries=result.entries)

    def _additions(
        self, rows: list[tuple[Any, Any]], result: Backfilled
    ) -> tuple[list[str], list[str | int]]:
        """The keys and arguments of _BATCH for `rows`, as AuditLog.adds indexes them."""
        keys: list[str] = []
        args: list[str | int] = []
        # Each key's latest expiry (the entries come oldest first) and the index it stages.
        expiries: dict[str, tuple[int, str]] = {}
        now_ms = int(time.time() * 1000)
        for raw_id, raw in rows:
            record = AuditRecord.from_fields({text(k): text(v) for k, v in raw.items()})
            expiry = record.time_ms + self._retention_ms
            if expiry <= now_ms:
                continue  # past the retention: the log drops it at its next trim
            stream_id = text(raw_id)
            index, targets = org_index_keys(record)
            if index is not None:
                stage = keyspace.audit_backfill_stage(index)
                keys.append(stage)
                args += ["x", stream_id]
                expiries[stage] = (expiry, index)
                result.user_entries += 1
            for key in targets.values():
                keys.append(key)
                args += ["z", lex_member(stream_id)]
                expiries[key] = (expiry, "")
                result.target_entries += 1
        head: list[str | int] = [len(keys)]
        for key, (expiry, index) in expiries.items():
            keys.append(key)
            args += [expiry, index]
        return keys, head + args

    async def _put_in_place(self, high: str, result: Backfilled) -> bool:
        """Each staged user index in place of its index, with the index's entries past `high`.
        False when the lock went to another replica."""
        while True:
            if not await self._lock.hold():
                return False
            some = await self._redis.srandmember(keyspace.AUDIT_BACKFILL_STAGED, 100)
            staged = [text(i) for i in some or ()]
            if not staged:
                return True
            for index in staged:
                carried = await self._swap(
                    keys=[
                        index,
                        keyspace.audit_backfill_stage(index),
                        keyspace.AUDIT_BACKFILL_STAGED,
                    ],
                    args=[high, index],
                )
                if int(carried) >= 0:
                    result.indexes += 1


async def backfill_in_background(backfill: AuditBackfill, retry: float = RETRY) -> None:
    """Run the backfill until it is done, by this replica or another: every replica starts this
    (wiring.audit_ctx), one works at a time, another takes over if it dies."""
    while True:
        try:
            if await backfill.run() is not None:
                return
        except REDIS_DOWN as exc:
            log.warning("audit_backfill_interrupted", error=str(exc))
        except Exception:
            # A failover's read-only replica, or a bug: said, and tried again from where the
            # progress stands (the lock expires by itself if its release failed too).
            log.exception("audit_backfill_failed")
        await asyncio.sleep(retry)
