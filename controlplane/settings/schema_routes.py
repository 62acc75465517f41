"""The settings forms' schemas (controlplane/settings/schema.py): the same for every caller."""

from __future__ import annotations

from aiohttp import web

from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.settings.schema import AGENT_SCHEMA, CONVERSATION_SCHEMA, SettingsSchema

routes = RouteTable(tag="settings")


@routes.route(
    "GET",
    "/api/v1/settings/agent-schema",
    summary="The agent settings our agent honours, as a form schema (SDK SettingsSchema)",
    response=SettingsSchema,
)
async def agent_schema(request: web.Request) -> web.Response:
    return json_response(AGENT_SCHEMA)


@routes.route(
    "GET",
    "/api/v1/settings/conversation-schema",
    summary="The conversation settings our agent honours, as a form schema",
    response=SettingsSchema,
)
async def conversation_schema(request: web.Request) -> web.Response:
    return json_response(CONVERSATION_SCHEMA)
