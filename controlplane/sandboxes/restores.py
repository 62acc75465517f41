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

    async def source(
        self, owner: str, snapshot_id: str, sandbox_id: str, *, carried: str | None = None
    ) -> FileSource:
        """The snapshot's files for sandbox `sandbox_id`, read when the runtime needs them (a
        missing or damaged snapshot raises then); the agent's state too when it is the sandbox
        the snapshot was taken of (a rewind); else, with `carried` (a conversation's fork,
        SandboxRecord.carried), that conversation's stored history under its new id."""
