"""The events of a conversation, in the OpenHands SDK's wire shapes (docs/agent-protocol.md).

Events are plain JSON dicts built here: every one has ``id``, ``timestamp``, ``source`` and
``kind`` and validates against the SDK's ``Event`` discriminated union (openhands-sdk 1.21).
They are masked (:mod:`agent.conversations.masking`) before they are kept or sent. Building
dicts rather than pydantic models keeps the agent's start-up and memory small.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

Source = Literal["agent", "user", "environment"]
Event = dict[str, Any]

FULL_STATE = "full_state"


def utc_now() -> str:
    """As the SDK writes event timestamps: naive ISO 8601, here always UTC, to the microsecond."""
    return datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")


def new_id() -> str:
    return str(uuid.uuid4())


def _event(kind: str, source: Source, **fields: Any) -> Event:
    return {"id": new_id(), "timestamp": utc_now(), "source": source, "kind": kind, **fields}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def message(role: str, content: str) -> dict[str, Any]:
    """An SDK ``Message`` with one text part."""
    return {"role": role, "content": [text(content)]}


def message_event(
    source: Source,
    role: str,
    content: str,
    *,
    llm_response_id: str | None = None,
    sender: str | None = None,
) -> Event:
    event = _event(
        "MessageEvent",
        source,
        llm_message=message(role, content),
        activated_skills=[],
        extended_content=[],
    )
    if llm_response_id is not None:
        event["llm_response_id"] = llm_response_id
    if sender is not None:
        event["sender"] = sender
    return event


def system_prompt_event(prompt: str, tools: list[dict[str, Any]]) -> Event:
    """``tools`` are SDK ``ToolDefinition`` dumps (see :func:`tool_definition`)."""
    return _event("SystemPromptEvent", "agent", system_prompt=text(prompt), tools=tools)


def tool_definition(
    kind: str, title: str, description: str, action: str, observation: str, **extra: Any
) -> dict[str, Any]:
    return {
        "kind": kind,
        "title": title,
        "description": description,
        "action_type": action,
        "observation_type": observation,
        **extra,
    }


def action_event(
    *,
    tool_name: str,
    tool_call_id: str,
    arguments: str,
    action: dict[str, Any] | None,
    thought: str,
    llm_response_id: str,
    summary: str | None = None,
) -> Event:
    """``action`` is an SDK ``Action`` dump (with its ``kind``); None: not executable."""
    event = _event(
        "ActionEvent",
        "agent",
        thought=[text(thought)] if thought else [],
        thinking_blocks=[],
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        tool_call={
            "id": tool_call_id,
            "name": tool_name,
            "arguments": arguments,
            "origin": "completion",
        },
        llm_response_id=llm_response_id,
        security_risk="UNKNOWN",
    )
    if action is not None:
        event["action"] = action
    if summary:
        event["summary"] = summary
    return event


def observation_event(
    *, tool_name: str, tool_call_id: str, action_id: str, observation: dict[str, Any]
) -> Event:
    """``observation`` is an SDK ``Observation`` dump (with its ``kind``)."""
    return _event(
        "ObservationEvent",
        "environment",
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        action_id=action_id,
        observation=observation,
    )


def user_reject_event(*, tool_name: str, tool_call_id: str, action_id: str, reason: str) -> Event:
    return _event(
        "UserRejectObservation",
        "environment",
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        action_id=action_id,
        rejection_reason=reason,
        rejection_source="user",
    )


def agent_error_event(*, tool_name: str, tool_call_id: str, error: str) -> Event:
    return _event(
        "AgentErrorEvent", "agent", tool_name=tool_name, tool_call_id=tool_call_id, error=error
    )


def state_update_event(key: str, value: Any) -> Event:
    return _event("ConversationStateUpdateEvent", "environment", key=key, value=value)


def conversation_error_event(code: str, detail: str) -> Event:
    return _event("ConversationErrorEvent", "environment", code=code, detail=detail)


def pause_event() -> Event:
    return _event("PauseEvent", "user")


def llm_completion_log_event(
    *, filename: str, log_data: str, model_name: str, usage_id: str
) -> Event:
    return _event(
        "LLMCompletionLogEvent",
        "environment",
        filename=filename,
        log_data=log_data,
        model_name=model_name,
        usage_id=usage_id,
    )


def server_error_event(code: str, detail: str) -> Event:
    """Sent on a WebSocket when a frame cannot be handled; never stored."""
    return _event("ServerErrorEvent", "environment", code=code, detail=detail)
