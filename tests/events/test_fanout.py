"""The events WebSocket's shared read (events/fanout.py): sockets on one conversation share one
read of it on a replica, each from its own start (the first event, after an event id, from
now), and get every event once, in order, as the text it was stored as; a socket whose queue
overflows catches up from the store with nothing lost; the read ends with its last socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import WSMsgType
from aiohttp._websocket.writer import WebSocketWriter
from aiohttp.base_protocol import BaseProtocol

from controlplane import keys
from controlplane.events import fanout, routes
from controlplane.events import frames as frames_module
from controlplane.store import keyspace, text
from tests.support.event_sockets import SOCKET, frames, nothing_more, post_events, until
from tests.support.records import RecordedSandbox


async def test_sockets_share_one_read_each_from_its_start(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    first = await post_events(client, sandbox, cid, key, 3)
    base = f"{SOCKET}?conversation_id={cid}"
    everything = await client.ws_connect(base, headers=alice)  # resend_all: true by default
    after_one = await client.ws_connect(f"{base}&after={first[0]}", headers=alice)
    from_now = await client.ws_connect(f"{base}&resend_all=false", headers=alice)
    assert [json.loads(f)["id"] for f in await frames(everything, 3)] == first
    assert [json.loads(f)["id"] for f in await frames(after_one, 2)] == first[1:]
    await until(lambda: events.fanout.watched() == 1)  # one read for the three of them

    more = await post_events(client, sandbox, cid, key, 40)
    entries: Any = await raw_redis.xrange(keyspace.events(cid))
    stored = [text(fields[b"e"]) for _sid, fields in entries]
    for ws in (everything, after_one, from_now):
        sent = await frames(ws, 40)
        assert [json.loads(f)["id"] for f in sent] == more  # each once, in order
        assert sent == stored[3:]  # the stored text as it is
        await nothing_more(ws)

    for ws in (everything, after_one, from_now):
        await ws.close()
    await until(lambda: events.fanout.watched() == 0)  # the read ends with its last socket

    # A socket resumes after the last event it got: a new read, only what came since.
    again = await client.ws_connect(f"{base}&after={more[-1]}", headers=alice)
    later = await post_events(client, sandbox, cid, key, 2)
    assert [json.loads(f)["id"] for f in await frames(again, 2)] == later
    await nothing_more(again)
    await again.close()


async def test_a_socket_whose_queue_overflows_catches_up_from_the_store(
    recorded: RecordedSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch larger than a socket's queue: the queue is dropped and the socket reads those
    events from the store itself, then follows the shared read again, missing nothing."""
    monkeypatch.setattr(fanout, "QUEUE_CAP", 10)
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    base = f"{SOCKET}?conversation_id={cid}"
    sockets = [await client.ws_connect(f"{base}&resend_all=false", headers=alice) for _ in "abc"]
    await until(lambda: events.fanout.watched() == 1)
    await asyncio.sleep(0.2)  # the channel's start is fixed

    posted: list[str] = []
    for size in (25, 5, 30, 3):
        posted += await post_events(client, sandbox, cid, key, size)
    for ws in sockets:
        assert [json.loads(f)["id"] for f in await frames(ws, len(posted))] == posted
        await nothing_more(ws)
    assert events.fanout.fell_behind >= 2 * len(sockets)  # the batches of 25 and 30
    for ws in sockets:
        await ws.close()
    await until(lambda: events.fanout.watched() == 0)


@pytest.mark.parametrize("compress", [0, 15])
async def test_a_batch_is_written_at_once_one_event_per_frame(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis, compress: int
) -> None:
    """What a socket has to send at once (a catch-up's page, a queue of several) is framed one
    event per frame, in order, as stored, with or without the client's compression."""
    client, sandbox, cid, key, alice = recorded
    first = await post_events(client, sandbox, cid, key, 30)
    ws = await client.ws_connect(
        f"{SOCKET}?conversation_id={cid}", headers=alice, compress=compress
    )
    assert ws.compress == compress  # negotiated: aiohttp's compressor writes to the cork too
    more = await post_events(client, sandbox, cid, key, 60)
    entries: Any = await raw_redis.xrange(keyspace.events(cid))
    stored = [text(fields[b"e"]) for _sid, fields in entries]
    sent = await frames(ws, 90)
    assert [json.loads(f)["id"] for f in sent] == first + more
    assert sent == stored
    await nothing_more(ws)
    await ws.close()


class _Recorded(asyncio.Transport):
    """A connection's transport as far as the cork sees it: what was written to it, each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def test_a_cork_writes_at_most_its_size_at_once() -> None:
    """A batch of large frames (a catch-up's page of big events) is not held and copied whole:
    the cork writes every CORK_BYTES, in order, and what is left at the end."""
    below = _Recorded()
    cork = routes._Corked(below)
    frames_sent = [bytes([i]) * 40_000 for i in range(10)]
    for frame in frames_sent:
        cork.write(frame)
    cork.flush()
    assert b"".join(below.writes) == b"".join(frames_sent)
    assert max(len(w) for w in below.writes) < routes.CORK_BYTES + 40_000
    small = _Recorded()
    cork = routes._Corked(small)
    for frame in (b"a" * 100, b"b" * 100, b"c" * 100):
        cork.write(frame)
    assert small.writes == []  # small frames wait for the batch's one write
    cork.flush()
    assert small.writes == [b"a" * 100 + b"b" * 100 + b"c" * 100]


@pytest.mark.parametrize("size", [0, 125, 126, 65_535, 65_536, 200_000])
async def test_an_events_frame_is_the_frame_aiohttp_would_write(size: int) -> None:
    """The frame made once per replica (events/frames.py) is byte for byte the one aiohttp's
    server writer makes for the same text, at each of the three lengths' encodings."""
    stored = json.dumps({"id": "e", "text": "é" * (size // 2)})[: max(size, 2)]
    transport = _Recorded()
    writer = WebSocketWriter(BaseProtocol(asyncio.get_running_loop()), transport)
    await writer.send_frame(stored.encode(), WSMsgType.TEXT)
    made = frames_module.text_frame(stored)
    assert made == b"".join(transport.writes)
    assert frames_module.frame_text(made) == stored


async def test_an_events_frame_is_made_once_for_every_socket_of_a_replica(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three uncompressed sockets on one conversation: each event's frame is made once (by the
    shared read), not once a socket, and each socket gets it, in order, as stored."""
    made: list[str] = []

    def counted(stored: str) -> bytes:
        made.append(stored)
        return frames_module.text_frame(stored)

    monkeypatch.setattr(fanout, "text_frame", counted)
    client, sandbox, cid, key, alice = recorded
    events = client.app[keys.EVENTS]
    base = f"{SOCKET}?conversation_id={cid}&resend_all=false"
    sockets = [await client.ws_connect(base, headers=alice) for _ in "abc"]
    await until(lambda: events.fanout.watched() == 1)
    await asyncio.sleep(0.2)  # the channel's start is fixed: no catch-up reads what follows
    posted = await post_events(client, sandbox, cid, key, 40)
    entries: Any = await raw_redis.xrange(keyspace.events(cid))
    stored = [text(fields[b"e"]) for _sid, fields in entries]
    for ws in sockets:
        assert await frames(ws, 40) == stored
        await nothing_more(ws)
    assert [json.loads(s)["id"] for s in made] == posted  # once each, for the three sockets
    for ws in sockets:
        await ws.close()
