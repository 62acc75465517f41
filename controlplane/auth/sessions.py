"""Browser sessions: a signed, expiring cookie backed by a record in Redis.

The cookie reads `<session id>.<expiry>.<signature>`: a random 256-bit id, the expiry in Unix
seconds and an HMAC-SHA256 of both under a key derived from the secret key (crypto.SecretBox).
The signature rejects forged or edited cookies without touching Redis; the record (found by the
SHA-256 of the id, never the id itself) makes sign-out and key revocation take effect at once.

A session opened with an API key lives while that key does. One opened through the OpenID
provider holds the provider's refresh token (encrypted) and is checked with the provider again
once `recheck_at` has passed (auth/oidc_sessions.py): a user disabled there loses the session
at the first request after that.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis.asyncio as aioredis

from controlplane.auth.models import Principal
from controlplane.auth.service import BOOTSTRAP_KEY_ID, ApiKeyService, Memberships
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.read_script import ReadScript
from controlplane.store.streams import APPEND_ENTRY, script_args, stored

COOKIE_NAME = "acs_session"
SIGNING_PURPOSE = "acs browser session cookie v1"
# A sign-out's audit entry (KEYS[2..]) only when it ended a session.
_END = (
    APPEND_ENTRY
    + """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
append_entry(2, 1)
return 1
"""
)

# A session's record, whether the API key it was opened with is live (ARGV[3], the key id,
# ARGV[4]: keyspace.api_key around it; read for any session, used for those opened with a key):
# it exists and is not suspended (its user refused by the OpenID provider: the key's own
# requests are refused then, auth/service.py), and its user's organizations hash (ARGV[1], the
# user id, ARGV[2]): what a browser's request needs before its handler, in one round trip, as
# an API key's. Nothing more for a record without a user (gone or signed out).
_SESSION_AND_ORGS = ReadScript("""
local row = redis.call('HGETALL', KEYS[1])
local user, key = nil, nil
for i = 1, #row, 2 do
  if row[i] == 'user_id' then user = row[i + 1] elseif row[i] == 'key_id' then key = row[i + 1] end
end
if user == nil then return {row, 0, {}} end
local live = 0
if key ~= nil then
  local record = ARGV[3] .. key .. ARGV[4]
  if redis.call('EXISTS', record) == 1 and redis.call('HEXISTS', record, 'suspended') == 0 then
    live = 1
  end
end
return {row, live, redis.call('HGETALL', ARGV[1] .. user .. ARGV[2])}
""")
_ORGS_AROUND = keyspace.user_orgs("\x00").split("\x00")
_KEY_AROUND = keyspace.api_key("\x00").split("\x00")


@dataclass(frozen=True)
class NewSession:
    cookie: str
    expires_at: int
    """Unix seconds."""


class Recheck(Protocol):
    async def __call__(self, record_key: str, row: dict[Any, Any]) -> bool:
        """Check an OpenID session whose `recheck_at` has passed with the provider (and update
        its record); False: the session is over (its record is gone)."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SessionService:
    def __init__(
        self,
        redis: aioredis.Redis,
        api_keys: ApiKeyService,
        signing_key: bytes,
        ttl: int,
        recheck: Recheck | None = None,
    ) -> None:
        self._redis = redis
        self._api_keys = api_keys
        self._key = signing_key
        self.ttl = ttl
        self._recheck = recheck
        self._end = redis.register_script(_END)

    def _sign(self, session_id: str, expires_at: int) -> str:
        mac = hmac.new(self._key, f"{session_id}.{expires_at}".encode(), hashlib.sha256)
        return _b64(mac.digest())

    @staticmethod
    def _record_key(session_id: str) -> str:
        return keyspace.browser_session(hashlib.sha256(session_id.encode()).hexdigest())

    async def create(self, principal: Principal) -> NewSession:
        """A new session acting as `principal` (who signed in with an API key)."""
        return await self.open(
            {
                "user_id": principal.user_id,
                "key_id": principal.key_id,
                "is_admin": "1" if principal.is_admin else "0",
            }
        )

    async def open(self, fields: dict[Any, Any], ttl: int | None = None) -> NewSession:
        """A new session whose record holds `fields` (user_id, key_id, is_admin; an OpenID
        session's `via`, `recheck_at` and encrypted refresh token), for `ttl` seconds (default:
        ACS_SESSION_TTL)."""
        session_id = secrets.token_urlsafe(32)
        expires_at = int(time.time()) + (ttl or self.ttl)
        record = self._record_key(session_id)
        # The sign-in's audit entry, with the session it opens.
        made = audit.entry(AuditAction.SIGN_IN, actor=_actor(fields, "api_key"))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(record, mapping=fields)
            pipe.expireat(record, expires_at)
            if made is not None:
                made.queue(pipe)
            await pipe.execute()
        stored(made)
        cookie = f"{session_id}.{expires_at}.{self._sign(session_id, expires_at)}"
        return NewSession(cookie=cookie, expires_at=expires_at)

    def _verified_id(self, cookie: str) -> str | None:
        """The session id of a well-formed, correctly signed, unexpired cookie; else None."""
        parts = cookie.split(".")
        # ASCII digits: int() refuses others that str.isdigit() accepts ("³"), a 500 otherwise.
        expiry_ok = parts[1].isascii() and parts[1].isdigit() if len(parts) == 3 else False
        if not expiry_ok or len(cookie) > 200:
            return None
        session_id, expiry, signature = parts
        if not hmac.compare_digest(signature, self._sign(session_id, int(expiry))):
            return None
        if int(expiry) <= time.time():
            return None
        return session_id

    async def resolve(self, cookie: str) -> Principal | None:
        """The principal of a live session; None for a bad, expired or signed-out cookie, or
        when the API key it was opened with has been revoked since, or is suspended (its user
        refused by the OpenID provider) while it is."""
        found = await self.resolve_with_orgs(cookie)
        return found[0] if found is not None else None

    async def resolve_with_orgs(self, cookie: str) -> tuple[Principal, Memberships | None] | None:
        """As `resolve`, with the user's organizations hash read in the same round trip (None
        when an OpenID session was checked with the provider, which may have changed them)."""
        session_id = self._verified_id(cookie)
        if session_id is None:
            return None
        record = self._record_key(session_id)
        flat, key_live, orgs = await _SESSION_AND_ORGS(
            self._redis, [record], (*_ORGS_AROUND, *_KEY_AROUND)
        )
        row = dict(zip(flat[::2], flat[1::2], strict=True))
        if not row:
            return None
        key_id = text(row[b"key_id"])
        memberships: Memberships | None = {
            text(k): text(v) for k, v in zip(orgs[::2], orgs[1::2], strict=True)
        }
        via: Literal["oidc", "session"]
        if row.get(b"via") == b"oidc":
            due = float(text(row.get(b"recheck_at", b"0"))) <= time.time()
            if due:
                if self._recheck is None or not await self._recheck(record, row):
                    return None
                memberships = None  # the provider's groups were applied again just now
            via = "oidc"
        elif key_id == BOOTSTRAP_KEY_ID:
            if not await self._api_keys.is_live(key_id):  # configured, not stored
                return None
            via = "session"
        elif not key_live:
            return None
        else:
            via = "session"
        principal = Principal(
            user_id=text(row[b"user_id"]),
            is_admin=text(row[b"is_admin"]) == "1",
            key_id=key_id,
            via=via,
        )
        return principal, memberships

    async def revoke(self, cookie: str) -> bool:
        """End the session of `cookie`. False when it was not a live, correctly signed one."""
        session_id = self._verified_id(cookie)
        if session_id is None:
            return False
        record = self._record_key(session_id)
        row = await self._redis.hgetall(record)
        made = audit.entry(AuditAction.SIGN_OUT, actor=_actor(row, "session")) if row else None
        streams, entry_args = script_args(made)
        ended = bool(await self._end(keys=[record, *streams], args=entry_args))
        if ended:
            stored(made)
        return ended


def _actor(fields: dict[Any, Any], via: str) -> audit.Actor:
    """Who a session's record says signed in (`via`: how, when the record does not say)."""
    row = {text(k): text(v) for k, v in fields.items()}
    return audit.Actor(
        user_id=row.get("user_id"),
        key_id=row.get("key_id"),
        via=row.get("via") or via,
        admin=row.get("is_admin") == "1",
    )
