"""The gate of anonymous failures (a failed sign-in nobody authenticated): anyone on the network
can send them, so without a bound each would be an entry and Redis's memory the attacker's.

Per window of ACS_AUDIT_ANONYMOUS_WINDOW seconds (fixed windows, shared by every replica through
Redis) a **source** writes at most ACS_AUDIT_ANONYMOUS_PER_SOURCE entries and everyone together
at most ACS_AUDIT_ANONYMOUS_PER_WINDOW: past either, the entry is not written but counted (and
its source added to a HyperLogLog), and once the window is over **one summary entry**
(`audit.dropped`, details `dropped`, `sources`, `window_start`, `window_s`) says how many were
left out and from how many sources. So the log holds at most PER_WINDOW + 1 anonymous entries a
window, whatever the traffic.

A source is the client's address; an IPv6 address counts by its /64 (what one host or one
customer is given: a single machine may use any of its 2**64 addresses), an IPv4 address (and
an IPv4-mapped IPv6 one) by itself. The check and the entry are one Lua script (an entry that
passed is written, a dropped one counted, never both or neither), and the summary's count is
read and cleared by the script that writes the summary: a kill between two steps loses nothing.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from controlplane.store import keyspace, text
from controlplane.store.audit_event import AuditRecord
from controlplane.store.streams import APPEND_ENTRY, StreamAdd, StreamEntry

DROPPED_ACTION = "audit.dropped"
_COUNT, _SOURCES = "\x00", "\x01"
"""Stand, in the summary's fields, for the counts its script reads as it writes it."""
_DROPPED_TTL_MS = 7 * 86400 * 1000
"""How long a window's dropped count waits for its summary (every replica writes the summaries
due at each window's end: only a deployment stopped for a week loses one)."""

# KEYS: source, all, dropped, sources, pending, then the entry's streams; ARGV: per-source cap,
# window cap, window ms, source, window, then the entry's groups.
_GATE = (
    APPEND_ENTRY
    + """
local function counted(key, ttl)
  local n = redis.call('INCR', key)
  if n == 1 then redis.call('PEXPIRE', key, ttl) end
  return n
end
if counted(KEYS[1], ARGV[3]) <= tonumber(ARGV[1])
    and counted(KEYS[2], ARGV[3]) <= tonumber(ARGV[2]) then
  append_entry(6, 6)
  return 1
end
redis.call('INCR', KEYS[3])
redis.call('PFADD', KEYS[4], ARGV[4])
redis.call('PEXPIRE', KEYS[3], DROPPED_TTL_MS)
redis.call('PEXPIRE', KEYS[4], DROPPED_TTL_MS)
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[5])
return 0
"""
).replace("DROPPED_TTL_MS", str(_DROPPED_TTL_MS))

# KEYS: dropped, sources, pending, then the summary's streams; ARGV: window, then its groups.
_SUMMARY = (
    APPEND_ENTRY
    + """
local dropped = redis.call('GET', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if not dropped then return 0 end
local sources = tostring(redis.call('PFCOUNT', KEYS[2]))
append_entry(4, 2, function(s)
  return (string.gsub(string.gsub(s, '%z', dropped), '\\1', sources))
end)
redis.call('DEL', KEYS[1], KEYS[2])
return tonumber(dropped)
"""
)


def source_of(ip: str | None) -> str:
    """The source an address counts as: an IPv6 address's /64, an IPv4 address itself."""
    if not ip:
        return "unknown"
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(address), 64), strict=False))
    return str(address)


@dataclass(frozen=True)
class AnonymousLimits:
    per_source: int
    per_window: int
    window: float
    """Seconds."""


class AnonymousGate:
    def __init__(
        self,
        redis: aioredis.Redis,
        limits: AnonymousLimits,
        adds: Callable[[AuditRecord], tuple[StreamAdd, ...]],
    ) -> None:
        """`adds`: how the audit log stores a record (AuditLog.adds)."""
        self.limits = limits
        self._redis = redis
        self._adds = adds
        self._window_ms = max(int(limits.window * 1000), 1)
        self._gate = redis.register_script(_GATE)
        self._summary = redis.register_script(_SUMMARY)

    def _window(self, now_ms: int) -> int:
        return now_ms // self._window_ms

    async def write(self, entry: StreamEntry, ip: str | None) -> bool:
        """Write `entry` (an anonymous failure) if its source and the window have room, else
        count it for the window's summary. True: written. Then writes the summaries due."""
        now_ms = int(time.time() * 1000)
        window = self._window(now_ms)
        source = source_of(ip)
        stream_keys, entry_args = entry.script_args()
        written = await self._gate(
            keys=[
                keyspace.audit_anonymous(window, "src:" + source),
                keyspace.audit_anonymous(window, "all"),
                keyspace.audit_anonymous(window, "dropped"),
                keyspace.audit_anonymous(window, "sources"),
                keyspace.AUDIT_ANONYMOUS_PENDING,
                *stream_keys,
            ],
            args=[
                self.limits.per_source,
                self.limits.per_window,
                self._window_ms,
                source,
                window,
                *entry_args,
            ],
        )
        if written:
            entry.stored()
        await self.summarize(now_ms)
        return bool(written)

    async def summarize(self, now_ms: int | None = None) -> int:
        """Write the summary entry of every window over with dropped entries (each once, by
        whichever replica comes first). Returns how many entries they count."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        due = await self._redis.zrangebyscore(
            keyspace.AUDIT_ANONYMOUS_PENDING, "-inf", f"({self._window(now_ms)}"
        )
        total = 0
        for raw in due:
            window = int(text(raw))
            summary = StreamEntry((self._summary_adds(window, now_ms),))
            stream_keys, entry_args = summary.script_args()
            total += int(
                await self._summary(
                    keys=[
                        keyspace.audit_anonymous(window, "dropped"),
                        keyspace.audit_anonymous(window, "sources"),
                        keyspace.AUDIT_ANONYMOUS_PENDING,
                        *stream_keys,
                    ],
                    args=[window, *entry_args],
                )
            )
        return total

    def _summary_adds(self, window: int, now_ms: int) -> tuple[StreamAdd, ...]:
        start = datetime.fromtimestamp(window * self._window_ms / 1000, UTC)
        record = AuditRecord(
            id=f"{now_ms:012x}{secrets.token_hex(4)}",
            time_ms=now_ms,
            action=DROPPED_ACTION,
            outcome="failure",
            user_id=None,
            key_id=None,
            via="system",
            admin=False,
            org_id=None,
            role=None,
            reason="anonymous_failures_limited",
            details={
                "dropped": _COUNT,
                "sources": _SOURCES,
                "window_start": start.isoformat(),
                "window_s": f"{self.limits.window:g}",
            },
        )
        # JSON writes the stand-ins as escapes: back to the bytes the script replaces.
        return tuple(
            add._replace(
                fields=tuple(
                    f.replace("\\u0000", _COUNT).replace("\\u0001", _SOURCES) for f in add.fields
                ),
            )
            for add in self._adds(record)
        )
