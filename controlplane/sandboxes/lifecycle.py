"""A sandbox's lifecycle events, as the service, the launcher and the reconciler publish them
(none for an unclaimed warm pool member: nobody owns it yet), and the audit entry of the request
that made the change, stored by the same write."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.store import audit
from controlplane.store.audit import AuditAction
from controlplane.store.streams import LATE_ID, StreamEntry, join

S = SandboxStatus
OBSERVED = {
    S.RUNNING: LifecycleType.SANDBOX_RUNNING,
    S.PAUSED: LifecycleType.SANDBOX_PAUSED,
    S.ERROR: LifecycleType.SANDBOX_ERROR,
    S.MISSING: LifecycleType.SANDBOX_MISSING,
}


@dataclass(frozen=True)
class Pending:
    """An event (and the request's audit entry) for a compare-and-set to store (`entry`), then
    logged (SandboxLifecycle.done)."""

    event: LifecycleEvent | None
    entry: StreamEntry


def entry_of(pending: Pending | None) -> StreamEntry | None:
    """What a store write takes as `entry=` for `pending` (None: no event to store)."""
    return pending.entry if pending is not None else None


class SandboxLifecycle:
    def __init__(self, publisher: LifecyclePublisher | None = None) -> None:
        self.publisher = publisher

    async def __call__(
        self,
        kind: LifecycleType,
        record: SandboxRecord,
        reason: str | None = None,
        *,
        automatic: bool = False,
    ) -> None:
        await self.several((kind,), record, reason, automatic=automatic)

    async def several(
        self,
        kinds: tuple[LifecycleType, ...],
        record: SandboxRecord,
        reason: str | None = None,
        *,
        automatic: bool = False,
    ) -> None:
        """The events of `kinds`, in order, in one round trip (a claim's created and running)."""
        events = [self._event(kind, record, reason, automatic) for kind in kinds]
        published = [event for event in events if event is not None]
        if self.publisher is not None and published:
            await self.publisher.publish(*published)

    def pending(
        self,
        kind: LifecycleType,
        record: SandboxRecord,
        reason: str | None = None,
        *,
        automatic: bool = False,
        action: AuditAction | None = None,
    ) -> Pending | None:
        """The event of a change, for the transition that makes it to store (`entry=`):
        the two are stored together or not at all; with `action`, the request's audit entry
        too. None when there is nothing to store."""
        event = self._event(kind, record, reason, automatic)
        if self.publisher is None:
            event = None
        return self.with_audit(event, record, action)

    def with_audit(
        self, event: LifecycleEvent | None, record: SandboxRecord, action: AuditAction | None
    ) -> Pending | None:
        """`event` (if any) and the request's `action` on `record` (if in a request), as one
        entry."""
        made = None
        if action is not None:
            made = audit.entry(action, org=record.org_id, sandbox_id=record.id)
        published = self.publisher.entry(event) if self.publisher and event else None
        entry = join(published, made)
        return Pending(event, entry) if entry is not None else None

    def claimed(self, owner: str) -> Pending | None:
        """A warm pool claim's events for `owner` (created, then running), for the claim's
        script to store with the claim (`entry`), naming the member it picks (their sandbox id
        is streams.LATE_ID until then); logged by `done_claimed`."""
        if self.publisher is None or owner == naming.POOL_OWNER:
            return None
        events = [
            LifecycleEvent(type=kind, user_id=owner, sandbox_id=LATE_ID)
            for kind in (LifecycleType.SANDBOX_CREATED, LifecycleType.SANDBOX_RUNNING)
        ]
        entry = join(*(self.publisher.entry(event) for event in events))
        return Pending(None, entry) if entry is not None else None

    def done_claimed(self, sandbox_id: str, owner: str) -> None:
        """After a claim stored `claimed`'s events: their log lines, naming the member."""
        if self.publisher is None:
            return
        for kind in (LifecycleType.SANDBOX_CREATED, LifecycleType.SANDBOX_RUNNING):
            self.publisher.logged(LifecycleEvent(type=kind, user_id=owner, sandbox_id=sandbox_id))

    def done(self, pending: Pending | None) -> None:
        """After the transition stored `pending`: its log line."""
        if self.publisher is not None and pending is not None and pending.event is not None:
            self.publisher.logged(pending.event)

    @staticmethod
    def _event(
        kind: LifecycleType, record: SandboxRecord, reason: str | None, automatic: bool
    ) -> LifecycleEvent | None:
        if record.owner == naming.POOL_OWNER:
            return None
        return LifecycleEvent(
            type=kind,
            user_id=record.owner,
            sandbox_id=record.id,
            reason=reason,
            automatic=automatic,
        )

    def observed(self, record: SandboxRecord, status: SandboxStatus, reason: str) -> Pending | None:
        """The automatic event of a change the reconciler saw in the runtime, for the
        transition that records the change to store (`entry=`)."""
        kind = OBSERVED.get(status)
        return self.pending(kind, record, reason or None, automatic=True) if kind else None

    def adopted(self, record: SandboxRecord) -> Pending | None:
        """The event of a sandbox found in the runtime without a record, adopted by the
        reconciler, for the create that records it to store (`entry=`)."""
        return self.pending(
            LifecycleType.SANDBOX_CREATED, record, record.reason or None, automatic=True
        )
