"""Who is calling: an API key, a browser session cookie, or (ACS_AUTH_MODE=none) the local user.

A key in X-Session-API-Key or Authorization: Bearer always decides alone: a wrong key is a 401
even with a valid cookie. Without one, a browser session cookie counts, then single-user mode.
The last two are ambient credentials a browser attaches by itself, so requests that change
something (and WebSocket handshakes, which no CORS check covers) must come from our own origin or
a configured one (docs/api.md#browsers).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from controlplane import keys
from controlplane.auth.models import Principal
from controlplane.auth.sandbox_scope import bearer_of, check_sandbox_scope, paired_session_key
from controlplane.auth.service import Memberships
from controlplane.auth.sessions import COOKIE_NAME
from controlplane.errors import Forbidden, QuotaExceeded, Unauthorized
from controlplane.store.audit_flood import source_of

PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal")
"""The caller, set by the auth middleware on every route that is not public."""
ORGS_READ: web.RequestKey[Memberships] = web.RequestKey("orgs_read")
"""The caller's organizations hash, read with their API key in its one round trip
(ApiKeyService.authenticate_with_orgs) for the auth middleware's scope; this request only."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SINGLE_USER_KEY_ID = "single-user"
# Signs of a reverse proxy: a request it forwards comes from loopback but not from this machine's
# user, so single-user mode must not trust it.
FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP", "Via")


def presented_key(request: web.Request) -> str | None:
    """The API key in X-Session-API-Key or Authorization: Bearer, if any. With both, and
    different, the bearer is the user's key and the other a sandbox's (auth/sandbox_scope.py)."""
    if paired_session_key(request) is not None:
        return bearer_of(request)
    presented = request.headers.get("X-Session-API-Key")
    if presented is None or (presented == "" and bearer_of(request) is not None):
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            presented = auth[7:].strip()
    return presented


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_loopback_host(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (the addresses single-user mode may serve on)."""
    return _is_loopback(host)


def _single_user_request(request: web.Request) -> bool:
    """From a process on this machine, addressed to this machine by a loopback name (a site
    that rebinds its own DNS name to 127.0.0.1 still sends its own name as Host)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not isinstance(peer, tuple) or not _is_loopback(str(peer[0])):
        return False
    if any(name in request.headers for name in FORWARDING_HEADERS):
        return False
    host = urlsplit(f"//{request.host}").hostname or ""
    return _is_loopback(host)


def origin_allowed(request: web.Request, origin: str) -> bool:
    """Our own origin (the Host the browser addressed) or one of ACS_CORS_ORIGINS."""
    origin = origin.rstrip("/").lower()
    if origin in request.app[keys.CONFIG].cors_origins:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == request.host.lower()


def check_origin(request: web.Request, *, required: bool) -> None:
    """Refuse a cross-origin request (Forbidden). Origin, else Referer, must be allowed; with
    neither, `required` decides."""
    origin = request.headers.get("Origin")
    if origin is None and "Referer" in request.headers:
        parts = urlsplit(request.headers["Referer"])
        origin = f"{parts.scheme}://{parts.netloc}"
    if origin is None:
        if required:
            raise Forbidden("a request with a session cookie must carry an Origin header")
        return
    if not origin_allowed(request, origin):
        raise Forbidden(f"cross-origin request from {origin} refused (see ACS_CORS_ORIGINS)")


def _changes_state(request: web.Request) -> bool:
    upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
    return request.method not in SAFE_METHODS or upgrade


async def authenticate_request(request: web.Request, presented: str | None = None) -> Principal:
    """The caller of `request` (`presented`: a key found elsewhere, e.g. a WebSocket query).

    Raises Unauthorized (no usable credential) or Forbidden (an ambient credential on a
    cross-origin request that changes state)."""
    session_key = None
    if presented is None:
        presented = presented_key(request)
        session_key = paired_session_key(request)
    if presented is not None:
        caller, orgs = await request.app[keys.API_KEYS].authenticate_with_orgs(presented)
        if orgs is not None:
            request[ORGS_READ] = orgs
        if session_key is not None:
            await check_sandbox_scope(request, caller, session_key)
        return caller
    cookie = request.cookies.get(COOKIE_NAME)
    sessions = request.app.get(keys.SESSIONS)
    if cookie and sessions is not None:
        found = await sessions.resolve_with_orgs(cookie)
        if found is not None:
            principal, orgs = found
            if _changes_state(request):
                check_origin(request, required=True)
            if orgs is not None:
                request[ORGS_READ] = orgs
            return principal
    config = request.app[keys.CONFIG]
    if config.auth_mode == "none" and _single_user_request(request):
        if _changes_state(request):
            check_origin(request, required=False)
        return Principal(
            user_id=config.bootstrap_user,
            is_admin=True,
            key_id=SINGLE_USER_KEY_ID,
            via="single_user",
        )
    if cookie:
        raise Unauthorized("your session expired or was signed out: sign in again")
    raise Unauthorized(
        "missing API key: send X-Session-API-Key or Authorization: Bearer, "
        "or sign in at /auth/sign-in"
    )


async def limit_attempts(request: web.Request, bucket: str, who: str | None = None) -> None:
    """Count one attempt at a sign-in-like action for `who` (default: the client address).
    Raises QuotaExceeded past ACS_AUTH_RATE_LIMIT_PER_MINUTE."""
    limiter = request.app.get(keys.AUTH_LIMITER)
    if limiter is None:
        return
    # An address counts as the audit gate counts it: an IPv6 client by its /64, which one
    # machine may rotate through (store/audit_flood.py).
    decision = await limiter.hit(f"{bucket}:{who or source_of(request.remote)}")
    if not decision.allowed:
        raise QuotaExceeded(
            f"too many attempts; retry in {decision.reset_after} s",
            retry_after=decision.reset_after,
        )


def principal_of(request: web.Request) -> Principal:
    """The caller the auth middleware found (a route that is not public always has one)."""
    return request[PRINCIPAL]
