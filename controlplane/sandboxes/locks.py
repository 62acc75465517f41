"""Serialising operations on one sandbox within this process (across replicas, the store's
compare-and-set and the intent leases do that)."""

from __future__ import annotations

import asyncio


class SandboxLocks:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def of(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lock, made at first use."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def forget(self, sandbox_id: str) -> None:
        """After the sandbox is gone: its lock is not kept for ever."""
        self._locks.pop(sandbox_id, None)
