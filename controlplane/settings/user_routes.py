"""Who am I (/api/v1/users/me) and the BYOR LLM key the OpenHands CLI asks for at login: the
user's LLM gateway key (docs/llm-gateway.md)."""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane import keys
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.settings.gateway_view import gateway_llm
from controlplane.settings.models import SettingsResponse

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


class LlmKeyResponse(BaseModel):
    """The caller's LLM gateway key: never the provider key, which stays on the server
    (docs/llm-gateway.md); null when the gateway does not run."""

    key: str | None = None


class UserInfoWithSecrets(UserInfo):
    """`?expose_secrets=true`: the LLM as the caller's own tools must call it (the gateway)."""

    llm_api_key: str | None = None  # type: ignore[assignment]


class MeQuery(BaseModel):
    expose_secrets: bool = False


@routes.route(
    "GET",
    "/api/v1/users/me",
    summary="The calling user, with their settings",
    query=MeQuery,
    response=UserInfo | UserInfoWithSecrets,
)
async def get_me(request: web.Request) -> web.Response:
    principal = principal_of(request)
    settings = await request.app[keys.SETTINGS].get(principal.user_id)
    if parse_query(request, MeQuery).expose_secrets:
        llm = await gateway_llm(request, principal.user_id, settings.llm_model)
        return json_response(
            UserInfoWithSecrets(
                **(settings.model_dump() | llm),
                id=principal.user_id,
                is_admin=principal.is_admin,
                key_id=principal.key_id,
                auth_method=principal.via,
            )
        )
    return json_response(
        UserInfo(
            **settings.model_dump(),
            id=principal.user_id,
            is_admin=principal.is_admin,
            key_id=principal.key_id,
            auth_method=principal.via,
        )
    )


@routes.route(
    "GET",
    "/api/keys/llm/byor",
    summary="The caller's LLM gateway key (made on first use) for running agents elsewhere",
    response=LlmKeyResponse,
)
async def get_byor_key(request: web.Request) -> web.Response:
    gateway = request.app.get(keys.GATEWAY)
    if gateway is None:
        return json_response(LlmKeyResponse())
    key = await gateway.user_keys.get_or_create(principal_of(request).user_id)
    return json_response(LlmKeyResponse(key=key))
