"""Names, labels and ids of the Docker objects behind a sandbox."""

from __future__ import annotations

import secrets
import time

LABEL_ID = "acs.sandbox_id"
LABEL_OWNER = "acs.owner"
LABEL_SPEC = "acs.spec_id"
LABEL_PREFIX = "acs.prefix"
"""Scopes a deployment (and a test run): every list and event filter includes it."""
POOL_OWNER = "~pool"
"""The owner of an unclaimed warm pool member, in its record and (for good) in its container's
owner label; never a valid user id. Once claimed, the record in Redis names the real owner."""


def new_sandbox_id() -> str:
    """22 hex characters, time-ordered, so lexical order is creation order (cursor paging)."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(5)}"


def container_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}"


def volume_name(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}{sandbox_id}-workspace"


def labels(prefix: str, sandbox_id: str, owner: str, spec_id: str) -> dict[str, str]:
    return {LABEL_ID: sandbox_id, LABEL_OWNER: owner, LABEL_SPEC: spec_id, LABEL_PREFIX: prefix}
