"""The middleware that makes a request's Redis writes wait for their replicas
(controlplane/store/durable.py): every request that may change something."""

from __future__ import annotations

from aiohttp import web

from controlplane.api.routing import Handler
from controlplane.store.durable import durable_writes

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@web.middleware
async def durable_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Innermost: the rate limiter's and the session's own bookkeeping do not wait, only what
    the handler (and the tasks it starts) records."""
    if request.method not in MUTATING:
        return await handler(request)
    with durable_writes():
        return await handler(request)
