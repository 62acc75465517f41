"""One Redis stream per conversation, a per-conversation set of event ids, and a global index
from event id to its place.

Appends go through a Lua script that skips event ids the conversation already stored, so a
webhook batch the agent retries after a timeout is never stored twice. Event ids come from
agents, which run code a model wrote: they are deduplicated per conversation only, and the
global index keeps the first conversation that stored an id, so one sandbox can neither hide
nor move another conversation's events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import redis.asyncio as aioredis
import structlog

from controlplane.api.ratelimit import HIT_FUNCTION, WINDOW_MS
from controlplane.crypto import hash_api_key
from controlplane.store import keyspace, text
from controlplane.store.streams import id_order

log = structlog.get_logger(__name__)

# Appends the pairs of event id and JSON in ARGV from `first` on to `stream`, each id once:
# `ids` is the conversation's hash of its ids, `index` the global one. An id in the global
# index under this conversation (stored before the per-conversation hash existed) counts as
# stored too. The new stream ids go into `out`.
_APPEND_FUNCTION = """
local function append(stream, ids, index, conversation, first, out)
  local mine = conversation .. ' '
  for i = first, #ARGV, 2 do
    local id = ARGV[i]
    local placed = redis.call('HGET', index, id)
    local legacy = placed and string.sub(placed, 1, #mine) == mine
    if redis.call('HEXISTS', ids, id) == 0 and not legacy then
      local sid = redis.call('XADD', stream, '*', 'e', ARGV[i + 1])
      redis.call('HSET', ids, id, sid)
      redis.call('HSETNX', index, id, mine .. sid)
      table.insert(out, sid)
    end
  end
end
"""

# KEYS: stream, the conversation's id hash, the global index. ARGV: conversation id, then pairs
# of event id and JSON.
_APPEND = (
    _APPEND_FUNCTION
    + """
local out = {}
append(KEYS[1], KEYS[2], KEYS[3], ARGV[1], 2, out)
return out
"""
)

# A webhook's batch in one round trip, every check in the order the middleware made them:
# the session key (KEYS[1]: the sandbox id for its hash; Lua compares interned strings by
# pointer, so the comparison takes the same time whatever the id), the per-sandbox rate count
# (KEYS[2]; ARGV[2] '' = no limit), the conversation (KEYS[3]: its record names this sandbox;
# pcall: an id from the path can name another key of the conversation, a hash, see keyspace),
# the append (KEYS[4..6], as _APPEND) and the sandbox's activity (KEYS[7]; ARGV[4] '' = not
# now). ARGV: sandbox id, the window in ms, the limit, the touch time, the conversation id,
# then pairs of event id and JSON. Replies: {'key'}, {'rate', count, ttl ms}, {'none'} (not
# this sandbox's conversation: nothing stored), or {'ok', the record, stream ids added...}.
_INGEST = (
    HIT_FUNCTION
    + _APPEND_FUNCTION
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'key'} end
if ARGV[2] ~= '' then
  local counted = hit(KEYS[2], ARGV[2])
  if counted[1] > tonumber(ARGV[3]) then return {'rate', counted[1], counted[2]} end
end
local record = redis.pcall('GET', KEYS[3])
if type(record) ~= 'string' then return {'none'} end
local ok, info = pcall(cjson.decode, record)
if not ok or type(info) ~= 'table' or info['sandbox_id'] ~= ARGV[1] then return {'none'} end
local out = {'ok', record}
append(KEYS[4], KEYS[5], KEYS[6], ARGV[5], 6, out)
if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[7]) == 1 then
  redis.call('HSET', KEYS[7], 'last_activity_at', ARGV[4])
end
return out
"""
)

# KEYS: stream, the conversation's id hash, the global index. ARGV: conversation id, then the
# event ids of the stream. Only index entries that point into this conversation are removed.
_DELETE = """
local mine = ARGV[1] .. ' '
for i = 2, #ARGV do
  local placed = redis.call('HGET', KEYS[3], ARGV[i])
  if placed and string.sub(placed, 1, #mine) == mine then redis.call('HDEL', KEYS[3], ARGV[i]) end
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""


class Ingested(NamedTuple):
    """What `EventStore.ingest` found: `refused` 'key' (not this sandbox's session key), 'rate'
    (over its limit: `rate` is the limiter's reply), 'none' (not a conversation of this sandbox:
    nothing stored), else '' with the conversation's record (its JSON) and how many were new."""

    refused: str
    record: str = ""
    added: int = 0
    rate: tuple[int, int] = (0, 0)


StoredEvent = tuple[str, dict[str, Any]]
"""(stream id, event)"""

StoredText = tuple[str, str]
"""(stream id, the event's JSON as stored): what a live socket sends as it is."""

REWOUND_BY = "rewound_by"
"""The field a search adds to an event that a rewind superseded: that rewind's checkpoint."""


class Page(NamedTuple):
    """A read of a stream's entries: the events among them, how many entries were read (events
    or not) and the stream id of the last one (None: none), where the next read starts."""

    events: list[StoredEvent]
    read: int
    last: str | None


def _event(fields: dict[Any, Any]) -> dict[str, Any] | None:
    """The entry's event: the JSON object in its `e` field; None when it has none."""
    raw = fields.get(b"e") if b"e" in fields else fields.get("e")
    if raw is None:
        return None
    try:
        event = json.loads(text(raw))
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) else None


def _decode(entries: list[Any], conversation_id: str) -> list[StoredEvent]:
    """The entries that are events, decoded. The others (only a hand, a script or another
    program writing to the stream makes them: the webhook stores checked events) are logged
    and left out, as the live socket leaves them out (events/fanout.py): every reader of a
    conversation's history answers its events, never a 500 for an entry that is none."""
    out: list[StoredEvent] = []
    for sid, fields in entries:
        event = _event(fields)
        if event is None:
            log.warning(
                "event_entry_not_an_event", conversation_id=conversation_id, stream_id=text(sid)
            )
            continue
        out.append((text(sid), event))
    return out


def _texts(entries: list[Any]) -> list[StoredText]:
    out: list[StoredText] = []
    for sid, fields in entries:
        raw = fields.get(b"e") if b"e" in fields else fields.get("e")
        out.append((text(sid), text(raw)))
    return out


class EventStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._append = redis.register_script(_APPEND)
        self._delete = redis.register_script(_DELETE)
        self._ingest = redis.register_script(_INGEST)
        self.on_delete: list[Callable[[str], None]] = []
        """Told each conversation id whose events `delete` dropped (the live sockets' fanout)."""

    async def ingest(
        self,
        sandbox_id: str,
        session_key: str,
        conversation_id: str,
        events: list[dict[str, Any]],
        *,
        limit: int | None,
        touch_at: str | None,
    ) -> Ingested:
        """A webhook's batch in one round trip (_INGEST): the sandbox's session key checked (never
        remembered: a deleted sandbox's key fails at its next post), one request counted against
        `limit` a minute (None: no limit), the conversation's record read and checked to be this
        sandbox's, the events appended as `append` does, and the sandbox's activity set to
        `touch_at` (None: not this time)."""
        args: list[str | int] = [
            sandbox_id,
            WINDOW_MS if limit is not None else "",
            limit or 0,
            touch_at or "",
            conversation_id,
        ]
        for event in events:
            args += [str(event["id"]), json.dumps(event, separators=(",", ":"))]
        reply: Any = await self._ingest(
            keys=[
                keyspace.sandbox_by_key(hash_api_key(session_key)),
                keyspace.rate_limit(f"sandbox:{sandbox_id}"),
                keyspace.conversation(conversation_id),
                keyspace.events(conversation_id),
                keyspace.event_ids(conversation_id),
                keyspace.EVENT_INDEX,
                keyspace.sandbox(sandbox_id),
            ],
            args=args,
        )
        verdict = text(reply[0])
        if verdict == "rate":
            return Ingested("rate", rate=(int(reply[1]), int(reply[2])))
        if verdict != "ok":
            return Ingested(verdict)
        return Ingested("", text(reply[1]), len(reply) - 2)

    async def append(self, conversation_id: str, events: list[dict[str, Any]]) -> int:
        """Store events in order, skipping ids already stored; returns how many were new."""
        args: list[str] = [conversation_id]
        for event in events:
            args += [str(event["id"]), json.dumps(event, separators=(",", ":"))]
        added = await self._append(
            keys=[
                keyspace.events(conversation_id),
                keyspace.event_ids(conversation_id),
                keyspace.EVENT_INDEX,
            ],
            args=args,
        )
        return len(added)

    async def page(self, conversation_id: str, after: str | None, count: int, desc: bool) -> Page:
        """Up to `count` entries after stream id `after` (None: from the first, or the last
        when `desc`); the events among them. Fewer than `count` read: the stream's end."""
        key = keyspace.events(conversation_id)
        entries: Any
        if desc:
            entries = await self._redis.xrevrange(key, f"({after}" if after else "+", "-", count)
        else:
            entries = await self._redis.xrange(key, f"({after}" if after else "-", "+", count)
        last = text(entries[-1][0]) if entries else None
        return Page(_decode(entries, conversation_id), len(entries), last)

    async def texts_after(self, conversation_id: str, after: str, count: int) -> list[StoredText]:
        """Up to `count` events after stream id `after` ("0": from the first), as stored."""
        entries: Any = await self._redis.xrange(
            keyspace.events(conversation_id), "-" if after == "0" else f"({after}", "+", count
        )
        return _texts(entries)

    async def newest_id(self, conversation_id: str) -> str:
        """The stream id of the conversation's last stored event ("0": none yet)."""
        entries: Any = await self._redis.xrevrange(keyspace.events(conversation_id), "+", "-", 1)
        return text(entries[0][0]) if entries else "0"

    async def count(self, conversation_id: str) -> int:
        return int(await self._redis.xlen(keyspace.events(conversation_id)))

    async def locate(self, event_ids: list[str]) -> list[tuple[str, str] | None]:
        """(conversation id, stream id) for each event id, None when unknown."""
        if not event_ids:
            return []
        rows = await self._redis.hmget(keyspace.EVENT_INDEX, event_ids)
        out: list[tuple[str, str] | None] = []
        for row in rows:
            if row is None:
                out.append(None)
            else:
                conv, _, sid = text(row).partition(" ")
                out.append((conv, sid))
        return out

    async def get_at(self, conversation_id: str, stream_id: str) -> dict[str, Any] | None:
        entries: Any = await self._redis.xrange(
            keyspace.events(conversation_id), stream_id, stream_id, 1
        )
        decoded = _decode(entries, conversation_id)
        return decoded[0][1] if decoded else None

    async def follow_texts(
        self, reader: aioredis.Redis, conversation_id: str, last: str, block_ms: int
    ) -> list[StoredText]:
        """Events after `last` ("0" for all) as stored (not decoded), waiting up to block_ms
        for the first one. `reader` must be a connection of its own: a blocking read holds
        it."""
        reply: Any = await reader.xread(
            {keyspace.events(conversation_id): last}, count=500, block=block_ms
        )
        return _texts(reply[0][1]) if reply else []

    async def newest(self, conversation_id: str) -> StoredEvent | None:
        """The conversation's last stored event (past entries that are not events)."""
        after: str | None = None
        while True:
            page = await self.page(conversation_id, after, 1 if after is None else 100, True)
            if page.events:
                return page.events[0]
            if page.last is None:
                return None
            after = page.last

    async def mark_rewound(self, conversation_id: str, after: str, checkpoint_id: str) -> int:
        """Record that a rewind to `checkpoint_id` superseded every event stored after stream
        id `after` ("0": all) up to now; the events stay. How many it covers."""
        newest = await self.newest_id(conversation_id)
        if newest == "0" or id_order(newest) <= id_order(after):
            return 0
        entries: Any = await self._redis.xrange(keyspace.events(conversation_id), f"({after}", "+")
        covered = len(_decode(entries, conversation_id))
        mark = {"after": after, "upto": newest, "checkpoint": checkpoint_id, "at": time.time()}
        await self._redis.rpush(keyspace.events_rewound(conversation_id), json.dumps(mark))
        return covered

    async def rewound(self, conversation_id: str) -> list[dict[str, Any]]:
        """The rewinds' marks of the conversation, oldest first."""
        rows = await self._redis.lrange(keyspace.events_rewound(conversation_id), 0, -1)
        return [json.loads(text(row)) for row in rows]

    @staticmethod
    def marked(stored: list[StoredEvent], marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events, each a rewind superseded carrying `rewound_by` (the first such rewind's
        checkpoint); copies, the stored ones unchanged."""
        out: list[dict[str, Any]] = []
        for sid, event in stored:
            at = id_order(sid)
            by = next(
                (
                    m["checkpoint"]
                    for m in marks
                    if id_order(m["after"]) < at <= id_order(m["upto"])
                ),
                None,
            )
            out.append(event if by is None else {**event, REWOUND_BY: by})
        return out

    async def copy(self, source: str, target: str, upto: str | None) -> int:
        """The history of `source` at stream id `upto` (None: none) appended to `target` as
        stored (a fork's): its events up to there, less those a rewind made before that point
        had superseded; how many."""
        if upto is None:
            return 0
        end = id_order(upto)
        earlier = [m for m in await self.rewound(source) if id_order(m["upto"]) <= end]
        copied, cursor = 0, "-"
        while True:
            entries: Any = await self._redis.xrange(keyspace.events(source), cursor, upto, 500)
            if not entries:
                return copied
            batch = _decode(entries, source)
            kept = [e for e in self.marked(batch, earlier) if REWOUND_BY not in e]
            copied += await self.append(target, kept)
            cursor = f"({text(entries[-1][0])}"

    async def delete(self, conversation_id: str) -> None:
        await self._redis.delete(keyspace.events_rewound(conversation_id))
        key = keyspace.events(conversation_id)
        ids: list[str] = []
        cursor = "-"
        while True:
            batch = await self._redis.xrange(key, cursor, "+", 1000)
            if not batch:
                break
            ids += [str(event["id"]) for _sid, event in _decode(batch, conversation_id)]
            cursor = f"({text(batch[-1][0])}"
        await self._delete(
            keys=[key, keyspace.event_ids(conversation_id), keyspace.EVENT_INDEX],
            args=[conversation_id, *ids],
        )
        for told in self.on_delete:
            told(conversation_id)
