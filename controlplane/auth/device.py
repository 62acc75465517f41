"""The OAuth 2.0 device authorization grant (RFC 8628), as `openhands login` uses it.

The CLI asks for a device code and a user code (authorize), shows the user the verification
page, and polls the token endpoint. A signed-in user approves or denies the user code on that
page; the next poll then receives a new API key for that user. Codes expire, a device code is
exchanged at most once, and polling faster than the interval earns `slow_down` (the interval then
grows by 5 s, as the RFC asks). Redis holds only the SHA-256 of a device code.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from pydantic import BaseModel

from controlplane.auth.models import CreatedApiKey, Principal
from controlplane.auth.service import ApiKeyService
from controlplane.errors import Conflict, ControlPlaneError, NotFound
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.streams import APPEND_ENTRY, script_args, stored

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"
# RFC 8628 §6.1: consonants only (no words can form, no 0/O or 1/I look-alikes); 20^8 codes.
USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
EXPIRED_GRACE = 600
"""Seconds a device record outlives its code, so a late poll hears expired_token, not
invalid_grant."""
SLOW_DOWN_STEP = 5

# The decision's audit entry (KEYS[2..], ARGV[4..]) with it.
_DECIDE = (
    APPEND_ENTRY
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if tonumber(redis.call('HGET', KEYS[1], 'expires_at')) <= tonumber(ARGV[3]) then
  return 'expired'
end
if status ~= 'pending' then return status end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'user_id', ARGV[2])
append_entry(2, 4)
return 'ok'
"""
)

# A poll: the first caller to see 'approved' deletes the record, so a device code yields one key.
_POLL = """
local rec = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'interval', 'last_poll',
                       'user_id')
local now = tonumber(ARGV[1])
if not rec[1] then return {'invalid_grant', '0', ''} end
if tonumber(rec[2]) <= now then return {'expired_token', rec[3], ''} end
if rec[1] == 'denied' then return {'access_denied', rec[3], ''} end
if rec[1] == 'approved' then
  redis.call('DEL', KEYS[1])
  return {'approved', rec[3], rec[5]}
end
local interval = tonumber(rec[3])
local last = tonumber(rec[4])
redis.call('HSET', KEYS[1], 'last_poll', ARGV[1])
if last and now - last < interval * 0.8 then
  interval = interval + tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'interval', interval)
  return {'slow_down', tostring(interval), ''}
end
return {'authorization_pending', tostring(interval), ''}
"""


class DeviceAuthorization(BaseModel):
    """RFC 8628 §3.2 device authorization response."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int


class DeviceToken(BaseModel):
    """RFC 8628 §3.5 / RFC 6749 §5.1 access token response: the access token is an API key."""

    access_token: str
    token_type: str = "Bearer"  # noqa: S105 (the OAuth token type, not a secret)
    expires_in: int | None = None


class PendingDevice(BaseModel):
    user_code: str
    expires_in: int


class OAuthError(ControlPlaneError):
    """An RFC 6749 §5.2 error: rendered as {"error", "error_description"} (plus our "detail")."""

    status = 400

    def __init__(
        self, error: str, description: str, *, interval: int | None = None, status: int = 400
    ) -> None:
        super().__init__(description)
        self.code = error
        self.status = status
        self.interval = interval


def normalise_user_code(raw: str) -> str | None:
    """`bcdf-ghjk`, ` BCDF GHJK ` → `BCDFGHJK`; None when it cannot be a user code."""
    plain = re.sub(r"[\s-]", "", raw).upper()
    if len(plain) != USER_CODE_LENGTH or any(c not in USER_CODE_ALPHABET for c in plain):
        return None
    return plain


def display_user_code(code: str) -> str:
    half = USER_CODE_LENGTH // 2
    return f"{code[:half]}-{code[half:]}"


def _hash(device_code: str) -> str:
    return hashlib.sha256(device_code.encode()).hexdigest()


@dataclass(frozen=True)
class DeviceFlowConfig:
    ttl: int
    interval: int


class DeviceFlowService:
    def __init__(
        self, redis: aioredis.Redis, api_keys: ApiKeyService, config: DeviceFlowConfig
    ) -> None:
        self._redis = redis
        self._api_keys = api_keys
        self._config = config
        self._decide = redis.register_script(_DECIDE)
        self._poll = redis.register_script(_POLL)

    async def authorize(self, verification_uri: str) -> DeviceAuthorization:
        """Open a new device authorization, pending until a user decides on its user code."""
        ttl = self._config.ttl
        device_code = secrets.token_urlsafe(32)
        code_hash = _hash(device_code)
        while True:
            user_code = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))
            # NX: a live user code is never handed out twice.
            if await self._redis.set(
                keyspace.device_user_code(user_code), code_hash, ex=ttl, nx=True
            ):
                break
        now = time.time()
        record = keyspace.device_code(code_hash)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                record,
                mapping={
                    "user_code": user_code,
                    "status": "pending",
                    "created_at": repr(now),
                    "expires_at": repr(now + ttl),
                    "interval": str(self._config.interval),
                },
            )
            pipe.expire(record, ttl + EXPIRED_GRACE)
            await pipe.execute()
        shown = display_user_code(user_code)
        return DeviceAuthorization(
            device_code=device_code,
            user_code=shown,
            verification_uri=verification_uri,
            verification_uri_complete=f"{verification_uri}?user_code={shown}",
            expires_in=ttl,
            interval=self._config.interval,
        )

    async def _code_hash(self, user_code: str) -> tuple[str, str]:
        code = normalise_user_code(user_code)
        if code is None:
            raise NotFound("that is not a code this server issued (8 letters, e.g. BCDF-GHJK)")
        code_hash = await self._redis.get(keyspace.device_user_code(code))
        if code_hash is None:
            raise NotFound("unknown or expired code: start again with `openhands login`")
        return code, text(code_hash)

    async def pending(self, user_code: str) -> PendingDevice:
        """A code waiting for a decision. Raises NotFound (unknown, expired, or already exchanged)
        or Conflict (approved or denied, not exchanged yet)."""
        code, code_hash = await self._code_hash(user_code)
        status, expires_at = await self._redis.hmget(
            keyspace.device_code(code_hash), ["status", "expires_at"]
        )
        remaining = int(float(text(expires_at)) - time.time()) if expires_at else 0
        if status is None or remaining <= 0:
            raise NotFound("unknown or expired code: start again with `openhands login`")
        if text(status) != "pending":
            raise Conflict(f"this code was already {text(status)}")
        return PendingDevice(user_code=display_user_code(code), expires_in=remaining)

    async def decide(self, principal: Principal, user_code: str, *, approve: bool) -> str:
        """Approve (the device gets a key for `principal`'s user) or deny a pending code.

        Returns the code as displayed. Raises NotFound (unknown or expired) or Conflict (already
        decided)."""
        code, code_hash = await self._code_hash(user_code)
        decision = "approved" if approve else "denied"
        # Never the user code: while it is pending it is what approves a device.
        made = audit.entry(
            AuditAction.DEVICE_DECIDE, actor=principal.actor(), details={"decision": decision}
        )
        streams, entry_args = script_args(made)
        outcome = text(
            await self._decide(
                keys=[keyspace.device_code(code_hash), *streams],
                args=[decision, principal.user_id, repr(time.time()), *entry_args],
            )
        )
        if outcome in ("missing", "expired"):
            raise NotFound("unknown or expired code: start again with `openhands login`")
        if outcome != "ok":
            raise Conflict(f"this code was already {outcome}")
        stored(made)
        return display_user_code(code)

    async def exchange(self, device_code: str) -> DeviceToken:
        """The token for an approved device code (once). Raises OAuthError otherwise:
        authorization_pending, slow_down, access_denied, expired_token or invalid_grant."""
        outcome, interval, user_id = (
            text(part)
            for part in await self._poll(
                keys=[keyspace.device_code(_hash(device_code))],
                args=[repr(time.time()), SLOW_DOWN_STEP],
            )
        )
        if outcome == "approved":
            # The key is the approving user's, made for their device.
            with audit.as_actor(audit.Actor(user_id=user_id, via="device")):
                created: CreatedApiKey = await self._api_keys.create(user_id)
            return DeviceToken(access_token=created.key)
        descriptions = {
            "authorization_pending": "the user has not approved this code yet",
            "slow_down": f"polling too fast: wait {interval} s between requests",
            "access_denied": "the user denied this request",
            "expired_token": "the code expired: start again",
            "invalid_grant": "unknown or already used device code",
        }
        raise OAuthError(
            outcome,
            descriptions[outcome],
            interval=int(interval) if outcome in ("slow_down", "authorization_pending") else None,
        )
