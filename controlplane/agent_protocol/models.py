"""Shapes of the agent-server protocol the control plane keeps: a conversation's execution
status and its metrics (the SDK's ``ConversationStats`` folded into one snapshot: state.py)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel


class ExecutionStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    PAUSED = "paused"
    WAITING_FOR_CONFIRMATION = "waiting_for_confirmation"
    FINISHED = "finished"
    ERROR = "error"
    STUCK = "stuck"


class TokenUsage(BaseModel):
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    context_window: int = 0
    per_turn_token: int = 0
    response_id: str = ""


class MetricsSnapshot(BaseModel):
    model_name: str = "default"
    accumulated_cost: float = 0.0
    max_budget_per_task: float | None = None
    accumulated_token_usage: TokenUsage | None = None
