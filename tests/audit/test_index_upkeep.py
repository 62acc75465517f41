"""An audit index's expiry and a sorted-set index's trim are renewed by a writer at most once
per `upkeep` (controlplane/store/audit.py, UPKEEP), and never so that an index expires sooner
than one retention after its last entry; an index that is gone meanwhile (deleted, flushed) is
made again with its expiry. Against a real redis-server: the entries go through the same script
and MULTI as a store's write (StreamEntry.queue)."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.store import audit, keyspace, text
from controlplane.store.audit import Actor, AuditAction, AuditLog
from controlplane.store.streams import lex_member

RETENTION = 3600.0
# Long enough that two writes a test makes back to back are always within one upkeep, however
# loaded the host (1 s failed at a load of 19); its passing is `pass_upkeep`, not a sleep.
UPKEEP = 60.0
ADMIN = Actor(user_id="ana", key_id="k1", via="api_key", org_id="eng", role="owner")


def indexes(user: str) -> list[str]:
    """The indexes a member.set of `user` in eng by ana adds to (streams, then sorted sets)."""
    return [
        keyspace.audit_org("eng"),
        keyspace.audit_org_action("eng", AuditAction.MEMBER_SET),
        keyspace.audit_action(AuditAction.MEMBER_SET),
        keyspace.audit_user("ana"),
        keyspace.audit_org_user("eng", "ana"),
        keyspace.audit_target(user),
        keyspace.audit_org_target("eng", user),
    ]


async def write(redis: aioredis.Redis, log: AuditLog, user: str) -> str:
    """A member.set entry in a MULTI, as OrganizationStore.set_role writes it; its stream id."""
    scope = audit.Scope(
        log=log,
        actor=lambda: ADMIN,
        action=AuditAction.MEMBER_SET,
        targets={"org_id": "eng", "user_id": user},
    )
    with audit.acting(scope):
        entry = audit.entry()
    assert entry is not None
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keyspace.org_members("eng"), user, "member")
        entry.queue(pipe)
        await pipe.execute()
    entry.stored()
    rows: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
    return text(rows[0][0])


def pass_upkeep(log: AuditLog) -> None:
    """Stand-in for an upkeep passing: the writer's record of when it renewed each index is made
    one upkeep older, which is all the writer reads of time."""
    log._renewed = {key: at - UPKEEP for key, at in log._renewed.items()}


async def assert_indexed(redis: aioredis.Redis, user: str, stream_id: str) -> None:
    for key in indexes(user)[:5]:
        rows: Any = await redis.xrange(key, stream_id, stream_id)
        assert len(rows) == 1, key
    for key in indexes(user)[5:]:
        assert await redis.zscore(key, lex_member(stream_id)) == 0, key


async def test_a_writer_renews_an_index_once_per_upkeep_never_below_the_retention(
    redis: aioredis.Redis,
) -> None:
    log = AuditLog(redis, retention=RETENTION, upkeep=UPKEEP)
    full = int((RETENTION + UPKEEP) * 1000)
    first = await write(redis, log, "bo")
    await assert_indexed(redis, "bo", first)
    for key in indexes("bo"):
        assert full - 2000 < await redis.pttl(key) <= full, key
    # Stand-in for time passing: every index's expiry runs down to a retention and a bit.
    shorter = int(RETENTION * 1000) + 500
    for key in indexes("bo"):
        await redis.pexpire(key, shorter)
    # Within the upkeep: the entry is indexed, the expiry left as it was (no PEXPIRE).
    second = await write(redis, log, "bo")
    await assert_indexed(redis, "bo", second)
    for key in indexes("bo"):
        assert await redis.pttl(key) <= shorter, key
    # Past it: renewed to a full retention and upkeep again.
    pass_upkeep(log)
    third = await write(redis, log, "bo")
    await assert_indexed(redis, "bo", third)
    for key in indexes("bo"):
        assert full - 2000 < await redis.pttl(key) <= full, key


async def test_a_sorted_set_index_is_trimmed_at_the_upkeep(redis: aioredis.Redis) -> None:
    log = AuditLog(redis, retention=RETENTION, upkeep=UPKEEP)
    target = keyspace.audit_target("cy")
    await redis.zadd(target, {lex_member("1000-0"): 0})  # far older than the retention
    await write(redis, log, "cy")
    assert await redis.zscore(target, lex_member("1000-0")) is None
    await redis.zadd(target, {lex_member("1000-0"): 0})
    await write(redis, log, "cy")  # within the upkeep: not trimmed yet
    assert await redis.zscore(target, lex_member("1000-0")) == 0
    pass_upkeep(log)
    await write(redis, log, "cy")
    assert await redis.zscore(target, lex_member("1000-0")) is None


async def test_an_index_gone_within_the_upkeep_is_made_again_with_its_expiry(
    redis: aioredis.Redis,
) -> None:
    log = AuditLog(redis, retention=RETENTION, upkeep=UPKEEP)
    await write(redis, log, "di")
    await redis.flushdb()  # every index gone, the writer still counting them renewed
    again = await write(redis, log, "di")
    await assert_indexed(redis, "di", again)
    for key in indexes("di"):
        assert await redis.pttl(key) > RETENTION * 1000, key
    # One index stream deleted alone: it comes back with its expiry too.
    await redis.delete(keyspace.audit_user("ana"))
    third = await write(redis, log, "di")
    await assert_indexed(redis, "di", third)
    assert await redis.pttl(keyspace.audit_user("ana")) > RETENTION * 1000


async def test_a_failed_write_renews_nothing(redis: aioredis.Redis) -> None:
    """A write that did not store its entry (EXEC refused) leaves the writer renewing at the
    next: otherwise an index could expire sooner than a retention after that next entry."""
    log = AuditLog(redis, retention=RETENTION, upkeep=UPKEEP)
    scope = audit.Scope(
        log=log,
        actor=lambda: ADMIN,
        action=AuditAction.MEMBER_SET,
        targets={"org_id": "eng", "user_id": "ed"},
    )
    with audit.acting(scope):
        entry = audit.entry()
    assert entry is not None
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keyspace.org_members("eng"), "ed", "member")
        pipe.execute_command("NO-SUCH-COMMAND")  # the whole MULTI is refused
        entry.queue(pipe)
        with pytest.raises(aioredis.ResponseError):
            await pipe.execute()
    assert not await redis.exists(keyspace.audit_org("eng"))
    stream_id = await write(redis, log, "ed")
    await assert_indexed(redis, "ed", stream_id)
    for key in indexes("ed"):
        assert await redis.pttl(key) > RETENTION * 1000, key
