"""GET /api/v1/sandbox-specs/search and the batch get."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.pagination import MAX_BATCH, PageQuery, cursor_field
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.specs.models import SPEC_ID_PATTERN, SandboxSpecInfo, SandboxSpecInfoPage

routes = RouteTable(tag="sandbox-specs")


class SpecBatchQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class SpecPageQuery(PageQuery):
    page_id: str | None = cursor_field(SPEC_ID_PATTERN.strip("^$"))


@routes.route(
    "GET",
    "/api/v1/sandbox-specs/search",
    summary="List sandbox specs (templates), in id order",
    query=SpecPageQuery,
    response=SandboxSpecInfoPage,
)
async def search_specs(request: web.Request) -> web.Response:
    query = parse_query(request, SpecPageQuery)
    return json_response(request.app[keys.SPECS].search(query.page_id, query.limit))


@routes.route(
    "GET",
    "/api/v1/sandbox-specs",
    summary="Get sandbox specs by id (null for missing)",
    query=SpecBatchQuery,
    response=list[SandboxSpecInfo | None],
)
async def batch_get_specs(request: web.Request) -> web.Response:
    query = parse_query(request, SpecBatchQuery)
    return json_response(request.app[keys.SPECS].infos(query.id))
