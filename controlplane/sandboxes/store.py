"""Sandbox records in Redis: atomic create with the running cap, compare-and-set transitions.

Layout (names in controlplane.store.keyspace): one hash per sandbox; lexically ordered sorted sets
(all members score 0, ids are time-ordered hex) per user and global for cursor paging; a set of
each user's STARTING/RUNNING ids that the Lua scripts count for the cap; a hash of the memory each
STARTING/RUNNING sandbox reserves, and each PAUSED one where a pause keeps its memory (capacity);
an index from the hash of a session key to its sandbox; a short-lived tombstone per deleted id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from controlplane.crypto import SecretBox, hash_api_key
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.store import keyspace, text
from controlplane.store.streams import APPEND_ENTRY, StreamEntry, script_args, stored

TOMBSTONE_TTL = 3600
"""A deleted id is remembered for an hour so that a sweep that listed its container just before
the delete does not adopt it back."""

RESERVATIONS = (
    """
-- The host's reservations (the hash `key`, keyspace.MEMORY_RESERVED) and their sum, kept beside
-- them so that admission reads one number: summing every sandbox's at each create made a burst
-- of n creates cost Redis n times the number of sandboxes. A sum that is not there yet (an
-- upgrade, or the sweep's recount) is made from the hash first, then kept with each change.
local RESERVED_TOTAL = '"""
    + keyspace.MEMORY_RESERVED_TOTAL
    + """'
local function reserved(key)
  local total = redis.call('GET', RESERVED_TOTAL)
  if total then return tonumber(total) end
  local used = 0
  for _, v in ipairs(redis.call('HVALS', key)) do used = used + tonumber(v) end
  redis.call('SET', RESERVED_TOTAL, string.format('%d', used))
  return used
end
local function reserve(key, id, memory)
  local before = tonumber(redis.call('HGET', key, id) or '0')
  reserved(key)
  redis.call('HSET', key, id, memory)
  redis.call('INCRBY', RESERVED_TOTAL, string.format('%d', memory - before))
end
local function release(key, id)
  local before = redis.call('HGET', key, id)
  if not before then return end
  reserved(key)
  redis.call('HDEL', key, id)
  redis.call('DECRBY', RESERVED_TOTAL, before)
end
"""
)
"""Lua: `reserved(key)`, `reserve(key, id, memory)` and `release(key, id)`: every change of
MEMORY_RESERVED goes through these two, which keep MEMORY_RESERVED_TOTAL with it."""

_RELEASE = (
    RESERVATIONS
    + """
release(KEYS[1], ARGV[1])
return 1
"""
)

# KEYS: the reservations. The sum made again from them (the reconciler's sweep: a writer that did
# not keep it, an older replica or a hand edit, cannot leave it wrong for longer than a sweep).
# Returns the sum before and after.
_RECOUNT = (
    RESERVATIONS
    + """
local before = redis.call('GET', RESERVED_TOTAL)
redis.call('DEL', RESERVED_TOTAL)
return {before or '', reserved(KEYS[1])}
"""
)

# KEYS: a status set. ARGV: the most members wanted. Its members, or nil (false) past that.
_IN_STATUS = """
if redis.call('SCARD', KEYS[1]) > tonumber(ARGV[1]) then return false end
return redis.call('SMEMBERS', KEYS[1])
"""

_STATUS_SETS = keyspace.sandboxes_in_status("")
_STATUSES = " ".join(s.value for s in SandboxStatus)
STATUS_INDEX = (
    """
-- The /metrics gauge's sets (keyspace.sandboxes_in_status): a listed sandbox's id is in the set
-- of its status, changed in the same script as the status, so that a scrape only counts them.
local function index_status(id, from, to)
  if from ~= nil and from ~= '' and from ~= to then
    redis.call('SREM', '"""
    + _STATUS_SETS
    + """' .. from, id)
  end
  if to ~= nil and to ~= '' then redis.call('SADD', '"""
    + _STATUS_SETS
    + """' .. to, id) end
end
"""
)
"""Lua: `index_status(id, from, to)`, for every script that lists a sandbox or changes the status
of a listed one (here and pool_store's claim)."""

_REINDEX = (
    """
local fixed = 0
for _, id in ipairs(ARGV) do
  local status = redis.call('HGET', '"""
    + keyspace.sandbox("")
    + """' .. id, 'status')
  local listed = redis.call('ZSCORE', KEYS[1], id)
  for s in string.gmatch('"""
    + _STATUSES
    + """', '%S+') do
    if listed and s == status then
      fixed = fixed + redis.call('SADD', '"""
    + _STATUS_SETS
    + """' .. s, id)
    else
      fixed = fixed + redis.call('SREM', '"""
    + _STATUS_SETS
    + """' .. s, id)
    end
  end
end
return fixed
"""
)
"""Puts each id of ARGV in the status set of its record, and in no other (in none when it is not
listed in ALL_SANDBOXES, KEYS[1]); returns how many memberships it changed."""

_CREATE = (
    RESERVATIONS
    + APPEND_ENTRY
    + STATUS_INDEX
    + """
local running_cap, total_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local memory, memory_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local id, status, paused_holds = ARGV[5], ARGV[6], ARGV[7] == '1'
local fields = tonumber(ARGV[8])
if running_cap >= 0 and redis.call('SCARD', KEYS[4]) >= running_cap then return 'running' end
if total_cap >= 0 and redis.call('ZCARD', KEYS[3]) >= total_cap then return 'total' end
if memory_cap >= 0 and reserved(KEYS[6]) + memory > memory_cap then return 'memory' end
redis.call('HSET', KEYS[1], 'memory', ARGV[3], 'generation', 1, unpack(ARGV, 9, 8 + fields))
redis.call('ZADD', KEYS[2], 0, id)
redis.call('ZADD', KEYS[3], 0, id)
if status == 'STARTING' or status == 'RUNNING' then redis.call('SADD', KEYS[4], id) end
if status ~= 'ERROR' and status ~= 'MISSING' and (status ~= 'PAUSED' or paused_holds) then
  reserve(KEYS[6], id, memory)
end
redis.call('SET', KEYS[5], id)
index_status(id, nil, status)
redis.call('PUBLISH', ARGV[9 + fields], id .. ' ' .. status)
-- The creation's lifecycle event and audit entry (KEYS[7..]: their streams), stored with it or
-- not at all.
append_entry(7, 10 + fields)
return 'ok'
"""
)

_TRANSITION = (
    RESERVATIONS
    + APPEND_ENTRY
    + STATUS_INDEX
    + """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {'missing', ''} end
local allowed = false
for s in string.gmatch(ARGV[1], '%S+') do if s == cur then allowed = true end end
if not allowed then return {'conflict', cur} end
local to, id = ARGV[2], ARGV[4]
local cap, memory_cap = tonumber(ARGV[3]), tonumber(ARGV[5])
local active_to = (to == 'STARTING' or to == 'RUNNING')
local active_from = (cur == 'STARTING' or cur == 'RUNNING')
if active_to and not active_from and cap >= 0 and redis.call('SCARD', KEYS[2]) >= cap then
  return {'quota', cur}
end
-- Paused sandboxes keep their memory where a pause freezes them (Docker, ARGV[7] = '1'), unless
-- hibernated; where it releases the instance (Kubernetes) PAUSED gives it back, as ERROR and
-- MISSING do.
local hibernated = redis.call('HEXISTS', KEYS[1], 'hibernated_at') == 1
local holds = (to ~= 'ERROR' and to ~= 'MISSING'
               and (to ~= 'PAUSED' or (ARGV[7] == '1' and not hibernated)))
local memory = tonumber(redis.call('HGET', KEYS[1], 'memory') or '0')
if holds and redis.call('HEXISTS', KEYS[3], id) == 0 and memory_cap >= 0
   and reserved(KEYS[3]) + memory > memory_cap then
  return {'memory', cur}
end
local fields = tonumber(ARGV[8])
-- A new generation with every change of status or of where the sandbox is reached (models.py).
local moved = (to ~= cur)
for i = 9, 8 + fields, 2 do if ARGV[i] == 'ports' then moved = true end end
if moved then redis.call('HINCRBY', KEYS[1], 'generation', 1) end
redis.call('HSET', KEYS[1], 'status', to, unpack(ARGV, 9, 8 + fields))
if to ~= 'PAUSED' then redis.call('HDEL', KEYS[1], 'hibernated_at') end
-- A warm pool member (not listed) is counted by the pool's gauge, not this one.
if redis.call('ZSCORE', KEYS[4], id) then index_status(id, cur, to) end
redis.call('PUBLISH', ARGV[6], id .. ' ' .. to)
if active_to then redis.call('SADD', KEYS[2], id) else redis.call('SREM', KEYS[2], id) end
if holds then reserve(KEYS[3], id, memory) else release(KEYS[3], id) end
-- The change's lifecycle event and audit entry (KEYS[5..]: their streams), stored with it or
-- not at all.
append_entry(5, 9 + fields)
return {'ok', cur}
"""
)

_MARK_DELETING = (
    APPEND_ENTRY
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'deleting_at') == 0 then
  redis.call('HSET', KEYS[1], 'deleting_at', ARGV[1])
end
-- The delete's audit entry (KEYS[2..]): the intent is the action; whoever finishes it, it has
-- its entry.
append_entry(2, 2)
return 1
"""
)

_HIBERNATE = (
    RESERVATIONS
    + """
if redis.call('HGET', KEYS[1], 'status') ~= 'PAUSED' then return 0 end
if redis.call('HEXISTS', KEYS[1], 'deleting_at') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'hibernated_at', ARGV[1], 'reason', ARGV[3])
release(KEYS[2], ARGV[2])
return 1
"""
)

_HOLD = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'held_until') else
  redis.call('HSET', KEYS[1], 'held_until', ARGV[1]) end
return 1
"""

_TOUCH = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'last_activity_at', ARGV[1])
end
return 1
"""


@dataclass(frozen=True)
class TransitionResult:
    outcome: str  # ok, conflict, quota (running cap), memory (host capacity), missing
    previous: SandboxStatus | None


@dataclass(frozen=True)
class Limits:
    """Caps checked atomically with a write; None means no limit."""

    running: int | None = None
    total: int | None = None
    memory_capacity: int | None = None
    pool_share: float | None = None
    """The organization's part of each spec's warm pool (0 to 1) a window; None: no share."""


def _n(value: int | None) -> int:
    return -1 if value is None else value


def _now() -> datetime:
    return datetime.now(UTC)


class _SessionKeys:
    """Session keys as decrypted before, by their encrypted form: a Fernet decryption (its
    HMAC check and AES) is ~10 us, paid for every RUNNING sandbox of every batch GET that
    clients poll every few ms. A token decrypts to one plaintext only (it is authenticated), so
    a token seen before needs no second check. Holding them adds nothing to what this process
    holds already: it has the key that decrypts every record. At most `size` keys (all
    forgotten when full, then decrypted again at their next read)."""

    def __init__(self, box: SecretBox, size: int = 10_000) -> None:
        self._box = box
        self._size = size
        self._known: dict[str, str] = {}

    def decrypt(self, token: str) -> str:
        key = self._known.get(token)
        if key is None:
            key = self._box.decrypt(token.encode()).decode()
            if len(self._known) >= self._size:
                self._known.clear()
            self._known[token] = key
        return key


class SandboxStore:
    def __init__(
        self,
        redis: aioredis.Redis,
        box: SecretBox,
        on_change: Callable[[str], None] | None = None,
        *,
        paused_holds_memory: bool = True,
    ) -> None:
        """`on_change(sandbox_id)` is called after every change this process makes (it wakes
        local waiters: StatusFeed.notify). `paused_holds_memory`: a PAUSED sandbox keeps its
        reservation (the runtime's pause freezes it in place: Docker), else it gives it back
        (Kubernetes: the pod is gone) and a resume reserves it again."""
        self._redis = redis
        self._paused_holds = "1" if paused_holds_memory else "0"
        self._box = box
        self._keys = _SessionKeys(box)
        self._create = redis.register_script(_CREATE)
        self._transition = redis.register_script(_TRANSITION)
        self._touch = redis.register_script(_TOUCH)
        self._mark_deleting = redis.register_script(_MARK_DELETING)
        self._hibernate = redis.register_script(_HIBERNATE)
        self._hold = redis.register_script(_HOLD)
        self._reindex = redis.register_script(_REINDEX)
        self._recount = redis.register_script(_RECOUNT)
        self._in_status = redis.register_script(_IN_STATUS)
        self._on_change = on_change

    def _changed(self, sandbox_id: str) -> None:
        if self._on_change is not None:
            self._on_change(sandbox_id)

    def _encode(self, record: SandboxRecord) -> dict[str, str]:
        return {
            "id": record.id,
            "owner": record.owner,
            "spec_id": record.spec_id,
            "status": record.status.value,
            "reason": record.reason or "",
            "key_enc": self._box.encrypt(record.session_api_key.encode()).decode(),
            "ports": json.dumps(record.ports),
            "host": record.host or "",
            "created_at": record.created_at.isoformat(),
            "updated_at": record.updated_at.isoformat(),
            "last_activity_at": record.last_activity_at.isoformat(),
            "org": record.org_id or "",
            "origin": record.origin or "",
            "origin_at": record.origin_at.isoformat() if record.origin_at else "",
            "carried": record.carried or "",
        }

    def encode(self, record: SandboxRecord) -> dict[str, str]:
        """The record's hash fields (session key encrypted), for stores that write records."""
        return self._encode(record)

    def decode(self, raw: dict[Any, Any]) -> SandboxRecord:
        """A record from its hash fields (HGETALL), for stores whose scripts return one."""
        return self._decode(raw)

    def _decode(self, raw: dict[Any, Any], key: bool = True) -> SandboxRecord:
        """`key` False: the session key only of a RUNNING sandbox (else "", not decrypted)."""
        # text(), inlined: ~20 fields a record, ten records a poll.
        row = {
            k.decode() if isinstance(k, bytes) else str(k): v.decode()
            if isinstance(v, bytes)
            else str(v)
            for k, v in raw.items()
        }
        return SandboxRecord(
            id=row["id"],
            owner=row["owner"],
            spec_id=row["spec_id"],
            status=SandboxStatus(row["status"]),
            reason=row.get("reason") or None,
            session_api_key=self._keys.decrypt(row["key_enc"])
            if key or row["status"] == SandboxStatus.RUNNING.value
            else "",
            ports=json.loads(row.get("ports") or "{}"),
            host=row.get("host") or None,
            created_at=datetime.fromisoformat(row["created_at"]),
            updated_at=datetime.fromisoformat(row["updated_at"]),
            last_activity_at=datetime.fromisoformat(row["last_activity_at"]),
            deleting_at=datetime.fromisoformat(row["deleting_at"])
            if row.get("deleting_at")
            else None,
            org_id=row.get("org") or None,
            origin=row.get("origin") or None,
            origin_at=datetime.fromisoformat(row["origin_at"]) if row.get("origin_at") else None,
            carried=row.get("carried") or None,
            held_until=float(row["held_until"]) if row.get("held_until") else None,
            hibernated_at=datetime.fromisoformat(row["hibernated_at"])
            if row.get("hibernated_at")
            else None,
            generation=int(row.get("generation") or 0),
        )

    async def create(
        self,
        record: SandboxRecord,
        memory: int,
        limits: Limits,
        *,
        entry: StreamEntry | None = None,
    ) -> str:
        """Write a new record and its indexes at once, reserving `memory` bytes; `entry` (the
        creation's lifecycle event) is added to its streams by the same script when it is made.

        Returns "ok", or which limit refused it: "running", "total" or "memory".
        """
        fields = self._encode(record)
        flat = [item for pair in fields.items() for item in pair]
        streams, entry_args = script_args(entry)
        outcome = await self._create(
            keys=[
                keyspace.sandbox(record.id),
                keyspace.ALL_SANDBOXES,
                keyspace.user_sandboxes(record.owner),
                keyspace.user_active_sandboxes(record.owner),
                keyspace.sandbox_by_key(hash_api_key(record.session_api_key)),
                keyspace.MEMORY_RESERVED,
                *streams,
            ],
            args=[
                _n(limits.running),
                _n(limits.total),
                memory,
                _n(limits.memory_capacity),
                record.id,
                record.status.value,
                self._paused_holds,
                len(flat),
                *flat,
                keyspace.SANDBOX_STATUS_CHANNEL,
                *entry_args,
            ],
        )
        if text(outcome) == "ok":
            self._changed(record.id)
            stored(entry)
        return text(outcome)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        raw = await self._redis.hgetall(keyspace.sandbox(sandbox_id))
        return self._decode(raw) if raw else None

    async def get_many(
        self, ids: Iterable[str], *, keys: bool = True
    ) -> list[SandboxRecord | None]:
        """`keys` False, for reads that show a session key only while the sandbox is RUNNING:
        the others' keys are not decrypted ("" in their records). A decryption is ~25 us, a
        good part of a batch GET that clients poll every few ms while their sandboxes start."""
        ids = list(ids)
        async with self._redis.pipeline(transaction=False) as pipe:
            for sandbox_id in ids:
                pipe.hgetall(keyspace.sandbox(sandbox_id))
            rows = await pipe.execute()
        return [self._decode(r, keys) if r else None for r in rows]

    async def transition(
        self,
        record: SandboxRecord,
        allowed_from: Iterable[SandboxStatus],
        to: SandboxStatus,
        *,
        limits: Limits | None = None,
        reason: str | None = None,
        ports: dict[str, int] | None = None,
        host: str | None = None,
        touch: bool = False,
        origin: str | None = None,
        entry: StreamEntry | None = None,
    ) -> TransitionResult:
        """Move to `to` only if the current status is in `allowed_from` (compare-and-set).

        `limits` (running cap, host memory) are checked when the move takes the sandbox from
        not counting to counting against them. `ports` (and the `host` they are reached at)
        replace the record's when given; so does `origin` (a rewind: the snapshot its files
        come from now). `entry` (the change's lifecycle event) is added to its streams by the
        same script when the move is made, and only then.
        """
        limits = limits or Limits()
        now = _now()
        fields: dict[str, str] = {"reason": reason or "", "updated_at": now.isoformat()}
        if ports is not None:
            fields["ports"] = json.dumps(ports)
            fields["host"] = host or ""
        if touch:
            fields["last_activity_at"] = now.isoformat()
        if origin is not None:
            fields["origin"] = origin
            fields["origin_at"] = now.isoformat()
        flat = [item for pair in fields.items() for item in pair]
        streams, entry_args = script_args(entry)
        outcome, previous = await self._transition(
            keys=[
                keyspace.sandbox(record.id),
                keyspace.user_active_sandboxes(record.owner),
                keyspace.MEMORY_RESERVED,
                keyspace.ALL_SANDBOXES,
                *streams,
            ],
            args=[
                " ".join(s.value for s in allowed_from),
                to.value,
                _n(limits.running),
                record.id,
                _n(limits.memory_capacity),
                keyspace.SANDBOX_STATUS_CHANNEL,
                self._paused_holds,
                len(flat),
                *flat,
                *entry_args,
            ],
        )
        if text(outcome) == "ok":
            self._changed(record.id)
            stored(entry)
        prev = text(previous) if previous else ""
        return TransitionResult(text(outcome), SandboxStatus(prev) if prev else None)

    async def touch(self, sandbox_id: str) -> None:
        """Bump last_activity_at if the record still exists (never re-creates a deleted one)."""
        await self._touch(keys=[keyspace.sandbox(sandbox_id)], args=[_now().isoformat()])

    async def delete(self, record: SandboxRecord, *, entry: StreamEntry | None = None) -> None:
        """The record and its indexes, and (`entry`) the deletion's lifecycle event, in one
        transaction."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keyspace.sandbox(record.id))
            pipe.zrem(keyspace.ALL_SANDBOXES, record.id)
            pipe.zrem(keyspace.user_sandboxes(record.owner), record.id)
            pipe.srem(keyspace.user_active_sandboxes(record.owner), record.id)
            # EVAL, not EVALSHA: inside a MULTI a script Redis does not hold fails only at
            # EXEC, after the rest applied.
            pipe.eval(_RELEASE, 1, keyspace.MEMORY_RESERVED, record.id)
            for status in SandboxStatus:  # whichever it is in now (the record may be stale)
                pipe.srem(keyspace.sandboxes_in_status(status), record.id)
            pipe.delete(keyspace.sandbox_by_key(hash_api_key(record.session_api_key)))
            pipe.set(keyspace.sandbox_tombstone(record.id), "1", ex=TOMBSTONE_TTL)
            pipe.delete(keyspace.sandbox_lease(record.id))
            pipe.publish(keyspace.SANDBOX_STATUS_CHANNEL, f"{record.id} DELETED")
            if entry is not None:
                entry.queue(pipe)
            await pipe.execute()
        self._changed(record.id)
        stored(entry)

    async def mark_deleting(self, sandbox_id: str, *, entry: StreamEntry | None = None) -> bool:
        """Record the intent to delete before acting on it, so that whoever finds the record
        next (the reconciler, after a restart) finishes the delete; `entry` (the request's audit
        entry) is added with it. False: no such record (and no entry)."""
        streams, entry_args = script_args(entry)
        found = await self._mark_deleting(
            keys=[keyspace.sandbox(sandbox_id), *streams], args=[_now().isoformat(), *entry_args]
        )
        if found:
            stored(entry)
        return bool(found)

    async def hibernated(self, sandbox_id: str, reason: str) -> bool:
        """Record that a PAUSED sandbox gave its memory back (its reservation is released, so
        admission counts only memory really held). False: no longer PAUSED (or being deleted),
        nothing written."""
        done = await self._hibernate(
            keys=[keyspace.sandbox(sandbox_id), keyspace.MEMORY_RESERVED],
            args=[_now().isoformat(), sandbox_id, reason],
        )
        if done:
            self._changed(sandbox_id)
        return bool(done)

    async def hold(self, sandbox_id: str, until: float | None) -> None:
        """Mark a sandbox held still by a snapshot until `until` (Unix seconds); None clears
        the mark. The reconciler leaves a frozen sandbox so marked alone, and thaws one whose
        mark has passed (its snapshot's control plane died)."""
        await self._hold(
            keys=[keyspace.sandbox(sandbox_id)], args=["" if until is None else repr(until)]
        )

    async def is_tombstoned(self, sandbox_id: str) -> bool:
        return bool(await self._redis.exists(keyspace.sandbox_tombstone(sandbox_id)))

    async def id_for_key(self, session_api_key: str) -> str | None:
        raw = await self._redis.get(keyspace.sandbox_by_key(hash_api_key(session_api_key)))
        return text(raw) if raw else None

    async def recount_reserved(self) -> tuple[int | None, int]:
        """Make the reservations' sum again from the reservations (the reconciler's sweep);
        returns the sum before (None: there was none) and after."""
        before, after = await self._recount(keys=[keyspace.MEMORY_RESERVED])
        return (int(before) if before else None), int(after)

    async def count_active(self, owner: str) -> int:
        return int(await self._redis.scard(keyspace.user_active_sandboxes(owner)))

    async def page_ids(self, owner: str | None, after: str | None, count: int) -> list[str]:
        """Up to `count` ids older than `after`, newest first; owner None lists every user."""
        key = keyspace.ALL_SANDBOXES if owner is None else keyspace.user_sandboxes(owner)
        start = f"({after}" if after else "+"
        raw = await self._redis.zrange(key, start, "-", desc=True, bylex=True, offset=0, num=count)
        return [text(i) for i in raw]

    async def ids_in_status(self, status: SandboxStatus, most: int) -> list[str] | None:
        """The ids of every listed sandbox in `status` (the /metrics gauge's set, kept with the
        status by every writer), newest first; None when the set holds more than `most`, where
        paging the index (page_ids) finds its matches sooner. One round trip."""
        found = await self._in_status(keys=[keyspace.sandboxes_in_status(status)], args=[most])
        if found is None:
            return None
        return sorted((text(i) for i in found), reverse=True)

    async def reindex_status(self, ids: list[str]) -> int:
        """Put each of `ids` in the status set of its record and in no other (in none when it
        is deleted or not listed); returns how many memberships were wrong. Atomic per call, so
        safe beside any change: the reconciler's repair of drift (see count_by_status)."""
        if not ids:
            return 0
        return int(await self._reindex(keys=[keyspace.ALL_SANDBOXES], args=ids))

    async def reindex_strays(self) -> int:
        """`reindex_status` of every id the status sets hold, in pages: removes those whose
        record is gone or moved (what a writer without the sets left, say an older replica)."""
        fixed = 0
        for status in SandboxStatus:
            cursor = 0
            while True:
                cursor, raw = await self._redis.sscan(
                    keyspace.sandboxes_in_status(status), cursor, count=REINDEX_PAGE
                )
                fixed += await self.reindex_status([text(i) for i in raw])
                if not cursor:
                    break
        return fixed


REINDEX_PAGE = 500
"""Ids per reindex script call (the sweep's page): one call held Redis 7 ms on a loaded 2-core
host, a pass over 10,000 sandboxes took 0.4 s in all."""


async def count_by_status(redis: aioredis.Redis) -> dict[str, int]:
    """Every listed sandbox by status (the /metrics gauge): the size of each status set, one
    round trip whatever the number of sandboxes. The sets change in the same script as the
    status (store, pool claim, delete's transaction), so neither a crash nor another replica
    can leave them behind; what a writer without them leaves (an older replica during an
    upgrade, a hand edit) the reconciler's sweep repairs (`reindex_status`, `reindex_strays`)."""
    async with redis.pipeline(transaction=False) as pipe:
        for status in SandboxStatus:
            pipe.scard(keyspace.sandboxes_in_status(status))
        sizes = await pipe.execute()
    return {status.value: int(n) for status, n in zip(SandboxStatus, sizes, strict=True) if n}
