"""The secrets a sandbox may look up, for code running in it (OpenHands' sandbox-scoped settings
routes; the SDK's `OpenHandsCloudWorkspace.get_secrets()` lists them and hands the agent
`LookupSecret`s that fetch each value on use):

- `GET /api/v1/sandboxes/{sandbox_id}/settings/secrets`: the names and descriptions of the
  owner's custom secrets and of their git provider tokens (as `GITHUB_TOKEN`, … the names a
  conversation gets them under), never a value;
- `GET /api/v1/sandboxes/{sandbox_id}/settings/secrets/{secret_name}`: one value, as text/plain.

The credential is the sandbox's own session key in `X-Session-API-Key`, and the sandbox must be
RUNNING: these routes answer a sandbox about its owner, nothing more (a user's API key is not
accepted here; another sandbox's key, or a sandbox id that is not the key's, is a 404).
"""

from __future__ import annotations

import secrets

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.errors import Conflict, NotFound, SandboxNotFound, Unauthorized
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.settings.models import UserRecord

routes = RouteTable(tag="sandboxes")
BASE = "/api/v1/sandboxes/{sandbox_id}/settings/secrets"
DEFAULT_AGENT_PROFILE = "default"


class SecretNamesQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_profile_id: str | None = Field(
        default=None, max_length=64, description="Only 'default': the one agent profile there is"
    )


class SecretNameItem(BaseModel):
    name: str
    description: str | None = None


class SecretNamesResponse(BaseModel):
    secrets: list[SecretNameItem]


async def sandbox_of_key(request: web.Request) -> SandboxRecord:
    """The RUNNING sandbox of the path whose session key the request carries. Raises
    Unauthorized (no session key of any sandbox), SandboxNotFound (the key is another
    sandbox's) or Conflict (not RUNNING)."""
    sandboxes = request.app.get(keys.SANDBOXES)
    key = request.headers.get("X-Session-API-Key")
    record = await sandboxes.by_session_key(key) if sandboxes is not None else None
    if record is None:
        raise Unauthorized("X-Session-API-Key must be the session key of a sandbox")
    wanted = request.match_info["sandbox_id"]
    if not secrets.compare_digest(record.id.encode(), wanted.encode()):
        raise SandboxNotFound(f"sandbox {wanted} not found")
    if record.status != SandboxStatus.RUNNING:
        raise Conflict(f"sandbox {wanted} is {record.status.value}")
    return record


def provider_secrets(record: UserRecord) -> dict[str, str]:
    return {f"{p.value.upper()}_TOKEN": t.token for p, t in record.provider_tokens.items()}


@routes.route(
    "GET",
    BASE,
    summary="Names of the secrets this sandbox may look up (its session key authorises)",
    query=SecretNamesQuery,
    response=SecretNamesResponse,
    public=True,
    errors=(401, 404, 409),
)
async def list_secret_names(request: web.Request) -> web.Response:
    query = parse_query(request, SecretNamesQuery)
    sandbox = await sandbox_of_key(request)
    if query.agent_profile_id not in (None, DEFAULT_AGENT_PROFILE):
        raise NotFound(f"agent profile {query.agent_profile_id} not found")
    record = await request.app[keys.SETTINGS].record(sandbox.owner)
    items = [
        SecretNameItem(name=name, description=secret.description)
        for name, secret in sorted(record.custom_secrets.items())
    ]
    items += [
        SecretNameItem(name=name, description=f"{name} provider token")
        for name in sorted(provider_secrets(record))
        if name not in record.custom_secrets
    ]
    return json_response(SecretNamesResponse(secrets=items))


@routes.route(
    "GET",
    BASE + "/{secret_name}",
    summary="One secret's value as text/plain, for this sandbox (its session key authorises)",
    public=True,
    errors=(401, 404, 409),
)
async def get_secret_value(request: web.Request) -> web.Response:
    sandbox = await sandbox_of_key(request)
    name = request.match_info["secret_name"]
    record = await request.app[keys.SETTINGS].record(sandbox.owner)
    custom = record.custom_secrets.get(name)
    value = custom.value if custom is not None else provider_secrets(record).get(name)
    if value is None:
        raise NotFound(f"secret {name} not found")
    return web.Response(
        text=value, content_type="text/plain", headers={"Cache-Control": "no-store"}
    )
