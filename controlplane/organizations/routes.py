"""Organizations, their members, switching, and users' API keys.

What Agent Canvas reads (`src/api/cloud/organization-service.api.ts`): `GET /api/organizations`
(the caller's organizations and the current one), `/api/organizations/{org_id}/me` (the caller's
role and permissions there) and `GET /api/keys/current` (the key of the call and the
organization it acts in); it then sends `X-Org-Id` with every call. Everything else here is
ours: making organizations (deployment admins), members and their roles and limits (owners and
admins), switching the current organization, and the keys users make for scripts.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.pagination import (
    OFFSET,
    OptionalPageQuery,
    cursor_field,
    decode_cursor,
    encode_cursor,
)
from controlplane.api.parsing import json_response, parse_body, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.auth.models import USER_ID_PATTERN, ApiKeyInfo, CreatedApiKey
from controlplane.config import ORG_ID_PATTERN
from controlplane.organizations.keys import MemberKeys
from controlplane.organizations.models import (
    CreateOrganization,
    MemberPage,
    Organization,
    OrganizationMember,
    OrganizationPage,
    PutMember,
    Switched,
    UpdateOrganization,
)
from controlplane.organizations.service import OrganizationService

routes = RouteTable(tag="organizations")
ORG = "/api/organizations/{org_id}"
MEMBER = ORG + "/members/{user_id}"


class ApiKeyMetadata(BaseModel):
    """The credential of the call: the API key (or the browser session)."""

    id: str
    name: str
    org_id: str | None = Field(description="The organization the call acts in")
    user_id: str
    auth_type: Literal["api_key", "session", "oidc", "single_user", "ticket"]


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=80)


ORG_CURSOR = ORG_ID_PATTERN.strip("^$")
USER_CURSOR = USER_ID_PATTERN.strip("^$")


class OrganizationQuery(OptionalPageQuery):
    page_id: str | None = cursor_field(ORG_CURSOR)


class MemberQuery(OptionalPageQuery):
    page_id: str | None = cursor_field(USER_CURSOR)


class KeyQuery(OptionalPageQuery):
    page_id: str | None = cursor_field(OFFSET)
    user_id: str | None = Field(
        default=None,
        pattern=USER_ID_PATTERN,
        description="Another user's keys (a deployment admin's, or an organization owner's or "
        "admin's for keys made in their organization)",
    )


class KeyList(BaseModel):
    items: list[ApiKeyInfo]
    next_page_id: str | None = Field(
        default=None,
        description="The page after this one (only when `limit` was given); a page holds fewer "
        "than `limit` keys where some are not the caller's to see",
    )


class Done(BaseModel):
    success: bool = True


def _orgs(request: web.Request) -> OrganizationService:
    return request.app[keys.ORGANIZATIONS]


def _keys(request: web.Request) -> MemberKeys:
    config = request.app[keys.CONFIG]
    return MemberKeys(request.app[keys.API_KEYS], config.default_organization)


@routes.route(
    "GET",
    "/api/organizations",
    summary="The caller's organizations (every one for an admin key) and the current one; "
    "every one at once unless `limit` or `page_id` asks for a page",
    query=OrganizationQuery,
    response=OrganizationPage,
)
async def list_organizations(request: web.Request) -> web.Response:
    query = parse_query(request, OrganizationQuery)
    after = decode_cursor(query.page_id, ORG_CURSOR)
    page = await _orgs(request).list_for(principal_of(request), after, query.page_size())
    return json_response(page)


@routes.route(
    "POST",
    "/api/organizations",
    summary="Make an organization (admin keys); its owner is `owner` or the caller",
    body=CreateOrganization,
    response=Organization,
    status=201,
    errors=(403, 409),
)
async def create_organization(request: web.Request) -> web.Response:
    body = await parse_body(request, CreateOrganization)
    made = await _orgs(request).create(principal_of(request), body)
    return json_response(made, status=201)


@routes.route(
    "PATCH",
    ORG,
    summary="Rename an organization or set its limits (owners, admins)",
    body=UpdateOrganization,
    response=Organization,
    errors=(403, 404),
)
async def update_organization(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateOrganization)
    org_id = request.match_info["org_id"]
    return json_response(await _orgs(request).update(principal_of(request), org_id, body))


@routes.route(
    "GET",
    ORG + "/me",
    summary="The caller as a member of the organization: role, permissions, limits",
    response=OrganizationMember,
    errors=(404,),
)
async def organization_me(request: web.Request) -> web.Response:
    org_id = request.match_info["org_id"]
    return json_response(await _orgs(request).me(principal_of(request), org_id))


@routes.route(
    "GET",
    ORG + "/members",
    summary="The organization's members and roles (owners, admins, auditors); every one at "
    "once unless `limit` or `page_id` asks for a page",
    query=MemberQuery,
    response=MemberPage,
    errors=(403, 404),
)
async def list_members(request: web.Request) -> web.Response:
    query = parse_query(request, MemberQuery)
    after = decode_cursor(query.page_id, USER_CURSOR)
    org_id = request.match_info["org_id"]
    page = await _orgs(request).members(principal_of(request), org_id, after, query.page_size())
    return json_response(page)


@routes.route(
    "PUT",
    MEMBER,
    summary="Add a member or set their role and limits (owners, admins; owner role: owners)",
    body=PutMember,
    response=OrganizationMember,
    errors=(403, 404, 409),
)
async def put_member(request: web.Request) -> web.Response:
    body = await parse_body(request, PutMember)
    org_id, user_id = request.match_info["org_id"], request.match_info["user_id"]
    member = await _orgs(request).put_member(principal_of(request), org_id, user_id, body)
    return json_response(member)


@routes.route(
    "DELETE",
    MEMBER,
    summary="Remove a member (owners, admins; an owner: owners); the last owner stays",
    response=Done,
    errors=(403, 404, 409),
)
async def remove_member(request: web.Request) -> web.Response:
    org_id, user_id = request.match_info["org_id"], request.match_info["user_id"]
    await _orgs(request).remove_member(principal_of(request), org_id, user_id)
    return json_response(Done())


@routes.route(
    "POST",
    ORG + "/switch",
    summary="Make this the caller's current organization (requests without X-Org-Id act there)",
    response=Switched,
    errors=(404,),
)
async def switch_organization(request: web.Request) -> web.Response:
    org_id = request.match_info["org_id"]
    switched = await _orgs(request).switch(principal_of(request), org_id)
    return json_response(Switched(current_org_id=switched))


@routes.route(
    "GET",
    "/api/keys/current",
    summary="The credential of this call and the organization it acts in",
    response=ApiKeyMetadata,
)
async def current_key(request: web.Request) -> web.Response:
    principal = principal_of(request)
    return json_response(
        ApiKeyMetadata(
            id=principal.key_id,
            name=principal.key_id,
            org_id=principal.org_id,
            user_id=principal.user_id,
            auth_type=principal.via,
        )
    )


@routes.route(
    "GET",
    "/api/v1/keys",
    summary="The caller's API keys (or another user's, for those who manage them); no secrets",
    query=KeyQuery,
    response=KeyList,
)
async def list_keys(request: web.Request) -> web.Response:
    query = parse_query(request, KeyQuery)
    offset = int(decode_cursor(query.page_id, OFFSET) or 0)
    found, following = await _keys(request).list(
        principal_of(request), query.user_id, offset, query.page_size()
    )
    cursor = None if following is None else encode_cursor(str(following))
    return json_response(KeyList(items=found, next_page_id=cursor))


@routes.route(
    "POST",
    "/api/v1/keys",
    summary="Make an API key of the caller's for scripts (shown once), in the current organization",
    body=NewKey,
    body_optional=True,
    response=CreatedApiKey,
    status=201,
)
async def create_key(request: web.Request) -> web.Response:
    body = await parse_body(request, NewKey, optional=True)
    created = await _keys(request).create(principal_of(request), body.name)
    return json_response(created, status=201)


@routes.route(
    "DELETE",
    "/api/v1/keys/{key_id}",
    summary="Revoke an API key: its owner's, or one the caller manages (at once)",
    response=Done,
    errors=(404,),
)
async def revoke_key(request: web.Request) -> web.Response:
    await _keys(request).revoke(principal_of(request), request.match_info["key_id"])
    return json_response(Done())
