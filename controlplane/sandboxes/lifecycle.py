"""A sandbox's lifecycle events, as the service, the launcher and the reconciler publish them
(none for an unclaimed warm pool member: nobody owns it yet)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.store.streams import StreamEntry

S = SandboxStatus
OBSERVED = {
    S.RUNNING: LifecycleType.SANDBOX_RUNNING,
    S.PAUSED: LifecycleType.SANDBOX_PAUSED,
    S.ERROR: LifecycleType.SANDBOX_ERROR,
    S.MISSING: LifecycleType.SANDBOX_MISSING,
}


@dataclass(frozen=True)
class Pending:
    """An event for a compare-and-set to store (`entry`), then logged (SandboxLifecycle.done)."""

    event: LifecycleEvent
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
        event = self._event(kind, record, reason, automatic)
        if self.publisher is not None and event is not None:
            await self.publisher.publish(event)

    def pending(
        self,
        kind: LifecycleType,
        record: SandboxRecord,
        reason: str | None = None,
        *,
        automatic: bool = False,
    ) -> Pending | None:
        """The event of a change, for the transition that makes it to store (`entry=`):
        the two are stored together or not at all. None when there is nothing to publish."""
        event = self._event(kind, record, reason, automatic)
        if self.publisher is None or event is None:
            return None
        return Pending(event, self.publisher.entry(event))

    def done(self, pending: Pending | None) -> None:
        """After the transition stored `pending`: its log line."""
        if self.publisher is not None and pending is not None:
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
