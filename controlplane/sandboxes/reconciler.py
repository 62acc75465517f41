"""Keeps Redis true to the runtime: follows the driver's events and sweeps every few seconds.
(Below, "container" is the sandbox's instance in the runtime, by its RunState.)

Rules (also in docs/sandboxes.md):
- RUNNING + container paused → PAUSED; exited/created → PAUSED ("stopped outside the control
  plane", resume starts it again); dead → ERROR; gone → MISSING (resume re-creates it).
- PAUSED + container running → RUNNING; gone → MISSING.
- STARTING whose start nobody carries (no launch in this process, the lease of the replica that
  had it lapsed): the start is taken over and finished from what the container is (launcher.py).
- A record marked for deletion that nobody is deleting: the delete is finished.
- A sandbox of this deployment with no record is adopted: its record is rebuilt from its
  owner, spec and environment (Docker: the container's labels and env). One without a session
  key in its environment, or of a sandbox deleted within the tombstone TTL, is removed (with its
  volume, for the deleted one). A warm pool member (owner `~pool`) is never adopted: it is
  removed and its volume kept, since a user may have claimed it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

import structlog

from controlplane.background import stop_tasks
from controlplane.config import ServiceConfig
from controlplane.errors import ControlPlaneError, RuntimeUnavailable
from controlplane.sandboxes import naming
from controlplane.sandboxes.launcher import Launcher, reached
from controlplane.sandboxes.leases import LEASE_TTL, IntentLeases
from controlplane.sandboxes.lifecycle import SandboxLifecycle, entry_of
from controlplane.sandboxes.locks import SandboxLocks
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.specs.catalog import SpecCatalog
from drivers.base import RunState, SandboxDriver, SandboxEvent, SandboxState

log = structlog.get_logger(__name__)
S = SandboxStatus
ADOPTED = {RunState.RUNNING: S.RUNNING, RunState.PAUSED: S.PAUSED, RunState.EXITED: S.PAUSED}
"""The status an adopted sandbox's record starts in; ERROR for any other state."""


def observed_status(record: SandboxRecord, state: SandboxState | None) -> tuple[S, str] | None:
    """The status the runtime implies for a settled record, with a reason; None when it
    agrees."""
    if record.status not in (S.RUNNING, S.PAUSED):
        return None
    if state is None:
        return S.MISSING, "container removed outside the control plane; resume re-creates it"
    if state.status == RunState.RUNNING:
        return (S.RUNNING, "") if record.status == S.PAUSED else None
    if state.status == RunState.PAUSED:
        return (
            (S.PAUSED, "paused outside the control plane") if record.status == S.RUNNING else None
        )
    if state.status in (RunState.EXITED, RunState.CREATED):
        if record.status == S.PAUSED:
            return None
        why = "out of memory" if state.oom_killed else f"exit code {state.exit_code}"
        return S.PAUSED, f"container stopped outside the control plane ({why}); resume starts it"
    if state.status == RunState.DEAD:
        return S.ERROR, f"container is dead: {state.error or 'unknown engine error'}"
    return None


class Deletes(Protocol):
    async def finish_delete(
        self, record: SandboxRecord, *, reason: str | None = None, automatic: bool = False
    ) -> None:
        """Remove what the runtime has of the sandbox, then its record (idempotent)."""


class Reconciler:
    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        *,
        deletes: Deletes,
        launcher: Launcher,
        locks: SandboxLocks,
        notes: SandboxLifecycle,
        leases: IntentLeases | None = None,
        on_fix: Callable[[], None] | None = None,
    ) -> None:
        """`on_fix()` is called for every record changed (the metric's hook)."""
        self._config = config
        self._store = store
        self._driver = driver
        self._catalog = catalog
        self._deletes = deletes
        self._launcher = launcher
        self._locks = locks
        self._notes = notes
        self._leases = leases
        self._on_fix = on_fix
        self._interval = config.reconcile_interval
        self.fixes = 0
        self.busy_elsewhere = False
        self._tasks: list[asyncio.Task[None]] = []

    def _fixed(self) -> None:
        self.fixes += 1
        if self._on_fix is not None:
            self._on_fix()

    def start(self) -> None:
        """Begin sweeping (at once, then periodically) and following engine events."""
        self._tasks = [
            asyncio.create_task(self._sweep_loop(), name="reconcile-sweep"),
            asyncio.create_task(self._event_loop(), name="reconcile-events"),
        ]

    async def stop(self) -> None:
        """Cancel both loops and wait until they have really ended (controlplane/background.py)."""
        await stop_tasks(self._tasks)
        self._tasks = []

    async def _sweep_loop(self) -> None:
        while True:
            self.busy_elsewhere = False
            try:
                await self.sweep()
            except RuntimeUnavailable as exc:
                log.warning("reconcile_sweep_skipped", error=str(exc))
            except Exception:
                log.exception("reconcile_sweep_failed")
            # An intent held by another replica's lease: look again once it could have lapsed
            # (its holder may be dead), not a whole interval later.
            wait = min(self._interval, LEASE_TTL + 0.5) if self.busy_elsewhere else self._interval
            await asyncio.sleep(wait)

    async def _event_loop(self) -> None:
        delay = 0.5
        while True:
            queue: asyncio.Queue[SandboxEvent | Exception | None] = asyncio.Queue()
            watch = self._driver.watch(queue.put_nowait)
            try:
                while (item := await queue.get()) is not None:
                    if isinstance(item, Exception):
                        raise item
                    delay = 0.5
                    if item.sandbox_id:
                        await self._check_one(item.sandbox_id)
            except RuntimeUnavailable as exc:
                log.warning("runtime_events_broken", error=str(exc))
            except Exception:
                log.exception("runtime_events_failed")
            finally:
                watch.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def _check_one(self, sandbox_id: str) -> None:
        # Most events are the echo of our own operation: don't queue an inspect behind it.
        # A change missed here is caught by the next sweep.
        if self._launcher.is_launching(sandbox_id) or self._locks.of(sandbox_id).locked():
            return
        try:
            await self._apply(sandbox_id, await self._driver.inspect(sandbox_id))
        except ControlPlaneError as exc:
            log.warning("reconcile_event_failed", sandbox_id=sandbox_id, error=str(exc))

    async def sweep(self) -> int:
        """One full pass over containers and records; returns how many records it changed."""
        before = self.fixes
        containers = {c.sandbox_id: c for c in await self._driver.list_sandboxes()}
        after: str | None = None
        seen: set[str] = set()
        repaired = 0
        while True:
            ids = await self._store.page_ids(None, after, 500)
            # The /metrics gauge's status sets, repaired where a writer without them left
            # them wrong (store.count_by_status); nothing to do when they are right.
            repaired += await self._store.reindex_status(ids)
            for sandbox_id, record in zip(ids, await self._store.get_many(ids), strict=True):
                seen.add(sandbox_id)
                state = containers.get(sandbox_id)
                if record is not None and (
                    record.status == S.STARTING
                    or record.deleting_at is not None
                    or observed_status(record, state) is not None
                ):
                    await self._apply(sandbox_id, state)
            if len(ids) < 500:
                break
            after = ids[-1]
        repaired += await self._store.reindex_strays()
        if repaired:
            log.warning("sandbox_status_sets_repaired", memberships=repaired)
        # Admission's sum of the reservations, made again from them (store.RESERVATIONS).
        total_before, total = await self._store.recount_reserved()
        if total_before is not None and total_before != total:
            log.warning("memory_reserved_total_repaired", before=total_before, after=total)
        for sandbox_id, state in containers.items():
            if sandbox_id and sandbox_id not in seen:
                await self._apply(sandbox_id, state)
        return self.fixes - before

    async def _apply(self, sandbox_id: str, state: SandboxState | None) -> None:
        """Bring one record in line with `state`, re-reading the record under its lock."""
        if self._launcher.is_launching(sandbox_id):
            return
        lock = self._locks.of(sandbox_id)
        if lock.locked():
            return  # an API operation is acting on it; its own CAS keeps the record right
        async with lock:
            record = await self._store.get(sandbox_id)
            if record is None:
                if state is not None:
                    await self._orphan(sandbox_id, state)
                return
            if record.deleting_at is not None:
                await self._finish_delete(record)
                return
            if record.status == S.STARTING:
                await self._interrupted_start(record)
                return
            if observed_status(record, state) is not None or record.held_until is not None:
                # A sweep lists the runtime before it reads the records, so `state` may be
                # older than `record`: a re-create by another replica in between read as "gone"
                # and turned a RUNNING sandbox MISSING (seen in CI). What is done is judged on
                # the runtime as it is after the record was read.
                state = await self._driver.inspect(sandbox_id)
            if await self._held_still(record, state):
                return
            change = observed_status(record, state)
            if change is None:
                return
            status, reason = change
            ports, host = None, None
            spec = self._catalog.find(record.spec_id)
            if status == S.RUNNING and state is not None and spec is not None:
                ports, host = reached(spec, state)
            event = self._notes.observed(record, status, reason)
            result = await self._store.transition(
                record,
                [record.status],
                status,
                reason=reason or None,
                ports=ports,
                host=host,
                entry=entry_of(event),
            )
            if result.outcome == "ok":
                self._fixed()
                self._notes.done(event)
                log.info(
                    "reconciled",
                    sandbox_id=sandbox_id,
                    was=record.status,
                    now=status,
                    reason=reason,
                )

    async def _held_still(self, record: SandboxRecord, state: SandboxState | None) -> bool:
        """A RUNNING sandbox frozen by a snapshot (its record says until when) is left alone;
        one still frozen past that time was left so by a control plane that died in the
        middle: it is thawed. True when it was either."""
        if (
            record.held_until is None
            or record.status != S.RUNNING
            or state is None
            or state.status != RunState.PAUSED
        ):
            return False
        if record.held_until > time.time():
            return True
        await self._driver.unpause(record.id)
        await self._store.hold(record.id, None)
        self._fixed()
        log.info("snapshot_hold_released", sandbox_id=record.id)
        return True

    async def _claim(self, record: SandboxRecord) -> bool:
        """Take over the pending intent of `record` unless a live replica carries it."""
        leases = self._leases
        if leases is None:
            return True
        if await leases.claim(record.id):
            return True
        self.busy_elsewhere = True
        return False

    async def _finish_delete(self, record: SandboxRecord) -> None:
        if not await self._claim(record):
            return
        try:
            await self._deletes.finish_delete(
                record, reason="delete finished after an interruption", automatic=True
            )
        finally:
            if self._leases is not None:
                await self._leases.release(record.id)
        self._fixed()
        log.info("reconciled", sandbox_id=record.id, was=record.status, now="deleted")

    async def _interrupted_start(self, record: SandboxRecord) -> None:
        if datetime.now(UTC) - record.updated_at < timedelta(seconds=LEASE_TTL):
            # Just recorded, perhaps by another replica that has yet to take its lease.
            self.busy_elsewhere = True
            return
        if await self._claim(record):
            log.info("start_taken_over", sandbox_id=record.id)
            self._fixed()
            self._launcher.take_over(record)

    async def _orphan(self, sandbox_id: str, state: SandboxState) -> None:
        if await self._store.is_tombstoned(sandbox_id):
            # Deleted through the API: whatever is left of it goes too. Leaving it would keep it
            # running, and adopt it back as a live sandbox once the tombstone expires.
            await self._driver.remove(sandbox_id)
            return
        key = state.env.get("OH_SESSION_API_KEYS_0")
        owner = state.owner
        if owner == naming.POOL_OWNER:
            # Its label cannot say whether a user claimed it: adopting it into the pool could
            # hand one user's workspace to another. The volume stays for an operator to look at.
            log.warning("pool_orphan_removed", sandbox_id=sandbox_id, container=state.name)
            await self._driver.remove(sandbox_id, keep_workspace=True)
            return
        spec_id = state.spec_id
        if not key or not owner or not spec_id:
            log.warning("orphan_removed", sandbox_id=sandbox_id, container=state.name)
            await self._driver.remove(sandbox_id, keep_workspace=True)
            return
        status = ADOPTED.get(state.status, S.ERROR)
        spec = self._catalog.find(spec_id)
        ports, host = reached(spec, state) if spec else ({}, None)
        now = datetime.now(UTC)
        record = SandboxRecord(
            id=sandbox_id,
            owner=owner,
            spec_id=spec_id,
            status=status,
            reason="adopted: container found without a record",
            session_api_key=key,
            ports=ports,
            host=host,
            created_at=state.created_at or now,
            updated_at=now,
            last_activity_at=now,
        )
        memory = spec.resources.reservation_bytes if spec else 0
        event = self._notes.adopted(record)
        if await self._store.create(record, memory, Limits(), entry=entry_of(event)) == "ok":
            self._fixed()
            log.info("orphan_adopted", sandbox_id=sandbox_id, status=status)
            self._notes.done(event)
