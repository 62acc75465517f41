"""The OpenID Connect relying party: discovery, authorization code with PKCE, state and nonce,
ID token validation against the provider's JWKS, refresh. Every protocol step is Authlib's
(docs/architecture.md, "Choices and why"); this module chooses the parameters and pins what a
security office expects pinned:

- the issuer is the configured one: discovery must name it (OpenID Discovery §4.3) and every ID
  token must carry it;
- the audience must be our client id (Authlib checks `azp`; the audience is pinned here);
- only asymmetric signatures, from the provider's JWKS, are accepted (never `none`, never an
  HMAC with the client secret as key), whatever the provider's metadata advertises;
- a key id the cached JWKS does not know fetches the JWKS again once (key rotation), at most
  every JWKS_REFETCH seconds, so forged key ids cannot make us hammer the provider.
"""

from __future__ import annotations

import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
from authlib.integrations.base_client import BaseApp, OAuthError
from authlib.integrations.base_client.async_app import AsyncOAuth2Mixin
from authlib.integrations.base_client.async_openid import AsyncOpenIDMixin
from authlib.integrations.httpx_client import AsyncOAuth2Client
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry

from controlplane.auth.models import USER_ID_PATTERN
from controlplane.errors import RuntimeUnavailable, Unauthorized

log = structlog.get_logger(__name__)

SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                      "ES512", "EdDSA")  # fmt: skip
"""Asymmetric algorithms only: an ID token's signature must come from the provider's keys."""
JWKS_REFETCH = 10.0
"""Seconds between two fetches of the JWKS forced by an unknown key id."""
METADATA_TTL = 3600.0
"""Seconds discovery (and the JWKS with it) is kept before it is read again."""
LEEWAY = 60
"""Seconds of clock skew allowed on exp, iat and nbf."""


@dataclass(frozen=True)
class OidcSettings:
    issuer: str
    client_id: str
    client_secret: str | None
    scopes: tuple[str, ...]
    user_claim: str = "sub"
    groups_claim: str | None = "groups"
    auth_params: dict[str, str] = field(default_factory=dict)
    timeout: float = 10.0


@dataclass(frozen=True)
class Authorization:
    """A started authorization: where to send the browser, and what the callback must match."""

    url: str
    state: str
    nonce: str
    code_verifier: str


@dataclass(frozen=True)
class Identity:
    """Who the provider says signed in (from a validated ID token), and the tokens to keep."""

    user_id: str
    subject: str
    groups: tuple[str, ...]
    email: str | None
    name: str | None
    refresh_token: str | None


class SignInFailed(Unauthorized):
    """The provider refused, or what it answered does not prove who signed in."""

    code = "sign_in_failed"


class _ProviderApp(AsyncOAuth2Mixin, AsyncOpenIDMixin, BaseApp):  # type: ignore[misc]
    """Authlib's framework-neutral OAuth 2 + OpenID app over httpx (its Starlette app without
    Starlette: the state is kept in Redis by the caller, not in a framework session)."""

    client_cls = AsyncOAuth2Client


class OidcClient:
    def __init__(self, settings: OidcSettings) -> None:
        self.settings = settings
        self._app = _ProviderApp(
            framework=None,
            client_id=settings.client_id,
            client_secret=settings.client_secret,
            server_metadata_url=settings.issuer.rstrip("/") + "/.well-known/openid-configuration",
            client_kwargs={
                "scope": " ".join(settings.scopes),
                "code_challenge_method": "S256",
                "timeout": settings.timeout,
                # Authlib opens an httpx client per call: one TLS context made here, not a
                # certificate store loaded at every call (tens of milliseconds each).
                "verify": ssl.create_default_context(),
            },
        )
        self._forced_at = float("-inf")

    async def _metadata(self) -> dict[str, Any]:
        loaded = self._app.server_metadata.get("_loaded_at")
        if loaded is not None and time.time() - float(loaded) > METADATA_TTL:
            self._app.server_metadata.clear()
        try:
            metadata: dict[str, Any] = await self._app.load_server_metadata()
        except (httpx.HTTPError, ValueError) as exc:
            self._app.server_metadata.clear()
            raise RuntimeUnavailable(f"the OpenID provider's discovery failed: {exc}") from None
        if metadata.get("issuer") != self.settings.issuer:
            self._app.server_metadata.clear()
            raise RuntimeUnavailable(
                f"the OpenID provider names issuer {metadata.get('issuer')!r}, not the "
                f"configured {self.settings.issuer!r} (ACS_OIDC_ISSUER)"
            )
        return metadata

    async def authorization(self, redirect_uri: str) -> Authorization:
        """A new authorization request: fresh state, nonce and PKCE verifier (S256)."""
        await self._metadata()
        created = await self._app.create_authorization_url(
            redirect_uri, **self.settings.auth_params
        )
        return Authorization(
            url=created["url"],
            state=created["state"],
            nonce=created["nonce"],
            code_verifier=created["code_verifier"],
        )

    async def redeem(
        self, code: str, *, code_verifier: str, redirect_uri: str, nonce: str
    ) -> Identity:
        """Exchange an authorization code and validate its ID token. Raises SignInFailed."""
        await self._metadata()
        try:
            token = await self._app.fetch_access_token(
                redirect_uri, code=code, code_verifier=code_verifier
            )
        except (OAuthError, httpx.HTTPError) as exc:
            raise SignInFailed(f"the provider refused the sign-in: {_oauth_reason(exc)}") from None
        return await self.identity(token, nonce=nonce)

    async def refresh(self, refresh_token: str) -> tuple[Identity | None, str]:
        """Ask the provider again (refresh token grant): a disabled or removed user is refused
        there. Returns the new identity (None when the provider sent no new ID token) and the
        refresh token to keep. Raises SignInFailed when the provider refuses, RuntimeUnavailable
        when it cannot be reached (the caller decides what an unreachable provider means)."""
        metadata = await self._metadata()
        try:
            async with self._app._get_oauth_client(**metadata) as client:
                token = await client.refresh_token(
                    metadata["token_endpoint"], refresh_token=refresh_token
                )
        except OAuthError as exc:
            raise SignInFailed(f"the provider refused the refresh: {_oauth_reason(exc)}") from None
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"the OpenID provider cannot be reached: {exc}") from None
        kept = str(token.get("refresh_token") or refresh_token)  # rotated, or the same
        if "id_token" not in token:
            # No new ID token (allowed by OIDC §12.2): the refresh itself proved the user live.
            return None, kept
        return await self.identity(token, nonce=None), kept

    async def identity(self, token: dict[str, Any], *, nonce: str | None) -> Identity:
        """Validate the token response's ID token (signature from the JWKS, iss, aud, azp, exp,
        iat, nonce, at_hash) and read who it names. Raises SignInFailed."""
        raw = token.get("id_token")
        if not isinstance(raw, str):
            raise SignInFailed("the provider answered no ID token (is `openid` in the scopes?)")
        claims = await self.validate_id_token(
            raw, nonce=nonce, access_token=token.get("access_token")
        )
        user_id = claims.get(self.settings.user_claim)
        if not isinstance(user_id, str) or not _valid_user_id(user_id):
            raise SignInFailed(
                f"the ID token's {self.settings.user_claim!r} claim is not a usable user id "
                "(1-64 letters, digits, '_', '.', '@' or '-'; see ACS_OIDC_USER_CLAIM)"
            )
        groups = claims.get(self.settings.groups_claim) if self.settings.groups_claim else None
        return Identity(
            user_id=user_id,
            subject=str(claims["sub"]),
            groups=tuple(g for g in groups if isinstance(g, str))
            if isinstance(groups, list)
            else (),
            email=claims.get("email") if isinstance(claims.get("email"), str) else None,
            name=claims.get("name") if isinstance(claims.get("name"), str) else None,
            refresh_token=token.get("refresh_token"),
        )

    async def validate_id_token(
        self, raw: str, *, nonce: str | None, access_token: str | None = None
    ) -> CodeIDToken:
        """The claims of a valid ID token for this client. Raises SignInFailed."""
        metadata = await self._metadata()
        registry = JWSRegistry(algorithms=list(SIGNING_ALGORITHMS), strict_check_header=False)
        try:
            try:
                decoded = jwt.decode(raw, await self._key_set(metadata), registry=registry)
            except InvalidKeyIdError:
                decoded = jwt.decode(
                    raw, await self._key_set(metadata, force=True), registry=registry
                )
            params: dict[str, Any] = {"client_id": self.settings.client_id, "nonce": nonce}
            if access_token:
                params["access_token"] = access_token
            claims = CodeIDToken(
                decoded.claims,
                decoded.header,
                {
                    "iss": {"essential": True, "value": self.settings.issuer},
                    "aud": {"essential": True, "value": self.settings.client_id},
                },
                params,
            )
            claims.validate(leeway=LEEWAY)
        except (JoseError, ValueError) as exc:
            log.warning("oidc_id_token_refused", error=type(exc).__name__)
            raise SignInFailed(f"the ID token is not valid: {_jose_reason(exc)}") from None
        return claims

    async def _key_set(self, metadata: dict[str, Any], *, force: bool = False) -> KeySet:
        if force:
            if time.monotonic() - self._forced_at < JWKS_REFETCH:
                force = False  # refetched a moment ago: an unknown kid stays unknown
            else:
                self._forced_at = time.monotonic()
        try:
            jwks = await self._app.fetch_jwk_set(force=force)
        except (httpx.HTTPError, ValueError, RuntimeError) as exc:
            raise RuntimeUnavailable(f"the OpenID provider's JWKS cannot be read: {exc}") from None
        return KeySet.import_key_set(jwks)


def _valid_user_id(value: str) -> bool:
    return re.fullmatch(USER_ID_PATTERN, value) is not None


def _oauth_reason(exc: Exception) -> str:
    """The provider's error code, never its whole answer (which may echo what we sent)."""
    if isinstance(exc, OAuthError):
        return str(exc.error or "error")
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def _jose_reason(exc: Exception) -> str:
    error = getattr(exc, "error", None)
    description = getattr(exc, "description", None)
    return str(description or error or type(exc).__name__)
