"""GET /api/v1/sandbox-pool: the warm pool as an admin sees it (members are nobody's sandboxes,
so they show in no user's search, not even an admin's `all_users=true`)."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.errors import Forbidden, RuntimeUnavailable
from controlplane.sandboxes.pool_models import PoolView

routes = RouteTable(tag="sandboxes")


@routes.route(
    "GET",
    "/api/v1/sandbox-pool",
    summary="The warm pool per spec: target size, members and their state, claims, misses (admin)",
    response=PoolView,
    errors=(403,),
)
async def get_pool(request: web.Request) -> web.Response:
    if not principal_of(request).is_admin:
        raise Forbidden("the sandbox pool needs an admin key")
    pool = request.app.get(keys.POOL)
    if pool is None:
        raise RuntimeUnavailable("sandboxes are not enabled on this server")
    return json_response(await pool.view())
