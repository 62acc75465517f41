"""Settings (V0 under /api, V1 with the nested agent_settings view), git providers, secrets."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.settings.diff import SettingsDiffUpdate, as_v1_update
from controlplane.settings.models import (
    GitProvidersUpdate,
    Message,
    SecretCreate,
    SecretList,
    SecretUpdate,
    SettingsResponse,
    SettingsUpdate,
)
from controlplane.settings.v1 import SettingsV1Response, v1_view

routes = RouteTable(tag="settings")


def _message(text: str, status: int = 200) -> web.Response:
    return json_response(Message(message=text), status=status)


@routes.route("GET", "/api/settings", summary="Load settings", response=SettingsResponse)
async def get_settings(request: web.Request) -> web.Response:
    settings = await request.app[keys.SETTINGS].get(principal_of(request).user_id)
    return json_response(settings)


@routes.route(
    "POST",
    "/api/settings",
    summary="Store settings (merge)",
    body=SettingsUpdate,
    response=Message,
    errors=(409,),  # provider_tokens without a token, when none is stored
)
async def store_settings(request: web.Request) -> web.Response:
    body = await parse_body(request, SettingsUpdate)
    await request.app[keys.SETTINGS].update(principal_of(request).user_id, body)
    return _message("Settings stored")


@routes.route(
    "GET",
    "/api/v1/settings",
    summary="Load settings, with the nested agent_settings view",
    response=SettingsV1Response,
)
async def get_settings_v1(request: web.Request) -> web.Response:
    settings = await request.app[keys.SETTINGS].get(principal_of(request).user_id)
    return json_response(v1_view(settings))


@routes.route(
    "POST",
    "/api/v1/settings",
    summary="Store settings (merge; flat or nested fields, or their diffs) and return them",
    body=SettingsDiffUpdate,
    response=SettingsV1Response,
    errors=(409,),  # a flat field and its twin disagree; a provider without a stored token
)
async def store_settings_v1(request: web.Request) -> web.Response:
    body = as_v1_update(await parse_body(request, SettingsDiffUpdate))
    settings = await request.app[keys.SETTINGS].update_v1(principal_of(request).user_id, body)
    return json_response(v1_view(settings))


@routes.route(
    "POST",
    "/api/add-git-providers",
    summary="Store git provider tokens and MCP config",
    body=GitProvidersUpdate,
    response=Message,
    errors=(409,),  # provider_tokens without a token, when none is stored
)
async def add_git_providers(request: web.Request) -> web.Response:
    body = await parse_body(request, GitProvidersUpdate)
    await request.app[keys.SETTINGS].add_git_providers(principal_of(request).user_id, body)
    return _message("Git providers stored")


@routes.route(
    "POST", "/api/unset-provider-tokens", summary="Forget all provider tokens", response=Message
)
async def unset_provider_tokens(request: web.Request) -> web.Response:
    await request.app[keys.SETTINGS].unset_provider_tokens(principal_of(request).user_id)
    return _message("Unset Git provider tokens")


@routes.route(
    "GET", "/api/secrets", summary="List custom secrets (names only)", response=SecretList
)
async def list_secrets(request: web.Request) -> web.Response:
    items = await request.app[keys.SETTINGS].list_secrets(principal_of(request).user_id)
    return json_response(SecretList(custom_secrets=items))


@routes.route(
    "POST",
    "/api/secrets",
    summary="Create a custom secret",
    body=SecretCreate,
    response=Message,
    status=201,
    errors=(409,),
)
async def create_secret(request: web.Request) -> web.Response:
    body = await parse_body(request, SecretCreate)
    await request.app[keys.SETTINGS].create_secret(principal_of(request).user_id, body)
    return _message("Secret created successfully", status=201)


@routes.route(
    "PUT",
    "/api/secrets/{name}",
    summary="Rename or re-describe a custom secret",
    body=SecretUpdate,
    response=Message,
    errors=(404, 409),
)
async def update_secret(request: web.Request) -> web.Response:
    body = await parse_body(request, SecretUpdate)
    name = request.match_info["name"]
    await request.app[keys.SETTINGS].update_secret(principal_of(request).user_id, name, body)
    return _message("Secret updated successfully")


@routes.route(
    "DELETE",
    "/api/secrets/{name}",
    summary="Delete a custom secret",
    response=Message,
    errors=(404,),
)
async def delete_secret(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await request.app[keys.SETTINGS].delete_secret(principal_of(request).user_id, name)
    return _message("Secret deleted successfully")
