"""/api/v1/sandboxes: search, batch get, start, pause, resume, delete (by path or query)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.errors import RuntimeUnavailable
from controlplane.sandboxes.models import (
    DeleteSandboxQuery,
    SandboxBatchQuery,
    SandboxInfo,
    SandboxPage,
    SandboxSearchQuery,
    StartSandboxQuery,
    StartSandboxRequest,
    Success,
)
from controlplane.sandboxes.service import SandboxService

routes = RouteTable(tag="sandboxes")
# Anything but "search", so that /search never matches it (a 405 there would advertise this
# route's methods in its Allow header); a malformed id still gets its "sandbox … not found".
SANDBOX = "{sandbox_id:(?!search$)[^/]+}"
T = TypeVar("T")


def _service(request: web.Request) -> SandboxService:
    service = request.app.get(keys.SANDBOXES)
    if service is None:
        raise RuntimeUnavailable("sandboxes are not enabled on this server")
    return service


async def _timed(request: web.Request, operation: str, call: Awaitable[T]) -> T:
    """Await one service call; a successful one is observed in acs_sandbox_api_seconds."""
    started = time.perf_counter()
    result = await call
    metrics = request.app.get(keys.METRICS)
    if metrics is not None:
        metrics.sandbox_call(operation, time.perf_counter() - started)
    return result


@routes.route(
    "GET",
    "/api/v1/sandboxes/search",
    summary="Search sandboxes, newest first",
    query=SandboxSearchQuery,
    response=SandboxPage,
    errors=(403,),
)
async def search_sandboxes(request: web.Request) -> web.Response:
    query = parse_query(request, SandboxSearchQuery)
    return json_response(await _service(request).search(principal_of(request), query))


@routes.route(
    "GET",
    "/api/v1/sandboxes",
    summary="Get sandboxes by id (null for unknown or not yours)",
    query=SandboxBatchQuery,
    response=list[SandboxInfo | None],
)
async def batch_get_sandboxes(request: web.Request) -> web.Response:
    query = parse_query(request, SandboxBatchQuery)
    return json_response(await _service(request).batch_get(principal_of(request), query.id))


@routes.route(
    "GET",
    f"/api/v1/sandboxes/{SANDBOX}",
    summary="Get one sandbox",
    response=SandboxInfo,
    errors=(404,),
)
async def get_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["sandbox_id"]
    return json_response(await _service(request).get(principal_of(request), sandbox_id))


@routes.route(
    "POST",
    "/api/v1/sandboxes",
    summary="Start a sandbox from a spec (JSON body or query sandbox_spec_id; default spec), "
    "or from a snapshot (snapshot_id)",
    body=StartSandboxRequest,
    body_optional=True,
    query=StartSandboxQuery,
    response=SandboxInfo,
    errors=(404, 422, 429, 503),
)
async def start_sandbox(request: web.Request) -> web.Response:
    query = parse_query(request, StartSandboxQuery)
    body = await parse_body(request, StartSandboxRequest, optional=True)
    spec_id = body.sandbox_spec_id or query.sandbox_spec_id
    started = _service(request).start(principal_of(request), spec_id, body.snapshot_id)
    return json_response(await _timed(request, "start", started))


@routes.route(
    "POST",
    f"/api/v1/sandboxes/{SANDBOX}/pause",
    summary="Pause a sandbox (its processes stop, its workspace stays); a paused one is a no-op",
    response=Success,
    errors=(404, 409),
)
async def pause_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["sandbox_id"]
    await _timed(request, "pause", _service(request).pause(principal_of(request), sandbox_id))
    return json_response(Success())


@routes.route(
    "POST",
    f"/api/v1/sandboxes/{SANDBOX}/resume",
    summary="Resume a sandbox; a running one is a no-op",
    response=Success,
    errors=(404, 409, 429),
)
async def resume_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["sandbox_id"]
    await _timed(request, "resume", _service(request).resume(principal_of(request), sandbox_id))
    return json_response(Success())


@routes.route(
    "DELETE",
    f"/api/v1/sandboxes/{SANDBOX}",
    summary="Delete a sandbox, its container and its workspace volume",
    response=Success,
    errors=(404,),
)
async def delete_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["sandbox_id"]
    await _timed(request, "delete", _service(request).delete(principal_of(request), sandbox_id))
    return json_response(Success())


@routes.route(
    "DELETE",
    "/api/v1/sandboxes",
    summary="Delete a sandbox named by the query (?sandbox_id=), as OpenHands clients send it",
    query=DeleteSandboxQuery,
    response=Success,
    errors=(404,),
)
async def delete_sandbox_by_query(request: web.Request) -> web.Response:
    sandbox_id = parse_query(request, DeleteSandboxQuery).sandbox_id
    await _timed(request, "delete", _service(request).delete(principal_of(request), sandbox_id))
    return json_response(Success())
