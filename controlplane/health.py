"""Liveness, readiness, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane import keys
from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import authenticate_request
from controlplane.errors import Forbidden
from controlplane.metrics import CONTENT_TYPE
from controlplane.store.pool import StoreBusy
from controlplane.store.redis import REDIS_DOWN

routes = RouteTable(tag="health")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ok", "degraded", "draining"]
    redis: bool
    runtime: bool | None = Field(
        default=None,
        description="the sandbox runtime answers (null: this app runs no sandboxes)",
    )
    driver: str | None = Field(default=None, description="which runtime: ACS_DRIVER")


@routes.route(
    "GET", "/health", summary="Liveness: the process serves HTTP", response=Health, public=True
)
async def health(_request: web.Request) -> web.Response:
    return json_response(Health())


@routes.route(
    "GET",
    "/ready",
    summary="Readiness: Redis (and the sandbox runtime) answer, and the replica is not shutting "
    "down",
    response=Readiness,
    public=True,
    errors=(503,),
)
async def ready(request: web.Request) -> web.Response:
    try:
        redis_ok = bool(await request.app[keys.REDIS].ping())
    except StoreBusy:
        redis_ok = True  # it answers; this replica's pool was full (a burst), not an outage
    except REDIS_DOWN:
        redis_ok = False
    runtime_ok: bool | None = None
    driver: str | None = None
    if keys.SANDBOXES in request.app:
        runtime_ok = await request.app[keys.SANDBOXES].runtime_available()
        driver = request.app[keys.CONFIG].driver
    ok = redis_ok and runtime_ok is not False
    status: Literal["ok", "degraded", "draining"] = "ok" if ok else "degraded"
    if request.app[keys.DRAIN].draining:  # first thing at SIGTERM: a balancer stops sending here
        status, ok = "draining", False
    body = Readiness(status=status, redis=redis_ok, runtime=runtime_ok, driver=driver)
    return json_response(body, status=200 if ok else 503)


@routes.route(
    "GET",
    "/metrics",
    summary="Prometheus metrics (text format); an admin key unless ACS_METRICS_PUBLIC",
    public=True,  # authenticates itself, so that ACS_METRICS_PUBLIC can open it
    errors=(401, 403, 503),
)
async def metrics(request: web.Request) -> web.Response:
    config = request.app[keys.CONFIG]
    if not config.metrics_public:
        principal = await authenticate_request(request)
        if not principal.is_admin:
            raise Forbidden("metrics need an admin API key")
    collected = request.app[keys.METRICS]
    await request.app[keys.GAUGES].refresh(
        collected, request.app[keys.REDIS], request.app.get(keys.WEBHOOK_OUTBOX)
    )
    return web.Response(body=collected.render(), headers={"Content-Type": CONTENT_TYPE})


@routes.route(
    "GET",
    "/api/openapi.json",
    summary="This API's OpenAPI 3.1 document",
    public=True,
    response=dict[str, Any],
)
async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[keys.OPENAPI_DOC], content_type="application/json")
