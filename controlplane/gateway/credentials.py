"""The two credentials the LLM gateway accepts, neither of which is the user's provider key.

- A **sandbox token**, `acsgw.<conversation id>.<sandbox id>.<user, base64url>.<mac>`, handed
  to the agent in its start request: an HMAC (a key derived from ACS_SECRET_KEY) over the
  sandbox, conversation and user ids. It is stateless, so nothing needs to be written at a
  start (the warm pool's path stays as fast), and it is checked against Redis at every call:
  the conversation must still live in that sandbox and the sandbox must be RUNNING and not
  being deleted, so a deleted sandbox or conversation loses access at once, and the token
  names one conversation only.
- A **user gateway key**, `acs-llm.<user, base64url>.<key id>.<secret>`, what
  `GET /api/keys/llm/byor` answers: for the user's own tools (the OpenHands CLI's local mode,
  the SDK). Redis keeps its SHA-256 for the check and the key itself encrypted so that the
  route can answer it again; revoking it (DELETE /api/keys/llm/byor) ends its access at once.

Both name their user, so that everything a call needs from Redis (the records to check, the
user's settings, usage and rate-limit count) is read in one round trip; the name grants
nothing until the signature or the stored hash agrees.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from controlplane.crypto import SecretBox, hash_api_key
from controlplane.sandboxes.models import SandboxStatus
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.streams import APPEND_ENTRY, script_args, stored

TOKEN_PURPOSE = "llm-gateway-sandbox-token"  # noqa: S105 (a derivation label, not a secret)
_TOKEN_RE = re.compile(
    r"^acsgw\.([0-9a-f]{32})\.([0-9a-f]{1,64})\.([A-Za-z0-9_-]{1,100})\.([A-Za-z0-9_-]{43})$"
)
_USER_KEY_RE = re.compile(r"^acs-llm\.([A-Za-z0-9_-]{1,100})\.([0-9a-f]{12})\.[A-Za-z0-9_-]{43}$")


def _b64(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).rstrip(b"=").decode()


def _unb64(value: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


MAX_CREDENTIAL = 256


@dataclass(frozen=True)
class Caller:
    """Who a gateway call is for: always a user; a conversation when a sandbox calls."""

    user_id: str
    conversation_id: str | None = None
    sandbox_id: str | None = None
    model: str | None = None
    """The model the conversation started with (a sandbox); None: the user's settings."""
    key_id: str | None = None
    org_id: str | None = None
    """The organization the call is charged to (set from the reads, gateway/service.py)."""

    @property
    def label(self) -> str:
        return "sandbox" if self.sandbox_id else "user_key"


class InvalidCredential(Exception):
    """Not a gateway credential, or one that no longer grants access (the message says which,
    without echoing what was presented)."""


@dataclass(frozen=True)
class SandboxClaim:
    """A genuine sandbox token, not yet checked against the records."""

    sandbox_id: str
    conversation_id: str
    user_id: str


@dataclass(frozen=True)
class UserKeyClaim:
    """A well-formed user gateway key, not yet checked against its stored hash."""

    user_id: str
    key_id: str
    digest: str


class SandboxTokens:
    def __init__(self, box: SecretBox) -> None:
        self._key = box.derive_key(TOKEN_PURPOSE)

    def _mac(self, sandbox_id: str, conversation_id: str, user_id: str) -> str:
        digest = hmac.new(
            self._key, f"v1|{sandbox_id}|{conversation_id}|{user_id}".encode(), hashlib.sha256
        ).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self, sandbox_id: str, conversation_id: str, user_id: str) -> str:
        mac = self._mac(sandbox_id, conversation_id, user_id)
        return f"acsgw.{conversation_id}.{sandbox_id}.{_b64(user_id)}.{mac}"

    def parse(self, token: str) -> SandboxClaim | None:
        """The claim of a genuine token, else None."""
        match = _TOKEN_RE.match(token)
        if match is None:
            return None
        conversation_id, sandbox_id, user, mac = match.groups()
        user_id = _unb64(user)
        if user_id is None:
            return None
        if not hmac.compare_digest(mac, self._mac(sandbox_id, conversation_id, user_id)):
            return None
        return SandboxClaim(sandbox_id, conversation_id, user_id)


def check_scope(
    claim: SandboxClaim, conversation: dict[str, Any] | None, sandbox: list[Any]
) -> str | None:
    """The model of the conversation a genuine token may call for, or InvalidCredential: the
    conversation must exist and live in that sandbox, which must be RUNNING, not being deleted
    and owned by the token's user. `conversation` is its record's JSON, `sandbox` the record's
    owner, status and deleting_at fields."""
    if (
        conversation is None
        or conversation.get("sandbox_id") != claim.sandbox_id
        or conversation.get("created_by_user_id") != claim.user_id
    ):
        raise InvalidCredential("the conversation of this credential does not exist any more")
    owner, status, deleting_at = (text(v) if v is not None else None for v in sandbox)
    if owner is None or deleting_at:
        raise InvalidCredential("the sandbox of this credential does not exist any more")
    if status != SandboxStatus.RUNNING.value or owner != claim.user_id:
        raise InvalidCredential("the sandbox of this credential is not running")
    model = conversation.get("llm_model")
    return model if isinstance(model, str) else None


SANDBOX_FIELDS = ["owner", "status", "deleting_at"]


# The user's key and its pointer, and the revoke's audit entry (KEYS[2..], ARGV[2..]), if there
# was a key.
_REVOKE = (
    APPEND_ENTRY
    + """
local current = redis.call('GETDEL', KEYS[1])
if not current then return 0 end
redis.call('DEL', ARGV[1] .. current)
append_entry(2, 2)
return 1
"""
)


class UserGatewayKeys:
    def __init__(self, redis: aioredis.Redis, box: SecretBox) -> None:
        self._redis = redis
        self._box = box
        self._revoke = redis.register_script(_REVOKE)

    async def get_or_create(self, user_id: str) -> str:
        """The user's current key, made on first use. Two concurrent first calls may each make
        one; the last written wins and the other is deleted, so one key stays valid."""
        current = await self._redis.get(keyspace.user_llm_gateway_key(user_id))
        if current is not None:
            row = await self._redis.hget(keyspace.llm_gateway_key(text(current)), "enc")
            if row is not None:
                return self._box.decrypt(text(row).encode()).decode()
        return await self.rotate(user_id)

    async def rotate(self, user_id: str) -> str:
        """A new key for the user; the previous one stops working at once."""
        key_id = secrets.token_hex(6)
        key = f"acs-llm.{_b64(user_id)}.{key_id}.{secrets.token_urlsafe(32)}"
        pointer = keyspace.user_llm_gateway_key(user_id)
        made = audit.route_entry(AuditAction.GATEWAY_KEY_REFRESH)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(pointer)
            pipe.hset(
                keyspace.llm_gateway_key(key_id),
                mapping={
                    "user_id": user_id,
                    "hash": hash_api_key(key),
                    "enc": self._box.encrypt(key.encode()),
                    "created_at": datetime.now(UTC).isoformat(),
                },
            )
            pipe.set(pointer, key_id)
            if made is not None:
                made.queue(pipe)
            previous, *_ = await pipe.execute()
        stored(made)
        if previous is not None and text(previous) != key_id:
            await self._redis.delete(keyspace.llm_gateway_key(text(previous)))
        return key

    async def revoke(self, user_id: str) -> bool:
        """Delete the user's key; False when there was none."""
        made = audit.route_entry(AuditAction.GATEWAY_KEY_REVOKE)
        streams, entry_args = script_args(made)
        revoked = await self._revoke(
            keys=[keyspace.user_llm_gateway_key(user_id), *streams],
            args=[keyspace.llm_gateway_key(""), *entry_args],
        )
        if revoked:
            stored(made)
        return bool(revoked)

    @staticmethod
    def parse(presented: str) -> UserKeyClaim | None:
        match = _USER_KEY_RE.match(presented)
        if match is None:
            return None
        user_id = _unb64(match.group(1))
        if user_id is None:
            return None
        return UserKeyClaim(user_id, match.group(2), hash_api_key(presented))

    @staticmethod
    def check(claim: UserKeyClaim, stored: list[Any]) -> None:
        """`stored`: the key record's user_id and hash fields. Raises InvalidCredential."""
        user, digest = (text(v) if v is not None else None for v in stored)
        if (
            user is None
            or digest is None
            or user != claim.user_id
            or not hmac.compare_digest(digest, claim.digest)
        ):
            raise InvalidCredential("unknown or revoked LLM gateway key")


USER_KEY_FIELDS = ["user_id", "hash"]


def looks_like_sandbox_token(presented: str) -> bool:
    return presented.startswith("acsgw.")


def looks_like_user_key(presented: str) -> bool:
    return presented.startswith("acs-llm.")
