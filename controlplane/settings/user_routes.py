"""Who am I (/api/v1/users/me) and the BYOR LLM key the OpenHands CLI asks for at login: the
user's LLM gateway key (docs/llm-gateway.md)."""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.auth.sandbox_scope import running_scope
from controlplane.errors import Unauthorized
from controlplane.settings.gateway_view import gateway_llm
from controlplane.settings.models import SettingsResponse
from controlplane.settings.profiles import LlmProfilesView

routes = RouteTable(tag="users")


class UserInfo(SettingsResponse):
    """OpenHands' UserInfo (every settings field, secrets null) plus who the caller is."""

    id: str = Field(description="The user id (users exist through their API keys)")
    is_admin: bool
    key_id: str = Field(
        description="The API key the caller used or signed in with; 'bootstrap' for "
        "ACS_BOOTSTRAP_API_KEY, 'single-user' in ACS_AUTH_MODE=none"
    )
    auth_method: Literal["api_key", "session", "oidc", "single_user", "ticket"]
    llm_profiles: LlmProfilesView = Field(
        description="Named LLM settings (keys always null), as the SDK's get_llm() reads them"
    )


class LlmKeyResponse(BaseModel):
    """The caller's LLM gateway key: never the provider key, which stays on the server
    (docs/llm-gateway.md); null when the gateway does not run."""

    key: str | None = None
    llm_model: str | None = Field(
        default=None,
        description="The user's model as LiteLLM names it to call the gateway with this key "
        "(`litellm_proxy/<model>`); null without a model in settings",
    )
    llm_base_url: str | None = Field(
        default=None, description="The gateway's URL, as the caller reached this API"
    )


class UserInfoWithSecrets(UserInfo):
    """`?expose_secrets=true`: the LLM as the caller's own tools must call it (the gateway)."""

    llm_api_key: str | None = None  # type: ignore[assignment]


class MeQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expose_secrets: bool = Field(
        default=False,
        description="For code in a sandbox (SDK get_llm()): needs Authorization: Bearer <your "
        "key> plus the X-Session-API-Key of a running sandbox of yours (else 401); answers the "
        "LLM as the LLM gateway serves it (`litellm_proxy/<model>`, the gateway's URL, your "
        "gateway key), never the provider key",
    )


@routes.route(
    "GET",
    "/api/v1/users/me",
    summary="The calling user, with their settings",
    query=MeQuery,
    response=UserInfo | UserInfoWithSecrets,
)
async def get_me(request: web.Request) -> web.Response:
    expose_secrets = parse_query(request, MeQuery).expose_secrets
    principal = principal_of(request)
    if expose_secrets and running_scope(request) is None:
        raise Unauthorized(
            "expose_secrets needs Authorization: Bearer <your API key> and the "
            "X-Session-API-Key of a running sandbox of yours"
        )
    settings, profiles = await request.app[keys.SETTINGS].with_profiles(principal.user_id)
    fields = settings.model_dump()
    model: type[UserInfo] = UserInfo
    if expose_secrets:
        # The provider's key never leaves: the llm_* fields become the gateway's.
        fields |= await gateway_llm(request, principal.user_id, settings.llm_model)
        model = UserInfoWithSecrets
    return json_response(
        model(
            **fields,
            id=principal.user_id,
            is_admin=principal.is_admin,
            key_id=principal.key_id,
            auth_method=principal.via,
            llm_profiles=profiles,
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
    user_id = principal_of(request).user_id
    # The model and URL to use the key with, for tools run on the user's machine (the CLI's
    # local mode: docs/llm-gateway.md#the-openhands-cli). users/me?expose_secrets answers the
    # same view, but only with a sandbox's session key too (OpenHands' rule); this key alone
    # already reaches the gateway, so where to call it is no secret.
    view = await gateway_llm(
        request, user_id, (await request.app[keys.SETTINGS].get(user_id)).llm_model
    )
    # The view holds the key once there is a model; without one, the key alone.
    key = view.get("llm_api_key") or await gateway.user_key(user_id)
    return json_response(
        LlmKeyResponse(
            key=key, llm_model=view.get("llm_model"), llm_base_url=view.get("llm_base_url")
        )
    )
