"""Settings as stored, as read (GET /api/settings) and as written (POST /api/settings)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
)

from controlplane.settings.mcp import MCPConfig

MAX_ITERATIONS_LIMIT = 10_000
RESOURCE_FACTORS = (1, 2, 4, 8)
SECRET_FIELDS = ("llm_api_key", "search_api_key", "sandbox_api_key")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$")
_SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ProviderType(StrEnum):
    GITHUB = "github"
    GITLAB = "gitlab"
    BITBUCKET = "bitbucket"
    AZURE_DEVOPS = "azure_devops"
    ENTERPRISE_SSO = "enterprise_sso"


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not re.match(r"^https?://[^\s/]+", value):
        raise ValueError("must be an http:// or https:// URL")
    return value


def _resource_factor(value: int | None) -> int | None:
    if value is not None and value not in RESOURCE_FACTORS:
        raise ValueError(f"must be one of {', '.join(map(str, RESOURCE_FACTORS))}")
    return value


ShortStr = Annotated[str, Field(max_length=256)]
# Whitespace spelled out: Python's \s and JSON Schema's (ECMA) differ (\x1c-\x1f, \x85, \ufeff),
# and the pattern in the OpenAPI document must refuse exactly what the validator refuses.
_SPACE = r"\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_EMAIL_RE = re.compile(rf"^[^@{_SPACE}]+@[^@{_SPACE}]+\.[^@{_SPACE}.]+$")


def _email(value: str) -> str:
    if not _EMAIL_RE.match(value):
        raise ValueError("not an email address (name@domain.tld)")
    return value


Email = Annotated[
    str,
    Field(max_length=254, json_schema_extra={"pattern": _EMAIL_RE.pattern}),
    AfterValidator(_email),
]
"""An address as git and mail headers take it. Not pydantic's EmailStr: that refuses reserved
domains (dev@example.invalid, me@host.test), which are fine as a git author's address."""
HttpUrl = Annotated[
    str | None,
    Field(max_length=2048, json_schema_extra={"pattern": r"^[\s\x1c-\x1f]*https?://[^\s/]+"}),
    AfterValidator(_http_url),
]


class SettingsFields(BaseModel):
    """The non-secret, user-editable settings (spec table 2.1) with their defaults."""

    language: ShortStr | None = None
    agent: ShortStr | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=MAX_ITERATIONS_LIMIT)
    security_analyzer: ShortStr | None = None
    confirmation_mode: bool | None = None
    llm_model: ShortStr | None = None
    llm_base_url: HttpUrl = None
    remote_runtime_resource_factor: Annotated[
        int | None,
        Field(json_schema_extra={"enum": [*RESOURCE_FACTORS, None]}),
        AfterValidator(_resource_factor),
    ] = None
    enable_default_condenser: bool = True
    enable_sound_notifications: bool = False
    enable_proactive_conversation_starters: bool = True
    enable_solvability_analysis: bool = True
    user_consents_to_analytics: bool | None = None
    sandbox_base_container_image: ShortStr | None = None
    sandbox_runtime_container_image: ShortStr | None = None
    mcp_config: MCPConfig | None = None
    max_budget_per_task: float | None = Field(default=None, ge=0, le=1_000_000, allow_inf_nan=False)
    condenser_max_size: int | None = Field(default=None, ge=20, le=100_000)
    email: Email | None = None
    email_verified: bool | None = None
    git_user_name: ShortStr | None = None
    git_user_email: Email | None = None
    v1_enabled: bool | None = None
    sandbox_idle_timeout: int | None = Field(
        default=None, ge=0, le=30 * 86400, description="Seconds before auto-pause; 0 disables"
    )
    sandbox_spec_id: ShortStr | None = Field(
        default=None, description="Spec of the sandboxes new conversations start; unset: default"
    )
    enable_checkpoints: bool = Field(
        default=True,
        description="A checkpoint of the conversation's sandbox at each of your messages "
        "(rewind and fork from it); false: none",
    )


class StoredProviderToken(BaseModel):
    token: str
    host: str | None = None
    user_id: str | None = None


class StoredSecret(BaseModel):
    value: str
    description: str | None = None


class StoredLlmProfile(BaseModel):
    """A named LLM configuration (controlplane/settings/profiles.py)."""

    model: str
    base_url: str | None = None
    api_key: str | None = None
    options: dict[str, Any] = Field(
        default_factory=dict, description="Other LLM fields the client sent, kept as sent"
    )


class UserRecord(BaseModel):
    """Everything stored for one user; encrypted as a whole at rest."""

    settings: SettingsFields = Field(default_factory=SettingsFields)
    llm_api_key: str | None = None
    search_api_key: str | None = None
    sandbox_api_key: str | None = None
    provider_tokens: dict[ProviderType, StoredProviderToken] = Field(default_factory=dict)
    custom_secrets: dict[str, StoredSecret] = Field(default_factory=dict)
    llm_profiles: dict[str, StoredLlmProfile] = Field(default_factory=dict)
    active_llm_profile: str | None = None
    stored: bool = False


class SettingsUpdate(SettingsFields):
    """Body of POST /api/settings. Only the fields present in the body change.

    Secrets: absent or null keeps the stored value, "" clears it. Read-only indicator fields that
    a client may echo back from GET are accepted and ignored; any other unknown key is a 422.
    """

    model_config = ConfigDict(extra="forbid")

    llm_api_key: SecretStr | None = None
    search_api_key: SecretStr | None = None
    sandbox_api_key: SecretStr | None = None
    llm_api_key_set: Any = Field(default=None, exclude=True)
    search_api_key_set: Any = Field(default=None, exclude=True)
    sandbox_api_key_set: Any = Field(default=None, exclude=True)
    provider_tokens_set: Any = Field(default=None, exclude=True)
    secrets_store: Any = Field(default=None, exclude=True)


class ProviderTokenInfo(BaseModel):
    token: None = None
    host: str | None = None
    user_id: str | None = None


class SecretInfo(BaseModel):
    secret: None = None
    description: str | None = None


class UserSecretsInfo(BaseModel):
    """spec 2.3 UserSecrets as read: which tokens and secrets exist, values always null."""

    provider_tokens: dict[str, ProviderTokenInfo] = Field(default_factory=dict)
    custom_secrets: dict[str, SecretInfo] = Field(default_factory=dict)


class SettingsResponse(SettingsFields):
    """GET /api/settings: every field of spec table 2.1; secret values are always null."""

    llm_api_key_set: bool
    llm_api_key: None = None
    search_api_key: None = None
    sandbox_api_key: None = None
    search_api_key_set: bool = False
    sandbox_api_key_set: bool = False
    provider_tokens_set: dict[str, str | None] = Field(default_factory=dict)
    secrets_store: UserSecretsInfo = Field(default_factory=UserSecretsInfo)


class ProviderTokenIn(BaseModel):
    """Token omitted or null: keep the stored token (host and user_id may change). "": remove."""

    model_config = ConfigDict(extra="forbid")

    token: SecretStr | None = None
    host: str | None = Field(
        default=None,
        max_length=255,
        json_schema_extra={
            "pattern": r"^(?:(?:https?://)?[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
            r"(?::[0-9]{1,5})?/?)?$"
        },
    )
    user_id: str | None = Field(default=None, max_length=255)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        value = value.strip().removeprefix("https://").removeprefix("http://").rstrip("/")
        if not _HOST_RE.match(value):
            raise ValueError("must be a host name, optionally with :port, e.g. gitlab.example.com")
        return value


class GitProvidersUpdate(BaseModel):
    """Body of POST /api/add-git-providers."""

    model_config = ConfigDict(extra="forbid")

    provider_tokens: dict[ProviderType, ProviderTokenIn] = Field(default_factory=dict)
    mcp_config: MCPConfig | None = None


def _secret_name(value: str) -> str:
    if not _SECRET_NAME_RE.match(value):
        raise ValueError(
            "must start with a letter or '_' and hold only letters, digits and '_' (max 64)"
        )
    return value


# The pattern is in the OpenAPI document; the validator keeps the message that explains it.
SecretName = Annotated[
    str, Field(json_schema_extra={"pattern": _SECRET_NAME_RE.pattern}), AfterValidator(_secret_name)
]


class SecretCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: SecretName
    value: SecretStr = Field(min_length=1, max_length=65536)
    description: str | None = Field(default=None, max_length=1024)


class SecretUpdate(BaseModel):
    """PUT /api/secrets/{name}: rename and/or change the description; the value is kept."""

    model_config = ConfigDict(extra="forbid")

    name: SecretName | None = None
    description: str | None = Field(default=None, max_length=1024)


class SecretListItem(BaseModel):
    name: str
    description: str | None = None


class SecretList(BaseModel):
    custom_secrets: list[SecretListItem]


class Message(BaseModel):
    message: str
