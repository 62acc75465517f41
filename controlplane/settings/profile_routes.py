"""LLM profile routes, per user (`/api/v1/settings/profiles`) and, as Agent Canvas addresses
them once it has picked the deployment's organization, under `/api/organizations/{org_id}/
profiles` (agent-canvas `src/api/cloud/profiles-service.api.ts`). Both act on the caller's own
profiles: the organization shares none (controlplane/organizations/routes.py)."""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import json_response, parse_body
from controlplane.api.routing import Handler, RouteTable
from controlplane.auth.identity import principal_of
from controlplane.organizations.deployment import require_org
from controlplane.settings.profiles import (
    ActivateProfileRequest,
    ActivateProfileResponse,
    ProfileDetailResponse,
    ProfileListResponse,
    ProfileMutationResponse,
    RenameProfileRequest,
    SaveProfileRequest,
)

routes = RouteTable(tag="profiles")
USER_BASE = "/api/v1/settings/profiles"
ORG_BASE = "/api/organizations/{org_id}/profiles"


def _scope(request: web.Request) -> str:
    """The caller's user id, once an organization in the path (if any) is checked."""
    principal = principal_of(request)
    if "org_id" in request.match_info:
        require_org(request.match_info["org_id"], principal)
    return principal.user_id


async def list_profiles(request: web.Request) -> web.Response:
    return json_response(await request.app[keys.PROFILES].list(_scope(request)))


async def get_profile(request: web.Request) -> web.Response:
    user = _scope(request)
    return json_response(await request.app[keys.PROFILES].get(user, request.match_info["name"]))


async def save_profile(request: web.Request) -> web.Response:
    user = _scope(request)
    name = request.match_info["name"]
    body = await parse_body(request, SaveProfileRequest)
    await request.app[keys.PROFILES].save(user, name, body)
    return json_response(
        ProfileMutationResponse(name=name, message=f"Profile '{name}' saved"), status=201
    )


async def delete_profile(request: web.Request) -> web.Response:
    user = _scope(request)
    name = request.match_info["name"]
    await request.app[keys.PROFILES].delete(user, name)
    return json_response(ProfileMutationResponse(name=name, message=f"Profile '{name}' deleted"))


async def rename_profile(request: web.Request) -> web.Response:
    user = _scope(request)
    body = await parse_body(request, RenameProfileRequest)
    message = await request.app[keys.PROFILES].rename(
        user, request.match_info["name"], body.new_name
    )
    return json_response(ProfileMutationResponse(name=body.new_name, message=message))


async def activate_profile(request: web.Request) -> web.Response:
    user = _scope(request)
    await parse_body(request, ActivateProfileRequest)
    return json_response(
        await request.app[keys.PROFILES].activate(user, request.match_info["name"])
    )


def _named(handler: Handler, name: str) -> Handler:
    """The same handler under another name: each route has its own OpenAPI operation id."""

    async def named(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    named.__name__ = named.__qualname__ = name
    return named


def _register(base: str, where: str, org_errors: tuple[int, ...], prefix: str) -> None:
    table: list[tuple[str, str, Handler, str, object, object, int, tuple[int, ...]]] = [
        ("GET", base, list_profiles, "List", None, ProfileListResponse, 200, ()),
        ("GET", base + "/{name}", get_profile, "Get one", None, ProfileDetailResponse, 200, (404,)),
        (
            "POST",
            base + "/{name}",
            save_profile,
            "Create or overwrite",
            SaveProfileRequest,
            ProfileMutationResponse,
            201,
            (404, 409),
        ),
        (
            "DELETE",
            base + "/{name}",
            delete_profile,
            "Delete (idempotent)",
            None,
            ProfileMutationResponse,
            200,
            (404,),
        ),
        (
            "POST",
            base + "/{name}/rename",
            rename_profile,
            "Rename",
            RenameProfileRequest,
            ProfileMutationResponse,
            200,
            (404, 409),
        ),
        (
            "POST",
            base + "/{name}/activate",
            activate_profile,
            "Apply to the LLM settings and mark active",
            ActivateProfileRequest,
            ActivateProfileResponse,
            200,
            (404,),
        ),
    ]
    for method, path, handler, summary, body, response, status, errors in table:
        routes.route(
            method,
            path,
            summary=f"{summary}: the caller's LLM profiles{where}",
            body=body,
            response=response,
            status=status,
            errors=tuple(sorted(set(errors) | set(org_errors))),
        )(_named(handler, prefix + handler.__name__) if prefix else handler)


_register(USER_BASE, "", (), "")
_register(ORG_BASE, " (the organization shares none: the caller's own)", (404,), "org_")
