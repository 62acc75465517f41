"""Request bodies of the conversations API, in the SDK's shapes (docs/agent-protocol.md).

``StartConversationRequest`` is the body openhands-sdk 1.21 sends (``agent``, ``workspace``,
``confirmation_policy``, ``secrets`` as secret sources, ...). Fields the agent does not use are
accepted and ignored, as the official agent server ignores unknown fields.
"""

from __future__ import annotations

import re
import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from .mcp_config import MCPConfig, parse_mcp_servers

_HEX_ID = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_TOOLS = ("FinishTool", "ThinkTool")
MASKED = "**********"  # how the SDK dumps a SecretStr it was not asked to expose


def normalize_conversation_id(value: str) -> str:
    """32 lowercase hex digits; a dashed UUID is accepted and normalised. ValueError else."""
    text = value.strip().lower()
    if _HEX_ID.match(text):
        return text
    try:
        return uuid.UUID(text).hex
    except ValueError:
        raise ValueError("conversation_id must be a UUID") from None


def dashed(conversation_id: str) -> str:
    """The id as the official server writes it (``str(UUID)``)."""
    return str(uuid.UUID(hex=conversation_id))


class ExecutionStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    PAUSED = "paused"
    WAITING_FOR_CONFIRMATION = "waiting_for_confirmation"
    FINISHED = "finished"
    ERROR = "error"
    STUCK = "stuck"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextContent(_Lenient):
    type: Literal["text"] = "text"
    text: str


class ImageContent(_Lenient):
    """Accepted in messages; the agent's models get text only, so images are left out."""

    type: Literal["image"] = "image"
    image_urls: list[str] = Field(default_factory=list)


class SendMessageRequest(_Lenient):
    """A message: ``{role, content, run}``; ``content`` may also be a plain string."""

    role: Literal["user", "system", "assistant", "tool"] = "user"
    content: list[TextContent | ImageContent] = Field(min_length=1)
    run: bool = False
    sender: str | None = Field(default=None, max_length=256)

    @field_validator("content", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return [{"type": "text", "text": value}] if isinstance(value, str) else value

    def text(self) -> str:
        return "\n".join(part.text for part in self.content if isinstance(part, TextContent))


class LLMSettings(_Lenient):
    """``agent.llm``: the SDK's ``LLM`` fields the agent uses; the others are ignored."""

    model: str = Field(min_length=1, max_length=256)
    base_url: str | None = Field(default=None, max_length=2048)
    api_key: str | None = Field(default=None, max_length=8192)
    usage_id: str = Field(default="default", min_length=1, max_length=128)
    input_cost_per_token: float | None = Field(default=None, ge=0)
    output_cost_per_token: float | None = Field(default=None, ge=0)
    timeout: float | None = Field(default=300, ge=0, le=3600)
    num_retries: int = Field(default=5, ge=0, le=20)
    retry_min_wait: float = Field(default=8, ge=0, le=600)
    retry_max_wait: float = Field(default=64, ge=0, le=3600)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    log_completions: bool = False

    @property
    def call_timeout(self) -> float:
        """Seconds per attempt; the SDK's None/0 (no timeout) is capped at an hour."""
        return self.timeout or 3600.0

    @property
    def key(self) -> str | None:
        return None if not self.api_key or self.api_key == MASKED else self.api_key


class ToolSpec(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    params: dict[str, Any] = Field(default_factory=dict)


class AgentContext(_Lenient):
    system_message_suffix: str | None = None


class AgentSpec(_Lenient):
    """``agent``: an SDK ``Agent`` (``kind: "Agent"``)."""

    kind: Literal["Agent"] = "Agent"
    llm: LLMSettings
    tools: list[ToolSpec] = Field(default_factory=list)
    mcp_config: dict[str, Any] = Field(default_factory=dict)
    agent_context: AgentContext | None = None
    include_default_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLS))
    system_prompt: str | None = None
    _mcp: MCPConfig = PrivateAttr(default_factory=MCPConfig)

    def tool_names(self) -> set[str]:
        return {t.name for t in self.tools} | set(self.include_default_tools)

    def mcp(self) -> MCPConfig:
        return self._mcp

    @model_validator(mode="after")
    def _parse_mcp(self) -> AgentSpec:
        self._mcp = parse_mcp_servers(self.mcp_config)  # ValueError (a 422) when malformed
        return self


class WorkspaceSpec(_Lenient):
    kind: Literal["LocalWorkspace"] = "LocalWorkspace"
    working_dir: str = Field(min_length=1, max_length=4096)


class ConfirmationPolicy(_Lenient):
    kind: Literal["NeverConfirm", "AlwaysConfirm", "ConfirmRisky"] = "NeverConfirm"
    threshold: Literal["LOW", "MEDIUM", "HIGH"] = "HIGH"
    confirm_unknown: bool = True

    @property
    def confirms(self) -> bool:
        """Every action of this agent has risk UNKNOWN: ConfirmRisky asks iff confirm_unknown."""
        if self.kind == "ConfirmRisky":
            return self.confirm_unknown
        return self.kind == "AlwaysConfirm"

    def dump(self) -> dict[str, Any]:
        if self.kind == "ConfirmRisky":
            return self.model_dump()
        return {"kind": self.kind}


class SecretSource(_Lenient):
    """``StaticSecret`` (a value) or ``LookupSecret`` (fetched with GET ``url`` + ``headers``)."""

    kind: Literal["StaticSecret", "LookupSecret"] = "StaticSecret"
    value: str | None = None
    url: str | None = Field(default=None, max_length=2048)
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        return {"kind": "StaticSecret", "value": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _complete(self) -> SecretSource:
        if self.kind == "StaticSecret" and self.value is None:
            raise ValueError("a StaticSecret needs a value")
        if self.kind == "LookupSecret" and not self.url:
            raise ValueError("a LookupSecret needs a url")
        return self

    def known_values(self) -> list[str]:
        return [v for v in (self.value, *self.headers.values()) if v]


class StartConversationRequest(_Lenient):
    conversation_id: str | None = None
    agent: AgentSpec
    workspace: WorkspaceSpec | None = None
    confirmation_policy: ConfirmationPolicy = Field(default_factory=ConfirmationPolicy)
    initial_message: SendMessageRequest | None = None
    max_iterations: int = Field(default=500, ge=1, le=100_000)
    stuck_detection: bool = True
    secrets: dict[str, SecretSource] = Field(default_factory=dict)
    secrets_encrypted: bool = False
    tags: dict[str, str] = Field(default_factory=dict)
    autotitle: bool = True
    # Ours: the official server has no budget; it ignores this field.
    max_budget_per_task: float | None = Field(default=None, ge=0)

    @field_validator("conversation_id", mode="before")
    @classmethod
    def _conversation_id(cls, value: Any) -> Any:
        return None if value is None else normalize_conversation_id(str(value))

    @field_validator("secrets_encrypted")
    @classmethod
    def _plain_secrets(cls, value: bool) -> bool:
        if value:
            raise ValueError("encrypted secrets are not supported: send the values")
        return value

    def secret_values(self) -> list[str]:
        """Every value that must never appear in an event."""
        values = [v for s in self.secrets.values() for v in s.known_values()]
        values.extend(self.agent.mcp().secret_values())
        if self.agent.llm.key:
            values.append(self.agent.llm.key)
        return values


class ConfirmationResponse(_Lenient):
    accept: bool
    reason: str = "User rejected the action."


class UpdateSecretsRequest(_Lenient):
    secrets: dict[str, SecretSource]


class SetConfirmationPolicyRequest(_Lenient):
    policy: ConfirmationPolicy


class SetSecurityAnalyzerRequest(_Lenient):
    security_analyzer: dict[str, Any] | None = None


class UpdateConversationRequest(_Lenient):
    title: str | None = Field(default=None, min_length=1, max_length=200)
    tags: dict[str, str] | None = None

    @field_validator("title")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("title must not be blank")
        return value


class AskAgentRequest(_Lenient):
    question: str = Field(min_length=1)


class GenerateTitleRequest(_Lenient):
    max_length: int = Field(default=50, ge=1, le=200)
