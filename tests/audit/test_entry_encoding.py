"""How an entry's additions travel to Redis's script (controlplane/store/streams.py,
StreamEntry.script_args): the audit log's record as its values only (the script knows the 17
names: NAMES), and an index that shares its minid, ttl and fields with the index add before it
as a short string. What Redis stores is what the full form stored: checked against a real
redis-server, through the same script and MULTI as a store's write (StreamEntry.queue), and
through a script that fills in an id it chooses (LATE_ID)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane.store import audit, keyspace, text
from controlplane.store.audit import Actor, AuditAction, AuditLog
from controlplane.store.audit_event import FIELDS
from controlplane.store.streams import (
    APPEND_ENTRY,
    LATE_ID,
    StreamAdd,
    StreamEntry,
    lex_member,
)

RETENTION = 3600.0
ADMIN = Actor(user_id="ana", key_id="k1", via="api_key", org_id="eng", role="owner")
AGENT = "curl/8.5.0"


def member_set(log: AuditLog, user: str) -> StreamEntry:
    scope = audit.Scope(
        log=log,
        actor=lambda: ADMIN,
        ip="10.0.0.7",
        user_agent=AGENT,
        action=AuditAction.MEMBER_SET,
        targets={"org_id": "eng", "user_id": user},
    )
    with audit.acting(scope):
        entry = audit.entry(details={"role": "admin"})
    assert entry is not None
    return entry


def stored_fields(row: Any) -> list[tuple[str, str]]:
    return [(text(k), text(v)) for k, v in row.items()]


async def test_an_audit_entry_sends_its_values_and_its_indexes_short(
    redis: aioredis.Redis,
) -> None:
    log = AuditLog(redis, retention=RETENTION)
    entry = member_set(log, "bo")
    keys, args = entry.script_args()
    assert len(args) == 1
    (group,) = json.loads(args[0])
    record, first_index, *others = group
    # The record: its values in FIELDS' order, and the names' table; no name travels.
    fields = entry.groups[0][0].fields
    assert record[4] == list(fields[1::2])
    assert record[6] == "audit"
    assert not set(FIELDS) & set(record[4])
    # The first index in full; the four other streams and the two sorted sets as their kind
    # (first write of this writer: every index renewed, so no lazy mark).
    assert first_index[:2] == ["1", ""]
    assert first_index[4] == ["r", ""]
    assert others == ["1", "1", "1", "1", "z", "z"]
    # Once renewed, the next entry's indexes go lazy, still short.
    entry.stored()
    (group,) = json.loads(member_set(log, "bo").script_args()[1][0])
    assert group[1][5] == "1"
    assert group[2:] == ["11", "11", "11", "11", "z1", "z1"]
    assert len(keys) == 8


async def test_the_short_form_stores_the_record_and_indexes_the_full_form_stored(
    redis: aioredis.Redis,
) -> None:
    log = AuditLog(redis, retention=RETENTION)
    for round_ in range(2):  # renewing, then lazy
        entry = member_set(log, "bo")
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hset(keyspace.org_members("eng"), "bo", "admin")
            entry.queue(pipe)
            await pipe.execute()
        entry.stored()
        rows: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
        stream_id, row = text(rows[0][0]), rows[0][1]
        expected = entry.groups[0][0].fields
        assert stored_fields(row) == list(zip(expected[::2], expected[1::2], strict=True))
        assert dict(stored_fields(row))["agent"] == AGENT
        for add in entry.groups[0][1:]:
            if add.lex_index:
                assert await redis.zscore(add.key, lex_member(stream_id)) == 0, add.key
            else:
                found: Any = await redis.xrange(add.key, stream_id, stream_id)
                assert [stored_fields(r) for _, r in found] == [[("r", "")]], add.key
            assert await redis.pttl(add.key) > 0, (round_, add.key)


async def test_an_id_the_script_chooses_fills_the_values_and_the_short_indexes(
    redis: aioredis.Redis,
) -> None:
    """A sandbox's id picked by the script (a warm pool claim): NUL in the record's values and
    in its target indexes' keys, which travel short, is replaced by it."""
    log = AuditLog(redis, retention=RETENTION)
    scope = audit.Scope(log=log, actor=lambda: ADMIN, action=AuditAction.SANDBOX_CREATE)
    with audit.acting(scope):
        entry = audit.entry(sandbox_id=LATE_ID)
    assert entry is not None
    keys, args = entry.script_args()
    group = json.loads(args[0])[0]
    assert group[-2:] == ["z", "z"]  # the target's sorted sets, whose keys hold NUL
    script = APPEND_ENTRY + "append_entry(1, 2, ARGV[1])\nreturn 1\n"
    await redis.eval(script, len(keys), *keys, "sb-picked", *args)
    rows: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
    stream_id, row = text(rows[0][0]), dict(stored_fields(rows[0][1]))
    assert json.loads(row["targets"]) == {"sandbox_id": "sb-picked"}
    assert row["action"] == "sandbox.create"
    member = lex_member(stream_id)
    assert await redis.zscore(keyspace.audit_target("sb-picked"), member) == 0
    assert await redis.zscore(keyspace.audit_org_target("eng", "sb-picked"), member) == 0
    assert not await redis.exists(keyspace.audit_target(LATE_ID))


async def test_an_index_unlike_the_one_before_it_goes_in_full(redis: aioredis.Redis) -> None:
    """Only an index with the same minid, ttl and fields as the full index add before it is
    sent short; a trim by length in between is never taken for the others' form."""
    old, older = 1_000_000_000_002, 1_000_000_000_001  # Unix ms, long past: trims nothing
    adds = (
        StreamAdd("t:log", ("a", "1"), minid=older),
        StreamAdd("t:i1", ("r", ""), minid=older, ttl_ms=60_000, same_id=True),
        StreamAdd("t:i2", ("r", ""), minid=old, ttl_ms=60_000, same_id=True),
        StreamAdd("t:i3", ("r", ""), minid=old, ttl_ms=60_000, same_id=True),
        StreamAdd("t:i4", ("r", ""), maxlen=100, ttl_ms=60_000, same_id=True),
        StreamAdd("t:i5", ("r", ""), minid=old, ttl_ms=60_000, same_id=True),
        StreamAdd("t:z1", (), minid=old, ttl_ms=60_000, same_id=True, lex_index=True),
        StreamAdd("t:i6", ("r", "x"), minid=old, ttl_ms=60_000, same_id=True),
    )
    entry = StreamEntry((adds,))
    keys, args = entry.script_args()
    group = json.loads(args[0])[0]
    short = [i for i, add in enumerate(group) if isinstance(add, str)]
    assert short == [3, 6]
    script = APPEND_ENTRY + "append_entry(1, 1)\nreturn 1\n"
    await redis.eval(script, len(keys), *keys, *args)
    logged: Any = await redis.xrange("t:log")
    log_id = logged[0][0]
    for add in adds[1:]:
        if add.lex_index:
            assert await redis.zscore(add.key, lex_member(text(log_id))) == 0
        else:
            found: Any = await redis.xrange(add.key)
            index_id, row = found[0]
            assert (index_id, stored_fields(row)) == (log_id, [add.fields]), add.key
        assert 0 < await redis.pttl(add.key) <= 60_000, add.key


def test_fields_not_named_as_their_table_are_refused() -> None:
    add = StreamAdd("t:log", ("id", "1", "when", "2"), names="audit")
    with pytest.raises(ValueError, match="not named"):
        StreamEntry(((add,),)).script_args()
