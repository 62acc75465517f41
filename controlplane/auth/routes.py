"""Who am I (/api/v1/users/me) and the BYOR LLM key question the OpenHands CLI asks at login."""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.middlewares import principal_of
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.sandbox_scope import SANDBOX_SCOPE
from controlplane.errors import Unauthorized
from controlplane.sandboxes.models import SandboxStatus
from controlplane.settings.models import SettingsResponse
from controlplane.settings.profiles import LlmProfilesView, view_of

routes = RouteTable(tag="users")


class UserInfo(SettingsResponse):
    """OpenHands' UserInfo (every settings field, secrets null) plus who the caller is."""

    id: str = Field(description="The user id (users exist through their API keys)")
    is_admin: bool
    key_id: str = Field(
        description="The API key the caller used or signed in with; 'bootstrap' for "
        "ACS_BOOTSTRAP_API_KEY, 'single-user' in ACS_AUTH_MODE=none"
    )
    auth_method: Literal["api_key", "session", "single_user"]
    llm_profiles: LlmProfilesView = Field(
        description="Named LLM settings (keys always null), as the SDK's get_llm() reads them"
    )


class MeQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expose_secrets: bool = Field(
        default=False,
        description="For code in a sandbox (SDK get_llm()): needs Authorization: Bearer <your "
        "key> plus the X-Session-API-Key of a running sandbox of yours (else 401)",
    )


class LlmKeyResponse(BaseModel):
    """Always null: the LLM key stays on the server (docs/api.md#openhands-clients)."""

    key: None = None


@routes.route(
    "GET",
    "/api/v1/users/me",
    summary="The calling user, with their settings",
    query=MeQuery,
    response=UserInfo,
)
async def get_me(request: web.Request) -> web.Response:
    query = parse_query(request, MeQuery)
    principal = principal_of(request)
    if query.expose_secrets:
        scope = request.get(SANDBOX_SCOPE)
        if scope is None or scope.status != SandboxStatus.RUNNING:
            raise Unauthorized(
                "expose_secrets needs Authorization: Bearer <your API key> and the "
                "X-Session-API-Key of a running sandbox of yours"
            )
    service = request.app[keys.SETTINGS]
    settings = await service.get(principal.user_id)
    # The provider's LLM key is never answered, expose_secrets or not: llm_api_key stays null
    # here. The LLM gateway (issue 22, branch gateway) fills the llm_* fields of an
    # expose_secrets answer with the model as the gateway serves it, its URL and the user's
    # gateway key, so that SDK code in a sandbox calls the gateway, never the provider.
    return json_response(
        UserInfo(
            **settings.model_dump(),
            id=principal.user_id,
            is_admin=principal.is_admin,
            key_id=principal.key_id,
            auth_method=principal.via,
            llm_profiles=view_of(await service.record(principal.user_id)),
        )
    )


@routes.route(
    "GET",
    "/api/keys/llm/byor",
    summary="The LLM key for running agents elsewhere: never handed out here, always null",
    response=LlmKeyResponse,
)
async def get_byor_key(request: web.Request) -> web.Response:
    return json_response(LlmKeyResponse())
