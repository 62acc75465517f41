"""GET /api/v1/lifecycle-events/search: what happened to the caller's sandboxes and why; and the
webhook deliveries given up (admin)."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.errors import Forbidden, RuntimeUnavailable
from controlplane.lifecycle.models import (
    DeadLetterList,
    DeadLetterQuery,
    LifecycleEventPage,
    LifecycleQuery,
)

routes = RouteTable(tag="lifecycle")


@routes.route(
    "GET",
    "/api/v1/lifecycle-events/search",
    summary="Lifecycle events (created, running, paused, resumed, deleted, error), newest first",
    query=LifecycleQuery,
    response=LifecycleEventPage,
    errors=(403,),
)
async def search_lifecycle(request: web.Request) -> web.Response:
    query = parse_query(request, LifecycleQuery)
    principal = principal_of(request)
    if query.all_users and not principal.is_admin:
        raise Forbidden("all_users=true needs an admin key")
    publisher = request.app.get(keys.LIFECYCLE)
    if publisher is None:
        raise RuntimeUnavailable("lifecycle events are not enabled on this server")
    user = None if query.all_users else principal.user_id
    page = await publisher.page(user, query.sandbox_id, query.page_id, query.limit)
    return json_response(page)


@routes.route(
    "GET",
    "/api/v1/lifecycle-events/dead-letters",
    summary="Admin: lifecycle webhook deliveries given up, newest first (empty without URLs)",
    query=DeadLetterQuery,
    response=DeadLetterList,
    errors=(403,),
)
async def dead_letters(request: web.Request) -> web.Response:
    query = parse_query(request, DeadLetterQuery)
    if not principal_of(request).is_admin:
        raise Forbidden("dead letters need an admin key")
    outbox = request.app.get(keys.WEBHOOK_OUTBOX)
    items = [] if outbox is None else await outbox.dead_letters(query.limit)
    return json_response(DeadLetterList(items=items))
