"""Sandbox ids and the owner of unclaimed warm pool members. (The runtime names its own objects,
in its package: drivers/docker/names.py, drivers/kubernetes/names.py.)"""

from __future__ import annotations

import secrets
import time

POOL_OWNER = "~pool"
"""The owner of an unclaimed warm pool member, in its record and (for good) in the runtime's
owner label; never a valid user id. Once claimed, the record in Redis names the real owner."""


def new_sandbox_id() -> str:
    """22 hex characters, time-ordered, so lexical order is creation order (cursor paging)."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(5)}"
