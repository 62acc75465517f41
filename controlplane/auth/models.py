"""Who is calling, and the API key records behind it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.store.audit import Actor

USER_ID_PATTERN = r"^[A-Za-z0-9_.@-]{1,64}$"
RoleName = Literal["owner", "admin", "member", "auditor"]
"""A member's role in an organization (organizations/roles.py says what each may do)."""


class Principal(BaseModel):
    """The authenticated caller. Admins may act on every user's resources."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    is_admin: bool = False
    key_id: str
    via: Literal["api_key", "session", "oidc", "single_user", "ticket"] = Field(
        default="api_key", description="How the caller proved who they are"
    )
    org_id: str | None = Field(
        default=None,
        description="The organization the caller acts in (X-Org-Id, else their current one); "
        "set by the auth middleware; None: they belong to none",
    )
    org_role: RoleName | None = None
    key_org_id: str | None = Field(
        default=None, description="The organization the API key was made in, if it names one"
    )

    def actor(self) -> Actor:
        """The caller as the audit log names them."""
        return Actor(
            user_id=self.user_id,
            key_id=self.key_id,
            via=self.via,
            admin=self.is_admin,
            org_id=self.org_id,
            role=self.org_role,
        )


class ApiKeyInfo(BaseModel):
    """A stored key, without its secret (only its hash is ever stored)."""

    key_id: str
    user_id: str = Field(pattern=USER_ID_PATTERN)
    is_admin: bool
    created_at: datetime
    name: str | None = Field(default=None, description="What its owner called it")
    org_id: str | None = Field(
        default=None, description="The organization it was made in (None: made before them)"
    )


class CreatedApiKey(ApiKeyInfo):
    """Returned once, at creation: the only time the plain key exists outside its holder."""

    key: str
