"""LLM profiles: named LLM settings a user keeps, lists, renames and activates (OpenHands'
`/api/v1/settings/profiles`, the agent server's `/api/profiles`: the same shapes, from the SDK's
`profiles_router.py`). Activating one copies its model, base URL and key (when it has one) into
the user's LLM settings, which new conversations use. Profiles live in the user's encrypted
record; their keys are never returned (`api_key_set` says whether one is stored).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, model_validator

from controlplane.errors import Conflict, NotFound
from controlplane.settings.models import HttpUrl, StoredLlmProfile, UserRecord
from controlplane.settings.store import UserRecordStore

MAX_PROFILES = 50
PROFILE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""The SDK's (openhands.sdk.profiles), so names travel between clients unchanged."""
_NAME = re.compile(PROFILE_NAME_PATTERN)
#: LLM fields that mean something to us or that clients echo; each is dropped from `options`.
_MAIN = ("model", "base_url", "api_key", "api_key_set")
_OPTIONS_BYTES = 16 * 1024


class LlmConfigIn(BaseModel):
    """The `llm` of a save: the SDK's LLM as clients dump it. model, base_url and api_key are
    read; every other field is kept as sent and handed back (it has no effect on our agent)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    base_url: HttpUrl = None
    api_key: SecretStr | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _options_size(self) -> LlmConfigIn:
        if len(json.dumps(self.model_extra or {}, default=str)) > _OPTIONS_BYTES:
            raise ValueError(f"the other LLM fields take more than {_OPTIONS_BYTES} bytes")
        return self


class SaveProfileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    llm: LlmConfigIn
    include_secrets: bool = Field(default=True, description="Store the API key with it")


def _new_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError("letters, digits, '.', '_' and '-', starting with a letter or digit")
    return name


class RenameProfileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    new_name: Annotated[
        str,
        Field(max_length=64, json_schema_extra={"pattern": PROFILE_NAME_PATTERN}),
        AfterValidator(_new_name),
    ]


class ActivateProfileRequest(BaseModel):
    """POST …/activate: `{}`, as Agent Canvas sends it."""

    model_config = ConfigDict(extra="forbid")


class ProfileInfo(BaseModel):
    name: str
    model: str | None = None
    base_url: str | None = None
    provider_connection_id: None = None
    provider_connection_broken: bool = False
    api_key_set: bool = False


class ProfileListResponse(BaseModel):
    profiles: list[ProfileInfo]
    active_profile: str | None = None


class ProfileDetailResponse(BaseModel):
    name: str
    config: dict[str, Any] = Field(description="The LLM configuration; api_key always null")
    api_key_set: bool = False


class ProfileMutationResponse(BaseModel):
    name: str
    message: str


class ActivateProfileResponse(ProfileMutationResponse):
    model: str
    llm_applied: bool = True


class LlmProfilesView(BaseModel):
    """`llm_profiles` of GET /api/v1/users/me: what the SDK's get_llm(profile_name=…) reads."""

    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    active_profile: str | None = None


def check_name(name: str) -> str:
    """Raises NotFound for a name no profile can have (as for one that does not exist)."""
    if not _NAME.match(name):
        raise NotFound(f"Profile '{name}' not found")
    return name


def config_of(profile: StoredLlmProfile) -> dict[str, Any]:
    """The LLM configuration as clients read it: the key as null."""
    main = {"model": profile.model, "base_url": profile.base_url, "api_key": None}
    return {**profile.options, **main}


def view_of(record: UserRecord) -> LlmProfilesView:
    return LlmProfilesView(
        profiles={name: config_of(p) for name, p in sorted(record.llm_profiles.items())},
        active_profile=record.active_llm_profile,
    )


class LlmProfiles:
    def __init__(self, store: UserRecordStore) -> None:
        self._store = store

    async def list(self, user_id: str) -> ProfileListResponse:
        record = await self._store.get(user_id)
        return ProfileListResponse(
            profiles=[
                ProfileInfo(
                    name=name, model=p.model, base_url=p.base_url, api_key_set=bool(p.api_key)
                )
                for name, p in sorted(record.llm_profiles.items())
            ],
            active_profile=record.active_llm_profile,
        )

    async def get(self, user_id: str, name: str) -> ProfileDetailResponse:
        """Raises NotFound."""
        profile = (await self._store.get(user_id)).llm_profiles.get(check_name(name))
        if profile is None:
            raise NotFound(f"Profile '{name}' not found")
        return ProfileDetailResponse(
            name=name, config=config_of(profile), api_key_set=bool(profile.api_key)
        )

    async def save(self, user_id: str, name: str, body: SaveProfileRequest) -> None:
        """Create or overwrite. Raises NotFound for an impossible name, Conflict past
        MAX_PROFILES."""
        check_name(name)
        llm = body.llm
        key = llm.api_key.get_secret_value() if llm.api_key and body.include_secrets else None
        options = {k: v for k, v in (llm.model_extra or {}).items() if k not in _MAIN}
        profile = StoredLlmProfile(
            model=llm.model, base_url=llm.base_url, api_key=key or None, options=options
        )

        def change(record: UserRecord) -> None:
            if name not in record.llm_profiles and len(record.llm_profiles) >= MAX_PROFILES:
                raise Conflict(
                    f"Profile limit reached ({MAX_PROFILES}). Delete a profile before saving"
                    " a new one."
                )
            record.llm_profiles[name] = profile

        await self._store.update(user_id, change)

    async def delete(self, user_id: str, name: str) -> None:
        """Idempotent, as the SDK's: deleting a missing profile succeeds."""
        check_name(name)

        def change(record: UserRecord) -> None:
            record.llm_profiles.pop(name, None)
            if record.active_llm_profile == name:
                record.active_llm_profile = None

        await self._store.update(user_id, change)

    async def rename(self, user_id: str, name: str, new_name: str) -> str:
        """Raises NotFound (no such profile) or Conflict (the new name is taken)."""
        check_name(name)

        def change(record: UserRecord) -> None:
            profile = record.llm_profiles.get(name)
            if profile is None:
                raise NotFound(f"Profile '{name}' not found")
            if new_name == name:
                return
            if new_name in record.llm_profiles:
                raise Conflict(f"Profile '{new_name}' already exists")
            record.llm_profiles[new_name] = record.llm_profiles.pop(name)
            if record.active_llm_profile == name:
                record.active_llm_profile = new_name

        await self._store.update(user_id, change)
        return (
            f"Profile '{name}' unchanged (same name)"
            if new_name == name
            else f"Profile '{name}' renamed to '{new_name}'"
        )

    async def activate(self, user_id: str, name: str) -> ActivateProfileResponse:
        """Copy the profile into the LLM settings and mark it active. Raises NotFound."""
        check_name(name)
        applied: list[StoredLlmProfile] = []

        def change(record: UserRecord) -> None:
            profile = record.llm_profiles.get(name)
            if profile is None:
                raise NotFound(f"Profile '{name}' not found")
            record.settings.llm_model = profile.model
            record.settings.llm_base_url = profile.base_url
            if profile.api_key:
                record.llm_api_key = profile.api_key
            record.active_llm_profile = name
            applied.append(profile)

        await self._store.update(user_id, change)
        return ActivateProfileResponse(
            name=name,
            message=f"Profile '{name}' activated and applied to current settings",
            model=applied[0].model,
        )
