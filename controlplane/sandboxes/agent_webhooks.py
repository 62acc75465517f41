"""What a sandbox's agent server tells the control plane about itself: that it listens.

Served, like the event webhooks, by the API and by the webhook listener on the sandbox networks'
gateways; the webhook middleware has checked the sandbox's own session key before this runs.
"""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.errors import RuntimeUnavailable
from controlplane.sandboxes.models import Success

webhook_routes = RouteTable(tag="sandboxes")


@webhook_routes.route(
    "POST",
    "/api/v1/webhooks/{sandbox_id}/ready",
    summary="Sandbox → control plane: its agent server listens (X-Session-API-Key = the sandbox "
    "key); a start waiting for it probes /health at once",
    public=True,
    response=Success,
    errors=(401,),
)
async def agent_ready_webhook(request: web.Request) -> web.Response:
    service = request.app.get(keys.SANDBOXES)
    if service is None:
        raise RuntimeUnavailable("sandboxes are not enabled on this server")
    await service.agent_listening(request.match_info["sandbox_id"])
    return json_response(Success())
