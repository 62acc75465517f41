"""A conversation deleted while watched: its sockets are sent what was stored before, then closed
with 4004 (the agent server's close for a conversation it does not have), on the replica that
deleted it at once and on any other at its shared read's next quiet read; the sockets of other
conversations stay open."""

from __future__ import annotations

import secrets

import aiohttp
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.events.routes import CONVERSATION_GONE
from controlplane.events.store import EventStore
from tests.support.event_sockets import SOCKET, event_ids, nothing_more, post_events, until
from tests.support.records import RecordedSandbox


async def closed_with(ws: aiohttp.ClientWebSocketResponse, within: float) -> int | None:
    message = await ws.receive(timeout=within)
    assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), message
    return ws.close_code


async def test_deleting_a_watched_conversation_closes_its_sockets_with_4004(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    other = secrets.token_hex(16)
    await ConversationStore(raw_redis).save(
        AppConversationInfo(id=other, created_by_user_id="alice", sandbox_id=sandbox)
    )
    watching = [
        await client.ws_connect(f"{SOCKET}?conversation_id={cid}", headers=alice) for _ in range(2)
    ]
    bystander = await client.ws_connect(f"{SOCKET}?conversation_id={other}", headers=alice)
    posted = await post_events(client, sandbox, cid, key, 3)
    for ws in watching:
        assert await event_ids(ws, 3) == posted
    await until(lambda: events.fanout.watched() == 2)

    # Deleted here (what ConversationService.delete does: the record, then the events).
    info = await ConversationStore(raw_redis).get(cid)
    assert info is not None
    await client.app[keys.CONVERSATIONS].store.delete(info)
    await events.store.delete(cid)
    for ws in watching:
        assert await closed_with(ws, 2) == CONVERSATION_GONE
    await until(lambda: events.fanout.watched() == 1)

    # The other conversation's socket is untouched.
    later = await post_events(client, sandbox, other, key, 2)
    assert await event_ids(bystander, 2) == later
    await nothing_more(bystander)
    # A new socket on the deleted conversation is refused before the upgrade.
    resp = await client.get(f"{SOCKET}?conversation_id={cid}", headers=alice)
    assert resp.status in (400, 404)
    await bystander.close()


async def test_a_conversation_deleted_by_another_replica_closes_the_sockets_here(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    ws = await client.ws_connect(f"{SOCKET}?conversation_id={cid}", headers=alice)
    posted = await post_events(client, sandbox, cid, key, 2)
    assert await event_ids(ws, 2) == posted
    # Another replica's store and records: this replica's fanout is not told.
    info = await ConversationStore(raw_redis).get(cid)
    assert info is not None
    await ConversationStore(raw_redis).delete(info)
    await EventStore(raw_redis).delete(cid)
    # Noticed at the shared read's next quiet read (within its blocking read's time).
    assert await closed_with(ws, 15) == CONVERSATION_GONE
    await until(lambda: events.fanout.watched() == 0)
