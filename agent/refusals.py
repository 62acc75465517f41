"""Calls of openhands-sdk 1.58 that this agent server refuses on purpose, each with a JSON error
that says why (docs/agent-protocol.md), rather than a bare 404 that reads as "no such
conversation":

- `POST /api/conversations/{id}/load_plugin` (RemoteConversation.load_plugin) and `…/navigate`
  (navigate_to): 400; this agent loads no plugins and keeps one linear history.
- `GET /api/settings`, `/api/profiles`, `/api/profiles/{name}`, `/api/settings/secrets`,
  `/api/settings/secrets/{name}` (RemoteWorkspace.get_llm, get_mcp_config, get_secrets): 404;
  settings, profiles and secrets live in the control plane, which SDK code reaches through
  OpenHandsCloudWorkspace (GET /api/v1/users/me, /api/v1/sandboxes/{id}/settings/secrets).
"""

from __future__ import annotations

from aiohttp import web

from .conversations.routes import conversation_of
from .errors import ApiError

NO_SETTINGS = (
    "this agent server keeps no settings, LLM profiles or secrets: its control plane does "
    "(OpenHandsCloudWorkspace.get_llm(), get_mcp_config(), get_secrets())"
)


async def load_plugin(request: web.Request) -> web.Response:
    conversation_of(request)  # 404 for an unknown conversation first
    raise ApiError(400, "this agent server loads no plugins")


async def navigate(request: web.Request) -> web.Response:
    conversation_of(request)
    raise ApiError(400, "this agent server keeps one linear history: navigate is not supported")


async def no_settings(request: web.Request) -> web.Response:
    raise ApiError(404, NO_SETTINGS)


def add_routes(app: web.Application) -> None:
    one = "/api/conversations/{conversation_id}"
    app.router.add_post(one + "/load_plugin", load_plugin)
    app.router.add_post(one + "/navigate", navigate)
    for path in (
        "/api/settings",
        "/api/profiles",
        "/api/profiles/{name}",
        "/api/settings/secrets",
        "/api/settings/secrets/{name}",
    ):
        app.router.add_get(path, no_settings)
