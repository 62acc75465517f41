"""GET /api/v1/sandbox-specs/search and the batch get."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.pagination import (
    MAX_BATCH,
    PageQuery,
    cursor_field,
    decode_cursor,
    encode_cursor,
)
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
    catalog = request.app[keys.SPECS]
    after = decode_cursor(query.page_id, SPEC_ID_PATTERN.strip("^$"))
    specs = [s for s in catalog.all() if after is None or s.id > after]
    page = specs[: query.limit]
    next_page = encode_cursor(page[-1].id) if len(specs) > query.limit else None
    return json_response(
        SandboxSpecInfoPage(items=[catalog.info(s) for s in page], next_page_id=next_page)
    )


@routes.route(
    "GET",
    "/api/v1/sandbox-specs",
    summary="Get sandbox specs by id (null for missing)",
    query=SpecBatchQuery,
    response=list[SandboxSpecInfo | None],
)
async def batch_get_specs(request: web.Request) -> web.Response:
    query = parse_query(request, SpecBatchQuery)
    catalog = request.app[keys.SPECS]
    items = [catalog.info(s) if (s := catalog.find(i)) else None for i in query.id]
    return json_response(items)
