"""GET /api/v1/sandbox-pool: the warm pool as an admin sees it (members are nobody's sandboxes,
so they show in no user's search, not even an admin's `all_users=true`)."""

from __future__ import annotations

from datetime import datetime

from aiohttp import web
from pydantic import BaseModel

from controlplane import keys
from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.errors import Forbidden, RuntimeUnavailable
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.pool import WarmPool

routes = RouteTable(tag="sandboxes")


class PoolMember(BaseModel):
    id: str
    status: SandboxStatus
    ready: bool  # claimable now
    stale: bool  # booted from another spec content or image; the refiller drops it
    created_at: datetime
    reason: str | None = None


class PoolOfSpec(BaseModel):
    spec_id: str
    size: int  # the target (ACS_WARM_POOL or the spec's warm_pool)
    state: str  # how members wait: running or paused
    claims: int
    misses: int
    members: list[PoolMember]


class PoolView(BaseModel):
    specs: list[PoolOfSpec]


async def describe(pool: WarmPool) -> PoolView:
    members = await pool.store.members()
    stats = await pool.store.stats()
    out: list[PoolOfSpec] = []
    for spec in pool.catalog.all():
        mine = [(r, fp) for r, fp in members if r.spec_id == spec.id]
        current = await pool.current(spec)
        ready = await pool.store.ready_ids(spec.id)
        out.append(
            PoolOfSpec(
                spec_id=spec.id,
                size=pool.size(spec),
                state=spec.warm_pool_state,
                claims=stats.get(f"claims:{spec.id}", 0),
                misses=stats.get(f"misses:{spec.id}", 0),
                members=[
                    PoolMember(
                        id=r.id,
                        status=r.status,
                        ready=r.id in ready,
                        stale=fp != current,
                        created_at=r.created_at,
                        reason=r.reason,
                    )
                    for r, fp in mine
                ],
            )
        )
    return PoolView(specs=out)


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
    return json_response(await describe(pool))
