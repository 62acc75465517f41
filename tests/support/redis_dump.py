"""Everything one Redis holds, as bytes: where the tests look for a secret kept in the clear."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane.store import text


def _raw(value: Any) -> bytes:
    """A Redis reply as bytes, whatever the client's decode setting."""
    return value if isinstance(value, bytes) else str(value).encode()


async def _members(redis: aioredis.Redis, name: Any, kind: str) -> list[Any]:
    """What a key of `kind` holds, flattened; a kind this does not read fails the test (a new
    kind of record must be searched too)."""
    if kind == "string":
        return [await redis.get(name) or b""]
    if kind == "hash":
        return [part for pair in (await redis.hgetall(name)).items() for part in pair]
    if kind == "zset":
        return list(await redis.zrange(name, 0, -1))
    if kind == "set":
        return list(await redis.smembers(name))
    if kind == "list":
        return list(await redis.lrange(name, 0, -1))
    if kind == "stream":  # the audit log, the webhook outboxes
        out: list[Any] = []
        for entry_id, fields in await redis.xrange(name, "-", "+") or []:
            out.append(entry_id)
            out += [part for pair in (fields or {}).items() for part in pair]
        return out
    raise AssertionError(f"no dump for Redis type {kind} ({name!r})")


async def dump_redis(redis: aioredis.Redis) -> bytes:
    """Every key and every value, whatever the type."""
    out = bytearray()
    async for name in redis.scan_iter(count=500):
        out += _raw(name) + b"\n"
        for member in await _members(redis, name, text(await redis.type(name))):
            out += _raw(member) + b"\n"
    return bytes(out)
