"""An audit log entry that does not decode (controlplane/store/audit_index.py): the indexer
passes it and indexes every entry after it, and a search skips it instead of failing."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio as aioredis

from controlplane.audit.models import AuditQuery
from controlplane.audit.search import AuditSearch
from controlplane.store import keyspace, text
from controlplane.store.audit_index import AuditIndexer
from tests.audit.test_indexer import ADMIN, RETENTION, held, made, wanted, write


async def test_an_undecodable_entry_stops_neither_the_indexer_nor_search(
    redis: aioredis.Redis,
) -> None:
    before = [made(n) for n in range(5)]
    await write(redis, before)
    # Its targets' JSON does not decode (as an entry whose target held a literal "\\u0000").
    await redis.xadd(keyspace.AUDIT, {"id": "x", "time": "1", "action": "a", "targets": "{bad"})
    after = [made(n) for n in range(5, 10)]
    await write(redis, after)
    indexer = AuditIndexer(redis, retention=RETENTION, batch=4)
    task = asyncio.create_task(indexer.run(interval=0.02))
    last: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
    try:
        for _ in range(250):
            if task.done() or await indexer.watermark() == text(last[0][0]):
                break
            await asyncio.sleep(0.02)
        assert not task.done(), f"the indexer ended: {task.exception()!r}"
    finally:
        task.cancel()
    assert await indexer.watermark() == text(last[0][0])
    page = await AuditSearch(redis, os.urandom(32)).search(ADMIN, AuditQuery(limit=100))
    assert [e["event"]["id"] for e in page.items] == [r.id for r in reversed(before + after)]
    # Every index the good entries call for (the bad one, deleted to compare, calls for none).
    rows: Any = await redis.xrange(keyspace.AUDIT)
    await redis.xdel(keyspace.AUDIT, *[text(i) for i, f in rows if f.get(b"id") == b"x"])
    assert await held(redis) == await wanted(redis)
