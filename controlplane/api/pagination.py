"""Opaque cursors and the query parameters shared by every /search route."""

from __future__ import annotations

import base64
import binascii
import re

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


def decode_cursor(page_id: str | None, pattern: str) -> str | None:
    """The position a page_id stands for, which must match `pattern`.

    Raises a 422 for a page_id we did not issue (strict base64, then the pattern: lenient
    decoding would turn garbage into an empty or foreign position and restart the listing).
    """
    if page_id is None or page_id == "":
        return None
    try:
        padded = page_id + "=" * (-len(page_id) % 4)
        value = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        value = None
    if value is None or not re.fullmatch(pattern, value):
        raise invalid(
            "query",
            "page_id",
            msg="page_id is not a cursor this API issued",
            error_type="value_error",
        )
    return value


OFFSET = r"[0-9]{1,9}"
HEX32 = r"[0-9a-f]{32}"
STREAM_ID = r"[0-9]{1,20}-[0-9]{1,20}"
