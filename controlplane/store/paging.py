"""Cursor paging over lexically ordered sorted sets (members score 0, time-ordered ids) and
over sorted sets scored by a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis

from controlplane.store import text


async def page_ids(
    redis: aioredis.Redis, key: str, after: str | None, count: int, *, desc: bool = True
) -> list[str]:
    """Up to `count` ids past `after` (exclusive): older ones when desc, newer ones otherwise."""
    if desc:
        raw = await redis.zrange(
            key, f"({after}" if after else "+", "-", desc=True, bylex=True, offset=0, num=count
        )
    else:
        raw = await redis.zrange(
            key, f"({after}" if after else "-", "+", bylex=True, offset=0, num=count
        )
    return [text(i) for i in raw]


# KEYS[1]: the sorted set of the records that exist; KEYS[2..]: indexes of them. Drops from each
# index every id the first does not hold (a record deleted by a writer that did not know the
# index). Used where an index found out of step is rebuilt.
DROP_STRAYS = """
local dropped = 0
for k = 2, #KEYS do
  for _, id in ipairs(redis.call('ZRANGE', KEYS[k], 0, -1)) do
    if not redis.call('ZSCORE', KEYS[1], id) then
      dropped = dropped + redis.call('ZREM', KEYS[k], id)
    end
  end
end
return dropped
"""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(at: datetime) -> int:
    """A time as a sorted set's score: whole microseconds since the epoch (exact in a sorted
    set's double until the year 2255); a time without a zone is UTC, as the records write it."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - _EPOCH) // timedelta(microseconds=1)


# KEYS: an index scored by time. ARGV: where to start and end (ZRANGE BYSCORE bounds, in the
# order's direction), the last page's score and id ('' for none: from the start), count, '1'
# for the highest first. Up to `count` (id, score) pairs within the bounds past that one in
# (score, id) order: members of equal score are in id order, so those up to it are skipped.
PAGE_IN_RANGE = """
local from, to, id, n, desc = ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1'
local score = tonumber(ARGV[3])
local out, offset = {}, 0
while #out < 2 * n do
  local rows
  if desc then
    rows = redis.call('ZRANGE', KEYS[1], from, to, 'BYSCORE', 'REV', 'LIMIT', offset, n,
      'WITHSCORES')
  else
    rows = redis.call('ZRANGE', KEYS[1], from, to, 'BYSCORE', 'LIMIT', offset, n, 'WITHSCORES')
  end
  if #rows == 0 then break end
  for i = 1, #rows, 2 do
    local past = score == nil or tonumber(rows[i + 1]) ~= score
      or (desc and rows[i] < id) or ((not desc) and rows[i] > id)
    if past and #out < 2 * n then
      out[#out + 1] = rows[i]
      out[#out + 1] = rows[i + 1]
    end
  end
  offset = offset + #rows / 2
end
return out
"""


async def page_by_score(
    redis: aioredis.Redis,
    page: Any,
    key: str,
    after: tuple[int, str] | None,
    *,
    count: int,
    desc: bool,
    low: str = "-inf",
    high: str = "+inf",
) -> list[tuple[str, int]]:
    """Up to `count` (id, score) of the index `key` within the ZRANGE BYSCORE bounds `low` and
    `high`, past `after` (a score and id, exclusive) in (score, id) order: the highest first
    when desc. `page`: PAGE_IN_RANGE as registered (the first page is a plain ZRANGE)."""
    start, end = (high, low) if desc else (low, high)
    if after is None:
        rows: Any = await redis.zrange(
            key, start, end, desc=desc, byscore=True, offset=0, num=count, withscores=True
        )
        return [(text(m), int(score)) for m, score in rows]
    # From the cursor's score (within the bounds), its ties up to its id skipped.
    order = "1" if desc else "0"
    flat = await page(keys=[key], args=[str(after[0]), end, after[0], after[1], count, order])
    return [(text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]
