"""Event queries (the OpenHands /api/v1/events shapes) and webhook bodies."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import STREAM_ID, PageQuery, cursor_field
from controlplane.api.parsing import QueryTime
from controlplane.conversations.models import Uuid


class EventKind(StrEnum):
    MESSAGE = "MessageEvent"
    ACTION = "ActionEvent"
    OBSERVATION = "ObservationEvent"
    USER_REJECT = "UserRejectObservation"
    AGENT_ERROR = "AgentErrorEvent"
    SYSTEM_PROMPT = "SystemPromptEvent"
    STATE_UPDATE = "ConversationStateUpdateEvent"
    CONVERSATION_ERROR = "ConversationErrorEvent"
    CONDENSATION = "Condensation"
    CONDENSATION_REQUEST = "CondensationRequest"
    CONDENSATION_SUMMARY = "CondensationSummaryEvent"
    PAUSE = "PauseEvent"
    TOKEN = "TokenEvent"  # noqa: S105 - an event kind, not a credential
    LLM_COMPLETION_LOG = "LLMCompletionLogEvent"


class EventSortOrder(StrEnum):
    TIMESTAMP = "TIMESTAMP"
    TIMESTAMP_DESC = "TIMESTAMP_DESC"


class EventFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id__eq: Uuid = Field(description="Required: events are kept per conversation")
    kind__eq: EventKind | None = None
    timestamp__gte: QueryTime | None = None
    timestamp__lt: QueryTime | None = None
    sort_order: EventSortOrder = EventSortOrder.TIMESTAMP


class EventSearchQuery(EventFilters, PageQuery):
    page_id: str | None = cursor_field(STREAM_ID)


class ConversationEventQuery(PageQuery):
    """The search of GET /api/v1/conversation/{id}/events/search: the id is in the path."""

    page_id: str | None = cursor_field(STREAM_ID)
    kind__eq: EventKind | None = None
    timestamp__gte: QueryTime | None = None
    timestamp__lt: QueryTime | None = None
    sort_order: EventSortOrder = EventSortOrder.TIMESTAMP

    def scoped(self, conversation_id: str) -> EventSearchQuery:
        # Not validated again: the service's ownership check answers 404 for a malformed id,
        # as every other path does.
        return EventSearchQuery.model_construct(
            **self.model_dump(), conversation_id__eq=conversation_id
        )


class EventBatchQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: list[str] = Field(min_length=1, max_length=100)


class Event(BaseModel):
    """An agent event: these four fields always, the rest depends on `kind`."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=64)
    kind: str = Field(min_length=1, max_length=64)
    timestamp: datetime
    source: str = Field(max_length=32)


class EventPage(BaseModel):
    items: list[dict[str, Any]]
    next_page_id: str | None = None


class WebSocketHandshake(BaseModel):
    """The headers of a WebSocket handshake (RFC 6455 §4.1); without them the socket is a 400."""

    upgrade: Literal["websocket"] = Field(alias="Upgrade")
    connection: Literal["Upgrade"] = Field(alias="Connection")
    version: Literal["13"] = Field(alias="Sec-WebSocket-Version")
    key: str = Field(alias="Sec-WebSocket-Key", pattern=r"^[A-Za-z0-9+/]{22}==$")


class EventSocketQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: Uuid
    after: str | None = Field(default=None, description="Replay after this event id")
    resend_all: bool = True
    session_api_key: str | None = Field(
        default=None,
        description="API key (kept for OpenHands clients; a ticket keeps keys out of URLs)",
    )
    acs_ticket: str | None = Field(
        default=None,
        max_length=64,
        description="A ticket from POST /api/v1/websocket-tickets for this conversation",
    )
