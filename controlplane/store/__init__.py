"""Redis plumbing shared by the domains' store modules: the connection (redis.py), every key
name (keyspace.py), cursor paging (paging.py) and the leader lock (leader.py)."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A Redis reply as str, whatever the client's decode setting."""
    return value.decode() if isinstance(value, bytes) else str(value)
