"""Signing a browser in through the OpenID provider, and keeping its session checked.

`start` records a new authorization (state, nonce, PKCE verifier) in Redis under the SHA-256 of
its state, bound to the browser by a random value whose cookie only that browser holds; the
browser goes to the provider. `finish` (the callback) takes that record (once: a replayed state
or code finds nothing), checks the binding, redeems the code and validates the ID token
(auth/oidc.py), applies the user's groups to their organizations (a `Memberships` of the layer
above, handed in by the wiring) and opens the session with the refresh token encrypted.

The session's periodic check with the provider is auth/oidc_recheck.py.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
import structlog

from controlplane.auth.oidc import Identity, OidcClient, SignInFailed
from controlplane.auth.service import ApiKeyService
from controlplane.auth.sessions import NewSession, SessionService
from controlplane.crypto import SecretBox
from controlplane.errors import RuntimeUnavailable
from controlplane.store import audit, keyspace, text
from controlplane.store.audit import AuditAction

log = structlog.get_logger(__name__)

STATE_TTL = 600
"""Seconds a started sign-in may take at the provider (its login page) before the callback."""

# The callback takes the state's record once: a second callback with it (a replay) finds none.
# Only the browser that started it takes it (ARGV[1]: the SHA-256 of its binding cookie), so
# another browser's attempt with a stolen state and code neither succeeds nor spoils it.
_TAKE = """
if redis.call('HGET', KEYS[1], 'binding') ~= ARGV[1] then
  return redis.call('EXISTS', KEYS[1]) == 1 and 'foreign' or 'missing'
end
local row = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return row
"""


class Memberships(Protocol):
    """The organizations layer's part in a sign-in (organizations/groups.py)."""

    async def signed_in(self, user_id: str, groups: tuple[str, ...]) -> bool:
        """Apply the provider's groups to the user's organizations. False: the user may not
        sign in (no organization and ACS_OIDC_DEFAULT_ROLE=none)."""


@dataclass(frozen=True)
class Started:
    url: str
    """Where to send the browser (the provider's authorization endpoint)."""
    binding: str
    """The value of the browser's binding cookie (only this browser can finish the sign-in)."""


@dataclass(frozen=True)
class Finished:
    session: NewSession
    user_id: str
    next_url: str


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class SignInFlow:
    def __init__(
        self,
        redis: aioredis.Redis,
        client: OidcClient,
        *,
        sessions: SessionService,
        api_keys: ApiKeyService,
        box: SecretBox,
        memberships: Memberships,
        recheck_interval: int,
    ) -> None:
        """`recheck_interval`: seconds until the new session's first check with the provider."""
        self._redis = redis
        self._client = client
        self._sessions = sessions
        self._api_keys = api_keys
        self._box = box
        self._memberships = memberships
        self._interval = recheck_interval
        self._take = redis.register_script(_TAKE)

    async def start(self, redirect_uri: str, next_url: str) -> Started:
        """A new authorization request for a browser. Raises RuntimeUnavailable when the
        provider's discovery fails."""
        auth = await self._client.authorization(redirect_uri)
        binding = secrets.token_urlsafe(32)
        record = keyspace.oidc_state(_sha(auth.state))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                record,
                mapping={
                    "nonce": auth.nonce,
                    "verifier_enc": self._box.encrypt(auth.code_verifier.encode()).decode(),
                    "binding": _sha(binding),
                    "redirect_uri": redirect_uri,
                    "next": next_url,
                },
            )
            pipe.expire(record, STATE_TTL)
            await pipe.execute()
        return Started(url=auth.url, binding=binding)

    async def finish(self, state: str, code: str, binding: str | None) -> Finished:
        """Redeem the provider's answer. Raises SignInFailed (unknown, used or expired state; a
        browser that did not start it; a code or ID token the provider or we refuse; a user
        with no organization) or RuntimeUnavailable (provider unreachable). A failure is in the
        audit log with its reason (a code: `state_unknown`, `state_foreign`, `refused`,
        `no_organization`, `provider_unavailable`), a success with the session it opens."""
        who: str | None = None
        reason = "refused"
        try:
            raw = await self._take(
                keys=[keyspace.oidc_state(_sha(state))], args=[_sha(binding or "")]
            )
            if raw == b"foreign":
                reason = "state_foreign"
                raise SignInFailed("this sign-in was started in another browser: start again")
            if not isinstance(raw, list) or not raw:
                reason = "state_unknown"
                raise SignInFailed("this sign-in is unknown, expired or already used: start again")
            row = {text(k): text(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}
            identity = await self._client.redeem(
                code,
                code_verifier=self._box.decrypt(row["verifier_enc"].encode()).decode(),
                redirect_uri=row["redirect_uri"],
                nonce=row["nonce"],
            )
            who = identity.user_id
            if not await self._memberships.signed_in(identity.user_id, identity.groups):
                reason = "no_organization"
                raise SignInFailed(f"{identity.user_id} belongs to no organization here")
        except (SignInFailed, RuntimeUnavailable) as exc:
            failed = "provider_unavailable" if isinstance(exc, RuntimeUnavailable) else reason
            await audit.record(
                AuditAction.SIGN_IN,
                actor=audit.Actor(user_id=who, via="oidc"),
                outcome="failure",
                status=exc.status,
                reason=failed,
            )
            raise
        await self._api_keys.set_suspended(identity.user_id, False)
        session = await self._sessions.open(self._fields(identity))
        log.info("oidc_signed_in", user_id=identity.user_id, groups=len(identity.groups))
        return Finished(session=session, user_id=identity.user_id, next_url=row["next"])

    def _fields(self, identity: Identity) -> dict[str, str]:
        fields = {
            "user_id": identity.user_id,
            "key_id": "oidc-" + secrets.token_hex(6),
            "is_admin": "0",
            "via": "oidc",
            "subject": identity.subject,
            "recheck_at": str(int(time.time()) + self._interval),
        }
        if identity.refresh_token:
            fields["refresh_enc"] = self._box.encrypt(identity.refresh_token.encode()).decode()
        return fields
