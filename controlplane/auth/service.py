"""Creating, listing, revoking and checking API keyspace.

A key reads `acs_<key id>_<secret>`. Redis holds only its SHA-256, under the key id, so a lookup
needs no scan and the comparison of hashes is constant-time.
"""

from __future__ import annotations

import hmac
import re
import secrets
from datetime import UTC, datetime

import redis.asyncio as aioredis

from controlplane.auth.models import USER_ID_PATTERN, ApiKeyInfo, CreatedApiKey, Principal
from controlplane.crypto import hash_api_key
from controlplane.errors import InvalidInput, NotFound, Unauthorized
from controlplane.store import keyspace, text

_KEY_RE = re.compile(r"^acs_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
BOOTSTRAP_KEY_ID = "bootstrap"


class ApiKeyService:
    def __init__(
        self, redis: aioredis.Redis, bootstrap_key: str | None, bootstrap_user: str = "admin"
    ) -> None:
        self._redis = redis
        self._bootstrap_hash = hash_api_key(bootstrap_key) if bootstrap_key else None
        self._bootstrap_user = bootstrap_user

    async def create(self, user_id: str, *, admin: bool = False) -> CreatedApiKey:
        """Create a key for `user_id` (users exist through their keys). Raises InvalidInput."""
        if not re.fullmatch(USER_ID_PATTERN, user_id):
            raise InvalidInput(
                "user names are 1-64 letters, digits, '_', '.', '@' or '-'", loc=["user"]
            )
        key_id = secrets.token_hex(6)
        key = f"acs_{key_id}_{secrets.token_urlsafe(32)}"
        now = datetime.now(UTC)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                keyspace.api_key(key_id),
                mapping={
                    "user_id": user_id,
                    "is_admin": "1" if admin else "0",
                    "hash": hash_api_key(key),
                    "created_at": now.isoformat(),
                },
            )
            pipe.zadd(keyspace.API_KEYS, {key_id: now.timestamp()})
            await pipe.execute()
        return CreatedApiKey(
            key_id=key_id, user_id=user_id, is_admin=admin, created_at=now, key=key
        )

    async def list(self) -> list[ApiKeyInfo]:
        """Every stored key, oldest first (the bootstrap key is configuration, not listed)."""
        ids = [text(i) for i in await self._redis.zrange(keyspace.API_KEYS, 0, -1)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.hgetall(keyspace.api_key(key_id))
            rows = await pipe.execute()
        return [
            ApiKeyInfo(
                key_id=key_id,
                user_id=text(row[b"user_id"]),
                is_admin=text(row[b"is_admin"]) == "1",
                created_at=datetime.fromisoformat(text(row[b"created_at"])),
            )
            for key_id, row in zip(ids, rows, strict=True)
            if row
        ]

    async def revoke(self, key_id: str) -> None:
        """Delete a key at once. Raises NotFound when no such key exists."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keyspace.api_key(key_id))
            pipe.zrem(keyspace.API_KEYS, key_id)
            deleted, _ = await pipe.execute()
        if not deleted:
            raise NotFound(f"no API key with id {key_id}")

    async def is_live(self, key_id: str) -> bool:
        """True while the key exists (the bootstrap key: while it is configured)."""
        if key_id == BOOTSTRAP_KEY_ID:
            return self._bootstrap_hash is not None
        return bool(await self._redis.exists(keyspace.api_key(key_id)))

    async def authenticate(self, presented: str | None) -> Principal:
        """The principal for a presented key. Raises Unauthorized for a missing or unknown key."""
        if not presented:
            raise Unauthorized("missing API key: send X-Session-API-Key or Authorization: Bearer")
        digest = hash_api_key(presented)
        if self._bootstrap_hash is not None and hmac.compare_digest(digest, self._bootstrap_hash):
            return Principal(user_id=self._bootstrap_user, is_admin=True, key_id=BOOTSTRAP_KEY_ID)
        match = _KEY_RE.match(presented)
        if match is not None:
            key_id = match.group(1)
            row = await self._redis.hgetall(keyspace.api_key(key_id))
            if row and hmac.compare_digest(text(row[b"hash"]), digest):
                return Principal(
                    user_id=text(row[b"user_id"]),
                    is_admin=text(row[b"is_admin"]) == "1",
                    key_id=key_id,
                )
        raise Unauthorized("invalid API key")
