"""The audit search's query (GET /api/v1/audit-events/search and /export)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import MAX_LIMIT, cursor_field

_ID = r"^[A-Za-z0-9_.@:~-]{1,128}$"
SEALED_CURSOR = r"[A-Za-z0-9_-]{70}"
"""A sealed position (controlplane/audit/search.py, Cursors): 12 bytes of nonce, 24 of
position, 16 of tag, in unpadded base64url."""


class AuditQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    org_id: str | None = Field(
        default=None,
        pattern=_ID,
        description="The organization whose entries to search (default: the one the caller "
        "acts in; a deployment admin: every organization, and `~` for entries of none such as "
        "sign-ins)",
    )
    user_id: str | None = Field(default=None, pattern=_ID, description="Who acted")
    action: str | None = Field(
        default=None, pattern=r"^[a-z_]+\.[a-z_]+$", description="e.g. `sandbox.delete`"
    )
    target: str | None = Field(
        default=None, pattern=_ID, description="An id the action was done to (sandbox, key, user…)"
    )
    since: datetime | None = Field(default=None, description="Entries at or after (ISO 8601)")
    until: datetime | None = Field(default=None, description="Entries before (ISO 8601)")
    page_id: str | None = cursor_field(SEALED_CURSOR)
    limit: int = Field(default=100, ge=1, le=MAX_LIMIT)
