"""Cursor paging over lexically ordered sorted sets (members score 0, time-ordered ids)."""

from __future__ import annotations

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
