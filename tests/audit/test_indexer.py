"""The audit indexes built from the log after the request (controlplane/store/audit_index.py): a
search finds every entry written, indexed or not yet; each index entry is written exactly once
whatever the indexers do (two at once, one killed mid-way, a pass that lost the race); and the
indexes are trimmed and expire with the retention."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import defaultdict
from typing import Any

import redis.asyncio as aioredis

from controlplane.audit.models import AuditQuery
from controlplane.audit.search import AuditSearch
from controlplane.auth.models import Principal
from controlplane.store import keyspace, text
from controlplane.store.audit import AuditLog, index_keys, new_id
from controlplane.store.audit_event import AuditRecord
from controlplane.store.audit_index import AuditIndexer
from controlplane.store.streams import lex_member

RETENTION = 86400.0
ADMIN = Principal(user_id="admin", is_admin=True, key_id="k")


def made(n: int, *, ms: int | None = None) -> AuditRecord:
    now_ms = ms if ms is not None else int(time.time() * 1000)
    return AuditRecord(
        id=new_id(now_ms),
        time_ms=now_ms,
        action=("sandbox.create", "member.set", "key.create")[n % 3],
        outcome="success",
        user_id=f"u{n % 4}",
        key_id=None,
        via="api_key",
        admin=False,
        org_id=("eng", "sales", None)[n % 3],
        role="member",
        targets={"sandbox_id": f"sb{n % 5}"},
    )


async def write(redis: aioredis.Redis, records: list[AuditRecord]) -> None:
    """As the requests write them: the log alone (no index)."""
    log = AuditLog(redis, retention=RETENTION)
    for record in records:
        await log.write(log.entry(record))


async def held(redis: aioredis.Redis) -> dict[str, list[str]]:
    """Every index and what it holds, oldest first."""
    out: dict[str, list[str]] = {}
    async for raw in redis.scan_iter(match="acs:audit:*"):
        key = text(raw)
        kind = text(await redis.type(key))
        if kind == "stream" and key != keyspace.AUDIT:
            rows: Any = await redis.xrange(key)
            out[key] = [text(i) for i, _ in rows]
        elif kind == "zset":
            out[key] = [text(m) for m in await redis.zrange(key, 0, -1)]
    return out


async def wanted(redis: aioredis.Redis) -> dict[str, list[str]]:
    """The indexes the log calls for (audit.index_keys of each entry), oldest first."""
    rows: Any = await redis.xrange(keyspace.AUDIT)
    out: dict[str, list[str]] = defaultdict(list)
    for stream_id, fields in rows:
        record = AuditRecord.from_fields({text(k): text(v) for k, v in fields.items()})
        streams, sorted_sets = index_keys(record)
        for key in streams:
            out[key].append(text(stream_id))
        for key in sorted_sets:
            out[key].append(lex_member(text(stream_id)))
    return dict(out)


async def found(search: AuditSearch, **query: Any) -> list[str]:
    """Every entry id a search finds, following its pages."""
    ids: list[str] = []
    page_id = None
    while True:
        page = await search.search(ADMIN, AuditQuery(limit=7, page_id=page_id, **query))
        ids += [e["event"]["id"] for e in page.items]
        if page.next_page_id is None:
            return ids
        page_id = page.next_page_id


QUERIES: list[dict[str, Any]] = [
    {},
    {"user_id": "u1"},
    {"target": "sb2"},
    {"action": "member.set"},
    {"org_id": "eng"},
    {"org_id": "sales", "user_id": "u2"},
    {"org_id": "~"},
]


async def test_a_search_right_after_the_writes_finds_every_entry_indexed_or_not(
    redis: aioredis.Redis,
) -> None:
    records = [made(n) for n in range(60)]
    await write(redis, records)
    assert await held(redis) == {}  # the requests wrote no index
    search = AuditSearch(redis, os.urandom(32))

    def expect(query: dict[str, Any]) -> list[str]:
        keep = [
            r
            for r in records
            if (query.get("user_id") in (None, r.user_id))
            and (query.get("action") in (None, r.action))
            and (query.get("target") in (None, *r.targets.values()))
            and (query.get("org_id") in (None, r.org_id or "~"))
        ]
        return [r.id for r in reversed(keep)]

    answers = {str(q): expect(q) for q in QUERIES}
    assert all(answers.values())
    # Nothing indexed yet, then part of the log (the watermark mid-way), then all of it.
    assert {str(q): await found(search, **q) for q in QUERIES} == answers
    indexer = AuditIndexer(redis, retention=RETENTION, batch=25)
    assert await indexer.run_once() == 25
    assert {str(q): await found(search, **q) for q in QUERIES} == answers
    assert await indexer.catch_up() == 35
    assert await held(redis) == await wanted(redis)
    assert {str(q): await found(search, **q) for q in QUERIES} == answers
    # A one-day window that ends before the watermark reads the indexes alone.
    since = "2020-01-01T00:00:00Z"
    assert await found(search, since=since, until="2020-01-02T00:00:00Z") == []
    assert await found(search, user_id="u1", since=since) == answers[str({"user_id": "u1"})]


async def test_two_replicas_at_once_and_a_pass_that_lost_the_race_write_each_entry_once(
    redis: aioredis.Redis,
) -> None:
    await write(redis, [made(n) for n in range(200)])
    late = AuditIndexer(redis, retention=RETENTION, batch=50)
    mark, stale = await late.read()  # read, then paused while the others run
    replicas = [AuditIndexer(redis, retention=RETENTION, batch=b) for b in (7, 11, 13)]
    done = await asyncio.gather(*(r.catch_up() for r in replicas))
    assert sum(done) == 200
    after = await held(redis)
    assert after == await wanted(redis)
    watermark = await late.watermark()
    # The paused pass resumes: its batch is refused whole (the watermark moved), nothing moves.
    assert not await late.apply(mark, stale)
    assert await late.watermark() == watermark
    assert await held(redis) == after


_KILLED_INDEXER = """
import asyncio, sys
import redis.asyncio as aioredis
from controlplane.store.audit_index import AuditIndexer
async def main():
    redis = aioredis.Redis.from_url(sys.argv[1])
    print("started", flush=True)
    await AuditIndexer(redis, retention=86400.0, batch=20).run()
asyncio.run(main())
"""


async def test_an_indexer_killed_mid_way_leaves_each_index_entry_once(
    redis: aioredis.Redis, redis_url: str
) -> None:
    await write(redis, [made(n) for n in range(3000)])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_INDEXER, redis_url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"started"
        deadline = time.monotonic() + 30
        while not await redis.exists(keyspace.AUDIT_INDEXED):
            assert time.monotonic() < deadline, "the indexer did not start"
            await asyncio.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    partly = await AuditIndexer(redis, retention=RETENTION).watermark()
    last: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
    assert partly != text(last[0][0]), "killed after it had finished: nothing was tested"
    await AuditIndexer(redis, retention=RETENTION, batch=64).catch_up()
    assert await held(redis) == await wanted(redis)


async def test_the_indexes_are_trimmed_and_expire_with_the_retention(
    redis: aioredis.Redis,
) -> None:
    retention = 1.0
    log = AuditLog(redis, retention=retention)
    indexer = AuditIndexer(redis, retention=retention)
    target = keyspace.audit_target("sb0")
    # Same user, organization, action and target, 0.6 s apart: each pass renews the expiry.
    for _ in range(3):
        await log.write(log.entry(made(0)))
        await indexer.catch_up()
        await asyncio.sleep(0.6)
    ids: Any = await redis.xrange(keyspace.AUDIT)
    stream_ids = [text(i) for i, _ in ids]
    assert len(stream_ids) == 3
    # The first entry, 1.2 s older than the last, is out of the sorted sets (trimmed exactly
    # at a pass); every index expires one retention after its last pass.
    assert [text(m) for m in await redis.zrange(target, 0, -1)] == [
        lex_member(i) for i in stream_ids[1:]
    ]
    streams, sorted_sets = index_keys(made(0))
    for key in streams + sorted_sets:
        assert 0 < await redis.pttl(key) <= 1000, key
    await asyncio.sleep(0.6)
    assert not await redis.exists(*streams, *sorted_sets)


async def test_an_older_replica_writing_its_own_index_entries_meanwhile_loses_none(
    redis: aioredis.Redis,
) -> None:
    """A rolling upgrade from the version whose requests wrote the indexes: this version's
    entries wait for the indexer while an older replica writes later entries with their index
    entries itself. The indexer then adds ids below what those streams hold: each goes in its
    place, and every index holds what the log calls for, in order (found by review: the
    streams refused them, and a search by organization missed them for good)."""
    await write(redis, [made(n) for n in range(6)])  # this version's: the log alone
    for n in (6, 9):  # an older replica's: the entry and its index entries
        record = made(n)
        await write(redis, [record])
        newest: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
        stream_id = text(newest[0][0])
        streams, sorted_sets = index_keys(record)
        for key in streams:
            await redis.xadd(key, {"r": ""}, id=stream_id)
        for key in sorted_sets:
            await redis.zadd(key, {lex_member(stream_id): 0})
    await write(redis, [made(n) for n in range(10, 13)])  # this version's again

    await AuditIndexer(redis, retention=RETENTION).catch_up()
    assert await held(redis) == await wanted(redis)
    search = AuditSearch(redis, os.urandom(32))
    rows: Any = await redis.xrevrange(keyspace.AUDIT)
    records = [AuditRecord.from_fields({text(k): text(v) for k, v in f.items()}) for _, f in rows]
    eng = [r.id for r in records if r.org_id == "eng"]
    assert len(eng) == 5  # 0, 3, 6 (the older replica's), 9 (its), 12
    assert await found(search, org_id="eng") == eng
