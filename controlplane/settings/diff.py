"""POST /api/v1/settings bodies as OpenHands' current clients send them: the nested settings as
`agent_settings_diff` / `conversation_settings_diff` (the keys that changed, in the shape of the
SDK's AgentSettings and ConversationSettings), next to flat app preferences.

A diff is read like the nested `agent_settings` / `conversation_settings` of SettingsV1Update
(same types, same merge), with two differences made for the SDK's wider models: keys our agent
does not use are ignored rather than refused, and an empty `llm.base_url` means "none". The
preferences `title_llm_profile` and `disabled_skills` are accepted and ignored (there is no
title model nor skill to turn off here). A diff and its nested twin in one body is a 422.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, field_validator

from controlplane.api.parsing import invalid
from controlplane.settings.models import _http_url
from controlplane.settings.v1 import (
    AgentSettingsIn,
    CondenserIn,
    ConversationSettingsIn,
    LlmIn,
    SettingsV1Update,
)


def _url_or_empty(value: str | None) -> str | None:
    return None if value == "" else _http_url(value)


DiffUrl = Annotated[
    str | None,
    Field(max_length=2048, json_schema_extra={"pattern": r"^$|^[\s\x1c-\x1f]*https?://[^\s/]+"}),
    AfterValidator(_url_or_empty),
]
"""An http(s) URL, or "" for none (the form's empty field)."""


class LlmDiff(LlmIn):
    model_config = ConfigDict(extra="ignore")

    base_url: DiffUrl = None

    @field_validator("model", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value


class CondenserDiff(CondenserIn):
    model_config = ConfigDict(extra="ignore")


class AgentSettingsDiff(AgentSettingsIn):
    model_config = ConfigDict(extra="ignore")

    llm: LlmDiff | None = None
    condenser: CondenserDiff | None = None


class ConversationSettingsDiff(ConversationSettingsIn):
    model_config = ConfigDict(extra="ignore")


def _both(nested: str, diff: str) -> dict[str, Any]:
    not_null = {"not": {"type": "null"}}
    return {"required": [nested, diff], "properties": {nested: not_null, diff: not_null}}


# What as_v1_update refuses, said in the schema too: a view and its diff, both non-null.
_NOT_BOTH: dict[str, Any] = {
    "not": {
        "anyOf": [
            _both("agent_settings", "agent_settings_diff"),
            _both("conversation_settings", "conversation_settings_diff"),
        ]
    }
}


class SettingsDiffUpdate(SettingsV1Update):
    """Body of POST /api/v1/settings: flat fields, nested views, or their diffs."""

    model_config = ConfigDict(json_schema_extra=_NOT_BOTH)

    agent_settings_diff: AgentSettingsDiff | None = None
    conversation_settings_diff: ConversationSettingsDiff | None = None
    title_llm_profile: Any = Field(default=None, exclude=True)
    disabled_skills: Any = Field(default=None, exclude=True)


def as_v1_update(body: SettingsDiffUpdate) -> SettingsV1Update:
    """The same update with each diff in its nested field's place."""
    data = body.model_dump(
        exclude_unset=True,
        exclude={"agent_settings_diff", "conversation_settings_diff"},
    )
    for diff, nested in (
        ("agent_settings_diff", "agent_settings"),
        ("conversation_settings_diff", "conversation_settings"),
    ):
        value = getattr(body, diff)
        if diff not in body.model_fields_set or value is None:
            continue
        if nested in body.model_fields_set and getattr(body, nested) is not None:
            msg = f"send {diff} or {nested}, not both"
            raise invalid("body", diff, msg=msg, error_type="value_error")
        data[nested] = value.model_dump(exclude_unset=True)
    for name in ("title_llm_profile", "disabled_skills"):
        data.pop(name, None)
    return SettingsV1Update.model_validate(data)
