"""CORS for the origins in ACS_CORS_ORIGINS only (none by default: same-origin pages only).

Allowed origins may send credentials (a key header or the session cookie); every other origin
gets no CORS headers, so browsers keep its scripts from reading our answers, and its preflights
are refused with 403.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from controlplane.api.routing import Handler

ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE"
# X-Org-Id and X-OpenHands-Client(-Version, -Telemetry-Distinct-Id): what Agent Canvas adds to
# its calls as a cloud client (agent-canvas src/api/client-source.ts, cloud/client.ts).
ALLOW_HEADERS = (
    "Authorization, Content-Type, X-Session-API-Key, X-Request-ID, X-Org-Id, X-OpenHands-Client,"
    " X-OpenHands-Client-Version, X-OpenHands-Telemetry-Distinct-Id"
)
EXPOSE_HEADERS = "X-Request-ID, X-RateLimit-Limit, X-RateLimit-Remaining, Retry-After"
PREFLIGHT_MAX_AGE = "600"


def cors_middleware(origins: Iterable[str]) -> Any:
    allowed = frozenset(origins)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        granted = origin if origin and origin.rstrip("/").lower() in allowed else None
        if (
            request.method == "OPTIONS"
            and origin is not None
            and "Access-Control-Request-Method" in request.headers
        ):
            if granted is None:
                return web.json_response(
                    {"detail": f"cross-origin requests from {origin} are not allowed"},
                    status=403,
                )
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Origin": granted,
                    "Access-Control-Allow-Credentials": "true",
                    "Access-Control-Allow-Methods": ALLOW_METHODS,
                    "Access-Control-Allow-Headers": ALLOW_HEADERS,
                    "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
                    "Vary": "Origin",
                },
            )
        response = await handler(request)
        if allowed and not response.prepared:
            response.headers["Vary"] = "Origin"
            if granted is not None:
                response.headers["Access-Control-Allow-Origin"] = granted
                response.headers["Access-Control-Allow-Credentials"] = "true"
                response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        return response

    return middleware
