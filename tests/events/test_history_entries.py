"""Reads of a conversation's history when its stream holds entries that are not events (not
JSON, JSON that is not an object, no `e` field: a hand, a script or another program wrote
them): events/search (both orders, paged across them), events/count, the batch read by id, a
live socket's start, the newest event and a fork's copy answer the events and leave those
entries out, never a 500 (events/store.py; the live socket's shared read does the same)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane.events.store import EventStore
from controlplane.store import keyspace, text
from tests.support.event_sockets import SOCKET, event_ids, nothing_more, post_events
from tests.support.records import RecordedSandbox, event
from tests.support.types import Client

NOT_EVENTS: list[dict[str, str]] = [{"e": "{not json"}, {"e": "[1, 2]"}, {"x": "no e field"}]


async def _history(recorded: RecordedSandbox, raw_redis: aioredis.Redis) -> list[str]:
    """Three events posted with entries that are not events before, between and after them;
    the events' ids in order."""
    client, sandbox, cid, key, _alice = recorded
    stream = keyspace.events(cid)
    ids: list[str] = []
    for fields in NOT_EVENTS:
        await raw_redis.xadd(stream, fields)  # type: ignore[arg-type]
        ids += await post_events(client, sandbox, cid, key, 1)
    for fields in NOT_EVENTS:
        await raw_redis.xadd(stream, fields)  # type: ignore[arg-type]
    return ids


async def _get(
    client: Client, path: str, headers: dict[str, str], params: list[tuple[str, str]]
) -> Any:
    resp = await client.get(path, params=params, headers=headers)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def _search_all(
    client: Client, headers: dict[str, str], cid: str, order: str, limit: int
) -> list[str]:
    """Every page of the conversation's events/search in `order`, `limit` a page: the ids."""
    seen: list[str] = []
    params = [("conversation_id__eq", cid), ("sort_order", order), ("limit", str(limit))]
    cursor: list[tuple[str, str]] = []
    while True:
        page = await _get(client, "/api/v1/events/search", headers, params + cursor)
        seen += [item["id"] for item in page["items"]]
        if page["next_page_id"] is None:
            return seen
        cursor = [("page_id", page["next_page_id"])]


async def test_search_count_and_batch_leave_out_entries_that_are_not_events(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, _sandbox, cid, _key, alice = recorded
    ids = await _history(recorded, raw_redis)
    for limit in (1, 2, 100):
        assert await _search_all(client, alice, cid, "TIMESTAMP", limit) == ids
        assert await _search_all(client, alice, cid, "TIMESTAMP_DESC", limit) == ids[::-1]
    filters = [("conversation_id__eq", cid), ("kind__eq", "MessageEvent")]
    counted = await _get(client, "/api/v1/events/count", alice, filters)
    assert counted == 3

    # An id whose index entry points at an entry that is not an event reads as missing.
    stray = await raw_redis.xadd(keyspace.events(cid), {"e": "{not json"})
    await raw_redis.hset(keyspace.EVENT_INDEX, "stray", f"{cid} {text(stray)}")
    asked = [("id", i) for i in [*ids, "stray", "unknown"]]
    found = await _get(client, "/api/v1/events", alice, asked)
    assert [e and e["id"] for e in found] == [*ids, None, None]


async def test_a_socket_from_now_starts_after_an_entry_that_is_not_an_event(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """The newest entry not an event: a socket without resend_all starts after it (it neither
    fails nor replays the history) and gets what comes next."""
    client, sandbox, cid, key, alice = recorded
    await _history(recorded, raw_redis)
    ws = await client.ws_connect(f"{SOCKET}?conversation_id={cid}&resend_all=false", headers=alice)
    later = await post_events(client, sandbox, cid, key, 2)
    assert await event_ids(ws, 2) == later
    await nothing_more(ws)
    await ws.close()


async def test_the_newest_event_and_a_fork_copy_step_over_entries_that_are_not_events(
    raw_redis: aioredis.Redis,
) -> None:
    store = EventStore(raw_redis)
    source, target = "src" + event()["id"], "dst" + event()["id"]
    stream = keyspace.events(source)
    try:
        posted = [event(n=i) for i in range(3)]
        await raw_redis.xadd(stream, NOT_EVENTS[0])  # type: ignore[arg-type]
        assert await store.append(source, posted[:2]) == 2
        await raw_redis.xadd(stream, NOT_EVENTS[1])  # type: ignore[arg-type]
        assert await store.append(source, posted[2:]) == 1
        for fields in NOT_EVENTS:
            await raw_redis.xadd(stream, fields)  # type: ignore[arg-type]
        newest = await store.newest(source)
        assert newest is not None
        assert newest[1] == posted[2]
        assert await store.copy(source, target, newest[0]) == 3
        page = await store.page(target, None, 10, False)
        assert [e for _sid, e in page.events] == posted
    finally:
        await store.delete(source)
        await store.delete(target)
    assert not await raw_redis.exists(stream, keyspace.events(target))
