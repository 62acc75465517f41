"""POST /api/conversations: OpenHands' V0 start, as the classic web frontend sends it with its
default feature flags (frontend 0.62 `ConversationService.createConversation`; the V1 API only
when `FEATURE_USE_V1_CONVERSATION_API` is set). It starts a V1 conversation, the only kind here.

The answer is V0's `ConversationResponse`, `{"status": "ok", "conversation_id",
"conversation_status": "STARTING"}`, where `conversation_id` is `task-<start task id>`: what the
frontend's own V1 path answers and then follows (its conversation page polls the start task and
moves to the conversation's id at READY), because the conversation's id exists only once its
sandbox does. Scripts poll GET /api/v1/app-conversations/start-tasks?ids=<id> the same way.

The body is V0's `InitSessionRequest`: `repository`, `git_provider`, `selected_branch`,
`initial_user_msg` (with `image_urls`), `suggested_task`, `conversation_instructions` (appended
to the agent's system prompt). What cannot be honoured here is a 422 rather than dropped:
`replay_json`, `create_microagent`, `mcp_config` (MCP servers are settings) and any other key.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.api.parsing import (
    RequestValidationError,
    error_items,
    json_response,
    parse_body,
)
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.conversations.handler_deps import conversation_service
from controlplane.conversations.models import (
    BRANCH_PATTERN,
    AppConversationStartRequest,
    ConversationTrigger,
    ImageContent,
    SendMessageRequest,
    SuggestedTask,
    TextContent,
)
from controlplane.settings.models import ProviderType

routes = RouteTable(tag="conversations-v0")
NOT_HERE = ("replay_json", "create_microagent", "mcp_config")


class InitSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repository: str | None = Field(
        default=None, max_length=256, pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$"
    )
    git_provider: ProviderType | None = None
    selected_branch: str | None = Field(default=None, max_length=256, pattern=BRANCH_PATTERN)
    initial_user_msg: str | None = Field(default=None, max_length=200_000)
    image_urls: list[str] | None = Field(default=None, max_length=20)
    suggested_task: SuggestedTask | None = None
    conversation_instructions: str | None = Field(default=None, max_length=20_000)
    replay_json: None = Field(default=None, description="Not supported: must be absent or null")
    create_microagent: None = Field(default=None, description="Not supported: absent or null")
    mcp_config: None = Field(default=None, description="Not here: MCP servers are settings")

    @model_validator(mode="before")
    @classmethod
    def _explain(cls, data: Any) -> Any:
        # A plain "Input should be None" would not say why.
        if isinstance(data, dict):
            for name in NOT_HERE:
                if data.get(name) is not None:
                    raise ValueError(f"{name} is not supported by this server")
        return data


class ConversationResponse(BaseModel):
    status: Literal["ok"] = "ok"
    conversation_id: str = Field(description="task-<start task id>: poll it until READY")
    message: str | None = None
    conversation_status: Literal["STARTING"] = "STARTING"


def as_start_request(body: InitSessionRequest) -> AppConversationStartRequest:
    """The V1 start request the V0 body means. The V0 model checks each field as V1 does; a
    value V1 still refuses is the caller's 422 (under the V0 body), never a 500."""
    try:
        return _translated(body)
    except ValidationError as exc:
        raise RequestValidationError(error_items(exc, "body")) from None


def _translated(body: InitSessionRequest) -> AppConversationStartRequest:
    content: list[TextContent | ImageContent] = []
    if body.initial_user_msg:
        content.append(TextContent(text=body.initial_user_msg))
    if body.image_urls:
        content.append(ImageContent(image_urls=body.image_urls))
    return AppConversationStartRequest(
        selected_repository=body.repository,
        git_provider=body.git_provider,
        selected_branch=body.selected_branch,
        initial_message=SendMessageRequest(content=content) if content else None,
        suggested_task=body.suggested_task,
        system_message_suffix=body.conversation_instructions,
        trigger=ConversationTrigger.SUGGESTED_TASK
        if body.suggested_task
        else ConversationTrigger.GUI,
    )


@routes.route(
    "POST",
    "/api/conversations",
    summary="Start a conversation (V0 body): answers task-<start task id> to follow",
    body=InitSessionRequest,
    response=ConversationResponse,
    errors=(404, 409, 429),
)
async def start_v0(request: web.Request) -> web.Response:
    body = await parse_body(request, InitSessionRequest)
    task = await conversation_service(request).start(principal_of(request), as_start_request(body))
    return json_response(ConversationResponse(conversation_id=f"task-{task.id}"))
