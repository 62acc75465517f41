"""What the user's own tools are told about the LLM (`GET /api/v1/users/me?expose_secrets=true`,
which OpenHands' SDK reads in OpenHandsCloudWorkspace.get_llm()): the gateway, never the
provider key."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from controlplane.gateway.keys import GATEWAY

PATH = "/api/v1/llm-gateway"


def public_gateway_url(request: web.Request) -> str:
    """The gateway as the caller reached the API (scheme and host of this request, as a reverse
    proxy forwards them)."""
    scheme = request.headers.get("X-Forwarded-Proto", request.scheme).split(",")[0].strip()
    host = request.headers.get("X-Forwarded-Host", request.host).split(",")[0].strip()
    return f"{scheme}://{host}{PATH}"


async def gateway_llm_fields(
    request: web.Request, user_id: str, model: str | None
) -> dict[str, Any]:
    """llm_model as LiteLLM must name it to call the gateway (`litellm_proxy/<model>`),
    llm_base_url the gateway, llm_api_key the user's gateway key; nothing without a gateway or
    a model."""
    gateway = request.app.get(GATEWAY)
    if gateway is None or not model:
        return {"llm_api_key": None}
    return {
        "llm_model": f"litellm_proxy/{model}",
        "llm_base_url": public_gateway_url(request),
        "llm_api_key": await gateway.user_keys.get_or_create(user_id),
    }
