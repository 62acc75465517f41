"""Time-ordered identifiers: lexical order is creation order, which cursor paging relies on."""

from __future__ import annotations

import secrets
import time


def uuid7_hex() -> str:
    """A version-7 UUID as 32 hex characters (OpenHands writes UUIDs without dashes)."""
    ms = int(time.time() * 1000) & ((1 << 48) - 1)
    rand_a = secrets.randbits(12)
    rand_b = secrets.randbits(62)
    value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return f"{value:032x}"
