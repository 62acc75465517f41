"""GET /api/v1/audit-events/search (a page of JSON) and /export (JSON lines): the audit log, for
deployment admins and an organization's owners, admins and auditors (controlplane/audit/search.py
says who reads what). No route writes to the log: it is append-only through the API."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import parse_query
from controlplane.api.routing import RouteTable
from controlplane.audit.models import AuditQuery
from controlplane.audit.search import AuditSearch
from controlplane.auth.identity import principal_of
from controlplane.errors import RuntimeUnavailable
from controlplane.store.audit_event import AuditEventPage

routes = RouteTable(tag="audit")


def _search(request: web.Request) -> tuple[AuditSearch, AuditQuery]:
    search = request.app.get(keys.AUDIT_SEARCH)
    if search is None:
        raise RuntimeUnavailable("the audit log is not enabled on this server")
    return search, parse_query(request, AuditQuery)


@routes.route(
    "GET",
    "/api/v1/audit-events/search",
    summary="Audit entries (who did what, to what, when, from where, how it ended), newest first",
    query=AuditQuery,
    response=AuditEventPage,
    errors=(403, 404),
)
async def search_audit(request: web.Request) -> web.Response:
    search, query = _search(request)
    page = await search.search(principal_of(request), query)
    return web.Response(text=page.json(), content_type="application/json")


@routes.route(
    "GET",
    "/api/v1/audit-events/export",
    summary="Every matching audit entry as JSON lines (application/x-ndjson), newest first",
    query=AuditQuery,
    response=str,
    errors=(403, 404),
)
async def export_audit(request: web.Request) -> web.StreamResponse:
    search, query = _search(request)
    lines = await search.export(principal_of(request), query)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    async for line in lines:
        await response.write(line.encode())
    await response.write_eof()
    return response
