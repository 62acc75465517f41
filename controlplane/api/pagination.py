"""Opaque cursors and the query parameters shared by every /search route."""

from __future__ import annotations

import base64
import binascii

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.parsing import invalid

MAX_LIMIT = 100
MAX_BATCH = 100


class PageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    page_id: str | None = Field(default=None, max_length=512, description="Opaque cursor")
    limit: int = Field(default=100, ge=1, le=MAX_LIMIT)


def encode_cursor(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def decode_cursor(page_id: str | None) -> str | None:
    """The position a page_id stands for. Raises a 422 for a page_id we did not issue."""
    if page_id is None or page_id == "":
        return None
    try:
        return base64.urlsafe_b64decode(page_id + "=" * (-len(page_id) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid(
            "query",
            "page_id",
            msg="page_id is not a cursor this API issued",
            error_type="value_error",
        ) from None
