"""A read-only Lua script, called by its hash as EVALSHA_RO.

redis-py's `Script` sends EVALSHA, which store/durable.py must count as a write (a script may
write): inside a request that changes something it would then wait for the replicas. A script
that only reads is sent as EVALSHA_RO, which never waits, wherever it is called; Redis itself
refuses a write from it. Loaded once per server (a new or flushed one answers NOSCRIPT), then
called by its hash."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError


class ReadScript:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(
        self, redis: aioredis.Redis, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """The script's reply for `keys` (KEYS) and `args` (ARGV)."""
        try:
            return await redis.evalsha_ro(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(self.source)
            return await redis.evalsha_ro(self.sha, len(keys), *keys, *args)
