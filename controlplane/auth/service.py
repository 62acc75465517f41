"""Creating, listing, revoking and checking API keyspace.

A key reads `acs_<key id>_<secret>`. Redis holds only its SHA-256, under the key id, so a lookup
needs no scan and the comparison of hashes is constant-time.
"""

from __future__ import annotations

import hmac
import re
import secrets
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.models import USER_ID_PATTERN, ApiKeyInfo, CreatedApiKey, Principal
from controlplane.crypto import hash_api_key
from controlplane.errors import InvalidInput, NotFound, Unauthorized
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.read_script import ReadScript
from controlplane.store.streams import APPEND_ENTRY, script_args, stored

_KEY_RE = re.compile(r"^acs_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
_KEY_ID_RE = re.compile(r"[0-9a-f]{12}")
_ORGS_AROUND = keyspace.user_orgs("\x00").split("\x00")
"""keyspace.user_orgs's name before and after the user id (for _RECORD_AND_ORGS)."""
KeyPage = tuple[list[ApiKeyInfo], int | None]
Memberships = dict[str, str]
"""A user's organizations hash as read (keyspace.user_orgs: organization -> role, `~current`,
`~known`)."""
"""Keys, and the offset of the next page (None: none after)."""
BOOTSTRAP_KEY_ID = "bootstrap"
# Only keys that still exist: a key revoked meanwhile must not come back as a husk. The audit
# entry (KEYS[n + 1..], ARGV[3..]) only when a key changed.
_SUSPEND = (
    APPEND_ENTRY
    + """
local n, changed = tonumber(ARGV[2]), 0
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if ARGV[1] == '1' then changed = changed + redis.call('HSET', KEYS[i], 'suspended', '1')
    else changed = changed + redis.call('HDEL', KEYS[i], 'suspended') end
  end
end
if changed > 0 then append_entry(n + 1, 3) end
return changed
"""
)
# A key's record and, in the same step, its user's organizations hash (named ARGV[1], the user
# id, ARGV[2]: keyspace.user_orgs around the id): every request authenticates, then reads
# where its caller acts (organizations/service.py); one round trip for both. The key's hash is
# compared in Python, constant-time; a record without a user reads nothing more. Called as
# EVALSHA_RO: a read, which never waits for replicas (store/durable.py) wherever it is called.
_RECORD_AND_ORGS = ReadScript("""
local row = redis.call('HGETALL', KEYS[1])
for i = 1, #row, 2 do
  if row[i] == 'user_id' then
    return {row, redis.call('HGETALL', ARGV[1] .. row[i + 1] .. ARGV[2])}
  end
end
return {row, {}}
""")
# The key and its indexes, and its audit entry (KEYS[4..]), only if it was still there.
_REVOKE = (
    APPEND_ENTRY
    + """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
append_entry(4, 2)
return 1
"""
)


class ApiKeyService:
    def __init__(
        self, redis: aioredis.Redis, bootstrap_key: str | None, bootstrap_user: str = "admin"
    ) -> None:
        self._redis = redis
        self._bootstrap_hash = hash_api_key(bootstrap_key) if bootstrap_key else None
        self._bootstrap_user = bootstrap_user
        self._suspend = redis.register_script(_SUSPEND)
        self._revoke = redis.register_script(_REVOKE)

    async def create(
        self,
        user_id: str,
        *,
        admin: bool = False,
        name: str | None = None,
        org_id: str | None = None,
    ) -> CreatedApiKey:
        """Create a key for `user_id` (users exist through their keys), named `name`, made in
        organization `org_id` (requests with it act there unless they name another). Raises
        InvalidInput."""
        if not re.fullmatch(USER_ID_PATTERN, user_id):
            raise InvalidInput(
                "user names are 1-64 letters, digits, '_', '.', '@' or '-'", loc=["user"]
            )
        key_id = secrets.token_hex(6)
        key = f"acs_{key_id}_{secrets.token_urlsafe(32)}"
        now = datetime.now(UTC)
        fields: dict[Any, Any] = {
            "user_id": user_id,
            "is_admin": "1" if admin else "0",
            "hash": hash_api_key(key),
            "created_at": now.isoformat(),
        }
        if name:
            fields["name"] = name
        if org_id:
            fields["org_id"] = org_id
        made = audit.entry(
            AuditAction.KEY_CREATE,
            org=org_id,
            details={"admin": "1"} if admin else None,
            key_id=key_id,
            user_id=user_id,
        )
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keyspace.api_key(key_id), mapping=fields)
            pipe.zadd(keyspace.API_KEYS, {key_id: now.timestamp()})
            pipe.zadd(keyspace.user_api_keys(user_id), {key_id: now.timestamp()})
            if made is not None:
                made.queue(pipe)
            await pipe.execute()
        stored(made)
        return CreatedApiKey(
            key_id=key_id,
            user_id=user_id,
            is_admin=admin,
            created_at=now,
            key=key,
            name=name,
            org_id=org_id,
        )

    async def list(self, user_id: str | None = None) -> list[ApiKeyInfo]:
        """Every stored key (or `user_id`'s), oldest first (the bootstrap key is configuration,
        not listed)."""
        return (await self.page(user_id, 0, None))[0]

    async def page(self, user_id: str | None, offset: int, count: int | None) -> KeyPage:
        """`list`'s keys from `offset`, `count` of them (None: to the end), with the offset of
        the next page (None: none after)."""
        index = keyspace.API_KEYS if user_id is None else keyspace.user_api_keys(user_id)
        last = -1 if count is None else offset + count  # one more: is there a next page?
        ids = [text(i) for i in await self._redis.zrange(index, offset, last)]
        following = None
        if count is not None and len(ids) > count:
            ids, following = ids[:count], offset + count
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.hgetall(keyspace.api_key(key_id))
            rows = await pipe.execute()
        found = [_info(key_id, row) for key_id, row in zip(ids, rows, strict=True) if row]
        return found, following

    async def get(self, key_id: str) -> ApiKeyInfo | None:
        """One key's record (no secret), None when there is no such key."""
        if not _KEY_ID_RE.fullmatch(key_id):
            return None
        row = await self._redis.hgetall(keyspace.api_key(key_id))
        return _info(key_id, row) if row else None

    async def revoke(self, key_id: str) -> None:
        """Delete a key at once. Raises NotFound when no such key exists."""
        info = await self.get(key_id)
        if info is None:
            raise NotFound(f"no API key with id {key_id}")
        made = audit.entry(
            AuditAction.KEY_REVOKE, org=info.org_id, key_id=key_id, user_id=info.user_id
        )
        streams, entry_args = script_args(made)
        deleted = await self._revoke(
            keys=[
                keyspace.api_key(key_id),
                keyspace.API_KEYS,
                keyspace.user_api_keys(info.user_id),
                *streams,
            ],
            args=[key_id, *entry_args],
        )
        if not deleted:
            raise NotFound(f"no API key with id {key_id}")
        stored(made)

    async def set_suspended(self, user_id: str, suspended: bool) -> None:
        """Refuse (or accept again) every key of `user_id`: the provider refused the user
        (disabled or removed there); a successful sign-in through it lifts this."""
        ids = [text(i) for i in await self._redis.zrange(keyspace.user_api_keys(user_id), 0, -1)]
        if not ids:
            return
        # The control plane acts, on what the provider said (the request is the user's).
        made = audit.entry(
            AuditAction.KEY_SUSPEND if suspended else AuditAction.KEY_RESTORE,
            actor=audit.SYSTEM,
            user_id=user_id,
        )
        streams, entry_args = script_args(made)
        changed = await self._suspend(
            keys=[*(keyspace.api_key(k) for k in ids), *streams],
            args=[int(suspended), len(ids), *entry_args],
        )
        if changed:
            stored(made)

    async def is_live(self, key_id: str) -> bool:
        """True while the key exists (the bootstrap key: while it is configured)."""
        if key_id == BOOTSTRAP_KEY_ID:
            return self._bootstrap_hash is not None
        return bool(await self._redis.exists(keyspace.api_key(key_id)))

    async def authenticate(self, presented: str | None) -> Principal:
        """The principal for a presented key. Raises Unauthorized for a missing, unknown or
        suspended key."""
        return (await self.authenticate_with_orgs(presented))[0]

    async def authenticate_with_orgs(
        self, presented: str | None
    ) -> tuple[Principal, Memberships | None]:
        """`authenticate`, with the key's user's organizations hash read in the same round trip
        (None for the bootstrap key, whose check reads nothing): what the auth middleware
        needs next. Nothing is kept between requests: each one reads the key's record afresh,
        so a revoked or suspended key, or a removed membership, counts at once."""
        if not presented:
            raise Unauthorized("missing API key: send X-Session-API-Key or Authorization: Bearer")
        digest = hash_api_key(presented)
        if self._bootstrap_hash is not None and hmac.compare_digest(digest, self._bootstrap_hash):
            principal = Principal(
                user_id=self._bootstrap_user, is_admin=True, key_id=BOOTSTRAP_KEY_ID
            )
            return principal, None
        match = _KEY_RE.match(presented)
        if match is not None:
            key_id = match.group(1)
            flat, orgs = await self._read_record_and_orgs(key_id)
            row = dict(zip(flat[::2], flat[1::2], strict=True))
            if row and hmac.compare_digest(text(row.get(b"hash", b"")), digest):
                if row.get(b"suspended"):
                    raise Unauthorized(
                        "this key's user was refused by the OpenID provider (disabled or "
                        "removed there); signing in through it again restores the key"
                    )
                org = row.get(b"org_id")
                principal = Principal(
                    user_id=text(row[b"user_id"]),
                    is_admin=text(row[b"is_admin"]) == "1",
                    key_id=key_id,
                    key_org_id=text(org) if org else None,
                )
                pairs = zip(orgs[::2], orgs[1::2], strict=True)
                return principal, {text(k): text(v) for k, v in pairs}
        raise Unauthorized("invalid API key")

    async def _read_record_and_orgs(self, key_id: str) -> Any:
        return await _RECORD_AND_ORGS(self._redis, [keyspace.api_key(key_id)], _ORGS_AROUND)


def _info(key_id: str, row: dict[Any, Any]) -> ApiKeyInfo:
    name, org = row.get(b"name"), row.get(b"org_id")
    return ApiKeyInfo(
        key_id=key_id,
        user_id=text(row[b"user_id"]),
        is_admin=text(row[b"is_admin"]) == "1",
        created_at=datetime.fromisoformat(text(row[b"created_at"])),
        name=text(name) if name else None,
        org_id=text(org) if org else None,
    )
