"""Opaque cursors and the query parameters shared by every /search route."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.parsing import invalid

MAX_LIMIT = 100
MAX_BATCH = 100


class PageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    page_id: str | None = Field(default=None, max_length=512, description="Opaque cursor")
    limit: int = Field(default=100, ge=1, le=MAX_LIMIT)


class OptionalPageQuery(BaseModel):
    """Paging for a list that answered everything at once before it had pages: without `limit`
    and `page_id` it still does (its clients read that shape), with either it answers a page
    and the `next_page_id` to follow (each route sets its `page_id`'s pattern)."""

    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(
        default=None,
        ge=1,
        le=MAX_LIMIT,
        description=f"Items per page (1-{MAX_LIMIT}); without it and without page_id, every item "
        f"in one answer",
    )
    page_id: str | None = Field(default=None, max_length=512, description="Opaque cursor")

    def page_size(self) -> int | None:
        """None: no page asked for (everything); else the page's size (a page_id alone: 100)."""
        if self.limit is None and not self.page_id:
            return None
        return self.limit or DEFAULT_LIMIT


DEFAULT_LIMIT = 100


def cursor_field(pattern: str) -> Any:
    """A route's page_id: the shape of its positions is in the OpenAPI document, so a client (or
    a fuzzer) knows which values can be a cursor at all. Clients still treat it as opaque."""
    return Field(
        default=None,
        pattern=f"^(?:{pattern})?$",
        description="Opaque cursor: the next_page_id of the previous page",
    )


def encode_cursor(value: str) -> str:
    """A position as a page_id. Positions are ids and offsets: nothing a client may not see."""
    return value


def decode_cursor(page_id: str | None, pattern: str) -> str | None:
    """The position a page_id stands for, which must match `pattern` (the query model checks it
    first; this keeps a route whose model forgot to from reading a foreign position)."""
    if page_id is None or page_id == "":
        return None
    if not re.fullmatch(pattern, page_id):
        raise invalid(
            "query",
            "page_id",
            msg="page_id is not a cursor this API issued",
            error_type="value_error",
        )
    return page_id


OFFSET = r"[0-9]{1,9}"
HEX32 = r"[0-9a-f]{32}"
STREAM_ID = r"[0-9]{1,19}-[0-9]{1,19}"  # 19 digits stay below 2**64, as Redis needs
SCORED = rf"[0-9]{{1,17}}-{HEX32}"  # a sorted set's integer score and the id it belongs to
TEXT = r"t[A-Za-z0-9_-]{2,500}"  # a position in a lexical index: its member, base64url


def encode_text_cursor(value: str) -> str:
    """A lexical index's member as a page_id (TEXT): the caller's own title and id."""
    return "t" + base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def decode_text_cursor(page_id: str | None) -> str | None:
    """The member a TEXT page_id stands for; a 422 for one this API cannot have issued."""
    raw = decode_cursor(page_id, TEXT)
    if raw is None:
        return None
    try:
        return base64.urlsafe_b64decode(raw[1:] + "=" * (-len(raw[1:]) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise invalid(
            "query",
            "page_id",
            msg="page_id is not a cursor this API issued",
            error_type="value_error",
        ) from None
