"""A browser session opened through the OpenID provider, checked with it again.

auth/sessions.py calls a `SessionRecheck` once a session's `recheck_at` has passed. One replica
per session asks the provider (refresh token grant; the new ID token's groups are applied to the
user's organizations again); refused (the user was disabled or removed there), the session ends
and the user's API keys are suspended until they sign in through the provider again; the
provider unreachable, the session goes on for at most one more interval. So a user the provider
drops keeps access at most ACS_OIDC_RECHECK_INTERVAL (twice that through a provider outage).
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.auth.oidc import OidcClient, SignInFailed
from controlplane.auth.oidc_flow import Memberships
from controlplane.auth.service import ApiKeyService
from controlplane.crypto import SecretBox
from controlplane.errors import RuntimeUnavailable
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction
from controlplane.store.streams import stored

log = structlog.get_logger(__name__)

RECHECK_LOCK_TTL = 15
"""Seconds one replica holds a session's re-check (longer than a call to the provider)."""

# Only a session that still exists: a sign-out during the check must not leave a husk behind.
_UPDATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'recheck_at', ARGV[1], 'refresh_enc', ARGV[2])
return 1
"""


class SessionRecheck:
    def __init__(
        self,
        redis: aioredis.Redis,
        client: OidcClient,
        api_keys: ApiKeyService,
        box: SecretBox,
        memberships: Memberships,
        *,
        interval: int,
    ) -> None:
        self._redis = redis
        self._client = client
        self._api_keys = api_keys
        self._box = box
        self._memberships = memberships
        self._interval = interval
        self._update = redis.register_script(_UPDATE)

    async def __call__(self, record_key: str, row: dict[Any, Any]) -> bool:
        """The session's check with the provider (auth/sessions.py: Recheck)."""
        user_id = text(row[b"user_id"])
        lock = keyspace.session_recheck_lock(record_key.rsplit(":", 1)[-1])
        if not await self._redis.set(lock, "1", nx=True, ex=RECHECK_LOCK_TTL):
            # Another request is checking it right now: this one may go on meanwhile, within
            # one more interval.
            return float(text(row[b"recheck_at"])) + self._interval > time.time()
        try:
            return await self._recheck(record_key, row, user_id)
        finally:
            await self._redis.delete(lock)

    async def _recheck(self, record_key: str, row: dict[Any, Any], user_id: str) -> bool:
        refresh_enc = row.get(b"refresh_enc")
        if refresh_enc is None:
            # No refresh token from this provider: the session lasts one interval.
            await self._end(record_key, user_id, "no refresh token", "no_refresh_token")
            return False
        refresh_token = self._box.decrypt(refresh_enc).decode()
        try:
            identity, kept = await self._client.refresh(refresh_token)
            if identity is not None and identity.user_id != user_id:
                raise SignInFailed("the refreshed ID token names another user")
            if identity is not None and not await self._memberships.signed_in(
                user_id, identity.groups
            ):
                raise SignInFailed("the user belongs to no organization any more")
        except SignInFailed as exc:
            await self._end(record_key, user_id, exc.message, "provider_refused")
            await self._api_keys.set_suspended(user_id, True)
            return False
        except RuntimeUnavailable as exc:
            grace = float(text(row[b"recheck_at"])) + self._interval > time.time()
            log.warning("oidc_recheck_unreachable", user_id=user_id, error=exc.message, grace=grace)
            return grace
        updated = await self._update(
            keys=[record_key],
            args=[
                str(int(time.time()) + self._interval),
                self._box.encrypt(kept.encode()).decode(),
            ],
        )
        return bool(updated)

    async def _end(self, record_key: str, user_id: str, reason: str, code: str) -> None:
        """End the session; its audit entry (the control plane acting on the provider's answer,
        `code` why) in the same transaction."""
        made = audit.entry(
            AuditAction.SESSION_END, actor=audit.SYSTEM, details={"reason": code}, user_id=user_id
        )
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(record_key)
            if made is not None:
                made.queue(pipe)
            await pipe.execute()
        stored(made)
        log.info("oidc_session_ended", user_id=user_id, reason=reason)
