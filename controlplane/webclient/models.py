"""The shapes of OpenHands' web-client config, legacy options config and model lists."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import OFFSET, PageQuery, cursor_field
from controlplane.settings.models import ProviderType


class WebClientFeatureFlags(BaseModel):
    enable_billing: bool = False
    hide_llm_settings: bool = False
    enable_jira: bool = False
    enable_jira_dc: bool = False
    enable_linear: bool = False
    hide_users_page: bool = True
    hide_billing_page: bool = True
    hide_integrations_page: bool = False
    enable_acp: bool = False
    deployment_mode: Literal["cloud", "self_hosted"] = "self_hosted"
    enable_onboarding: bool = False


class WebClientConfig(BaseModel):
    """GET /api/v1/web-client/config: open-source mode, no SaaS sign-in, no analytics."""

    app_mode: Literal["oss", "saas"] = "oss"
    posthog_client_key: str | None = None
    feature_flags: WebClientFeatureFlags = Field(default_factory=WebClientFeatureFlags)
    providers_configured: list[ProviderType] = Field(default_factory=list)
    maintenance_start_time: datetime | None = None
    auth_url: str | None = None
    recaptcha_site_key: str | None = None
    faulty_models: list[str] = Field(default_factory=list)
    error_message: str | None = None
    updated_at: datetime
    github_app_slug: str | None = None


class LegacyFeatureFlags(BaseModel):
    ENABLE_BILLING: bool = False
    HIDE_LLM_SETTINGS: bool = False
    ENABLE_JIRA: bool = False
    ENABLE_JIRA_DC: bool = False
    ENABLE_LINEAR: bool = False


class LegacyWebClientConfig(BaseModel):
    """GET /api/options/config, as older frontend builds read it."""

    APP_MODE: Literal["oss", "saas"] = "oss"
    APP_SLUG: str | None = None
    GITHUB_CLIENT_ID: str = ""
    POSTHOG_CLIENT_KEY: str = ""
    PROVIDERS_CONFIGURED: list[ProviderType] = Field(default_factory=list)
    AUTH_URL: str | None = None
    FEATURE_FLAGS: LegacyFeatureFlags = Field(default_factory=LegacyFeatureFlags)


class LLMModel(BaseModel):
    provider: str | None
    name: str
    verified: bool


class LLMModelPage(BaseModel):
    items: list[LLMModel]
    next_page_id: str | None = None


class ModelSearchQuery(PageQuery):
    model_config = ConfigDict(extra="forbid")

    page_id: str | None = cursor_field(OFFSET)
    limit: int = Field(default=50, ge=1, le=100)
    query: str | None = Field(default=None, max_length=256)
    verified__eq: bool | None = None
    provider__eq: str | None = Field(default=None, max_length=128)
