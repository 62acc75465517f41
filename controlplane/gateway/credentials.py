"""The two credentials the LLM gateway accepts, neither of which is the user's provider key.

- A **sandbox token**, `acsgw_<conversation id>_<sandbox id>_<mac>`, handed to the agent in
  its start request: an HMAC (a key derived from ACS_SECRET_KEY) over the sandbox and
  conversation ids. It is stateless, so nothing needs to be written at a start (the warm pool's
  path stays as fast), and it is checked against Redis at every call: the conversation must
  still live in that sandbox and the sandbox must be RUNNING and not being deleted, so a deleted
  sandbox or conversation loses access at once, and the token names one conversation only.
- A **user gateway key**, `acs-llm-<key id>_<secret>`, what `GET /api/keys/llm/byor` answers:
  for the user's own tools (the OpenHands CLI's local mode, the SDK). Redis keeps its SHA-256
  for the check and the key itself encrypted so that the route can answer it again; revoking it
  (DELETE /api/keys/llm/byor) ends its access at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

import redis.asyncio as aioredis

from controlplane.conversations.models import AppConversationInfo
from controlplane.crypto import SecretBox, hash_api_key
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.store import keys, text

TOKEN_PURPOSE = "llm-gateway-sandbox-token"  # noqa: S105 (a derivation label, not a secret)
_TOKEN_RE = re.compile(r"^acsgw_([0-9a-f]{32})_([0-9a-f]{1,64})_([A-Za-z0-9_-]{43})$")
_USER_KEY_RE = re.compile(r"^acs-llm-([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
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

    @property
    def label(self) -> str:
        return "sandbox" if self.sandbox_id else "user_key"


class InvalidCredential(Exception):
    """Not a gateway credential, or one that no longer grants access (the message says which,
    without echoing what was presented)."""


class SandboxTokens:
    def __init__(self, box: SecretBox) -> None:
        self._key = box.derive_key(TOKEN_PURPOSE)

    def _mac(self, sandbox_id: str, conversation_id: str) -> str:
        digest = hmac.new(
            self._key, f"v1|{sandbox_id}|{conversation_id}".encode(), hashlib.sha256
        ).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self, sandbox_id: str, conversation_id: str) -> str:
        return f"acsgw_{conversation_id}_{sandbox_id}_{self._mac(sandbox_id, conversation_id)}"

    def parse(self, token: str) -> tuple[str, str] | None:
        """(sandbox id, conversation id) of a genuine token, else None (not yet checked against
        the records)."""
        match = _TOKEN_RE.match(token)
        if match is None:
            return None
        conversation_id, sandbox_id, mac = match.groups()
        if not hmac.compare_digest(mac, self._mac(sandbox_id, conversation_id)):
            return None
        return sandbox_id, conversation_id


def check_scope(
    sandbox: SandboxRecord | None, conversation: AppConversationInfo | None, sandbox_id: str
) -> AppConversationInfo:
    """The conversation a genuine token may call for, or InvalidCredential: the conversation
    must exist and live in that sandbox, which must be RUNNING and not being deleted."""
    if conversation is None or conversation.sandbox_id != sandbox_id:
        raise InvalidCredential("the conversation of this credential does not exist any more")
    if sandbox is None or sandbox.deleting_at is not None:
        raise InvalidCredential("the sandbox of this credential does not exist any more")
    if sandbox.status != SandboxStatus.RUNNING or sandbox.owner != conversation.created_by_user_id:
        raise InvalidCredential("the sandbox of this credential is not running")
    return conversation


class UserGatewayKeys:
    def __init__(self, redis: aioredis.Redis, box: SecretBox) -> None:
        self._redis = redis
        self._box = box

    async def get_or_create(self, user_id: str) -> str:
        """The user's current key, made on first use. Two concurrent first calls may each make
        one; the last written wins and the other is deleted, so one key stays valid."""
        current = await self._redis.get(keys.user_llm_gateway_key(user_id))
        if current is not None:
            row = await self._redis.hget(keys.llm_gateway_key(text(current)), "enc")
            if row is not None:
                return self._box.decrypt(text(row).encode()).decode()
        return await self.rotate(user_id)

    async def rotate(self, user_id: str) -> str:
        """A new key for the user; the previous one stops working at once."""
        key_id = secrets.token_hex(6)
        key = f"acs-llm-{key_id}_{secrets.token_urlsafe(32)}"
        pointer = keys.user_llm_gateway_key(user_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(pointer)
            pipe.hset(
                keys.llm_gateway_key(key_id),
                mapping={
                    "user_id": user_id,
                    "hash": hash_api_key(key),
                    "enc": self._box.encrypt(key.encode()),
                    "created_at": datetime.now(UTC).isoformat(),
                },
            )
            pipe.set(pointer, key_id)
            previous, *_ = await pipe.execute()
        if previous is not None and text(previous) != key_id:
            await self._redis.delete(keys.llm_gateway_key(text(previous)))
        return key

    async def revoke(self, user_id: str) -> bool:
        """Delete the user's key; False when there was none."""
        pointer = keys.user_llm_gateway_key(user_id)
        current = await self._redis.getdel(pointer)
        if current is None:
            return False
        await self._redis.delete(keys.llm_gateway_key(text(current)))
        return True

    async def authenticate(self, presented: str) -> Caller:
        match = _USER_KEY_RE.match(presented)
        if match is None:
            raise InvalidCredential("not an LLM gateway key")
        key_id = match.group(1)
        row = await self._redis.hmget(keys.llm_gateway_key(key_id), ["user_id", "hash"])
        if row[0] is None or not hmac.compare_digest(text(row[1]), hash_api_key(presented)):
            raise InvalidCredential("unknown or revoked LLM gateway key")
        return Caller(user_id=text(row[0]), key_id=key_id)


def looks_like_sandbox_token(presented: str) -> bool:
    return presented.startswith("acsgw_")


def looks_like_user_key(presented: str) -> bool:
    return presented.startswith("acs-llm-")
