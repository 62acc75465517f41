"""What sandboxes ask the snapshots domain (above them) when a sandbox starts from a snapshot:
a Protocol the wiring answers with controlplane/snapshots/sources.py."""

from __future__ import annotations

from typing import Protocol

from controlplane.auth.models import Principal
from drivers.base import FileSource


class Restores(Protocol):
    async def spec_of(self, principal: Principal, snapshot_id: str) -> str:
        """The spec of the caller's snapshot, which the new sandbox runs. Raises
        SnapshotNotFound (someone else's too)."""

    def source(self, owner: str, snapshot_id: str) -> FileSource:
        """The snapshot's files, read when the runtime needs them (a missing or damaged
        snapshot raises then)."""
