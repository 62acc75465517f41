"""One read per conversation per replica, shared by every live socket watching it.

A conversation watched by any socket of this replica has one `Channel`: a task that blocks in
XREAD on the conversation's stream (one connection of the events reader pool) and hands each
new event, as the JSON text it was stored as, to every `Subscription` of it. A socket sends that
text as it is: an event is read once and decoded once (for its id) per replica, however many
sockets watch it, and never encoded again; its WebSocket frame (events/frames.py) is made once
too, and every uncompressed socket writes those same bytes.

A subscription starts from its own point (`after`, a stream id): it reads what it has not seen
from the store itself (XRANGE pages, the catch-up), while the channel already queues the new
events for it, then follows the queue. The catch-up always reaches the stream's end as of a
moment after the queue started to fill, so the two overlap and never leave a gap; the overlap is
skipped by stream id. Nothing is skipped through Redis outages and failovers (a read that fails
is tried again with backoff from the last stream id, however long the outage; each blocking read
stays under the socket timeout, `block_ms`), order is kept, and nothing is repeated: an event
read from a master that then lost it comes again under another stream id once its writer
stored it on the new master, and each subscription skips the event ids it handed out (one that
joined after the failover never had it, and gets it). A stream entry that is not an
event (not a JSON object) is never handed out.

A channel whose read fails with an error that is not an outage (a stream key of another type,
say) ends: it leaves the fanout, and its subscriptions raise `FeedFailed`, which ends their
sockets (events/routes.py closes them with 1011); the next socket starts a new channel.

A slow socket never holds up the others nor grows memory without bound: its queue holds at most
`QUEUE_CAP` events; past that the queue is dropped and the subscription catches up from the
store again from the last event it sent (the events are all kept in Redis), then rejoins the
queue. The socket stays open; a client that cannot keep up gets its events later, in order,
with none missing, and its heartbeat (30 s, events/routes.py) closes one that stopped reading.

A conversation deleted while watched ends its channel: its subscriptions raise
`ConversationGone` once they have handed out what was queued, and events/routes.py closes their
sockets with 4004 (as the agent server closes its own). The replica that deletes it ends the
channel at once (EventStore.delete tells the fanout); every other replica notices at its
channel's next quiet read (a deleted conversation gets no more events, so its read comes back
empty within `block_ms`), when the channel asks whether the conversation still exists.

The channel ends when its last subscription closes (and a new one starts for the next socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import redis.asyncio as aioredis
import structlog

from controlplane.events.frames import frame_text, text_frame
from controlplane.events.store import EventStore
from controlplane.store.redis import REDIS_DOWN
from controlplane.store.retry import raise_if_cancelled
from controlplane.store.streams import id_order

log = structlog.get_logger(__name__)

Frame = tuple[str, str, bytes]
"""(stream id, event id, the event's WebSocket frame: its JSON as stored, framed once per
replica by events/frames.py)"""

QUEUE_CAP = 1000
"""Events queued for one socket before it is made to catch up from the store instead."""
PAGE = 500
"""Events a catch-up reads at a time."""
LONGEST_BLOCK_MS = 10_000
REMEMBERED = 1000
"""Event ids a subscription handed out that it remembers, to skip a repeat."""
RETRY_FIRST, RETRY_MAX = 0.1, 2.0
"""Seconds between tries of a read while Redis is away: doubling, up to the second."""


def block_ms(reader: aioredis.Redis) -> int:
    """How long one XREAD may block: under the reader's socket timeout (by a second, or by
    half), so that a quiet conversation is never taken for a dead Redis."""
    timeout = reader.connection_pool.connection_kwargs.get("socket_timeout")
    if not timeout:
        return LONGEST_BLOCK_MS
    return max(100, min(LONGEST_BLOCK_MS, int(min(timeout - 1.0, timeout / 2) * 1000)))


class FeedFailed(Exception):
    """The conversation's shared read failed with an error that is not an outage."""


class ConversationGone(Exception):
    """The conversation was deleted: nothing more will come."""


def _event_id(stored: str) -> str | None:
    """The event's id; None when `stored` is not an event (not a JSON object)."""
    try:
        event = json.loads(stored)
    except (ValueError, RecursionError):
        return None
    return str(event.get("id")) if isinstance(event, dict) else None


def _frames(texts: list[tuple[str, str]], conversation_id: str) -> list[Frame]:
    """The entries that are events, as frames; the others are logged and left out (the socket
    sends one event's JSON per frame, and the old feed stopped at such an entry for good)."""
    out: list[Frame] = []
    for sid, stored in texts:
        event_id = _event_id(stored)
        if event_id is None:
            log.warning("event_entry_not_an_event", conversation_id=conversation_id, stream_id=sid)
            continue
        out.append((sid, event_id, text_frame(stored)))
    return out


class _Backoff:
    def __init__(self) -> None:
        self.delay = RETRY_FIRST

    async def wait(self, what: str, conversation_id: str, exc: BaseException) -> None:
        raise_if_cancelled()
        log.warning(what, conversation_id=conversation_id, error=str(exc))
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, RETRY_MAX)

    def reset(self) -> None:
        self.delay = RETRY_FIRST


class Subscription:
    """One socket's view of a conversation's events from stream id `after` on."""

    def __init__(self, fanout: Fanout, channel: Channel, after: str) -> None:
        self._fanout = fanout
        self.channel = channel
        self.position = after
        """The stream id of the last event handed out."""
        self._queue: deque[Frame] = deque()
        self._woken = asyncio.Event()
        self._behind = True  # catch up from the store before following the queue
        self._seen: dict[str, None] = {}  # event ids handed out, insertion-ordered
        self.closed = False

    def offer(self, frames: list[Frame]) -> None:
        """New events from the channel (called on the loop, never blocks)."""
        if len(self._queue) + len(frames) > QUEUE_CAP:
            # Too slow to keep up: drop what is queued, read it from the store instead.
            self._queue.clear()
            if not self._behind:
                self._behind = True
                self._fanout.fell_behind += 1
        else:
            self._queue.extend(frames)
        self._woken.set()

    def wake(self) -> None:
        """Look at the channel again (it failed)."""
        self._woken.set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.clear()
            self._woken.set()
            self._fanout.leave(self)

    def _fresh(self, frame: Frame) -> bool:
        """Whether to hand `frame` out (and note it handed out)."""
        sid, event_id, _stored = frame
        if id_order(sid) <= id_order(self.position):
            return False  # read by the catch-up already
        self.position = sid
        if event_id in self._seen:
            return False
        self._seen[event_id] = None
        if len(self._seen) > REMEMBERED:
            del self._seen[next(iter(self._seen))]
        return True

    def _raise_if_failed(self) -> None:
        failed = self.channel.failed
        if failed is not None:
            raise FeedFailed(f"the conversation's event read failed: {failed!r}") from failed

    async def texts(self) -> AsyncIterator[str]:
        """The events' stored JSON, in order, one at a time: `batches`' frames' payloads."""
        async for batch in self.batches():
            for frame in batch:
                yield frame_text(frame)

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The events' WebSocket frames (events/frames.py: the stored JSON as the payload), in
        order, until the subscription is closed: each time everything there is to send now
        (what was queued, or a page of the catch-up), so that a socket writes it at once; the
        queued ones are the same bytes for every subscription of the channel. Raises
        FeedFailed when the channel fails, ConversationGone once the conversation was deleted
        (after what was queued), and what the catch-up's read raises that is not an outage."""
        await self.channel.ready.wait()
        backoff, conversation_id = _Backoff(), self.channel.conversation_id
        while not self.closed:
            self._raise_if_failed()
            if self._behind:
                # From here on the channel's events are queued; the store is read to its end.
                self._behind = False
                self._queue.clear()
                while not self.closed:
                    try:
                        page = await self._fanout.store.texts_after(
                            conversation_id, self.position, PAGE
                        )
                    except REDIS_DOWN as exc:
                        await backoff.wait("event_catch_up_retry", conversation_id, exc)
                        continue
                    backoff.reset()
                    fresh = [f[2] for f in _frames(page, conversation_id) if self._fresh(f)]
                    if page and id_order(page[-1][0]) > id_order(self.position):
                        self.position = page[-1][0]  # the page ended in entries left out
                    if fresh:
                        yield fresh
                    if len(page) < PAGE:
                        break
                continue
            if not self._queue:
                if self.channel.gone:
                    raise ConversationGone(self.channel.conversation_id)
                self._woken.clear()
                await self._woken.wait()
                continue
            queued, self._queue = self._queue, deque()
            fresh = [frame[2] for frame in queued if self._fresh(frame)]
            if fresh:
                yield fresh


class Channel:
    """The one read of a conversation's new events on this replica."""

    def __init__(self, fanout: Fanout, conversation_id: str) -> None:
        self._fanout = fanout
        self.conversation_id = conversation_id
        self.subscriptions: set[Subscription] = set()
        self.ready = asyncio.Event()
        """Set once the channel's start (the stream's newest id) is fixed, or it failed."""
        self.closed = False
        self.failed: Exception | None = None
        """What ended the read when it failed (not an outage: those are retried)."""
        self.gone = False
        """The conversation was deleted."""
        self.task = asyncio.create_task(self._run(), name=f"events:{conversation_id}")

    async def _run(self) -> None:
        try:
            await self._read()
        except Exception as exc:  # any failure ends the sockets: none is left hanging
            # The old per-socket read left its socket open with nothing more to come; here
            # every socket of the conversation (and each new one) would share that fate.
            log.error("event_channel_failed", conversation_id=self.conversation_id, error=repr(exc))
            self.failed = exc
            self._fanout.forget(self)
            self.ready.set()
            for subscription in list(self.subscriptions):
                subscription.wake()

    async def _read(self) -> None:
        store, conversation_id = self._fanout.store, self.conversation_id
        backoff = _Backoff()
        while True:
            try:
                cursor = await store.newest_id(conversation_id)
                break
            except REDIS_DOWN as exc:
                await backoff.wait("event_channel_retry", conversation_id, exc)
        self.ready.set()
        backoff.reset()
        wait_ms = block_ms(self._fanout.reader)
        # Asked after every read too: a cancellation that coincides with a socket timeout can
        # be lost inside redis-py on Python 3.11, and this ends the read then.
        while not self.closed:
            try:
                texts = await store.follow_texts(
                    self._fanout.reader, conversation_id, cursor, wait_ms
                )
            except REDIS_DOWN as exc:
                await backoff.wait("event_channel_retry", conversation_id, exc)
                continue
            backoff.reset()
            if not texts:
                # Quiet for a whole read: still there? (Deleted, it never gets another event.)
                try:
                    exists = await self._fanout.exists(conversation_id)
                except REDIS_DOWN as exc:
                    await backoff.wait("event_channel_retry", conversation_id, exc)
                    continue
                if not exists:
                    self.end_gone()
                    return
                continue
            cursor = texts[-1][0]
            # No repeat filter here: an event stored again after a failover is new to a
            # subscription that joined since (its catch-up read the new master), and each
            # subscription skips what it handed out itself.
            frames = _frames(texts, conversation_id)
            if not frames:
                continue
            for subscription in list(self.subscriptions):
                subscription.offer(frames)

    def end_gone(self) -> None:
        """The conversation was deleted: its subscriptions end once they have sent what was
        queued, and the next socket (if one gets past the conversation's check) reads anew."""
        log.info("event_channel_conversation_gone", conversation_id=self.conversation_id)
        self.gone = True
        self.closed = True
        self._fanout.forget(self)
        for subscription in list(self.subscriptions):
            subscription.wake()

    def close(self) -> None:
        self.closed = True
        self.task.cancel()


class Fanout:
    """The channels of this replica, one per watched conversation."""

    def __init__(
        self,
        store: EventStore,
        reader: aioredis.Redis,
        exists: Callable[[str], Awaitable[bool]],
    ) -> None:
        """`reader`: the client the channels block on (a connection of its own per read);
        `exists(conversation id)`: whether the conversation is still there (asked after a
        quiet read)."""
        self.store = store
        self.reader = reader
        self.exists = exists
        store.on_delete.append(self.deleted)
        self._channels: dict[str, Channel] = {}
        self.fell_behind = 0
        """How many times a socket's queue overflowed (it caught up from the store then)."""

    def subscribe(self, conversation_id: str, after: str) -> Subscription:
        """A subscription to the conversation's events after stream id `after` ("0": all);
        close it when done."""
        channel = self._channels.get(conversation_id)
        if channel is None:
            channel = self._channels[conversation_id] = Channel(self, conversation_id)
        subscription = Subscription(self, channel, after)
        channel.subscriptions.add(subscription)
        return subscription

    def leave(self, subscription: Subscription) -> None:
        channel = subscription.channel
        channel.subscriptions.discard(subscription)
        if not channel.subscriptions:
            channel.close()
            self.forget(channel)

    def deleted(self, conversation_id: str) -> None:
        """The conversation's events were deleted here: its sockets end now."""
        channel = self._channels.get(conversation_id)
        if channel is not None:
            channel.task.cancel()
            channel.end_gone()

    def forget(self, channel: Channel) -> None:
        """`channel` is no longer the conversation's (it ended, or failed)."""
        if self._channels.get(channel.conversation_id) is channel:
            del self._channels[channel.conversation_id]

    def watched(self) -> int:
        """Conversations with a channel (a reader connection each, while it blocks)."""
        return len(self._channels)

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            channel.close()
        for channel in channels:
            with contextlib.suppress(asyncio.CancelledError, *REDIS_DOWN):
                await channel.task
