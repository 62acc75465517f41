"""Entries a Redis write adds to streams in the same step (a Lua script, or a pipeline), so that
the change and its record in the streams are stored together or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StreamEntry:
    """`{"e": body}` added to every stream of `streams`: (key, approximate maximum length, or
    None for no trimming)."""

    body: str
    streams: tuple[tuple[str, int | None], ...]

    def script_args(self) -> tuple[list[str], list[str]]:
        """(KEYS, ARGV) for `append_entry` below: the stream keys, then the body and each
        stream's maximum length ('' for none)."""
        keys = [key for key, _ in self.streams]
        args = [self.body, *("" if limit is None else str(limit) for _, limit in self.streams)]
        return keys, args

    def queue(self, pipe: Any) -> None:
        """The same additions queued on a pipeline (or MULTI) the caller executes."""
        for key, limit in self.streams:
            pipe.xadd(key, {"e": self.body}, maxlen=limit, approximate=limit is not None)


APPEND_ENTRY = """
-- XADD `body` to each of the streams KEYS[first_key..], their maximum lengths in
-- ARGV[first_arg + 1..] ('' for none), the body at ARGV[first_arg].
local function append_entry(first_key, first_arg)
  local body = ARGV[first_arg]
  for i = first_key, #KEYS do
    local limit = ARGV[first_arg + 1 + i - first_key]
    if limit == '' then
      redis.call('XADD', KEYS[i], '*', 'e', body)
    else
      redis.call('XADD', KEYS[i], 'MAXLEN', '~', limit, '*', 'e', body)
    end
  end
end
"""
