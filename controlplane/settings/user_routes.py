"""Who am I (/api/v1/users/me) and the BYOR LLM key question the OpenHands CLI asks at login."""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane import keys
from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
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
    """Always null: the LLM key stays on the server (docs/api.md#openhands-clients)."""

    key: None = None


@routes.route(
    "GET", "/api/v1/users/me", summary="The calling user, with their settings", response=UserInfo
)
async def get_me(request: web.Request) -> web.Response:
    principal = principal_of(request)
    settings = await request.app[keys.SETTINGS].get(principal.user_id)
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
    summary="The LLM key for running agents elsewhere: never handed out here, always null",
    response=LlmKeyResponse,
)
async def get_byor_key(request: web.Request) -> web.Response:
    return json_response(LlmKeyResponse())
