"""The warm pool as an admin reads it (GET /api/v1/sandbox-pool: WarmPool.view)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from controlplane.sandboxes.models import SandboxStatus


class PoolMember(BaseModel):
    id: str
    status: SandboxStatus
    ready: bool  # claimable now
    stale: bool  # booted from another spec content or image; the refiller drops it
    created_at: datetime
    reason: str | None = None


class PoolOfSpec(BaseModel):
    spec_id: str
    size: int  # the target (ACS_WARM_POOL or the spec's warm_pool)
    state: str  # how members wait: running or paused
    claims: int
    misses: int
    members: list[PoolMember]


class PoolView(BaseModel):
    specs: list[PoolOfSpec]
