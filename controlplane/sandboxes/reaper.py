"""The idle reaper: pauses RUNNING sandboxes idle past their timeout (or hibernates them:
ACS_IDLE_ACTION), hibernates sandboxes paused for longer than ACS_HIBERNATE_AFTER and, when
retention is on, deletes sandboxes paused for too long. One replica acts at a time (a Redis
leader lock).

Idle means: no API touch of the sandbox or its conversations, no agent event, and no
conversation in it whose agent is running, for longer than the timeout. The timeout is
ACS_IDLE_TIMEOUT when set, else the user's `sandbox_idle_timeout` setting, else the spec's
`idle_timeout`; 0 disables. A sweep reads the settings of a page's owners (500 sandboxes) in
one round trip. Deadlines are computed from `last_activity_at` in Redis, so a
restart neither resets nor forgets them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

import structlog

from controlplane.config import ServiceConfig
from controlplane.errors import ControlPlaneError
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import SandboxStore
from controlplane.settings.models import UserRecord
from controlplane.settings.service import SettingsService
from controlplane.specs.catalog import SpecCatalog
from controlplane.store.leader import LeaderLock, LeaderLoop

log = structlog.get_logger(__name__)


class Activity(Protocol):
    """What the reaper asks the layer above it (conversations) before pausing a sandbox."""

    async def busy(self, sandbox_id: str) -> bool:
        """True while an agent runs in the sandbox: activity even when it prints nothing."""


class IdleActions(Protocol):
    async def pause_idle(self, sandbox_id: str, reason: str) -> bool: ...

    async def hibernate_idle(self, sandbox_id: str, reason: str) -> bool: ...

    async def retire(self, sandbox_id: str, reason: str) -> bool: ...


class IdleReaper:
    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        catalog: SpecCatalog,
        *,
        actions: IdleActions,
        activity: Activity,
        settings: SettingsService,
        leader: LeaderLock,
    ) -> None:
        self._config = config
        self._store = store
        self._catalog = catalog
        self._actions = actions
        self._activity = activity
        self._settings = settings
        self._loop = LeaderLoop("reaper_sweep", leader, self.sweep, lambda: config.reaper_interval)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def timeout_of(self, record: SandboxRecord, owner: UserRecord | None = None) -> int:
        """Seconds of idleness before this sandbox is paused; 0 means never. `owner`: the
        owner's settings record when the caller read it already (a sweep reads a page's
        owners in one round trip)."""
        if self._config.idle_timeout is not None:
            return self._config.idle_timeout
        user = owner if owner is not None else await self._settings.record(record.owner)
        if user.settings.sandbox_idle_timeout is not None:
            return user.settings.sandbox_idle_timeout
        spec = self._catalog.find(record.spec_id)
        return spec.idle_timeout if spec else 0

    async def sweep(self, now: datetime | None = None) -> tuple[list[str], list[str]]:
        """One pass. Returns (paused ids, deleted ids)."""
        now = now or datetime.now(UTC)
        paused: list[str] = []
        retired: list[str] = []
        retention = self._config.paused_retention
        store = self._store
        after: str | None = None
        while True:
            ids = await store.page_ids(None, after, 500)
            records = await store.get_many(ids)
            owners = await self._owners(records)
            for record in records:
                if record is None:
                    continue
                try:
                    if record.status == SandboxStatus.RUNNING:
                        if await self._reap_idle(record, now, owners.get(record.owner)):
                            paused.append(record.id)
                    elif (
                        record.status == SandboxStatus.PAUSED
                        and retention > 0
                        and now - record.updated_at > timedelta(seconds=retention)
                    ):
                        reason = f"deleted after {retention} s paused (retention)"
                        if await self._actions.retire(record.id, reason):
                            retired.append(record.id)
                    elif record.status == SandboxStatus.PAUSED:
                        await self._hibernate_long_paused(record, now)
                except ControlPlaneError as exc:
                    log.warning("reaper_action_failed", sandbox_id=record.id, error=str(exc))
            if len(ids) < 500:
                break
            after = ids[-1]
        return paused, retired

    async def _hibernate_long_paused(self, record: SandboxRecord, now: datetime) -> None:
        """ACS_HIBERNATE_AFTER: a sandbox paused that long gives its memory back."""
        after = self._config.hibernate_after
        if after <= 0 or record.hibernated_at is not None:
            return
        paused = (now - record.updated_at).total_seconds()
        if paused >= after:
            await self._actions.hibernate_idle(
                record.id, f"hibernated after {int(paused)} s paused (ACS_HIBERNATE_AFTER)"
            )

    async def _owners(self, records: Sequence[SandboxRecord | None]) -> dict[str, UserRecord]:
        """The settings of the owners of a page's RUNNING sandboxes, in one round trip (none
        when ACS_IDLE_TIMEOUT decides every timeout)."""
        if self._config.idle_timeout is not None:
            return {}
        running = [r.owner for r in records if r is not None and r.status == SandboxStatus.RUNNING]
        return await self._settings.records(running) if running else {}

    async def _reap_idle(
        self, record: SandboxRecord, now: datetime, owner: UserRecord | None = None
    ) -> bool:
        timeout = await self.timeout_of(record, owner)
        idle = (now - record.last_activity_at).total_seconds()
        if timeout <= 0 or idle < timeout:
            return False
        if await self._activity.busy(record.id):
            # A running agent is activity, even when its command prints nothing for a while.
            await self._store.touch(record.id)
            return False
        return await self._actions.pause_idle(
            record.id, f"paused after {int(idle)} s idle (timeout {timeout} s)"
        )
