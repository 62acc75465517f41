"""The sandbox proxy: `/sandboxes/{sandbox_id}/proxy/{port}/{path}` reaches `path` on one port of
one of the caller's sandboxes, HTTP and WebSocket (the scheme: controlplane/sandboxes/links.py).

Who may: the sandbox's own session key (X-Session-API-Key, `Authorization: Bearer`, or
`session_api_key` in the query, as WebSocket clients send it), or the owner's API key, browser
session or single-user mode, or (a WebSocket) the owner's ticket (`acs_ticket`,
auth/tickets.py); anyone else, another user and an admin included, gets a 404, as for a sandbox
that does not exist or was deleted. Not an open proxy: the address is always the
sandbox's own published port, from its record, never from the request.

What reaches the sandbox: the request as sent, without the credential that authorized it (the
user's key or session cookie never reach a sandbox), with the sandbox's session key for its agent
server, `X-Forwarded-*` headers and no `Origin` (the proxy did the origin check) nor cookies
(those of this origin are the control plane's). What comes back: the answer as sent, streamed,
without what could act on the control plane's origin (cookies, Clear-Site-Data, HSTS, CORS, …:
controlplane/api/sandbox_answers.py), under `Content-Security-Policy: sandbox` (a page a
sandbox serves runs in an opaque origin: its scripts cannot use the control plane's cookies).
"""

from __future__ import annotations

import hashlib
import re

import structlog
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from controlplane import keys
from controlplane.api import sandbox_answers
from controlplane.api.cors import EXPOSE_HEADERS
from controlplane.api.routing import RouteTable
from controlplane.auth import tickets
from controlplane.auth.identity import (
    PRINCIPAL,
    SAFE_METHODS,
    authenticate_request,
    presented_key,
)
from controlplane.auth.sessions import COOKIE_NAME
from controlplane.config import ServiceConfig
from controlplane.errors import (
    Conflict,
    ControlPlaneError,
    NotFound,
    RuntimeUnavailable,
    SandboxNotFound,
    Unauthorized,
)
from controlplane.proxy.forward import Limits, Outgoing, ProxyError, request_headers
from controlplane.proxy.state import ProxyState
from controlplane.sandboxes import links
from controlplane.sandboxes.models import SANDBOX_ID_PATTERN, SandboxRecord, SandboxStatus
from controlplane.sandboxes.service import SandboxService
from controlplane.specs.models import AGENT_SERVER

log = structlog.get_logger(__name__)
routes = RouteTable(tag="proxy")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_ID_RE = re.compile(SANDBOX_ID_PATTERN)


class SandboxStarting(ControlPlaneError):
    code = "sandbox_starting"
    status = 503


PORT_DIGITS = 5
"""A port number's most digits (65535)."""


def _port_name(service: SandboxService, record: SandboxRecord, port: str) -> str:
    """The exposed port's name for the path segment: `agent`, a name (any case) or a number."""
    if port == links.AGENT_PORT:
        return AGENT_SERVER
    by_upper = {name.upper(): name for name in record.ports}
    if port.upper() in by_upper:
        return by_upper[port.upper()]
    spec = service.spec_of(record)
    # ASCII digits only, and few: "³" is a digit to str.isdigit() but not to int(), and int()
    # refuses a string of over 4,300 digits; either would be a 500 instead of this 404.
    if port.isascii() and port.isdigit() and len(port) <= PORT_DIGITS and spec is not None:
        for name, number in spec.exposed_ports.items():
            if number == int(port) and name in record.ports:
                return name
    raise NotFound(f"sandbox {record.id} exposes no port {port!r}")


async def _authorize(
    request: web.Request, service: SandboxService, state: ProxyState, sandbox_id: str
) -> tuple[SandboxRecord, str | None]:
    """The sandbox, if the caller may use it; and the key it presented (to strip). Raises
    Unauthorized, Forbidden (a browser session from another origin) or SandboxNotFound
    (someone else's, or none)."""
    ticket = request.query.get(tickets.QUERY_PARAM)
    if ticket is not None and _is_websocket(request):
        return await _ticket_holder(request, service, sandbox_id, ticket), None
    presented = presented_key(request) or request.query.get("session_api_key")
    credential = presented or request.cookies.get(COOKIE_NAME)
    cache_key = hashlib.sha256(credential.encode()).hexdigest() if credential else None
    if presented is None and _changes_state(request):
        cache_key = None  # a browser session's origin is checked on every such request
    if cache_key is not None:
        found = state.granted(sandbox_id, cache_key)
        if found is not None:
            return found[0], presented
    seen = state.version(sandbox_id)  # a change heard from here on voids what is read now
    own = await service.by_session_key(presented, sandbox_id)
    if own is not None:
        if cache_key is not None:
            state.grant(own, cache_key, True, seen)
        return own, presented
    record = await service.record(sandbox_id) if _ID_RE.match(sandbox_id) else None
    principal = await authenticate_request(request, presented)
    request[PRINCIPAL] = principal
    structlog.contextvars.bind_contextvars(user_id=principal.user_id)
    if record is None or record.owner != principal.user_id:
        raise SandboxNotFound(f"sandbox {sandbox_id} not found")
    if cache_key is not None:
        state.grant(record, cache_key, False, seen)
    return record, presented


async def _ticket_holder(
    request: web.Request, service: SandboxService, sandbox_id: str, ticket: str
) -> SandboxRecord:
    """The sandbox, for a WebSocket ticket its owner minted for it (auth/tickets.py): used up
    whatever happens; never cached."""
    principal = await request.app[keys.TICKETS].redeem(ticket, "sandbox", sandbox_id)
    if principal is None:
        raise Unauthorized("the ticket is unknown, used, expired or not for this sandbox")
    request[PRINCIPAL] = principal
    structlog.contextvars.bind_contextvars(user_id=principal.user_id)
    record = await service.record(sandbox_id)
    if record is None or record.owner != principal.user_id:
        raise SandboxNotFound(f"sandbox {sandbox_id} not found")
    return record


def _is_websocket(request: web.Request) -> bool:
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


def _changes_state(request: web.Request) -> bool:
    upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
    return request.method not in SAFE_METHODS or upgrade


def _usable(record: SandboxRecord) -> None:
    if record.status == SandboxStatus.RUNNING:
        return
    if record.status == SandboxStatus.STARTING:
        raise SandboxStarting(f"sandbox {record.id} is starting; retry in a moment")
    if record.status == SandboxStatus.PAUSED:
        raise Conflict(
            f"sandbox {record.id} is PAUSED: resume it (POST /api/v1/sandboxes/{record.id}/resume)"
        )
    raise Conflict(f"sandbox {record.id} is {record.status.value}: {record.reason or 'no reason'}")


def _upstream_url(request: web.Request, base: str, presented: str | None, websocket: bool) -> URL:
    """`base` + the path after the port segment, as the client encoded it, + the query without
    the credential it carried (a key, a ticket)."""
    parts = request.rel_url.raw_path.split("/", 5)  # '', sandboxes, id, proxy, port, rest
    tail = "/" + parts[5] if len(parts) > 5 else "/"
    query = [
        (k, v)
        for k, v in request.rel_url.query.items()
        if not (k == "session_api_key" and v == presented) and k != tickets.QUERY_PARAM
    ]
    scheme = "ws" if websocket else "http"
    url = URL(f"{scheme}{base.removeprefix('http')}{tail}", encoded=True)
    return url.with_query(query) if query else url


def _upstream_headers(
    request: web.Request, record: SandboxRecord, name: str, presented: str | None
) -> CIMultiDict[str]:
    # Cookies of this origin are the control plane's (a sandbox cannot set any): none is sent.
    strip = ["Origin", "Cookie", "X-Session-API-Key"]
    if presented is not None and request.headers.get("Authorization", "")[7:].strip() == presented:
        strip.append("Authorization")
    headers = request_headers(request.headers, strip=strip)
    if name == AGENT_SERVER:
        headers["X-Session-API-Key"] = record.session_api_key
    forwarded = request.headers.get("X-Forwarded-For")
    client = request.remote or ""
    headers["X-Forwarded-For"] = f"{forwarded}, {client}" if forwarded else client
    headers.setdefault("X-Forwarded-Proto", request.scheme)
    headers.setdefault("X-Forwarded-Host", request.host)
    port = request.match_info["port"]
    headers["X-Forwarded-Prefix"] = links.proxy_prefix(record.id, port)
    return headers


def _response_headers(request: web.Request, config: ServiceConfig) -> dict[str, str]:
    added = dict(sandbox_answers.ANSWER_HEADERS)
    origin = request.headers.get("Origin")
    if origin and origin.rstrip("/").lower() in config.cors_origins:
        added.update(
            {
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Credentials": "true",
                "Access-Control-Expose-Headers": EXPOSE_HEADERS,
                "Vary": "Origin",
            }
        )
    return added


async def proxy(request: web.Request) -> web.StreamResponse:
    config = request.app[keys.CONFIG]
    service = request.app.get(keys.SANDBOXES)
    if service is None:
        raise RuntimeUnavailable("this control plane runs no sandboxes")
    state = request.app[keys.PROXY]
    sandbox_id, port = request.match_info["sandbox_id"], request.match_info["port"]
    record, presented = await _authorize(request, service, state, sandbox_id)
    _usable(record)
    name = _port_name(service, record, port)
    websocket = request.headers.get("Upgrade", "").lower() == "websocket"
    base = await service.port_base(record, name, state)
    out = Outgoing(
        url=_upstream_url(request, base, presented, websocket),
        headers=_upstream_headers(request, record, name, presented),
        answer_headers=sandbox_answers.filtered,
        add_response=_response_headers(request, config),
    )
    if state.touch_due(record.id):
        await service.touch(record.id)
    limits = Limits(max_body=config.proxy_max_body_bytes, read_timeout=config.proxy_read_timeout)
    try:
        if websocket and request.method == "GET":
            return await state.forward_websocket(request, out, limits)
        return await state.forward_http(request, out, limits)
    except ProxyError as exc:
        log.info("proxy_upstream_failed", sandbox_id=record.id, port=port, error=str(exc))
        return web.json_response(
            {"detail": f"sandbox {record.id} port {port}: {exc}"}, status=exc.status
        )


def _register() -> None:
    """One documented operation per method and path (operation ids must differ), all `proxy`."""
    for path, suffix in (
        (f"{links.PROXY_ROOT}/{{sandbox_id}}/proxy/{{port}}", ""),
        (f"{links.PROXY_ROOT}/{{sandbox_id}}/proxy/{{port}}/{{path:.*}}", "_path"),
    ):
        for method in METHODS:

            async def handler(request: web.Request) -> web.StreamResponse:
                return await proxy(request)

            handler.__name__ = f"proxy_{method.lower()}{suffix}"
            # The proxy bounds bodies and time itself (ACS_PROXY_MAX_BODY_BYTES and
            # ACS_PROXY_READ_TIMEOUT), not with the API's limits (controlplane/middlewares.py).
            handler.acs_own_limits = True  # type: ignore[attr-defined]
            routes.route(
                method,
                path,
                summary="The sandbox proxy: this request, forwarded to one port of the caller's "
                "sandbox (`agent`, a port name or number); WebSocket upgrades too",
                public=True,  # authenticates itself (_authorize)
                errors=(401, 403, 404, 409, 413, 502, 503, 504),
            )(handler)


_register()
