"""The audit log's indexes, built from the log after the request (issue 29).

A request writes its audit entry alone, in its action's own transaction (store/audit.py): the
least that keeps the entry with the action. The indexes a search reads (audit.index_keys: an
organization's, an action's, a user's, a target's, each holding the entry's stream id) are
written here, by the indexer every replica runs in the background:

- **From a watermark forward.** `acs:audit:indexed` holds the stream id of the newest entry
  indexed. A pass reads the log's next entries after it (BATCH at most, oldest first) and sends
  one script with their index entries and the new watermark, which applies them only if the
  watermark is still the one the pass started from, and moves it in the same step. A script
  runs whole or not at all, so an indexer killed mid-batch leaves nothing half-done (the batch
  is redone by the next pass), and of two replicas indexing the same batch at once the second
  finds the watermark moved and writes nothing: each index entry is written exactly once.
- **Search never misses an entry.** It reads the indexes up to the watermark and the log past
  it (controlplane/audit/search.py): an entry is searchable as soon as its action's write is
  stored. Past MAX_SCANNED entries of un-indexed log a page is cut short with a cursor, as for
  any filter the indexes cannot serve (an indexer stopped for long makes searches slower,
  never wrong).
- **Retention.** Index streams are trimmed by age at each addition (MINID ~, the entry's time
  less the retention), sorted sets once per batch (ZREMRANGEBYLEX); every index written to is
  given an expiry of one retention after the pass (PEXPIRE), so one nobody writes to goes away
  by itself, never sooner than one retention after its newest entry.

A deployment whose indexes were written by the requests (before this indexer) has no watermark:
the indexer then goes over the whole log once. It writes nothing twice even then: an id an
index stream holds already is left, a sorted set holds a member once. During a rolling upgrade
an older replica writes its entries' index entries itself, above ids the indexer has yet to
add to the same stream: the script puts such an id in its place (_INDEX).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.store import keyspace, text
from controlplane.store.audit import index_keys
from controlplane.store.audit_event import AuditRecord, decoded_record
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.streams import lex_member

log = structlog.get_logger(__name__)

BATCH = 500
"""Entries one pass indexes at most: one script of some 3,500 Redis calls (a few ms)."""
INTERVAL = 0.2
"""Seconds between two passes of a replica's indexer once it has caught up: how long an entry
is at most read from the log's tail rather than from an index, on a live service."""
_NO_MARK = ""

# KEYS[1]: the watermark; KEYS[2..]: the indexes. ARGV[1]: the watermark the batch starts after
# ('' for none), ARGV[2]: the batch's newest entry, ARGV[3]: JSON
# [[key#, stream id or sorted-set member, minid or '', is_set], ...], ARGV[4]: JSON
# [[key#, expiry ms, minid of a sorted set or ''], ...] (each index of the batch once).
#
# An index stream takes an id only above its newest. One it refuses is either there already
# (written twice: nothing to do) or below entries an older replica wrote with their index
# entries meanwhile (a rolling upgrade from the version whose requests wrote the indexes):
# those are taken out, the stream's last id lowered to what is left, the refused id added and
# they are put back, in this one script.
_INDEX = """
local function stream_add(key, id, minid)
  local added
  if minid ~= '' then
    added = redis.pcall('XADD', key, 'MINID', '~', minid, id, 'r', '')
  else
    added = redis.pcall('XADD', key, id, 'r', '')
  end
  if type(added) ~= 'table' or not added.err then return end
  if #redis.call('XRANGE', key, id, id) > 0 then return end
  local later = redis.call('XRANGE', key, '(' .. id, '+')
  for _, row in ipairs(later) do redis.call('XDEL', key, row[1]) end
  local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  local last = (top[1] and top[1][1]) or '0-1'
  redis.call('XSETID', key, last, 'MAXDELETEDID', last)
  redis.call('XADD', key, id, 'r', '')
  for _, row in ipairs(later) do redis.call('XADD', key, row[1], unpack(row[2])) end
end
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
for _, add in ipairs(cjson.decode(ARGV[3])) do
  local key, id, minid = KEYS[add[1]], add[2], add[3]
  if add[4] == 1 then
    redis.call('ZADD', key, 0, id)
  else
    stream_add(key, id, minid)
  end
end
for _, upkeep in ipairs(cjson.decode(ARGV[4])) do
  local key = KEYS[upkeep[1]]
  if upkeep[3] ~= '' then redis.call('ZREMRANGEBYLEX', key, '-', '(' .. upkeep[3]) end
  redis.call('PEXPIRE', key, upkeep[2])
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class AuditIndexer:
    """Builds the audit indexes from the log (one replica's share: every replica runs one)."""

    def __init__(self, redis: aioredis.Redis, *, retention: float, batch: int = BATCH) -> None:
        """`retention`: seconds entries are kept (the log's ACS_AUDIT_RETENTION)."""
        self.redis = redis
        self.retention_ms = int(retention * 1000)
        self.batch = batch
        self._index = redis.register_script(_INDEX)

    async def watermark(self) -> str | None:
        """The stream id of the newest entry indexed (None: none yet)."""
        mark = await self.redis.get(keyspace.AUDIT_INDEXED)
        return text(mark) if mark else None

    async def read(self) -> tuple[str, list[tuple[str, AuditRecord | None]]]:
        """(the watermark, the log's next entries after it, oldest first)."""
        mark = await self.watermark()
        rows: Any = await self.redis.xrange(
            keyspace.AUDIT, f"({mark}" if mark else "-", "+", count=self.batch
        )
        return mark or _NO_MARK, [(text(i), _record(text(i), fields)) for i, fields in rows]

    async def apply(self, mark: str, batch: list[tuple[str, AuditRecord | None]]) -> bool:
        """Index `batch` (read after `mark`) and move the watermark to its newest entry, unless
        the watermark is no longer `mark` (another pass did it): False then, nothing written."""
        if not batch:
            return False
        slots: dict[str, int] = {}
        adds: list[tuple[int, str, str, int]] = []
        set_minids: dict[int, str] = {}
        for stream_id, record in batch:
            if record is None:
                continue  # undecodable: nothing to index, the watermark passes it
            minid = str(record.time_ms - self.retention_ms)
            streams, sorted_sets = index_keys(record)
            for key in streams:
                adds.append((slots.setdefault(key, len(slots) + 2), stream_id, minid, 0))
            member = lex_member(stream_id)
            for key in sorted_sets:
                slot = slots.setdefault(key, len(slots) + 2)
                adds.append((slot, member, minid, 1))
                set_minids[slot] = minid
        ttl = str(self.retention_ms)
        upkeep = [(slot, ttl, set_minids.get(slot, "")) for slot in slots.values()]
        done = await self._index(
            keys=[keyspace.AUDIT_INDEXED, *slots],
            args=[mark, batch[-1][0], _ENCODE(adds), _ENCODE(upkeep)],
        )
        return bool(done)

    async def run_once(self) -> int:
        """One pass: the entries it indexed (0: none waiting, or another replica's pass did)."""
        mark, batch = await self.read()
        return len(batch) if await self.apply(mark, batch) else 0

    async def catch_up(self) -> int:
        """Passes until no entry waits, whoever's pass indexed them (what every replica's
        indexer does within INTERVAL): the entries this indexer indexed."""
        done = 0
        while True:
            mark, batch = await self.read()
            if not batch:
                return done
            if await self.apply(mark, batch):
                done += len(batch)

    async def run(self, interval: float = INTERVAL) -> None:
        """Index until cancelled: back to back while a batch is full, else every `interval`."""
        while True:
            try:
                started = time.monotonic()
                if await self.run_once() >= self.batch:
                    continue
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
            except REDIS_DOWN as exc:
                log.warning("audit_indexer_redis_down", error=str(exc))
                await asyncio.sleep(max(interval, 1.0))
            except Exception:
                # Any other error (an OOM or READONLY answer past the retry window, a key of the
                # wrong type) must not end the task for good: every search would then read an
                # ever longer un-indexed tail. Said, and tried again.
                log.exception("audit_indexer_failed")
                await asyncio.sleep(max(interval, 1.0))


def _record(stream_id: str, fields: dict[Any, Any]) -> AuditRecord | None:
    """The entry's record, or None for one that does not decode (logged): one bad entry must
    not stop the indexing of every entry after it."""
    record = decoded_record({text(k): text(v) for k, v in fields.items()})
    if record is None:
        log.error("audit_entry_undecodable", stream_id=stream_id)
    return record
