"""Request and response bodies of the conversations API (docs/agent-protocol.md)."""

from __future__ import annotations

import re
import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_HEX_ID = re.compile(r"^[0-9a-f]{32}$")
_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")


def normalize_conversation_id(value: str) -> str:
    """32 lowercase hex digits; a dashed UUID is accepted and normalised. ValueError else."""
    text = value.strip().lower()
    if _HEX_ID.match(text):
        return text
    try:
        return uuid.UUID(text).hex
    except ValueError:
        raise ValueError("conversation_id must be 32 hex digits") from None


class ExecutionStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    PAUSED = "paused"
    WAITING_FOR_CONFIRMATION = "waiting_for_confirmation"
    FINISHED = "finished"
    ERROR = "error"
    STUCK = "stuck"


class TextContent(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. OpenHands' cache_prompt

    type: Literal["text"] = "text"
    text: str


class SendMessageRequest(BaseModel):
    """A user message: ``{role, content, run}``; ``content`` may also be a plain string."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "system", "assistant"] = "user"
    content: list[TextContent] = Field(min_length=1)
    run: bool = True

    @field_validator("content", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return [{"type": "text", "text": value}] if isinstance(value, str) else value

    def text(self) -> str:
        return "\n".join(part.text for part in self.content)


class LLMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    base_url: str | None = Field(default=None, max_length=2048)
    api_key: str | None = Field(default=None, max_length=8192)
    input_cost_per_token: float | None = Field(default=None, ge=0)
    output_cost_per_token: float | None = Field(default=None, ge=0)
    timeout: float = Field(default=120, gt=0, le=3600)
    num_retries: int = Field(default=3, ge=0, le=20)
    # Extensions beyond the contract (all optional):
    retry_min_wait: float = Field(default=2.0, ge=0, le=600)
    retry_max_wait: float = Field(default=30.0, ge=0, le=3600)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_output_tokens: int | None = Field(default=None, ge=1)


class MCPSSEServer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    url: str = Field(min_length=1, max_length=2048)
    api_key: str | None = None
    timeout: float | None = Field(default=None, gt=0, le=3600)


class MCPSHTTPServer(MCPSSEServer):
    timeout: float | None = Field(default=60, gt=0, le=3600)


class MCPStdioServer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64)
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SERVER_NAME.match(value):
            raise ValueError("Server name can only contain letters, numbers, hyphens, underscores")
        return value


class MCPConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    sse_servers: list[MCPSSEServer] = Field(default_factory=list)
    stdio_servers: list[MCPStdioServer] = Field(default_factory=list)
    shttp_servers: list[MCPSHTTPServer] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _plain_urls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("sse_servers", "shttp_servers"):
                items = data.get(key)
                if isinstance(items, list):
                    data[key] = [{"url": i} if isinstance(i, str) else i for i in items]
        return data

    def secret_values(self) -> list[str]:
        values = [s.api_key for s in [*self.sse_servers, *self.shttp_servers] if s.api_key]
        for server in self.stdio_servers:
            values.extend(server.env.values())
        return values


class StartConversationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: str | None = None
    llm: LLMConfig
    initial_message: SendMessageRequest | None = None
    max_iterations: int = Field(default=100, ge=1, le=10000)
    max_budget_per_task: float | None = Field(default=None, ge=0)
    confirmation_mode: bool = False
    secrets: dict[str, str] = Field(default_factory=dict)
    mcp_config: MCPConfig = Field(default_factory=MCPConfig)
    system_message_suffix: str | None = None
    working_dir: str | None = None

    @field_validator("conversation_id")
    @classmethod
    def _conversation_id(cls, value: str | None) -> str | None:
        return None if value is None else normalize_conversation_id(value)

    def secret_values(self) -> list[str]:
        """Every value that must never appear in an event."""
        values = [*self.secrets.values(), *self.mcp_config.secret_values()]
        if self.llm.api_key:
            values.append(self.llm.api_key)
        return values


class ConfirmationResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    accept: bool
    reason: str = "User rejected the action."


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Metrics(BaseModel):
    model_name: str
    accumulated_cost: float = 0.0
    max_budget_per_task: float | None = None
    accumulated_token_usage: TokenUsage = Field(default_factory=TokenUsage)


class ConversationInfo(BaseModel):
    id: str
    execution_status: ExecutionStatus
    title: str | None = None
    created_at: str
    updated_at: str
    max_iterations: int
    iterations: int = 0
    confirmation_mode: bool = False
    metrics: Metrics
    pending_action_ids: list[str] = Field(default_factory=list)
