"""What Agent Canvas reads that this deployment has one answer for (agent-canvas
`src/api/cloud/agent-profiles-service.api.ts`, `skills-service.api.ts`,
`automation-service/automation-service.api.ts`; shapes from the SDK's agent_profiles_router.py):

- agent profiles: our agent server runs one agent, so there is one agent profile, `default`:
  the SDK's agent with the caller's LLM settings (its `llm_profile_ref` is their active LLM
  profile). It is listed, read and activated; saving, renaming or deleting agent profiles is a
  409 (there is nothing else to run). LLM profiles are where a user keeps alternatives.
- skills: our agent loads none, so the skills search is an empty page (its query checked).
- the automation service's SDK version: there is no automation service here (null).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.pagination import MAX_LIMIT, OFFSET, cursor_field, decode_cursor
from controlplane.api.parsing import json_response, parse_body, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.errors import Conflict, NotFound

routes = RouteTable(tag="web-client")
DEFAULT_AGENT_PROFILE = "default"
ONE_AGENT = (
    "this deployment runs one agent: its profile 'default' uses your LLM settings; keep "
    "alternatives as LLM profiles (/api/v1/settings/profiles)"
)


class AgentProfileInfo(BaseModel):
    id: str
    name: str
    agent_kind: str = "openhands"
    revision: int = 1
    llm_profile_ref: str | None = None
    mcp_server_refs: list[str] | None = None


class AgentProfileListResponse(BaseModel):
    profiles: list[AgentProfileInfo]
    active_agent_profile_id: str


class AgentProfileDetailResponse(BaseModel):
    name: str
    profile: dict[str, Any]


class ActivateAgentProfileResponse(BaseModel):
    id: str
    message: str
    agent_settings_applied: bool = False


class AgentProfileWrite(BaseModel):
    """Any body: every write is refused (409) once the name is checked."""

    model_config = ConfigDict(extra="allow")


class SkillsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    page_id: str | None = cursor_field(OFFSET)
    limit: int = Field(default=100, ge=1, le=MAX_LIMIT)


class SkillInfo(BaseModel):
    name: str
    type: str
    source: str | None = None
    triggers: list[str] = Field(default_factory=list)


class SkillPage(BaseModel):
    items: list[SkillInfo]
    next_page_id: str | None = None


class SdkVersion(BaseModel):
    sdk_version: None = Field(default=None, description="No automation service runs here")


async def _default_profile(request: web.Request) -> AgentProfileInfo:
    record = await request.app[keys.SETTINGS].record(principal_of(request).user_id)
    return AgentProfileInfo(
        id=DEFAULT_AGENT_PROFILE,
        name=DEFAULT_AGENT_PROFILE,
        llm_profile_ref=record.active_llm_profile,
    )


def _known(name: str) -> None:
    if name != DEFAULT_AGENT_PROFILE:
        raise NotFound(f"Agent profile '{name}' not found")


@routes.route(
    "GET",
    "/api/agent-profiles",
    summary="The agent profiles: the one agent this deployment runs",
    response=AgentProfileListResponse,
)
async def list_agent_profiles(request: web.Request) -> web.Response:
    profile = await _default_profile(request)
    return json_response(
        AgentProfileListResponse(profiles=[profile], active_agent_profile_id=profile.id)
    )


@routes.route(
    "GET",
    "/api/agent-profiles/{name}",
    summary="One agent profile",
    response=AgentProfileDetailResponse,
    errors=(404,),
)
async def get_agent_profile(request: web.Request) -> web.Response:
    _known(request.match_info["name"])
    profile = await _default_profile(request)
    return json_response(
        AgentProfileDetailResponse(name=profile.name, profile=profile.model_dump())
    )


@routes.route(
    "POST",
    "/api/agent-profiles/{name}/activate",
    summary="Activate an agent profile (the one there is)",
    response=ActivateAgentProfileResponse,
    errors=(404,),
)
async def activate_agent_profile(request: web.Request) -> web.Response:
    _known(request.match_info["name"])
    return json_response(
        ActivateAgentProfileResponse(
            id=DEFAULT_AGENT_PROFILE, message=f"Agent profile '{DEFAULT_AGENT_PROFILE}' is active"
        )
    )


async def _refuse_write(request: web.Request) -> web.Response:
    if request.method == "POST":
        await parse_body(request, AgentProfileWrite, optional=True)
    raise Conflict(ONE_AGENT)


@routes.route(
    "POST",
    "/api/agent-profiles/{name}",
    summary="Save an agent profile: refused",
    body=AgentProfileWrite,
    body_optional=True,
    errors=(409,),
)
async def save_agent_profile(request: web.Request) -> web.Response:
    return await _refuse_write(request)


@routes.route(
    "DELETE",
    "/api/agent-profiles/{name}",
    summary="Delete an agent profile: refused",
    errors=(409,),
)
async def delete_agent_profile(request: web.Request) -> web.Response:
    return await _refuse_write(request)


@routes.route(
    "POST",
    "/api/agent-profiles/{name}/rename",
    summary="Rename an agent profile: refused",
    body=AgentProfileWrite,
    body_optional=True,
    errors=(409,),
)
async def rename_agent_profile(request: web.Request) -> web.Response:
    return await _refuse_write(request)


@routes.route(
    "GET",
    "/api/v1/skills/search",
    summary="The skills the agent offers: none (an empty page)",
    query=SkillsQuery,
    response=SkillPage,
)
async def search_skills(request: web.Request) -> web.Response:
    query = parse_query(request, SkillsQuery)
    decode_cursor(query.page_id, OFFSET)  # a cursor we never issued is a 422
    return json_response(SkillPage(items=[]))


@routes.route(
    "GET",
    "/api/automation/sdk-version",
    summary="The automation service's SDK version: null, none runs here",
    response=SdkVersion,
)
async def automation_sdk_version(request: web.Request) -> web.Response:
    return json_response(SdkVersion())
