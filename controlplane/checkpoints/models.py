"""Checkpoint records (stored) and the API's shapes."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import HEX32, PageQuery, cursor_field
from controlplane.conversations.models import AppConversationStartTask
from controlplane.sandboxes.models import SandboxStatus

CHECKPOINT_ID = Field(pattern=f"^{HEX32}$", description="A checkpoint of this conversation")


class CheckpointRecord(BaseModel):
    """What Redis holds for a checkpoint (in its conversation's hash)."""

    id: str
    conversation_id: str
    owner: str
    sandbox_id: str
    snapshot_id: str
    event_id: str | None
    """The conversation's last event when it was taken (None: it had none yet)."""
    stream_id: str | None
    """That event's place in the conversation's stream (internal)."""
    created_at: datetime


class CheckpointInfo(BaseModel):
    id: str
    conversation_id: str
    sandbox_id: str = Field(description="The sandbox it was taken of")
    snapshot_id: str = Field(description="The snapshot holding its files and the agent's state")
    event_id: str | None = Field(
        description="The conversation's last event at that point, before the user's message "
        "that caused it; null when the conversation had no event yet"
    )
    created_at: datetime


class CheckpointPage(BaseModel):
    items: list[CheckpointInfo]
    next_page_id: str | None = None


class CheckpointQuery(PageQuery):
    page_id: str | None = cursor_field(HEX32)


class RewindRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint_id: str = CHECKPOINT_ID


class RewindResult(BaseModel):
    checkpoint: CheckpointInfo
    sandbox_id: str
    sandbox_status: SandboxStatus = Field(
        description="STARTING: the sandbox is being made again from the checkpoint; the next "
        "message waits until it is RUNNING"
    )
    rewound_events: int = Field(
        description="Events after the checkpoint, now marked `rewound_by` (kept, not deleted)"
    )


class ForkConversationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint_id: str = CHECKPOINT_ID
    title: str | None = Field(default=None, min_length=1, max_length=200)


class ForkConversationResult(BaseModel):
    checkpoint: CheckpointInfo
    conversation_id: str = Field(description="The new conversation")
    sandbox_id: str = Field(description="Its own new sandbox, made from the checkpoint")
    copied_events: int = Field(description="History copied from the conversation, up to there")
    start_task: AppConversationStartTask
