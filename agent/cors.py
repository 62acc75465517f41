"""CORS for browsers calling the agent server directly (the OpenHands web frontend does).

Allowed origins: those in ``OH_ALLOW_CORS_ORIGINS_0``, ``_1``, ... (or a JSON list in
``OH_ALLOW_CORS_ORIGINS``), which the control plane sets per deployment, plus any
``localhost``/``127.0.0.1`` origin, as on the official agent server. Preflight requests are
answered before authentication (browsers send them without the key); a preflight from any other
origin is a 400. Responses to allowed origins carry ``Access-Control-Allow-Origin``.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from .errors import error_response

METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
MAX_AGE = "600"


def origin_allowed(origin: str, allowed: frozenset[str]) -> bool:
    if origin.rstrip("/").lower() in allowed:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and (parts.hostname or "") in LOCAL_HOSTS


def cors_middleware(origins: Iterable[str]) -> Middleware:
    allowed = frozenset(o.rstrip("/").lower() for o in origins if o)

    def decorate(response: web.StreamResponse, origin: str) -> None:
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_CREDENTIALS] = "true"
        response.headers.add(hdrs.VARY, "Origin")

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get(hdrs.ORIGIN)
        preflight = (
            request.method == hdrs.METH_OPTIONS
            and origin is not None
            and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers
        )
        if preflight:
            assert origin is not None
            if not origin_allowed(origin, allowed):
                return error_response(400, "Disallowed CORS origin")
            answer = web.Response(status=200, text="OK")
            decorate(answer, origin)
            answer.headers[hdrs.ACCESS_CONTROL_ALLOW_METHODS] = METHODS
            requested = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS)
            if requested:
                answer.headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = requested
            answer.headers[hdrs.ACCESS_CONTROL_MAX_AGE] = MAX_AGE
            return answer
        response = await handler(request)
        if origin is not None and origin_allowed(origin, allowed) and not response.prepared:
            decorate(response, origin)
        return response

    return middleware
