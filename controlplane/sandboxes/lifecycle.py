"""A sandbox's lifecycle events, as the service, the launcher and the reconciler publish them
(none for an unclaimed warm pool member: nobody owns it yet)."""

from __future__ import annotations

from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus

S = SandboxStatus
OBSERVED = {
    S.RUNNING: LifecycleType.SANDBOX_RUNNING,
    S.PAUSED: LifecycleType.SANDBOX_PAUSED,
    S.ERROR: LifecycleType.SANDBOX_ERROR,
    S.MISSING: LifecycleType.SANDBOX_MISSING,
}


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
        if self.publisher is not None and record.owner != naming.POOL_OWNER:
            await self.publisher.publish(
                LifecycleEvent(
                    type=kind,
                    user_id=record.owner,
                    sandbox_id=record.id,
                    reason=reason,
                    automatic=automatic,
                )
            )

    async def observed(self, record: SandboxRecord, status: SandboxStatus, reason: str) -> None:
        """A change the reconciler saw in the runtime, published as an automatic event."""
        kind = OBSERVED.get(status)
        if kind is not None:
            await self(kind, record, reason or None, automatic=True)

    async def adopted(self, record: SandboxRecord) -> None:
        """A sandbox found in the runtime without a record, adopted by the reconciler."""
        await self(LifecycleType.SANDBOX_CREATED, record, record.reason or None, automatic=True)
