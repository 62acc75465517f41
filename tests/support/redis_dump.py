"""Everything one Redis holds, as bytes: where the tests look for a secret kept in the clear."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from controlplane.store import text


def _raw(value: Any) -> bytes:
    """A Redis reply as bytes, whatever the client's decode setting."""
    return value if isinstance(value, bytes) else str(value).encode()


async def dump_redis(redis: aioredis.Redis) -> bytes:
    """Every key and every value, whatever the type; a type this does not read fails the test
    (a new kind of record must be searched too)."""
    out = bytearray()
    async for name in redis.scan_iter(count=500):
        out += _raw(name) + b"\n"
        kind = text(await redis.type(name))
        if kind == "string":
            out += _raw(await redis.get(name) or b"")
        elif kind == "hash":
            for field, value in (await redis.hgetall(name)).items():
                out += _raw(field) + b"=" + _raw(value) + b"\n"
        elif kind == "zset":
            for member in await redis.zrange(name, 0, -1):
                out += _raw(member) + b"\n"
        elif kind == "set":
            for member in await redis.smembers(name):
                out += _raw(member) + b"\n"
        elif kind == "list":
            for item in await redis.lrange(name, 0, -1):
                out += _raw(item) + b"\n"
        else:
            raise AssertionError(f"no dump for Redis type {kind} ({name!r})")
    return bytes(out)
