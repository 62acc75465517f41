"""The V0 conversation reads the OpenHands web frontend still makes: GET /api/conversations (a
`results` page), GET /api/conversations/{id} and its /config, in OpenHands' legacy shapes.

Our conversations are V1 ones, shown as OpenHands' app server shows V1 conversations on these
routes (docs/conversations.md#legacy-v0-reads)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane.agent_protocol.models import ExecutionStatus
from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.conversations.handler_deps import conversation_service as _service
from controlplane.conversations.models import (
    CONVERSATION_PARAM,
    AppConversation,
    ConversationTrigger,
    LegacyConversationQuery,
)
from controlplane.sandboxes.models import SandboxStatus
from controlplane.settings.models import ProviderType

routes = RouteTable(tag="conversations-v0")

LegacyStatus = Literal["STARTING", "RUNNING", "STOPPED", "ERROR", "ARCHIVED"]
_STATUS: dict[SandboxStatus, LegacyStatus] = {
    SandboxStatus.STARTING: "STARTING",
    SandboxStatus.RUNNING: "RUNNING",
    SandboxStatus.PAUSED: "STOPPED",
    SandboxStatus.ERROR: "ERROR",
    SandboxStatus.MISSING: "ARCHIVED",
}


class LegacyConversation(BaseModel):
    """OpenHands' V0 `ConversationInfo`."""

    conversation_id: str
    title: str
    last_updated_at: datetime
    created_at: datetime
    status: LegacyStatus
    runtime_status: Literal["STATUS$READY", "STATUS$ERROR"] | None = None
    selected_repository: str | None = None
    selected_branch: str | None = None
    git_provider: ProviderType | None = None
    trigger: ConversationTrigger | None = None
    url: str | None = None
    session_api_key: str | None = None
    pr_number: list[int] = Field(default_factory=list)
    llm_model: str | None = None
    conversation_version: Literal["V1"] = "V1"
    sub_conversation_ids: list[str] = Field(default_factory=list)
    public: bool | None = None


class LegacyConversationPage(BaseModel):
    results: list[LegacyConversation]
    next_page_id: str | None = None


class LegacyConversationConfig(BaseModel):
    """What the frontend reads from /config: the runtime is the conversation's sandbox."""

    runtime_id: str
    session_id: str


def legacy_view(conversation: AppConversation) -> LegacyConversation:
    runtime: Literal["STATUS$READY", "STATUS$ERROR"] | None = None
    if conversation.sandbox_status == SandboxStatus.RUNNING:
        failed = conversation.execution_status in (ExecutionStatus.ERROR, ExecutionStatus.STUCK)
        runtime = "STATUS$ERROR" if failed else "STATUS$READY"
    return LegacyConversation(
        conversation_id=conversation.id,
        title=conversation.title or f"Conversation {conversation.id[:5]}",
        last_updated_at=conversation.updated_at,
        created_at=conversation.created_at,
        status=_STATUS[conversation.sandbox_status],
        runtime_status=runtime,
        selected_repository=conversation.selected_repository,
        selected_branch=conversation.selected_branch,
        git_provider=conversation.git_provider,
        trigger=conversation.trigger,
        url=conversation.conversation_url,
        session_api_key=conversation.session_api_key,
        pr_number=conversation.pr_number,
        llm_model=conversation.llm_model,
        sub_conversation_ids=conversation.sub_conversation_ids,
        public=conversation.public,
    )


@routes.route(
    "GET",
    "/api/conversations",
    summary="List conversations, newest first (OpenHands' V0 shape: results, next_page_id)",
    query=LegacyConversationQuery,
    response=LegacyConversationPage,
)
async def list_conversations(request: web.Request) -> web.Response:
    query = parse_query(request, LegacyConversationQuery)
    items, next_id = await _service(request).legacy_list(principal_of(request), query)
    return json_response(
        LegacyConversationPage(results=[legacy_view(c) for c in items], next_page_id=next_id)
    )


@routes.route(
    "GET",
    f"/api/conversations/{CONVERSATION_PARAM}",
    summary="One conversation (OpenHands' V0 shape)",
    response=LegacyConversation,
    errors=(404,),
)
async def get_conversation(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    return json_response(legacy_view(await _service(request).get(principal_of(request), cid)))


@routes.route(
    "GET",
    f"/api/conversations/{CONVERSATION_PARAM}/config",
    summary="The conversation's runtime (its sandbox) id",
    response=LegacyConversationConfig,
    errors=(404,),
)
async def conversation_config(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    info = await _service(request).owned(principal_of(request), cid)
    return json_response(LegacyConversationConfig(runtime_id=info.sandbox_id, session_id=info.id))
