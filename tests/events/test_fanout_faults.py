"""The events WebSocket's shared read (events/fanout.py) when things go wrong: a read that fails
with an error that is not an outage ends its sockets (and the next socket reads again), an
event a failover made its writer store again reaches a socket that never had it, entries that
are not events are never sent, a killed reader connection loses and repeats nothing, a queue
that overflows while its socket still reads the history loses nothing, and sockets joining and
leaving together (some dropped without a close) leave no read behind."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.events import fanout
from controlplane.store import keyspace, text
from tests.support.event_sockets import SOCKET, event_ids, nothing_more, post_events, until
from tests.support.records import RecordedSandbox, event


async def test_a_failed_shared_read_ends_its_sockets_and_the_next_socket_reads_again(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """An error that is not an outage (here the stream's key holding a string: WRONGTYPE)
    ends the read: its sockets are closed with 1011 rather than left open with nothing more
    ever coming, and a socket opened once the key is right again gets its events."""
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    first = await post_events(client, sandbox, cid, key, 2)
    base = f"{SOCKET}?conversation_id={cid}"
    watchers = [await client.ws_connect(base, headers=alice) for _ in "ab"]
    for ws in watchers:
        assert await event_ids(ws, 2) == first
    await until(lambda: events.fanout.watched() == 1)

    stream = keyspace.events(cid)
    kept: Any = await raw_redis.dump(stream)
    await raw_redis.delete(stream)
    await raw_redis.set(stream, "not a stream")
    wait = (
        fanout.block_ms(events.fanout.reader) / 1000 + 5
    )  # the read blocked then may run out first
    for ws in watchers:
        message = await ws.receive(timeout=wait)
        assert message.type == aiohttp.WSMsgType.CLOSE, message
        assert ws.close_code == aiohttp.WSCloseCode.INTERNAL_ERROR
    await until(lambda: events.fanout.watched() == 0)

    await raw_redis.delete(stream)
    await raw_redis.restore(stream, 0, kept)
    again = await client.ws_connect(f"{base}&after={first[-1]}", headers=alice)
    later = await post_events(client, sandbox, cid, key, 2)
    assert await event_ids(again, 2) == later
    await again.close()


async def test_a_socket_whose_shared_read_cannot_start_is_closed(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """The read fails at its start (the stream's newest id): the socket, which waits for that
    start before reading the history, is closed with 1011 too, and no channel is left."""
    client, _sandbox, cid, _key, alice = recorded
    events = client.app[keys.EVENTS]
    await raw_redis.set(keyspace.events(cid), "not a stream")
    ws = await client.ws_connect(f"{SOCKET}?conversation_id={cid}", headers=alice)
    message = await ws.receive(timeout=5)
    assert message.type == aiohttp.WSMsgType.CLOSE, message
    assert ws.close_code == aiohttp.WSCloseCode.INTERNAL_ERROR
    await until(lambda: events.fanout.watched() == 0)


async def test_an_event_stored_again_after_a_failover_reaches_a_socket_that_lacked_it(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """A master replaced before it replicated an event loses it; its writer stores it again on
    the new master under a new stream id. A socket that had it skips it; one that joined in
    between (its history read from the new master, without it) gets it, once."""
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    base = f"{SOCKET}?conversation_id={cid}"
    had_it = await client.ws_connect(f"{base}&resend_all=false", headers=alice)
    await until(lambda: events.fanout.watched() == 1)
    await asyncio.sleep(0.2)  # the shared read's start is fixed
    before = await post_events(client, sandbox, cid, key, 1)
    lost = [event()]
    resp = await client.post(f"/api/v1/webhooks/{sandbox}/events/{cid}", json=lost, headers=key)
    assert resp.status == 200
    assert await event_ids(had_it, 2) == [*before, lost[0]["id"]]

    # The failover: the new master has neither the event nor its ids (the old one had both).
    entries: Any = await raw_redis.xrevrange(keyspace.events(cid), "+", "-", 1)
    await raw_redis.xdel(keyspace.events(cid), entries[0][0])
    await raw_redis.hdel(keyspace.event_ids(cid), lost[0]["id"])
    await raw_redis.hdel(keyspace.EVENT_INDEX, lost[0]["id"])

    joined = await client.ws_connect(base, headers=alice)  # all of it: the one before
    assert await event_ids(joined, 1) == before
    resp = await client.post(f"/api/v1/webhooks/{sandbox}/events/{cid}", json=lost, headers=key)
    assert resp.status == 200  # the writer's retry stores it again
    assert await event_ids(joined, 1) == [lost[0]["id"]]
    await nothing_more(joined)
    await nothing_more(had_it)
    for ws in (had_it, joined):
        await ws.close()


async def test_entries_that_are_not_events_are_never_sent(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """Each frame is one event's JSON (docs/api.md): a stream entry that is not (not JSON, not
    an object, no `e` field) is skipped by the history's read and by the shared one alike."""
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    stream = keyspace.events(cid)
    first = await post_events(client, sandbox, cid, key, 1)
    await raw_redis.xadd(stream, {"e": "{not json"})
    await raw_redis.xadd(stream, {"e": "[1, 2]"})
    await raw_redis.xadd(stream, {"x": "no e field"})
    second = await post_events(client, sandbox, cid, key, 1)
    base = f"{SOCKET}?conversation_id={cid}"
    ws = await client.ws_connect(base, headers=alice)
    assert await event_ids(ws, 2) == first + second  # the history's read
    await until(lambda: events.fanout.watched() == 1)
    await asyncio.sleep(0.2)
    await raw_redis.xadd(stream, {"e": "{not json"})
    await raw_redis.xadd(stream, {"x": "no e field"})
    third = await post_events(client, sandbox, cid, key, 1)
    assert await event_ids(ws, 1) == third  # the shared read's
    await nothing_more(ws)
    await ws.close()


async def _reader_clients(raw_redis: aioredis.Redis) -> list[str]:
    """The ids of the Redis clients blocked in XREAD now."""
    listed: Any = await raw_redis.client_list()
    return [str(c["id"]) for c in listed if text(c.get("cmd", "")) == "xread"]


async def test_a_killed_shared_read_connection_loses_and_repeats_nothing(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    base = f"{SOCKET}?conversation_id={cid}"
    sockets = [await client.ws_connect(f"{base}&resend_all=false", headers=alice) for _ in "ab"]
    await until(lambda: events.fanout.watched() == 1)
    posted: list[str] = []
    for _ in range(3):
        for _ in range(20):  # the read is back in XREAD
            blocked = await _reader_clients(raw_redis)
            if blocked:
                break
            await asyncio.sleep(0.05)
        assert len(blocked) == 1, blocked
        await raw_redis.client_kill_filter(_id=blocked[0])
        posted += await post_events(client, sandbox, cid, key, 5)
    for ws in sockets:
        assert await event_ids(ws, len(posted)) == posted
        await nothing_more(ws)
        await ws.close()
    await until(lambda: events.fanout.watched() == 0)


async def test_sockets_joining_and_leaving_together_leave_no_read_behind(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    """Twenty sockets join while events are posted, each gets all of them once and in order;
    half close, the others are dropped without a close frame: no channel, no blocked read, no
    reader connection in use remains."""
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    base = f"{SOCKET}?conversation_id={cid}"
    posted: list[str] = []

    async def poster() -> None:
        for _ in range(10):
            posted.extend(await post_events(client, sandbox, cid, key, 7))
            await asyncio.sleep(0.01)

    async def join() -> aiohttp.ClientWebSocketResponse:
        return await client.ws_connect(base, headers=alice)

    posting = asyncio.create_task(poster())
    sockets = await asyncio.gather(*(join() for _ in range(20)))
    await posting
    for ws in sockets:
        assert await event_ids(ws, len(posted)) == posted
    for ws in sockets:
        await nothing_more(ws)
    for n, ws in enumerate(sockets):
        if n % 2:
            await ws.close()
        else:
            connection = ws._conn
            assert connection is not None
            assert connection.transport is not None
            connection.transport.abort()
    await until(lambda: events.fanout.watched() == 0)
    pool: Any = events.fanout.reader.connection_pool
    await until(lambda: not pool._in_use_connections)
    assert await _reader_clients(raw_redis) == []


async def test_a_queue_that_overflows_during_its_own_catch_up_loses_nothing(
    recorded: RecordedSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sockets join a long history in small pages while batches larger than their queues keep
    coming: each queue overflows while its socket is still reading the history, and each
    socket still gets every event once, in order."""
    monkeypatch.setattr(fanout, "QUEUE_CAP", 10)
    monkeypatch.setattr(fanout, "PAGE", 7)
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    base = f"{SOCKET}?conversation_id={cid}"
    posted = await post_events(client, sandbox, cid, key, 150)
    watching = await client.ws_connect(f"{base}&resend_all=false", headers=alice)
    await until(lambda: events.fanout.watched() == 1)
    await asyncio.sleep(0.2)  # the shared read's start is fixed

    async def poster() -> None:
        for size in (30, 12, 40, 3, 25):
            posted.extend(await post_events(client, sandbox, cid, key, size))
            await asyncio.sleep(0)

    before = events.fanout.fell_behind
    posting = asyncio.create_task(poster())
    joined = [await client.ws_connect(base, headers=alice) for _ in range(3)]
    await posting
    for ws in joined:
        assert await event_ids(ws, len(posted)) == posted
        await nothing_more(ws)
    assert await event_ids(watching, len(posted) - 150) == posted[150:]
    assert events.fanout.fell_behind > before  # the queues did overflow
    for ws in [watching, *joined]:
        await ws.close()
    await until(lambda: events.fanout.watched() == 0)
