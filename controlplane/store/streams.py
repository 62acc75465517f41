"""Entries a Redis write adds to streams in the same step (a Lua script, or a MULTI), so that the
change and its records in the streams are stored together or not at all.

An entry is one or more groups of additions. Each addition puts fields into one stream, trimmed
by length (`maxlen`) or by age (`minid`, a Unix time in milliseconds), and may renew the
stream's expiry (`ttl_ms`: an index nobody adds to any more goes away by itself). Within a group,
an addition marked `same_id` takes the id Redis gave the group's first one: an index entry
that names its record by sharing its id (how the audit log's indexes were written before its
indexer, store/audit_index.py, wrote them; tests/audit/test_org_index_backfill.py writes such
entries as an older version did).
A lifecycle event and the request's audit entry made by one change are two groups of one entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

LATE_ID = "\x00"
"""Stands, in an entry's fields and stream names, for an id the script chooses as it runs (a
warm pool claim picks its sandbox there): `append_entry`'s `late` replaces it."""


class StreamAdd(NamedTuple):
    """One addition (a named tuple, not a frozen dataclass: an audit entry makes eight or so
    per request, and a tuple is made several times faster)."""

    key: str
    fields: tuple[str, ...]
    """Field, value, field, value, …"""
    maxlen: int | None = None
    """Trim to about this many entries."""
    minid: int | None = None
    """Trim the entries older than this (Unix milliseconds), about; never with `maxlen`."""
    ttl_ms: int | None = None
    """Expire the stream this long after this addition."""
    same_id: bool = False
    """The id of its group's first addition (never the first itself)."""
    lex_index: bool = False
    """With `same_id`: a sorted set instead of a stream, holding that id as a member of score 0,
    zero-padded so that members sort by it (`lex_member`); `minid` trims it too. For indexes
    that stay small: a stream costs about 4 kB however few entries it holds (Redis allocates
    its first node whole), a small sorted set some 30 bytes an entry."""


@dataclass(frozen=True)
class StreamEntry:
    groups: tuple[tuple[StreamAdd, ...], ...]
    on_stored: tuple[Callable[[], None], ...] = field(default=(), compare=False)
    """Called by `stored`: whoever made a group learns that it is in Redis."""

    def __add__(self, other: StreamEntry) -> StreamEntry:
        return StreamEntry(self.groups + other.groups, self.on_stored + other.on_stored)

    def script_args(self) -> tuple[list[str], list[str]]:
        """(KEYS, ARGV) for `append_entry` below: every addition's stream, then one argument,
        the groups in JSON (`[[[kind, maxlen, minid, ttl, [field, value, …]], …], …]`). One
        argument, not one per field: redis-py packs a command by copying what it packed so far
        at each argument, so behind a script's text 90 arguments cost more than the script's
        work; Redis's Lua decodes the JSON in C (cjson)."""
        keys: list[str] = []
        groups: list[list[tuple[str, str, str, str, tuple[str, ...]]]] = []
        for group in self.groups:
            adds = []
            for add in group:
                keys.append(add.key)
                adds.append(
                    (
                        ("z" if add.lex_index else "1") if add.same_id else "",
                        "" if add.maxlen is None else str(add.maxlen),
                        "" if add.minid is None else str(add.minid),
                        "" if add.ttl_ms is None else str(add.ttl_ms),
                        add.fields,
                    )
                )
            groups.append(adds)
        return keys, [_JSON(groups)]

    def queue(self, pipe: Any) -> None:
        """The same additions queued on a pipeline (or MULTI) the caller executes: plain XADDs,
        or the script for a group whose indexes share its first addition's id."""
        for group in self.groups:
            if any(add.same_id for add in group):
                keys, args = StreamEntry((group,)).script_args()
                pipe.eval(APPEND_SCRIPT, len(keys), *keys, *args)
                continue
            for add in group:
                pairs = dict(zip(add.fields[::2], add.fields[1::2], strict=True))
                if add.minid is not None:
                    pipe.xadd(add.key, pairs, minid=add.minid, approximate=True)
                else:
                    pipe.xadd(add.key, pairs, maxlen=add.maxlen, approximate=add.maxlen is not None)
                if add.ttl_ms is not None:
                    pipe.pexpire(add.key, add.ttl_ms)

    def stored(self) -> None:
        """The write that carried this entry succeeded (and added it)."""
        for hook in self.on_stored:
            hook()


def join(*entries: StreamEntry | None) -> StreamEntry | None:
    """The entries as one (None when there are none)."""
    present = [e for e in entries if e is not None]
    if not present:
        return None
    joined = present[0]
    for entry in present[1:]:
        joined = joined + entry
    return joined


def script_args(entry: StreamEntry | None) -> tuple[list[str], list[str]]:
    """`entry.script_args()`, or the arguments of no entry at all."""
    return entry.script_args() if entry is not None else ([], ["[]"])


def stored(entry: StreamEntry | None) -> None:
    if entry is not None:
        entry.stored()


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
"""json's C encoder (NUL, as LATE_ID, comes out as \\u0000 and cjson decodes it back)."""


APPEND_ENTRY_SOURCE = """
-- The additions of an entry (controlplane/store/streams.py): their streams are KEYS[first_key..],
-- the groups the JSON in ARGV[first_arg]. `late` (optional) replaces every NUL in names and
-- fields: an id (a string), or a function of the text.
local function append_entry(first_key, first_arg, late)
  if type(late) == 'string' then
    local id = late
    late = function(s) return (string.gsub(s, '%z', id)) end
  end
  local k = first_key
  for _, group in ipairs(cjson.decode(ARGV[first_arg])) do
    local first_id, member = nil, nil
    for _, add in ipairs(group) do
      local same, maxlen, minid, ttl, fields = add[1], add[2], add[3], add[4], add[5]
      local key = KEYS[k]
      if late then
        key = late(key)
        for i = 1, #fields do fields[i] = late(fields[i]) end
      end
      if same == 'z' then
        -- A sorted-set index: the id, its sequence zero-padded (lex_member), trimmed by age.
        if member == nil then
          local ms, seq = string.match(first_id, '^(%d+)-(%d+)$')
          member = ms .. '-' .. string.rep('0', 10 - #seq) .. seq
        end
        redis.pcall('ZADD', key, 0, member)
        if minid ~= '' then redis.pcall('ZREMRANGEBYLEX', key, '-', '(' .. minid) end
      elseif same == '1' then
        -- An index: its failure (it cannot, short of a clock gone back past a whole stream's
        -- life) must not undo what the script changed before it; the record stands.
        if maxlen ~= '' then
          redis.pcall('XADD', key, 'MAXLEN', '~', maxlen, first_id, unpack(fields))
        elseif minid ~= '' then
          redis.pcall('XADD', key, 'MINID', '~', minid, first_id, unpack(fields))
        else
          redis.pcall('XADD', key, first_id, unpack(fields))
        end
      else
        local id
        if maxlen ~= '' then
          id = redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
        elseif minid ~= '' then
          id = redis.call('XADD', key, 'MINID', '~', minid, '*', unpack(fields))
        else
          id = redis.call('XADD', key, '*', unpack(fields))
        end
        if first_id == nil then first_id = id end
      end
      if ttl ~= '' then redis.call('PEXPIRE', key, ttl) end
      k = k + 1
    end
  end
end
"""
"""The source, with its comments (APPEND_ENTRY is what the scripts send)."""


def compact(lua: str) -> str:
    """Lua source without its comment lines and indentation: every EVAL sends its script's
    text, which redis-py packs and Redis hashes (SHA1) at each call."""
    kept = (line.strip() for line in lua.splitlines())
    return "\n".join(line for line in kept if line and not line.startswith("--")) + "\n"


APPEND_ENTRY = compact(APPEND_ENTRY_SOURCE)
"""`append_entry` as the scripts that write entries embed it (compact: no comments)."""

APPEND_SCRIPT = APPEND_ENTRY + "\nappend_entry(1, 1)\nreturn 1\n"
"""An entry alone (inside a MULTI, or on its own)."""


def lex_member(stream_id: str) -> str:
    """A stream id as a sorted-set index holds it: `<ms>-<seq, 10 digits>`, so that members of
    score 0 sort as the ids do (milliseconds have 13 digits until the year 2286)."""
    ms, _, seq = stream_id.partition("-")
    return f"{ms}-{int(seq or 0):010d}"


def id_order(stream_id: str) -> tuple[int, int]:
    """A stream id as (milliseconds, sequence): what compares as Redis orders ids."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def stream_id_of(member: str) -> str:
    """The stream id a sorted-set index member stands for."""
    ms, _, seq = member.partition("-")
    return f"{ms}-{int(seq)}"


def flat(fields: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """[(name, value), …] as the flat tuple of StreamAdd.fields."""
    return tuple(item for pair in fields for item in pair)
