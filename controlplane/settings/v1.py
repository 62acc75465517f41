"""/api/v1/settings: the V0 settings plus OpenHands' nested `agent_settings` view.

GET answers every flat field of GET /api/settings and, on top, `agent_settings` (agent, llm,
mcp_config, condenser) and `conversation_settings` (run limits) built from the same record. POST
takes the flat fields, the nested ones, or both, with the merge semantics of POST /api/settings
(docs/settings.md#v1-settings).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from controlplane.errors import Conflict
from controlplane.settings.mcp import MCPConfig
from controlplane.settings.models import (
    MAX_ITERATIONS_LIMIT,
    HttpUrl,
    SettingsResponse,
    SettingsUpdate,
    ShortStr,
)


class LlmView(BaseModel):
    model: str | None
    base_url: str | None
    api_key: None = Field(default=None, description="Never returned; see api_key_set")
    api_key_set: bool


class CondenserView(BaseModel):
    enabled: bool
    max_size: int | None


class AgentSettingsView(BaseModel):
    agent: str | None
    llm: LlmView
    mcp_config: MCPConfig | None
    condenser: CondenserView


class ConversationSettingsView(BaseModel):
    max_iterations: int | None
    confirmation_mode: bool | None
    security_analyzer: str | None
    max_budget_per_task: float | None


class SettingsV1Response(SettingsResponse):
    agent_settings: AgentSettingsView
    conversation_settings: ConversationSettingsView


class LlmIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ShortStr | None = None
    base_url: HttpUrl = None
    api_key: SecretStr | None = None
    api_key_set: Any = Field(default=None, exclude=True)


class CondenserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_size: int | None = Field(default=None, ge=20, le=100_000)


class AgentSettingsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: ShortStr | None = None
    llm: LlmIn | None = None
    mcp_config: MCPConfig | None = None
    condenser: CondenserIn | None = None


class ConversationSettingsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_iterations: int | None = Field(default=None, ge=1, le=MAX_ITERATIONS_LIMIT)
    confirmation_mode: bool | None = None
    security_analyzer: ShortStr | None = None
    max_budget_per_task: float | None = Field(default=None, ge=0, le=1_000_000, allow_inf_nan=False)


class SettingsV1Update(SettingsUpdate):
    """Body of POST /api/v1/settings: SettingsUpdate plus the nested views (all optional)."""

    agent_settings: AgentSettingsIn | None = None
    conversation_settings: ConversationSettingsIn | None = None


# nested path -> flat field of SettingsUpdate
_NESTED: dict[tuple[str, ...], str] = {
    ("agent_settings", "agent"): "agent",
    ("agent_settings", "llm", "model"): "llm_model",
    ("agent_settings", "llm", "base_url"): "llm_base_url",
    ("agent_settings", "llm", "api_key"): "llm_api_key",
    ("agent_settings", "mcp_config"): "mcp_config",
    ("agent_settings", "condenser", "enabled"): "enable_default_condenser",
    ("agent_settings", "condenser", "max_size"): "condenser_max_size",
    ("conversation_settings", "max_iterations"): "max_iterations",
    ("conversation_settings", "confirmation_mode"): "confirmation_mode",
    ("conversation_settings", "security_analyzer"): "security_analyzer",
    ("conversation_settings", "max_budget_per_task"): "max_budget_per_task",
}


def _nested_values(body: SettingsV1Update) -> dict[str, tuple[Any, tuple[str, ...]]]:
    """flat name -> (value, nested path) for every nested field the body sets."""
    found: dict[str, tuple[Any, tuple[str, ...]]] = {}
    for path, flat in _NESTED.items():
        node: Any = body
        for part in path:
            if node is None or part not in node.model_fields_set:
                break
            node = getattr(node, part)
        else:
            found[flat] = (node, path)
    return found


def flatten(body: SettingsV1Update, stored: SettingsResponse) -> SettingsUpdate:
    """The flat update `body` means. A field sent both flat and nested takes the value that
    differs from what is stored (a client echoing what it read changed only the other one);
    two different new values are a 422 (for secrets, which null keeps: two different keys)."""
    data: dict[str, Any] = {
        name: getattr(body, name)
        for name in body.model_fields_set - {"agent_settings", "conversation_settings"}
    }
    for flat, (value, path) in _nested_values(body).items():
        sent = data.get(flat)
        if flat not in data or sent == value:
            data[flat] = value
            continue
        if isinstance(value, SecretStr) or isinstance(sent, SecretStr):
            if sent is None:
                data[flat] = value
            elif value is not None:
                raise _disagree(flat, path)
            continue
        current = getattr(stored, flat)
        if sent == current:
            data[flat] = value
        elif value != current:
            raise _disagree(flat, path)
    return SettingsUpdate.model_validate(data)


def _disagree(flat: str, path: tuple[str, ...]) -> Conflict:
    # 409, not 422: each value is valid alone; they conflict with each other and the stored one.
    return Conflict(f"{flat} and {'.'.join(path)} disagree; send one of them")


def v1_view(settings: SettingsResponse) -> SettingsV1Response:
    return SettingsV1Response(
        **settings.model_dump(),
        agent_settings=AgentSettingsView(
            agent=settings.agent,
            llm=LlmView(
                model=settings.llm_model,
                base_url=settings.llm_base_url,
                api_key_set=settings.llm_api_key_set,
            ),
            mcp_config=settings.mcp_config,
            condenser=CondenserView(
                enabled=settings.enable_default_condenser, max_size=settings.condenser_max_size
            ),
        ),
        conversation_settings=ConversationSettingsView(
            max_iterations=settings.max_iterations,
            confirmation_mode=settings.confirmation_mode,
            security_analyzer=settings.security_analyzer,
            max_budget_per_task=settings.max_budget_per_task,
        ),
    )
