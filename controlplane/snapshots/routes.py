"""/api/v1/snapshots and a sandbox's snapshots and forks (docs/api.md#snapshots)."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.errors import StoreUnavailable
from controlplane.sandboxes.models import Success
from controlplane.snapshots.models import (
    ForkRequest,
    ForkResult,
    SnapshotInfo,
    SnapshotPage,
    SnapshotSearchQuery,
    TakeSnapshotRequest,
)
from controlplane.snapshots.service import SnapshotService

routes = RouteTable(tag="snapshots")
SANDBOX = "{sandbox_id:(?!search$)[^/]+}"
SNAPSHOT = "{snapshot_id:(?!search$)[^/]+}"


def _service(request: web.Request) -> SnapshotService:
    service = request.app.get(keys.SNAPSHOTS)
    if service is None:
        raise StoreUnavailable("snapshots are not enabled: ACS_SNAPSHOT_STORE_URL is unset")
    return service


@routes.route(
    "POST",
    f"/api/v1/sandboxes/{SANDBOX}/snapshots",
    summary="Take a consistent snapshot of a sandbox (its workspace and what changed outside it)",
    body=TakeSnapshotRequest,
    body_optional=True,
    response=SnapshotInfo,
    errors=(404, 409, 429, 503),
)
async def take_snapshot(request: web.Request) -> web.Response:
    body = await parse_body(request, TakeSnapshotRequest, optional=True)
    sandbox_id = request.match_info["sandbox_id"]
    taken = await _service(request).take(principal_of(request), sandbox_id, body.name)
    return json_response(taken)


@routes.route(
    "GET",
    "/api/v1/snapshots/search",
    summary="Search your snapshots, newest first",
    query=SnapshotSearchQuery,
    response=SnapshotPage,
    errors=(503,),
)
async def search_snapshots(request: web.Request) -> web.Response:
    query = parse_query(request, SnapshotSearchQuery)
    return json_response(await _service(request).search(principal_of(request), query))


@routes.route(
    "GET",
    f"/api/v1/snapshots/{SNAPSHOT}",
    summary="Get one snapshot (size, parent, sandbox, spec, created)",
    response=SnapshotInfo,
    errors=(404, 503),
)
async def get_snapshot(request: web.Request) -> web.Response:
    snapshot_id = request.match_info["snapshot_id"]
    return json_response(await _service(request).get(principal_of(request), snapshot_id))


@routes.route(
    "DELETE",
    f"/api/v1/snapshots/{SNAPSHOT}",
    summary="Delete a snapshot (sandboxes started from it keep running)",
    response=Success,
    errors=(404, 503),
)
async def delete_snapshot(request: web.Request) -> web.Response:
    snapshot_id = request.match_info["snapshot_id"]
    await _service(request).delete(principal_of(request), snapshot_id)
    return json_response(Success())


@routes.route(
    "POST",
    f"/api/v1/sandboxes/{SANDBOX}/fork",
    summary="Start `count` new sandboxes from one consistent snapshot of a sandbox",
    body=ForkRequest,
    body_optional=True,
    response=ForkResult,
    errors=(404, 409, 429, 503),
)
async def fork_sandbox(request: web.Request) -> web.Response:
    body = await parse_body(request, ForkRequest, optional=True)
    sandbox_id = request.match_info["sandbox_id"]
    forked = await _service(request).fork(principal_of(request), sandbox_id, body.count)
    return json_response(forked)
