"""Calls of openhands-sdk 1.58 that this agent server refuses on purpose, each with a JSON error
that says why (docs/agent-protocol.md), rather than a bare 404 that reads as "no such
conversation":

- `POST /api/conversations/{id}/load_plugin` (RemoteConversation.load_plugin) and `…/navigate`
  (navigate_to): 400; this agent loads no plugins and keeps one linear history. Those two are
  conversation routes (a 404 for an unknown conversation first): conversations/extras.py.
- `GET /api/settings`, `/api/profiles`, `/api/profiles/{name}`, `/api/settings/secrets`,
  `/api/settings/secrets/{name}` (RemoteWorkspace.get_llm, get_mcp_config, get_secrets): 404;
  settings, profiles and secrets live in the control plane, which SDK code reaches through
  OpenHandsCloudWorkspace (GET /api/v1/users/me, /api/v1/sandboxes/{id}/settings/secrets).
"""

from __future__ import annotations

from aiohttp import web

from .errors import ApiError

NO_SETTINGS = (
    "this agent server keeps no settings, LLM profiles or secrets: its control plane does "
    "(OpenHandsCloudWorkspace.get_llm(), get_mcp_config(), get_secrets())"
)


async def no_settings(request: web.Request) -> web.Response:
    raise ApiError(404, NO_SETTINGS)


def add_routes(app: web.Application) -> None:
    for path in (
        "/api/settings",
        "/api/profiles",
        "/api/profiles/{name}",
        "/api/settings/secrets",
        "/api/settings/secrets/{name}",
    ):
        app.router.add_get(path, no_settings)
