"""GET /api/organizations, /api/organizations/{org_id}/me and /api/keys/current.

OpenHands Cloud groups users into organizations and binds each API key to one; Agent Canvas's
onboarding cannot finish without them (agent-canvas `src/api/cloud/organization-service.api.ts`).
Here a deployment is one organization that every user belongs to: it owns nothing, so a member's
permissions only ever reach their own data. Every member gets `edit_org_settings`, the
permission Canvas checks before offering profile editing, because the profile routes under the
organization change only the caller's own profiles (controlplane/settings/profile_routes.py).
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.auth.models import Principal
from controlplane.organizations.deployment import ORG_ID, ORG_NAME, require_org

routes = RouteTable(tag="organizations")

MEMBER_PERMISSIONS = ["edit_org_settings"]


class Organization(BaseModel):
    id: str
    name: str
    is_personal: bool = False


class OrganizationPage(BaseModel):
    items: list[Organization]
    current_org_id: str


class OrganizationMember(BaseModel):
    org_id: str
    user_id: str
    email: str | None = None
    role: Literal["owner", "admin", "member"]
    status: Literal["active"] = "active"
    permissions: list[str] = Field(
        description="Everyone may edit their own profiles: nothing of the organization is shared"
    )


class ApiKeyMetadata(BaseModel):
    """The credential of the call: the API key (or the key a browser session was opened with)."""

    id: str
    name: str
    org_id: str = Field(description="The deployment's organization: every key belongs to it")
    user_id: str
    auth_type: Literal["api_key", "session", "single_user"]


def organization() -> Organization:
    return Organization(id=ORG_ID, name=ORG_NAME)


def role_of(principal: Principal) -> Literal["admin", "member"]:
    return "admin" if principal.is_admin else "member"


@routes.route(
    "GET",
    "/api/organizations",
    summary="The caller's organizations: the deployment's one",
    response=OrganizationPage,
)
async def list_organizations(request: web.Request) -> web.Response:
    return json_response(OrganizationPage(items=[organization()], current_org_id=ORG_ID))


@routes.route(
    "GET",
    "/api/organizations/{org_id}/me",
    summary="The caller as a member of the organization",
    response=OrganizationMember,
    errors=(404,),
)
async def organization_me(request: web.Request) -> web.Response:
    require_org(request.match_info["org_id"])
    principal = principal_of(request)
    return json_response(
        OrganizationMember(
            org_id=ORG_ID,
            user_id=principal.user_id,
            role=role_of(principal),
            permissions=MEMBER_PERMISSIONS,
        )
    )


@routes.route(
    "GET",
    "/api/keys/current",
    summary="The credential of this call and the organization it acts on",
    response=ApiKeyMetadata,
)
async def current_key(request: web.Request) -> web.Response:
    principal = principal_of(request)
    return json_response(
        ApiKeyMetadata(
            id=principal.key_id,
            name=principal.key_id,
            org_id=ORG_ID,
            user_id=principal.user_id,
            auth_type=principal.via,
        )
    )
