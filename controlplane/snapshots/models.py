"""Snapshot records (stored) and the API's shapes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import PageQuery, cursor_field
from controlplane.sandboxes.models import SandboxInfo

SNAPSHOT_ID_PATTERN = r"^[0-9a-f]{32}$"
MAX_FORKS = 100
"""The most sandboxes one fork starts (as E2B's `fork(count)`); the per-user caps apply too."""


class SnapshotStatus(StrEnum):
    PENDING = "PENDING"  # being taken: never listed, collected if abandoned
    READY = "READY"


class SnapshotRecord(BaseModel):
    """What Redis holds for a snapshot."""

    id: str
    owner: str
    sandbox_id: str
    spec_id: str
    status: SnapshotStatus
    name: str | None = None
    parent: str | None = None
    """The snapshot this one was taken against: the sandbox's previous one, or the one its files
    came from when that is later (the sandbox's first snapshot, or the first after a rewind)."""
    created_at: datetime
    repository: str
    size: int = 0  # bytes of its files
    files: int = 0  # entries of its trees
    stored: int = 0  # bytes it added to the store (its new packs and its index)
    index_digest: str = ""
    index_size: int = 0
    manifest_digest: str = ""
    packs: list[str] = Field(default_factory=list)
    held_still: float = 0.0  # seconds the sandbox was frozen while it was taken
    read: int = 0  # bytes of the files read again: changed since the parent, or not known


class SnapshotInfo(BaseModel):
    id: str
    name: str | None
    sandbox_id: str = Field(description="The sandbox it was taken of (which may be gone)")
    sandbox_spec_id: str
    parent_id: str | None = Field(
        description="The snapshot this one is incremental to: the sandbox's previous one, or "
        "the one the sandbox was started or rewound from, when that came later"
    )
    created_at: datetime
    size_bytes: int = Field(description="Bytes of the files it holds")
    stored_bytes: int = Field(
        description="Bytes it added to the store (after deduplication and compression)"
    )
    files: int
    held_still_seconds: float = Field(
        description="How long the sandbox was frozen while this snapshot was taken"
    )
    read_bytes: int = Field(
        default=0,
        description="Bytes of the files read to take it: those that changed since its parent "
        "(the others' contents are known)",
    )


class SnapshotPage(BaseModel):
    items: list[SnapshotInfo]
    next_page_id: str | None = None


class SnapshotSearchQuery(PageQuery):
    page_id: str | None = cursor_field(SNAPSHOT_ID_PATTERN.strip("^$"))
    sandbox_id: str | None = Field(default=None, max_length=64, description="One sandbox's")


class TakeSnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="A named snapshot is kept until deleted (retention prunes unnamed ones)",
    )


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=1, le=MAX_FORKS)


class ForkResult(BaseModel):
    snapshot: SnapshotInfo = Field(description="The consistent state every fork starts from")
    sandboxes: list[SandboxInfo]
