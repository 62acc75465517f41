"""GET /api/v1/settings/agent-schema and /conversation-schema: the settings forms of OpenHands'
clients, rendered from a schema (the SDK's `SettingsSchema` shape: sections of fields keyed by
their dotted path in `agent_settings` / `conversation_settings`).

The schema lists what our agent honours, nothing more: an Agent Canvas form built from it can
only set what takes effect. The values are read from GET /api/v1/settings and written back as
`agent_settings_diff` / `conversation_settings_diff` (controlplane/settings/diff.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from controlplane.settings.models import MAX_ITERATIONS_LIMIT


class ValueType(StrEnum):
    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"


class Prominence(StrEnum):
    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"


class SettingsChoice(BaseModel):
    value: str | int | float | bool | None
    label: str


class SettingsFieldSchema(BaseModel):
    key: str
    label: str
    description: str | None = None
    section: str
    section_label: str
    value_type: ValueType
    default: Any = None
    prominence: Prominence = Prominence.MINOR
    depends_on: list[str] = Field(default_factory=list)
    secret: bool = False
    required: bool = False
    choices: list[SettingsChoice] = Field(default_factory=list)


class SettingsSectionSchema(BaseModel):
    key: str
    label: str
    fields: list[SettingsFieldSchema]


class SettingsSchema(BaseModel):
    model_name: str
    sections: list[SettingsSectionSchema]


def _section(key: str, label: str, *fields: dict[str, Any]) -> SettingsSectionSchema:
    return SettingsSectionSchema(
        key=key,
        label=label,
        fields=[SettingsFieldSchema(section=key, section_label=label, **f) for f in fields],
    )


AGENT_SCHEMA = SettingsSchema(
    model_name="AgentSettings",
    sections=[
        _section(
            "llm",
            "LLM",
            {
                "key": "llm.model",
                "label": "Model",
                "description": "LiteLLM-style model name, e.g. anthropic/claude-sonnet-4",
                "value_type": ValueType.STRING,
                "prominence": Prominence.CRITICAL,
                "required": True,
            },
            {
                "key": "llm.api_key",
                "label": "API key",
                "description": "Stored encrypted; never shown again nor given to sandboxes' users",
                "value_type": ValueType.STRING,
                "prominence": Prominence.CRITICAL,
                "secret": True,
            },
            {
                "key": "llm.base_url",
                "label": "Base URL",
                "description": "An OpenAI-compatible endpoint; empty: the provider's default",
                "value_type": ValueType.STRING,
                "prominence": Prominence.MAJOR,
            },
        ),
        _section(
            "condenser",
            "Memory condensation",
            {
                "key": "condenser.enabled",
                "label": "Condense long histories",
                "value_type": ValueType.BOOLEAN,
                "default": True,
                "prominence": Prominence.MINOR,
            },
            {
                "key": "condenser.max_size",
                "label": "Events kept before condensing",
                "value_type": ValueType.INTEGER,
                "prominence": Prominence.MINOR,
                "depends_on": ["condenser.enabled"],
            },
        ),
    ],
)

CONVERSATION_SCHEMA = SettingsSchema(
    model_name="ConversationSettings",
    sections=[
        _section(
            "conversation",
            "Conversation",
            {
                "key": "max_iterations",
                "label": "Maximum LLM calls per run",
                "description": f"1 to {MAX_ITERATIONS_LIMIT}; empty: the agent's default (500)",
                "value_type": ValueType.INTEGER,
                "prominence": Prominence.MAJOR,
            },
            {
                "key": "confirmation_mode",
                "label": "Ask before every action",
                "value_type": ValueType.BOOLEAN,
                "default": False,
                "prominence": Prominence.MAJOR,
            },
            {
                "key": "max_budget_per_task",
                "label": "Budget per conversation (USD)",
                "value_type": ValueType.NUMBER,
                "prominence": Prominence.MINOR,
            },
            {
                "key": "security_analyzer",
                "label": "Security analyzer",
                "description": "Kept and shown; confirmation mode is what guards actions here",
                "value_type": ValueType.STRING,
                "prominence": Prominence.MINOR,
                "choices": [{"value": "none", "label": "None"}],
            },
        ),
    ],
)
