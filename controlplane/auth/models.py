"""Who is calling, and the API key records behind it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

USER_ID_PATTERN = r"^[A-Za-z0-9_.@-]{1,64}$"


class Principal(BaseModel):
    """The authenticated caller. Admins may act on every user's resources."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    is_admin: bool = False
    key_id: str
    via: Literal["api_key", "session", "single_user", "ticket"] = Field(
        default="api_key", description="How the caller proved who they are"
    )


class ApiKeyInfo(BaseModel):
    """A stored key, without its secret (only its hash is ever stored)."""

    key_id: str
    user_id: str = Field(pattern=USER_ID_PATTERN)
    is_admin: bool
    created_at: datetime


class CreatedApiKey(ApiKeyInfo):
    """Returned once, at creation: the only time the plain key exists outside its holder."""

    key: str
