"""POST /api/cloud-proxy: how Agent Canvas reaches a sandbox's agent server (git, files, bash,
messages, confirmations) without the browser calling it directly.

The body is Canvas's envelope (agent-canvas `src/api/cloud/proxy.ts`, the typescript client's
`CloudClient.requestThroughProxy`): `{host, method, path, headers, body, timeout_seconds}`, where
`headers` carries the sandbox's `X-Session-API-Key`. That key is the credential: it names the
sandbox, and `host` must be that sandbox's agent server (its published port, under the host name
we publish or the one this request was addressed to, which is how Canvas rewrites a loopback URL
for a remote browser). Anything else is refused: this is no open proxy. A caller who also brings
an API key or a session must own the sandbox (else 404, as for a sandbox that does not exist).

The request goes to the agent server as the control plane reaches it, with the session key and
the content headers only; the answer comes back as the agent server gave it (status, body,
content type), at most 16 MiB, within `timeout_seconds` (1 to 60, below ACS_REQUEST_TIMEOUT).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Literal
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.parsing import parse_body
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import PRINCIPAL, authenticate_request, presented_key
from controlplane.auth.sessions import COOKIE_NAME
from controlplane.errors import Conflict, Forbidden, SandboxNotFound, Unauthorized
from controlplane.sandboxes.models import SandboxStatus
from controlplane.specs.models import AGENT_SERVER

routes = RouteTable(tag="sandboxes")
SESSION_HEADER = "x-session-api-key"


class CloudProxyRequest(BaseModel):
    """Fields of later Canvas versions are ignored, not refused."""

    model_config = ConfigDict(extra="ignore")

    host: str = Field(max_length=2048, pattern=r"^https?://[^/\s?#]+/?$")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    path: str = Field(max_length=8192, pattern=r"^/([^/\s#][^\s#]*)?$")
    headers: dict[str, str] = Field(default_factory=dict, max_length=64)
    body: Any = None
    timeout_seconds: float = Field(default=15.0, ge=1, le=60)


def _body(envelope: CloudProxyRequest) -> tuple[bytes | None, dict[str, str]]:
    headers = dict(envelope.headers)
    if envelope.body is None or envelope.method in ("GET", "DELETE"):
        return None, headers
    if isinstance(envelope.body, str):
        return envelope.body.encode(), headers
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    return json.dumps(envelope.body).encode(), headers


def _allowed_names(request: web.Request, url_host: str) -> set[str]:
    names = {url_host.lower(), (urlsplit(f"//{request.host}").hostname or "").lower()}
    try:
        if ipaddress.ip_address(url_host).is_loopback:
            names |= {"localhost", "127.0.0.1"}
    except ValueError:
        if url_host == "localhost":
            names.add("127.0.0.1")
    return names


async def _caller_may_use(request: web.Request, owner: str) -> None:
    """A caller who brings a credential must own the sandbox (admins: any)."""
    if presented_key(request) is None and COOKIE_NAME not in request.cookies:
        return
    principal = await authenticate_request(request)
    request[PRINCIPAL] = principal
    if principal.user_id != owner and not principal.is_admin:
        raise SandboxNotFound("no sandbox has that session key")


@routes.route(
    "POST",
    "/api/cloud-proxy",
    summary="Send a request to one of your sandboxes' agent servers (Agent Canvas's envelope; "
    "the sandbox's session key in `headers` authorises it)",
    body=CloudProxyRequest,
    public=True,
    errors=(401, 403, 404, 409, 502),
)
async def cloud_proxy(request: web.Request) -> web.Response:
    envelope = await parse_body(request, CloudProxyRequest)
    key = next((v for k, v in envelope.headers.items() if k.lower() == SESSION_HEADER), "")
    sandboxes = request.app.get(keys.SANDBOXES)
    if not key or sandboxes is None:
        raise Unauthorized("the envelope's headers must carry the sandbox's X-Session-API-Key")
    record = await sandboxes.by_session_key(key)
    if record is None:
        raise Unauthorized("no sandbox has that session key")
    await _caller_may_use(request, record.owner)
    config = request.app[keys.CONFIG]
    target = urlsplit(envelope.host)
    port = record.ports.get(AGENT_SERVER)
    if (
        port is None
        or target.port != port
        or (target.hostname or "").lower() not in _allowed_names(request, config.url_host)
    ):
        raise Forbidden(f"{envelope.host} is not the agent server of the sandbox of that key")
    if record.status != SandboxStatus.RUNNING:
        raise Conflict(
            f"sandbox {record.id} is {record.status.value}: resume it before calling its agent"
        )
    body, headers = _body(envelope)
    limit = max(1.0, min(envelope.timeout_seconds, config.request_timeout - 2))
    answer = await request.app[keys.RUNTIME_HTTP].send(
        envelope.method,
        record.agent_url(config.url_host) + envelope.path,
        record.session_api_key,
        headers=headers,
        body=body,
        timeout=limit,
    )
    return answer.response()
