"""The events of a conversation (docs/agent-protocol.md, "Events").

Events are built as pydantic models and leave the agent as plain JSON dicts, masked
(see :mod:`agent.conversations.masking`) before they are stored or sent.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

Source = Literal["agent", "user", "environment"]


def utc_now() -> str:
    """ISO 8601 UTC with a ``Z`` suffix, e.g. ``2026-11-22T12:00:03.123456Z``."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_id() -> str:
    return str(uuid.uuid4())


class Event(BaseModel):
    id: str = Field(default_factory=new_id)
    timestamp: str = Field(default_factory=utc_now)
    source: Source
    kind: str


class LLMMessage(BaseModel):
    role: str
    content: list[dict[str, Any]]


def text_message(role: str, text: str) -> LLMMessage:
    return LLMMessage(role=role, content=[{"type": "text", "text": text}])


class MessageEvent(Event):
    kind: Literal["MessageEvent"] = "MessageEvent"
    llm_message: LLMMessage


class ActionEvent(Event):
    source: Source = "agent"
    kind: Literal["ActionEvent"] = "ActionEvent"
    tool_name: str
    tool_call_id: str
    action: dict[str, Any]
    thought: str = ""
    llm_response_id: str | None = None


class ObservationEvent(Event):
    source: Source = "environment"
    kind: Literal["ObservationEvent"] = "ObservationEvent"
    tool_name: str
    tool_call_id: str
    action_id: str
    observation: dict[str, Any]


class UserRejectObservation(Event):
    source: Source = "environment"
    kind: Literal["UserRejectObservation"] = "UserRejectObservation"
    tool_name: str
    tool_call_id: str
    action_id: str
    rejection_reason: str


class AgentErrorEvent(Event):
    source: Source = "agent"
    kind: Literal["AgentErrorEvent"] = "AgentErrorEvent"
    tool_name: str
    tool_call_id: str
    error: str


class ConversationStateUpdateEvent(Event):
    source: Source = "environment"
    kind: Literal["ConversationStateUpdateEvent"] = "ConversationStateUpdateEvent"
    key: str
    value: Any


class ConversationErrorEvent(Event):
    source: Source = "environment"
    kind: Literal["ConversationErrorEvent"] = "ConversationErrorEvent"
    code: str
    detail: str


class LLMCompletionLogEvent(Event):
    source: Source = "environment"
    kind: Literal["LLMCompletionLogEvent"] = "LLMCompletionLogEvent"
    model: str
    latency_ms: int
    usage: dict[str, int]
    cost: float
    accumulated_cost: float
    response_id: str | None
    attempts: int
