"""What a lifecycle event says. It never carries a secret: ids, states and reasons only."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import STREAM_ID, PageQuery, cursor_field


class LifecycleType(StrEnum):
    SANDBOX_CREATED = "sandbox.created"
    SANDBOX_RUNNING = "sandbox.running"
    SANDBOX_PAUSED = "sandbox.paused"
    SANDBOX_RESUMED = "sandbox.resumed"
    SANDBOX_DELETED = "sandbox.deleted"
    SANDBOX_ERROR = "sandbox.error"
    SANDBOX_MISSING = "sandbox.missing"
    CONVERSATION_CREATED = "conversation.created"
    CONVERSATION_DELETED = "conversation.deleted"
    CONVERSATION_ERROR = "conversation.error"


class LifecycleEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(default_factory=lambda: secrets.token_hex(12))
    type: LifecycleType
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))
    user_id: str
    sandbox_id: str | None = None
    conversation_id: str | None = None
    automatic: bool = Field(
        default=False, description="True when the control plane acted on its own (reaper, sweep)"
    )
    reason: str | None = None


class LifecycleEventPage(BaseModel):
    items: list[LifecycleEvent]
    next_page_id: str | None = None


class DeadLetter(BaseModel):
    """A delivery given up after ACS_LIFECYCLE_WEBHOOK_DEAD_AFTER (docs/operations.md)."""

    url_id: str = Field(description="First 16 hex digits of the URL's SHA-256")
    event: LifecycleEvent
    attempts: int
    error: str = Field(description="The last attempt's error, e.g. HTTP 503")
    dead_at: datetime


class DeadLetterList(BaseModel):
    items: list[DeadLetter]


class DeadLetterQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=100, ge=1, le=1000, description="Per webhook URL, newest first")


class LifecycleQuery(PageQuery):
    page_id: str | None = cursor_field(STREAM_ID)
    sandbox_id: str | None = Field(default=None, max_length=64)
    all_users: bool = Field(default=False, description="Admin keys only")
