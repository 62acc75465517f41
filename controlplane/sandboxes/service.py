"""The sandbox manager: start, pause, resume and delete sandboxes, per user (reads.py reads).

Redis records intent and ownership; the driver decides liveness. Every status change is a
compare-and-set in the store, so two replicas (or a replica and the reconciler) cannot both win.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import structlog

from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    RuntimeUnavailable,
    StoreUnavailable,
)
from controlplane.lifecycle.models import LifecycleType
from controlplane.organizations.roles import Action, may
from controlplane.sandboxes import links, naming
from controlplane.sandboxes.admission import Admission
from controlplane.sandboxes.launcher import Launcher
from controlplane.sandboxes.leases import IntentLeases
from controlplane.sandboxes.lifecycle import SandboxLifecycle, entry_of
from controlplane.sandboxes.locks import SandboxLocks
from controlplane.sandboxes.models import (
    Claimed,
    SandboxInfo,
    SandboxRecord,
    SandboxStatus,
)
from controlplane.sandboxes.readiness import ReadinessProbe
from controlplane.sandboxes.reads import SandboxReads
from controlplane.sandboxes.restores import Restores
from controlplane.sandboxes.start_gate import Ticket
from controlplane.sandboxes.status_feed import StatusFeed
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import SandboxSpec
from controlplane.store.audit import AuditAction
from controlplane.store.streams import StreamEntry
from drivers.base import SandboxDriver
from drivers.errors import DriverError

log = structlog.get_logger(__name__)
S = SandboxStatus


class PoolClaims(Protocol):
    async def claim(
        self,
        principal: Principal,
        spec: SandboxSpec,
        image_id: str,
        events: StreamEntry | None = None,
    ) -> tuple[Claimed | None, Limits | None]:
        """A warm pool member of `spec`, now the principal's and RUNNING (None when the pool
        has none: then the caller starts one cold), and the principal's limits as the claim
        read them (None: no claim was tried). `events`: the user's lifecycle events for the
        claim to store with it (Claimed.events_stored). Raises QuotaExceeded at the user's
        caps."""


class AddressCache(Protocol):
    """Where a caller keeps the addresses `SandboxService.port_base` looked up (the sandbox
    proxy's state: controlplane/proxy/state.py), each for one generation of a sandbox."""

    def address(self, record: SandboxRecord) -> str | None:
        """The address kept for this very generation of the sandbox, if fresh ("": none)."""

    def version(self, sandbox_id: str) -> tuple[int, int]:
        """Taken before a lookup: `remember` keeps it only if nothing changed since."""

    def remember(self, record: SandboxRecord, address: str, seen: tuple[int, int]) -> None:
        """Keep what a lookup begun at `seen` found."""


class SandboxService(SandboxReads):
    """Every part it works with is made by the wiring (controlplane/wiring.py) and handed in."""

    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        *,
        launcher: Launcher,
        locks: SandboxLocks,
        admission: Admission,
        probe: ReadinessProbe,
        feed: StatusFeed,
        notes: SandboxLifecycle,
        leases: IntentLeases | None = None,
        pool: PoolClaims | None = None,
        restores: Restores | None = None,
    ) -> None:
        super().__init__(config, store, catalog, feed)
        self.driver = driver
        self.probe = probe
        self.leases = leases
        self.notes = notes
        self.launcher = launcher
        self.locks = locks
        self.admission = admission
        self.pool = pool
        self.restores = restores

    async def agent_listening(self, sandbox_id: str) -> None:
        """The sandbox's agent server announced that it listens (its webhook, whose key the
        middleware checked): its start, waited for here or on another replica, probes it now."""
        log.info("sandbox_agent_listening", sandbox_id=sandbox_id)
        self.probe.hint(sandbox_id)
        await self.feed.relay_listening(sandbox_id)

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises operations on one sandbox within this process."""
        return self.locks.of(sandbox_id)

    def is_launching(self, sandbox_id: str) -> bool:
        return self.launcher.is_launching(sandbox_id)

    async def limits(self) -> Limits:
        """The per-user caps and the host memory capacity (learned from the engine once)."""
        return await self.admission.limits()

    async def ensure_running(self, principal: Principal, sandbox_id: str) -> SandboxRecord:
        """Resume the sandbox if needed and wait until its agent server is up."""
        record = await self.owned(principal, sandbox_id)
        if record.status != S.RUNNING:
            await self.resume(principal, sandbox_id)
        else:
            await self.store.touch(sandbox_id)
        # A start waiting for its turn (launcher.gate) has its whole time-out still ahead.
        wait = self.config.start_timeout + 10 + self.launcher.gate.expected_wait()
        return await self.wait_running(sandbox_id, wait)

    async def runtime_available(self) -> bool:
        return await self.driver.ping()

    async def port_base(self, record: SandboxRecord, name: str, cache: AddressCache) -> str:
        """Where this process reaches the sandbox's exposed port `name`: at the address the
        driver gives for it (`direct_address`; Docker with a local engine: the container's own
        on its network, one copy less than through the engine's published port and its
        userland proxy), kept in `cache` for one generation of the record (a re-create, a
        resume or a failover looks it up again); otherwise at the endpoint the driver reported
        (`SandboxRecord.host`)."""
        published = links.direct_url(self.config, record, name)
        spec = self.catalog.find(record.spec_id)
        if spec is None or name not in spec.exposed_ports:
            return published
        address = cache.address(record)
        if address is None:
            seen = cache.version(record.id)
            address = await self.driver.direct_address(record.id) or ""
            cache.remember(record, address, seen)
        return f"http://{address}:{spec.exposed_ports[name]}" if address else published

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(
        self, principal: Principal, spec_id: str | None, snapshot_id: str | None = None
    ) -> SandboxInfo:
        """Record a STARTING sandbox and launch its container in the background; with
        `snapshot_id`, one made from that snapshot of the caller's (its spec's).

        Raises SpecNotFound or QuotaExceeded, or RuntimeUnavailable when the engine does not
        answer; SnapshotNotFound, StoreUnavailable or InvalidInput (another spec named) for a
        snapshot; in each case nothing is created. A missing image is reported by the launch
        (ERROR).
        """
        may_start(principal)
        if snapshot_id is not None:
            return (await self.start_from(principal, snapshot_id, 1, spec_id=spec_id))[0]
        spec = self.catalog.get(spec_id)
        image_id = await self.driver.image_id(spec.image)
        limits = None
        if self.pool is not None and image_id is not None:
            # The user's sandbox begins here: its events, as for a cold start, stored by the
            # claim's own script (one round trip, which reads the caller's limits too) unless
            # the member has to be unpaused first.
            events = self.notes.claimed(principal.user_id)
            claimed, limits = await self.pool.claim(principal, spec, image_id, entry_of(events))
            if claimed is not None:
                record = claimed.record
                if claimed.events_stored:
                    self.notes.done_claimed(record.id, record.owner)
                else:
                    await self.notes.several(
                        (LifecycleType.SANDBOX_CREATED, LifecycleType.SANDBOX_RUNNING), record
                    )
                return self.view(record, principal)
        if limits is None:
            limits = await self.admission.member_limits(principal.org_id, principal.user_id)
        record = SandboxRecord.starting(
            naming.new_sandbox_id(), principal.user_id, spec.id, principal.org_id
        )
        if not self.admission.room_for(spec.resources.reservation_bytes):
            raise self.admission.refused(principal, "memory")
        # A cold start: its place among the boots here, or 503 before anything is made.
        with self.launcher.gate.admitted() as (ticket,):
            event = self.notes.pending(
                LifecycleType.SANDBOX_CREATED, record, action=AuditAction.SANDBOX_CREATE
            )
            outcome = await self.store.create(
                record, spec.resources.reservation_bytes, limits, entry=entry_of(event)
            )
            if outcome != "ok":
                raise self.admission.refused(principal, outcome, limits)
        self.notes.done(event)
        self.launcher.launch(record, ticket)
        return self.view(record, principal)

    async def start_from(
        self,
        principal: Principal,
        snapshot_id: str,
        count: int,
        *,
        spec_id: str | None = None,
        carried: str | None = None,
        ids: Sequence[str] = (),
        unlisted: bool = False,
    ) -> list[SandboxInfo]:
        """`count` new sandboxes made from a snapshot of the caller's, each with its own id,
        session key and records; all or none (a cap that refuses one refuses them all).
        `carried`: a conversation's fork (SandboxRecord.carried); `ids`: their ids, chosen
        ahead (a fork's: its base was made with their directories), else new ones.
        `unlisted`: the snapshot is still being sealed into the store by the caller (a fork,
        whose sandboxes start on the runtime's local copy of it meanwhile), of a sandbox of
        `spec_id`; not looked up, and the caller `withdraw`s them unless it is listed. Raises
        as `start`."""
        if ids and len(ids) != count:
            raise ValueError("one id per sandbox")
        may_start(principal)
        spec = self.catalog.get(await self._spec_of(principal, snapshot_id, spec_id, unlisted))
        if await self.driver.image_id(spec.image) is None:
            raise RuntimeUnavailable(f"image {spec.image} is not on the runtime; run `make images`")
        reservation = spec.resources.reservation_bytes
        limits = await self.admission.member_limits(principal.org_id, principal.user_id)
        records: list[SandboxRecord] = []
        tickets = self.launcher.gate.admit(count)  # all or none, before anything is made
        try:
            for n in range(count):
                if not self.admission.room_for(reservation):
                    raise self.admission.refused(principal, "memory")
                record = SandboxRecord.starting(
                    ids[n] if ids else naming.new_sandbox_id(),
                    principal.user_id,
                    spec.id,
                    principal.org_id,
                    origin=snapshot_id,
                    carried=carried,
                )
                event = self.notes.pending(LifecycleType.SANDBOX_CREATED, record)
                outcome = await self.store.create(
                    record, reservation, limits, entry=entry_of(event)
                )
                if outcome != "ok":
                    raise self.admission.refused(principal, outcome)
                self.notes.done(event)
                records.append(record)
        except BaseException:
            for ticket in tickets:
                ticket.release()
            for record in records:  # none launched yet: the records are all there is
                await self.store.delete(record)
            raise
        for record, ticket in zip(records, tickets, strict=True):
            self.launcher.launch(record, ticket)
        return [self.view(record, principal) for record in records]

    async def _spec_of(
        self, principal: Principal, snapshot_id: str, spec_id: str | None, unlisted: bool
    ) -> str:
        """The spec of the sandboxes made from a snapshot (start_from's)."""
        if self.restores is None:
            raise StoreUnavailable("snapshots are not enabled: ACS_SNAPSHOT_STORE_URL is unset")
        if unlisted:
            if spec_id is None:
                raise ValueError("an unlisted snapshot's sandboxes name its spec")
            return spec_id
        own_spec = await self.restores.spec_of(principal, snapshot_id)
        if spec_id is not None and spec_id != own_spec:
            raise InvalidInput(
                f"snapshot {snapshot_id} was taken of a {own_spec!r} sandbox; a sandbox made "
                "from it runs that spec",
                ["body", "sandbox_spec_id"],
            )
        return own_spec

    async def rewind(self, principal: Principal, sandbox_id: str, snapshot_id: str) -> None:
        """Bring the caller's sandbox back to a snapshot taken of it, files and the agent's
        state (a conversation's rewind): its instance and workspace are replaced by ones made
        from the snapshot, in the background; it keeps its id, session key and records, and
        is STARTING until its agent answers. From RUNNING, PAUSED or ERROR. Raises
        SandboxNotFound, Conflict, QuotaExceeded, StoreUnavailable (snapshots off)."""
        if self.restores is None:
            raise StoreUnavailable("snapshots are not enabled: ACS_SNAPSHOT_STORE_URL is unset")
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id, Action.SANDBOX_OPERATE)
            if record.deleting_at is not None or record.status not in (
                S.RUNNING,
                S.PAUSED,
                S.ERROR,
            ):
                raise Conflict(
                    f"cannot rewind sandbox {sandbox_id}: it is "
                    f"{'being deleted' if record.deleting_at else record.status.value}"
                )
            limits = await self.admission.member_limits(record.org_id, record.owner)
            froze = record.status == S.RUNNING and not self.driver.pause_releases
            if froze:
                # Frozen at once: its agent posts nothing more while the rewind is recorded.
                await self.driver.pause(record.id)
            reason = f"rewound to snapshot {snapshot_id}"
            event = self.notes.pending(LifecycleType.SANDBOX_RESUMED, record, reason)
            ticket: Ticket | None = None
            try:
                (ticket,) = self.launcher.gate.admit()
                result = await self.store.transition(
                    record,
                    [S.RUNNING, S.PAUSED, S.ERROR],  # the reconciler may have seen the freeze
                    S.STARTING,
                    limits=limits,
                    reason=reason,
                    touch=True,
                    origin=snapshot_id,
                    entry=entry_of(event),
                )
                self._check_resume(result.outcome, result.previous, principal, sandbox_id)
            except BaseException:
                if ticket is not None:
                    ticket.release()
                if froze:
                    await self.driver.unpause(record.id)
                raise
            self.notes.done(event)
            log.info("sandbox_rewinding", sandbox_id=sandbox_id, snapshot_id=snapshot_id)
            self.launcher.replace(record.model_copy(update={"origin": snapshot_id}), ticket)

    async def pause(self, principal: Principal, sandbox_id: str) -> None:
        """Freeze a RUNNING sandbox; pausing a PAUSED one succeeds. Raises Conflict otherwise."""
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id, Action.SANDBOX_OPERATE)
            await self._pause(record, action=AuditAction.SANDBOX_PAUSE)

    async def pause_idle(self, sandbox_id: str, reason: str) -> bool:
        """The reaper's pause: only a sandbox still RUNNING, and not one being operated on."""
        lock = self.lock(sandbox_id)
        if lock.locked():
            return False
        async with lock:
            record = await self.store.get(sandbox_id)
            if record is None or record.status != S.RUNNING:
                return False
            await self._pause(record, reason=reason, automatic=True)
            if self.config.idle_action == "hibernate":
                await self._hibernate(record, f"{reason}; hibernated (ACS_IDLE_ACTION)")
            return True

    async def hibernate_idle(self, sandbox_id: str, reason: str) -> bool:
        """The reaper's hibernation of a sandbox paused for long: it gives its memory back
        (Docker: the container stops) and stays PAUSED; the same resume brings it back."""
        lock = self.lock(sandbox_id)
        if lock.locked():
            return False
        async with lock:
            record = await self.store.get(sandbox_id)
            if record is None or record.status != S.PAUSED or record.hibernated_at is not None:
                return False
            return await self._hibernate(record, reason)

    async def _hibernate(self, record: SandboxRecord, reason: str) -> bool:
        await self.driver.hibernate(record.id)
        if not await self.store.hibernated(record.id, reason):
            return False  # moved on meanwhile (resumed, deleted): the runtime follows it
        await self.notes(LifecycleType.SANDBOX_PAUSED, record, reason, automatic=True)
        log.info("sandbox_hibernated", sandbox_id=record.id, reason=reason)
        return True

    async def _pause(
        self,
        record: SandboxRecord,
        *,
        reason: str | None = None,
        automatic: bool = False,
        action: AuditAction | None = None,
    ) -> None:
        if record.status == S.PAUSED:
            return
        if record.status != S.RUNNING:
            raise Conflict(f"cannot pause sandbox {record.id}: it is {record.status.value}")
        await self.driver.pause(record.id)
        event = self.notes.pending(
            LifecycleType.SANDBOX_PAUSED, record, reason, automatic=automatic, action=action
        )
        # An automatic pause keeps last_activity_at, so the idle time stays visible. The event
        # is stored by the compare-and-set itself: one Redis round trip, and no PAUSED without
        # its event (nor an event without the change).
        result = await self.store.transition(
            record,
            [S.RUNNING],
            S.PAUSED,
            reason=reason,
            touch=not automatic,
            entry=entry_of(event),
        )
        if result.outcome != "ok" and result.previous != S.PAUSED:
            raise Conflict(f"sandbox {record.id} changed while pausing ({result.previous})")
        if result.outcome == "ok":
            self.notes.done(event)

    async def resume(self, principal: Principal, sandbox_id: str) -> None:
        """Unpause; otherwise (a stopped, vanished or dead container, or ERROR) record STARTING
        and bring it back up on its kept workspace in the background.

        RUNNING and STARTING succeed as no-ops. Raises QuotaExceeded, or Conflict while a
        delete of it is under way.
        """
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id, Action.SANDBOX_OPERATE)
            if record.deleting_at is not None:
                raise Conflict(f"cannot resume sandbox {sandbox_id}: it is being deleted")
            if record.status in (S.RUNNING, S.STARTING):
                await self.store.touch(record.id)
                return
            # The caps of the sandbox's owner in its organization (an admin may resume it).
            limits = await self.admission.member_limits(record.org_id, record.owner)
            # A runtime whose pause released the instance, or a hibernated sandbox, has nothing
            # to unpause: start it.
            thaw = (
                record.status == S.PAUSED
                and not self.driver.pause_releases
                and record.hibernated_at is None
            )
            if thaw and await self._unpause(record, limits, principal):
                await self.notes(LifecycleType.SANDBOX_RESUMED, record)
                return
            # The event is stored with the change (one script): none without the other.
            event = self.notes.pending(
                LifecycleType.SANDBOX_RESUMED, record, action=AuditAction.SANDBOX_RESUME
            )
            with self.launcher.gate.admitted() as (ticket,):  # it boots: a place, or 503 now
                result = await self.store.transition(
                    record,
                    [record.status],
                    S.STARTING,
                    limits=limits,
                    touch=True,
                    entry=entry_of(event),
                )
                self._check_resume(result.outcome, result.previous, principal, sandbox_id)
            self.notes.done(event)
            self.launcher.resume(record, ticket)

    def _check_resume(
        self, outcome: str, previous: S | None, principal: Principal, sandbox_id: str
    ) -> None:
        if outcome == "quota":
            raise self.admission.refused(principal)
        if outcome == "memory":
            raise self.admission.refused(principal, "memory")
        if outcome != "ok":
            raise Conflict(f"sandbox {sandbox_id} changed while resuming ({previous})")

    async def _unpause(self, record: SandboxRecord, limits: Limits, principal: Principal) -> bool:
        """The common resume: one cap-checked PAUSED → RUNNING, then the driver's unpause.

        False (with the record back to PAUSED) when the sandbox is not simply paused, e.g.
        stopped by a host reboot; the caller then inspects and restarts or re-creates it.
        """
        # The resume's audit entry with the change that makes it (its event follows the unpause).
        made = self.notes.with_audit(None, record, AuditAction.SANDBOX_RESUME)
        result = await self.store.transition(
            record,
            [S.PAUSED],
            S.RUNNING,
            limits=limits,
            reason=None,
            touch=True,
            entry=entry_of(made),
        )
        self._check_resume(result.outcome, result.previous, principal, record.id)
        try:
            await self.driver.unpause(record.id)
        except DriverError:
            await self.store.transition(record, [S.RUNNING], S.PAUSED, reason=record.reason)
            return False
        return True

    async def delete(self, principal: Principal, sandbox_id: str) -> None:
        """Remove the container, its workspace volume and the record. Raises SandboxNotFound."""
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id, Action.SANDBOX_OPERATE)
            await self._delete(record, action=AuditAction.SANDBOX_DELETE)
        self.locks.forget(sandbox_id)

    async def retire(self, sandbox_id: str, reason: str) -> bool:
        """The reaper's delete (retention of paused sandboxes): only a sandbox still PAUSED."""
        lock = self.lock(sandbox_id)
        if lock.locked():
            return False
        async with lock:
            record = await self.store.get(sandbox_id)
            if record is None or record.status != S.PAUSED:
                return False
            await self._delete(record, reason=reason, automatic=True)
        self.locks.forget(sandbox_id)
        return True

    async def withdraw(self, sandbox_ids: Sequence[str], reason: str) -> None:
        """Delete these sandboxes whatever their state, their launches stopped first (a fork's,
        whose snapshot was not listed after all: SnapshotService.fork); those gone already
        are skipped."""

        async def one(sandbox_id: str) -> None:
            async with self.lock(sandbox_id):
                record = await self.store.get(sandbox_id)
                if record is not None:
                    await self._delete(record, reason=reason, automatic=True)
            self.locks.forget(sandbox_id)

        results = await asyncio.gather(*(one(i) for i in sandbox_ids), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    async def _delete(
        self,
        record: SandboxRecord,
        *,
        reason: str | None = None,
        automatic: bool = False,
        action: AuditAction | None = None,
    ) -> None:
        # The intent first: if this process dies below, the reconciler finishes the delete. The
        # request's audit entry goes with it: the delete is decided there.
        made = self.notes.with_audit(None, record, action)
        if not await self.store.mark_deleting(record.id, entry=entry_of(made)):
            return  # already gone
        if self.leases is not None:
            self.leases.hold(record.id)
        try:
            await self.launcher.cancel(record.id)
            await self.finish_delete(record, reason=reason, automatic=automatic)
        finally:
            if self.leases is not None:
                await self.leases.release(record.id)

    async def finish_delete(
        self, record: SandboxRecord, *, reason: str | None = None, automatic: bool = False
    ) -> None:
        """Remove the container, its workspace volume and the record; each step is idempotent,
        so a delete cut off anywhere is finished by running this again."""
        await self.driver.remove(record.id)
        event = self.notes.pending(
            LifecycleType.SANDBOX_DELETED, record, reason, automatic=automatic
        )
        await self.store.delete(record, entry=entry_of(event))
        self.notes.done(event)


def may_start(principal: Principal) -> None:
    """A sandbox is started (new or from a snapshot) by a member of an organization whose role
    may; raises Forbidden otherwise."""
    if principal.org_id is None:
        raise Forbidden(f"{principal.user_id} belongs to no organization: ask an admin")
    if not may(principal, Action.SANDBOX_CREATE):
        raise Forbidden(f"an {principal.org_role} only reads: it starts no sandbox")
