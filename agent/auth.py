"""Session API key check for every ``/api/*`` route."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .errors import error_response

API_KEY_HEADER = "X-Session-API-Key"
PROTECTED_PREFIX = "/api/"


def key_is_valid(presented: str | None, keys: Sequence[str]) -> bool:
    """Constant-time comparison of ``presented`` against every configured key."""
    if not presented:
        return False
    given = presented.encode()
    valid = False
    for key in keys:
        # No early exit: the time taken does not depend on which key matched.
        valid |= hmac.compare_digest(given, key.encode())
    return valid


def is_protected(path: str) -> bool:
    return path == PROTECTED_PREFIX.rstrip("/") or path.startswith(PROTECTED_PREFIX)


def auth_middleware(keys: Sequence[str]) -> Middleware:
    """Middleware answering 401 ``{"detail": "Unauthorized"}`` on a bad key.

    With no keys configured (``--insecure-no-auth``) every request passes.
    """
    frozen = tuple(keys)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            frozen
            and is_protected(request.path)
            and not key_is_valid(request.headers.get(API_KEY_HEADER), frozen)
        ):
            return error_response(401, "Unauthorized")
        return await handler(request)

    return middleware
