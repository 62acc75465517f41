"""The user's LLM as their own tools must call it: through the control plane's LLM gateway
(controlplane/gateway, docs/llm-gateway.md), never with the provider key, which stays here.

`GET /api/v1/users/me?expose_secrets=true` answers it (OpenHands' SDK reads it in
OpenHandsCloudWorkspace.get_llm()). The gateway sits above settings in the layers, so it is
reached through its app key only."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from controlplane import keys


def public_api_url(request: web.Request) -> str:
    """The API as the caller reached it: the scheme and host of this request, as a reverse
    proxy forwards them."""
    scheme = request.headers.get("X-Forwarded-Proto", request.scheme).split(",")[0].strip()
    host = request.headers.get("X-Forwarded-Host", request.host).split(",")[0].strip()
    return f"{scheme}://{host}"


async def gateway_llm(request: web.Request, user_id: str, model: str | None) -> dict[str, Any]:
    """`llm_model` as LiteLLM names it to call the gateway (`litellm_proxy/<model>`),
    `llm_base_url` the gateway, `llm_api_key` the user's gateway key; without a gateway or a
    model only `llm_api_key: None`."""
    gateway = request.app.get(keys.GATEWAY)
    if gateway is None:
        return {"llm_api_key": None}
    return await gateway.tools_view(user_id, model, public_api_url(request))
