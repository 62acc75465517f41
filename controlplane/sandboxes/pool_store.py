"""Warm pool members in Redis: create within host capacity, claim exactly once, drop.

A member is an ordinary sandbox record (acs:sandbox:<id>) owned by naming.POOL_OWNER, plus a
`pool_fp` field (the fingerprint of the spec and image it was booted from). It is listed in
acs:pool:members (never in acs:sandboxes or any user's index, so no user search, count or
sweep sees it) and, once booted as its spec wants it, in acs:pool:ready:<spec>, the set a claim
pops from. A claim is one Lua script: it pops ready members until one is still unclaimed, of the
caller's fingerprint and RUNNING or PAUSED, and moves it into the user's indexes with the user's
caps checked, all at once; two replicas can never hand out the same member.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from controlplane.crypto import hash_api_key
from controlplane.sandboxes.admission import MEMBER_CAPS, CapSources
from controlplane.sandboxes.models import SandboxRecord
from controlplane.sandboxes.naming import POOL_OWNER
from controlplane.sandboxes.store import RESERVATIONS, STATUS_INDEX, TOMBSTONE_TTL, SandboxStore
from controlplane.store import keyspace, text
from controlplane.store.streams import APPEND_ENTRY, StreamEntry, script_args, stored

_CREATE = (
    RESERVATIONS
    + """
local memory, memory_cap, id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
if memory_cap >= 0 and reserved(KEYS[3]) + memory > memory_cap then return 'memory' end
redis.call('HSET', KEYS[1], 'memory', ARGV[1], unpack(ARGV, 4))
redis.call('ZADD', KEYS[2], 0, id)
reserve(KEYS[3], id, memory)
redis.call('SET', KEYS[4], id)
redis.call('SADD', KEYS[5], id)
return 'ok'
"""
)

_CLAIM = (
    APPEND_ENTRY
    + STATUS_INDEX
    + MEMBER_CAPS
    + """
-- The member's caps, read here (KEYS[10], KEYS[11]; the deployment's ARGV[1], ARGV[2]; the
-- share of a pool of ARGV[11]) and answered with every outcome: the caller's Limits.
local running_cap, total_cap, share_cap = member_caps(
  KEYS[10], KEYS[11], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[11]))
local fp, owner, now, spec, prefix = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if running_cap >= 0 and redis.call('SCARD', KEYS[5]) >= running_cap then
  return {'running', running_cap, total_cap}
end
if total_cap >= 0 and redis.call('ZCARD', KEYS[4]) >= total_cap then
  return {'total', running_cap, total_cap}
end
-- The organization's share of this spec's pool (KEYS[8]: its claims in the window).
if share_cap >= 0 and tonumber(redis.call('GET', KEYS[8]) or '0') >= share_cap then
  redis.call('HINCRBY', KEYS[7], 'share_misses:' .. spec, 1)
  return {'share', running_cap, total_cap}
end
while true do
  local popped = redis.call('ZPOPMIN', KEYS[1])
  if #popped == 0 then
    redis.call('HINCRBY', KEYS[7], 'misses:' .. spec, 1)
    return {'empty', running_cap, total_cap}
  end
  local id = popped[1]
  local key = prefix .. id
  local f = redis.call('HMGET', key, 'owner', 'status', 'pool_fp')
  if f[1] == ARGV[8] and f[3] == fp and (f[2] == 'RUNNING' or f[2] == 'PAUSED') then
    -- A paused member is STARTING until the caller has unpaused it.
    local status = (f[2] == 'RUNNING') and 'RUNNING' or 'STARTING'
    redis.call('HSET', key, 'owner', owner, 'status', status, 'reason', '', 'org', ARGV[10],
      'created_at', now, 'updated_at', now, 'last_activity_at', now)
    redis.call('HDEL', key, 'pool_fp')
    redis.call('ZREM', KEYS[2], id)
    redis.call('SREM', KEYS[6], id)
    redis.call('ZADD', KEYS[3], 0, id)
    index_status(id, nil, status)
    redis.call('ZADD', KEYS[4], 0, id)
    redis.call('SADD', KEYS[5], id)
    redis.call('HINCRBY', KEYS[7], 'claims:' .. spec, 1)
    if share_cap >= 0 and redis.call('INCR', KEYS[8]) == 1 then
      redis.call('PEXPIRE', KEYS[8], ARGV[12])
    end
    redis.call('PUBLISH', ARGV[9], id .. ' ' .. status)
    -- The refill holds while claims come (KEYS[9], for ARGV[13] ms; 0: no hold).
    if tonumber(ARGV[13]) > 0 then redis.call('SET', KEYS[9], '1', 'PX', ARGV[13]) end
    -- The create's audit entry (KEYS[12..], ARGV[14]; ARGV[15] keys), naming the member
    -- claimed; then the user's created and running events (the keys after those, ARGV[16])
    -- where the member runs (a paused one's are published once it is unpaused).
    append_entry(12, 14, id)
    if f[2] == 'RUNNING' then append_entry(12 + tonumber(ARGV[15]), 16, id) end
    -- The record as claimed: the caller answers with it, no second read.
    return {'ok', running_cap, total_cap, id, f[2], redis.call('HGETALL', key)}
  end
end
"""
)

_DROP = (
    RESERVATIONS
    + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
release(KEYS[4], ARGV[1])
redis.call('DEL', KEYS[5])
redis.call('SREM', KEYS[6], ARGV[1])
redis.call('SET', KEYS[7], '1', 'EX', ARGV[3])
return 1
"""
)


def _window(seconds: float) -> int:
    """The current window of `seconds` (fixed windows, as every replica counts them)."""
    return int(time.time() // seconds)


@dataclass(frozen=True)
class Claim:
    outcome: str
    """ok, empty, running (the user's running cap), total (the user's total cap), share (the
    organization's warm-pool share used)"""
    running_cap: int
    """The caps the claim found for the member (CapSources; -1: none), with every outcome."""
    total_cap: int
    sandbox_id: str | None = None
    was_paused: bool = False
    record: SandboxRecord | None = None
    """The member's record as the claim left it (the user's, RUNNING or STARTING)."""
    events_stored: bool = False
    """The claim's `events` were stored with it (a running member's)."""


class PoolStore:
    def __init__(self, redis: aioredis.Redis, sandboxes: SandboxStore) -> None:
        self._redis = redis
        self.sandboxes = sandboxes
        self._create = redis.register_script(_CREATE)
        self._claim = redis.register_script(_CLAIM)
        self._drop = redis.register_script(_DROP)

    async def create(
        self, record: SandboxRecord, fingerprint: str, memory: int, memory_capacity: int | None
    ) -> bool:
        """Write a STARTING member reserving `memory`; False when the host has no room."""
        fields = self.sandboxes.encode(record) | {"pool_fp": fingerprint}
        flat = [item for pair in fields.items() for item in pair]
        outcome = await self._create(
            keys=[
                keyspace.sandbox(record.id),
                keyspace.POOL_MEMBERS,
                keyspace.MEMORY_RESERVED,
                keyspace.sandbox_by_key(hash_api_key(record.session_api_key)),
                keyspace.user_active_sandboxes(POOL_OWNER),
            ],
            args=[memory, -1 if memory_capacity is None else memory_capacity, record.id, *flat],
        )
        return text(outcome) == "ok"

    async def claim(
        self,
        spec_id: str,
        fingerprint: str,
        owner: str,
        caps: CapSources,
        *,
        org_id: str | None = None,
        pool_size: int | None = None,
        share_window: float = 60.0,
        hold: float = 0.0,
        entry: StreamEntry | None = None,
        events: StreamEntry | None = None,
    ) -> Claim:
        """Claim a ready member for `owner` within the caps the script reads from `caps` (and
        answers with, whatever the outcome); `entry` (the create's audit entry, its sandbox id
        streams.LATE_ID) is added with the claim, naming the member, and so are `events` (the
        user's lifecycle events, named the same way) where the member was running (a paused
        member is unpaused first: Claim.events_stored says which). `pool_size`: the size of
        this spec's pool, where the organization's warm-pool share applies (None: it does
        not): the claims of its members `org_id` may make in a window of `share_window`
        seconds (past it: outcome `share`, the create starts cold). `hold`: seconds the refill
        holds its launches after this claim (claims_hold)."""
        streams, entry_args = script_args(entry)
        event_streams, event_args = script_args(events)
        result = await self._claim(
            keys=[
                keyspace.pool_ready(spec_id),
                keyspace.POOL_MEMBERS,
                keyspace.ALL_SANDBOXES,
                keyspace.user_sandboxes(owner),
                keyspace.user_active_sandboxes(owner),
                keyspace.user_active_sandboxes(POOL_OWNER),
                keyspace.POOL_STATS,
                keyspace.pool_org_claims(spec_id, org_id or "", _window(share_window)),
                keyspace.POOL_CLAIMED,
                caps.org,
                caps.member,
                *streams,
                *event_streams,
            ],
            args=[
                caps.running,
                caps.total,
                fingerprint,
                owner,
                datetime.now(UTC).isoformat(),
                spec_id,
                keyspace.sandbox(""),
                POOL_OWNER,
                keyspace.SANDBOX_STATUS_CHANNEL,
                org_id or "",
                -1 if pool_size is None else pool_size,
                int(share_window * 1000),
                int(hold * 1000),
                *entry_args,
                len(streams),
                *event_args,
            ],
        )
        outcome, running, total = text(result[0]), int(result[1]), int(result[2])
        if outcome != "ok":
            return Claim(outcome, running, total)
        stored(entry)
        was_paused = text(result[4]) == "PAUSED"
        if not was_paused:
            stored(events)
        flat = result[5]
        record = self.sandboxes.decode(dict(zip(flat[::2], flat[1::2], strict=True)))
        return Claim(
            outcome,
            running,
            total,
            text(result[3]),
            was_paused,
            record,
            events_stored=events is not None and not was_paused,
        )

    async def claims_hold(self) -> float:
        """Seconds the refill still holds after the last claim of any replica (0: none)."""
        left = int(await self._redis.pttl(keyspace.POOL_CLAIMED))
        return max(left, 0) / 1000

    async def mark_ready(self, spec_id: str, sandbox_id: str) -> None:
        await self._redis.zadd(keyspace.pool_ready(spec_id), {sandbox_id: 0}, nx=True)

    async def ready_ids(self, spec_id: str) -> set[str]:
        return {text(i) for i in await self._redis.zrange(keyspace.pool_ready(spec_id), 0, -1)}

    async def drop(self, record: SandboxRecord) -> bool:
        """Forget an unclaimed member (tombstoned, so a leftover container goes with its volume).
        False when a claim took it first."""
        dropped = await self._drop(
            keys=[
                keyspace.sandbox(record.id),
                keyspace.POOL_MEMBERS,
                keyspace.pool_ready(record.spec_id),
                keyspace.MEMORY_RESERVED,
                keyspace.sandbox_by_key(hash_api_key(record.session_api_key)),
                keyspace.user_active_sandboxes(POOL_OWNER),
                keyspace.sandbox_tombstone(record.id),
            ],
            args=[record.id, POOL_OWNER, TOMBSTONE_TTL],
        )
        return bool(dropped)

    async def members(self) -> list[tuple[SandboxRecord, str]]:
        """Every unclaimed member with its fingerprint, oldest first."""
        ids = [text(i) for i in await self._redis.zrange(keyspace.POOL_MEMBERS, 0, -1)]
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for sandbox_id in ids:
                pipe.hget(keyspace.sandbox(sandbox_id), "pool_fp")
            fps = await pipe.execute()
        records = await self.sandboxes.get_many(ids)
        return [
            (r, text(fp or b""))
            for r, fp in zip(records, fps, strict=True)
            if r is not None and r.owner == POOL_OWNER
        ]

    async def forget_missing(self) -> None:
        """Index entries whose record is gone (e.g. deleted by hand) are removed."""
        ids = [text(i) for i in await self._redis.zrange(keyspace.POOL_MEMBERS, 0, -1)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for sandbox_id in ids:
                pipe.exists(keyspace.sandbox(sandbox_id))
            exists = await pipe.execute()
        gone = [i for i, e in zip(ids, exists, strict=True) if not e]
        if gone:
            await self._redis.zrem(keyspace.POOL_MEMBERS, *gone)

    async def stats(self) -> dict[str, int]:
        raw = await self._redis.hgetall(keyspace.POOL_STATS)
        return {text(k): int(v) for k, v in raw.items()}


async def pool_counts(redis: aioredis.Redis) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """For /metrics: unclaimed members by (spec, status), with status "ready" for the claimable
    ones, and the claim/miss counters of keyspace.POOL_STATS."""
    ids = [text(i) for i in await redis.zrange(keyspace.POOL_MEMBERS, 0, -1)]
    async with redis.pipeline(transaction=False) as pipe:
        for sandbox_id in ids:
            pipe.hmget(keyspace.sandbox(sandbox_id), "spec_id", "status")
        rows = await pipe.execute()
    counts: dict[tuple[str, str], int] = {}
    specs: set[str] = set()
    for spec_id, status in rows:
        if spec_id is not None and status is not None:
            key = (text(spec_id), text(status))
            counts[key] = counts.get(key, 0) + 1
            specs.add(key[0])
    for spec_id in specs:
        counts[(spec_id, "ready")] = int(await redis.zcard(keyspace.pool_ready(spec_id)))
    raw = await redis.hgetall(keyspace.POOL_STATS)
    return counts, {text(k): int(v) for k, v in raw.items()}
