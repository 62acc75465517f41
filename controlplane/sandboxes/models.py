"""Sandbox records (stored) and SandboxInfo (the API shape OpenHands clients know)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.pagination import MAX_BATCH, PageQuery, cursor_field
from controlplane.api.parsing import QueryTime
from controlplane.specs.models import AGENT_SERVER

SANDBOX_ID_PATTERN = r"^[0-9a-f]{22}$"


class SandboxStatus(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    ERROR = "ERROR"
    MISSING = "MISSING"


ACTIVE = frozenset({SandboxStatus.STARTING, SandboxStatus.RUNNING})
"""Statuses that count toward the per-user running cap."""


class ExposedUrl(BaseModel):
    name: str
    url: str
    port: int


class SandboxRecord(BaseModel):
    """What Redis holds for a sandbox (the session key is encrypted there)."""

    id: str
    owner: str
    spec_id: str
    status: SandboxStatus
    reason: str | None = None
    session_api_key: str
    ports: dict[str, int] = Field(default_factory=dict)  # port name -> port where reached
    host: str | None = None
    """The address its ports are reached at, as the driver reported it (Docker: the engine's
    host, ACS_URL_HOST; Kubernetes: the pod's IP); None: ACS_URL_HOST."""
    created_at: datetime
    updated_at: datetime
    last_activity_at: datetime
    deleting_at: datetime | None = None  # a delete was asked for: it is finished, never undone
    org_id: str | None = None
    """The organization it belongs to; None: made before organizations, the default one's."""
    origin: str | None = None
    """The snapshot it was started from (its files came from there), None for a spec's new
    sandbox."""
    origin_at: datetime | None = None
    """When its files last came from `origin`: made from it, or a rewind to it."""
    carried: str | None = None
    """A conversation's fork (`<source conversation id>:<new conversation id>`): the source's
    conversation as the agent stored it at the snapshot (its events, no credential) is restored
    under the new id (docs/sandboxes.md#checkpoints)."""
    held_until: float | None = None
    """While a snapshot holds it still (frozen): until when, Unix seconds. A RUNNING sandbox
    found frozen past that time was left so by a dead control plane and is thawed."""
    hibernated_at: datetime | None = None
    """A PAUSED sandbox that gave its memory back (Docker: its container stopped)."""
    generation: int = 0
    """Bumped by the store with every change of status and every write of where the sandbox is
    reached (ports, host): a re-create, a resume or a failover makes a new one, so whatever a
    replica cached of an older generation (the proxy's container address) is not used."""

    def agent_url(self, default_host: str) -> str:
        """Base URL of the sandbox's agent server, as this control plane reaches it
        (`default_host`, ACS_URL_HOST, for a record that names no host)."""
        return f"http://{self.host or default_host}:{self.ports[AGENT_SERVER]}"

    @classmethod
    def starting(
        cls,
        sandbox_id: str,
        owner: str,
        spec_id: str,
        org_id: str | None = None,
        *,
        origin: str | None = None,
        carried: str | None = None,
    ) -> SandboxRecord:
        """A new sandbox's first record: STARTING, with a fresh session key, all times now
        (`origin`: the snapshot its files come from; `carried`: a conversation's fork)."""
        now = datetime.now(UTC)
        return cls(
            id=sandbox_id,
            owner=owner,
            org_id=org_id,
            spec_id=spec_id,
            status=SandboxStatus.STARTING,
            session_api_key=secrets.token_urlsafe(32),
            created_at=now,
            updated_at=now,
            last_activity_at=now,
            origin=origin,
            origin_at=now if origin is not None else None,
            carried=carried,
        )


class SandboxInfo(BaseModel):
    id: str
    created_by_user_id: str | None
    sandbox_spec_id: str
    status: SandboxStatus
    session_api_key: str | None = Field(
        default=None, description="Only for the owner, and only while RUNNING"
    )
    exposed_urls: list[ExposedUrl] | None = None
    created_at: datetime
    last_activity_at: datetime
    reason: str | None = Field(default=None, description="Why the sandbox is in ERROR or MISSING")
    org_id: str | None = Field(default=None, description="The organization it belongs to")
    snapshot_id: str | None = Field(
        default=None, description="The snapshot it was started from, if it was"
    )
    hibernated: bool = Field(
        default=False, description="PAUSED and its memory given back: resume restarts it"
    )


class SandboxPage(BaseModel):
    items: list[SandboxInfo]
    next_page_id: str | None = None


class StartSandboxRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sandbox_spec_id: str | None = Field(default=None, max_length=64)
    snapshot_id: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        description="Start from this snapshot of yours: its files, on its sandbox's spec (a "
        "new session key and identity; docs/sandboxes.md#snapshots)",
    )


class SandboxSearchQuery(PageQuery):
    page_id: str | None = cursor_field(SANDBOX_ID_PATTERN.strip("^$"))
    status: SandboxStatus | None = None
    sandbox_spec_id: str | None = Field(default=None, max_length=64)
    all_users: bool = Field(
        default=False,
        description="Every member's sandboxes in the organization acted in (owners, admins, "
        "auditors; admin keys: every user's)",
    )
    created_by_user_id: str | None = Field(
        default=None, max_length=64, description="One member's sandboxes (as all_users)"
    )
    last_activity_at__lt: QueryTime | None = Field(default=None, description="Idle since before")
    last_activity_at__gte: QueryTime | None = None

    def matches(self, record: SandboxRecord) -> bool:
        return (
            (self.status is None or record.status == self.status)
            and (self.sandbox_spec_id is None or record.spec_id == self.sandbox_spec_id)
            and (
                self.last_activity_at__lt is None
                or record.last_activity_at < self.last_activity_at__lt
            )
            and (
                self.last_activity_at__gte is None
                or record.last_activity_at >= self.last_activity_at__gte
            )
        )


class SandboxBatchQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class StartSandboxQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sandbox_spec_id: str | None = Field(default=None, max_length=64)


class DeleteSandboxQuery(BaseModel):
    """DELETE /api/v1/sandboxes?sandbox_id=…: the form OpenHands' route takes (its path
    parameter never binds) and the SDK's OpenHandsCloudWorkspace sends."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str = Field(max_length=64)


class Success(BaseModel):
    success: bool = True


class Claimed(NamedTuple):
    """A member claimed for a user."""

    record: SandboxRecord
    events_stored: bool
    """The claim's lifecycle events were stored with it (else the caller publishes them)."""
