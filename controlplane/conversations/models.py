"""App conversations and their start tasks, in the OpenHands V1 shapes."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from controlplane.agent_protocol.models import ExecutionStatus, MetricsSnapshot
from controlplane.api.pagination import HEX32, OFFSET, SCORED, TEXT, PageQuery, cursor_field
from controlplane.api.parsing import QueryTime
from controlplane.sandboxes.models import SandboxStatus
from controlplane.settings.models import ProviderType

HEX_ID = r"^[0-9a-f]{32}$"


def now() -> datetime:
    return datetime.now(UTC)


def normalise_uuid(value: str) -> str:
    """Accept dashed or plain UUIDs; store and return 32 lowercase hex characters."""
    plain = value.replace("-", "").lower()
    if not re.fullmatch(HEX_ID, plain):
        raise ValueError("must be a UUID (32 hex characters, dashes allowed)")
    return plain


HexId = Annotated[str, Field(pattern=HEX_ID)]
# What git refuses in a branch name (git check-ref-format), spelled out: `\s` means different
# characters to pydantic's regex engine and to Python's, and the document must say what is served.
BRANCH_PATTERN = r"^[^\x00-\x20\x7f~^:?*\[\\]+$"
# A path's conversation id: hex and dashes only, so that /count, /search and /start-tasks never
# match it (a 405 there would advertise this route's methods in its Allow header).
CONVERSATION_PARAM = "{conversation_id:[0-9a-fA-F-]+}"
UUID_PATTERN = (
    r"^(?:[0-9a-fA-F]{32}"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$"
)
Uuid = Annotated[str, Field(pattern=UUID_PATTERN), AfterValidator(normalise_uuid)]
"""A conversation id as clients send it: plain or in the 8-4-4-4-12 form, any case; kept as 32
lowercase hex."""


def _type_required(schema: dict[str, Any]) -> None:
    # `type` has a default, yet picks the variant of the union: the document says it is required.
    schema["required"] = ["type", *(f for f in schema.get("required", []) if f != "type")]


class TextContent(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_type_required)

    type: Literal["text"] = "text"
    text: str = Field(max_length=200_000)
    cache_prompt: bool = False


class ImageContent(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_type_required)

    type: Literal["image"] = "image"
    image_urls: list[str] = Field(max_length=20)


class SendMessageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "system", "assistant", "tool"] = "user"
    content: list[Annotated[TextContent | ImageContent, Field(discriminator="type")]] = Field(
        default_factory=list, max_length=50
    )
    run: bool = True


class ConversationTrigger(StrEnum):
    RESOLVER = "resolver"
    GUI = "gui"
    SUGGESTED_TASK = "suggested_task"
    OPENHANDS_API = "openhands_api"
    SLACK = "slack"
    MICROAGENT_MANAGEMENT = "microagent_management"
    JIRA = "jira"
    JIRA_DC = "jira_dc"
    LINEAR = "linear"
    BITBUCKET = "bitbucket"


class StartTaskStatus(StrEnum):
    WORKING = "WORKING"
    WAITING_FOR_SANDBOX = "WAITING_FOR_SANDBOX"
    PREPARING_REPOSITORY = "PREPARING_REPOSITORY"
    RUNNING_SETUP_SCRIPT = "RUNNING_SETUP_SCRIPT"
    SETTING_UP_GIT_HOOKS = "SETTING_UP_GIT_HOOKS"
    SETTING_UP_SKILLS = "SETTING_UP_SKILLS"
    STARTING_CONVERSATION = "STARTING_CONVERSATION"
    READY = "READY"
    ERROR = "ERROR"


TERMINAL_TASK = frozenset({StartTaskStatus.READY, StartTaskStatus.ERROR})


class PluginSpec(BaseModel):
    """OpenHands' plugin reference: accepted, not loaded (docs/conversations.md)."""

    source: str = Field(max_length=2000)
    ref: str | None = Field(default=None, max_length=256)
    repo_path: str | None = Field(default=None, max_length=1000)
    parameters: dict[str, Any] | None = None


class SuggestedTask(BaseModel):
    """OpenHands' suggested task (an issue or PR to work on); it becomes the first message."""

    git_provider: ProviderType | None = None
    task_type: str = Field(max_length=64)
    repo: str = Field(max_length=256)
    issue_number: int
    title: str = Field(max_length=1000)


class AppConversationStartRequest(BaseModel):
    """OpenHands' start request. Fields it defines that we do not use are typed and accepted;
    any other field is ignored, as OpenHands does (docs/conversations.md lists which)."""

    model_config = ConfigDict(extra="ignore")

    sandbox_id: str | None = Field(default=None, max_length=64)
    sandbox_spec_id: str | None = Field(
        default=None,
        max_length=64,
        description="Ours: the spec of a new sandbox (no sandbox_id); default: the user's setting",
    )
    conversation_id: Uuid | None = None
    initial_message: SendMessageRequest | None = None
    system_message_suffix: str | None = Field(default=None, max_length=20_000)
    processors: list[dict[str, Any]] | None = Field(default=None, max_length=20)
    llm_model: str | None = Field(default=None, max_length=256)
    selected_repository: str | None = Field(
        default=None, max_length=256, pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$"
    )
    selected_branch: str | None = Field(default=None, max_length=256, pattern=BRANCH_PATTERN)
    git_provider: ProviderType | None = None
    title: str | None = Field(default=None, max_length=200)
    trigger: ConversationTrigger | None = None
    pr_number: list[int] = Field(default_factory=list, max_length=100)
    parent_conversation_id: Uuid | None = None
    agent_type: Literal["default", "plan"] = "default"
    public: bool | None = None
    suggested_task: SuggestedTask | None = None
    # Accepted and ignored: see docs/conversations.md.
    dependency_repos: list[str] = Field(default_factory=list, max_length=50)
    plugins: list[PluginSpec] | None = Field(default=None, max_length=20)


class AppConversationStartTask(BaseModel):
    id: str
    created_by_user_id: str | None
    status: StartTaskStatus = StartTaskStatus.WORKING
    detail: str | None = None
    app_conversation_id: str | None = None
    sandbox_id: str | None = None
    agent_server_url: str | None = None
    request: AppConversationStartRequest
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


class AppConversationStartTaskPage(BaseModel):
    items: list[AppConversationStartTask]
    next_page_id: str | None = None


class AppConversationInfo(BaseModel):
    """The stored record; `execution_status` is the last one the agent reported."""

    id: str
    created_by_user_id: str | None
    sandbox_id: str
    selected_repository: str | None = None
    selected_branch: str | None = None
    git_provider: ProviderType | None = None
    title: str | None = None
    trigger: ConversationTrigger | None = None
    pr_number: list[int] = Field(default_factory=list)
    llm_model: str | None = None
    metrics: MetricsSnapshot | None = None
    parent_conversation_id: str | None = None
    sub_conversation_ids: list[str] = Field(default_factory=list)
    public: bool | None = None
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)
    execution_status: ExecutionStatus | None = None


class AppConversation(AppConversationInfo):
    sandbox_status: SandboxStatus = SandboxStatus.MISSING
    conversation_url: str | None = None
    session_api_key: str | None = None


class AppConversationPage(BaseModel):
    items: list[AppConversation]
    next_page_id: str | None = None


class ConversationSortOrder(StrEnum):
    CREATED_AT = "CREATED_AT"
    CREATED_AT_DESC = "CREATED_AT_DESC"
    UPDATED_AT = "UPDATED_AT"
    UPDATED_AT_DESC = "UPDATED_AT_DESC"
    TITLE = "TITLE"
    TITLE_DESC = "TITLE_DESC"


class ConversationFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title__contains: str | None = Field(default=None, max_length=200)
    sandbox_id__eq: str | None = Field(default=None, max_length=64)
    created_at__gte: QueryTime | None = None
    created_at__lt: QueryTime | None = None
    updated_at__gte: QueryTime | None = None
    updated_at__lt: QueryTime | None = None


class ConversationSearchQuery(ConversationFilters, PageQuery):
    # Created-at orders page by conversation id, updated-at ones by (updated_at, id), the others
    # by offset.
    page_id: str | None = cursor_field(f"{HEX32}|{SCORED}|{OFFSET}|{TEXT}")
    sort_order: ConversationSortOrder = ConversationSortOrder.CREATED_AT_DESC
    include_sub_conversations: bool = False


class ConversationBatchQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(min_length=1, max_length=100)


class LegacyConversationQuery(BaseModel):
    """GET /api/conversations (the V0 list: conversations/legacy.py)."""

    model_config = ConfigDict(extra="forbid")

    page_id: str | None = cursor_field(HEX32)
    limit: int = Field(default=20, ge=1, le=100)
    selected_repository: str | None = Field(default=None, max_length=256)
    conversation_trigger: ConversationTrigger | None = None
    include_sub_conversations: bool = False


class TaskSortOrder(StrEnum):
    CREATED_AT = "CREATED_AT"
    CREATED_AT_DESC = "CREATED_AT_DESC"
    UPDATED_AT = "UPDATED_AT"
    UPDATED_AT_DESC = "UPDATED_AT_DESC"


class TaskFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id__eq: Uuid | None = None
    created_at__gte: QueryTime | None = None


class TaskSearchQuery(TaskFilters, PageQuery):
    # Created-at orders page by task id, updated-at ones by (updated_at, id).
    page_id: str | None = cursor_field(f"{HEX32}|{SCORED}")
    sort_order: TaskSortOrder = TaskSortOrder.CREATED_AT_DESC


class RenameRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=200)


class AppConversationUpdateRequest(BaseModel):
    """PATCH body: only the fields sent change; null clears a repository field."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(default=None, min_length=1, max_length=200)
    public: bool | None = None
    selected_repository: str | None = Field(
        default=None, max_length=256, pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$"
    )
    selected_branch: str | None = Field(default=None, max_length=256, pattern=BRANCH_PATTERN)
    git_provider: ProviderType | None = None


class ConfirmationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    accept: bool
    reason: str = Field(default="User rejected the action.", max_length=2000)
