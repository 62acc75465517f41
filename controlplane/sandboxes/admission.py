"""Whether one more sandbox may start: the per-user caps and the host's memory capacity (checked
atomically by the store's scripts, with the Limits from here), the live host memory guard, and
the 429 each refusal is answered with."""

from __future__ import annotations

from dataclasses import replace

from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.errors import QuotaExceeded
from controlplane.organizations.service import OrganizationService
from controlplane.sandboxes.store import Limits
from drivers.base import SandboxDriver


class Admission:
    def __init__(
        self,
        config: ServiceConfig,
        driver: SandboxDriver,
        organizations: OrganizationService | None = None,
    ) -> None:
        self._config = config
        self._driver = driver
        self._memory_capacity = config.host_memory_bytes
        self._organizations = organizations

    @property
    def cap(self) -> int | None:
        """The per-user cap on STARTING and RUNNING sandboxes; None: no cap."""
        return self._config.max_running_per_user or None

    async def limits(self) -> Limits:
        """The per-user caps and the memory capacity (ACS_HOST_MEMORY_BYTES, else learned from
        the runtime once, times ACS_HOST_MEMORY_FRACTION)."""
        if self._memory_capacity is None:
            total = await self._driver.memory_capacity()
            if total:
                self._memory_capacity = int(total * self._config.host_memory_fraction)
        return Limits(
            running=self.cap,
            total=self._config.max_sandboxes_per_user or None,
            memory_capacity=self._memory_capacity,
        )

    async def member_limits(self, org_id: str | None, user_id: str) -> Limits:
        """limits() with the per-user caps of `user_id` in `org_id`: the member's own
        (PUT …/members/{user}), else the organization's for its members (PATCH …/{org}), else
        the deployment's (ACS_MAX_RUNNING_PER_USER, ACS_MAX_SANDBOXES_PER_USER); 0: no limit.
        With the organization's warm-pool share."""
        limits = await self.limits()
        if self._organizations is None:
            return limits
        org, member, share = await self._organizations.limits_for(
            org_id or self._config.default_organization, user_id
        )
        limits = replace(limits, pool_share=share)
        running = _first(member.max_running_sandboxes, org.max_running_sandboxes)
        total = _first(member.max_sandboxes, org.max_sandboxes)
        if running is not None:
            limits = replace(limits, running=running or None)
        if total is not None:
            limits = replace(limits, total=total or None)
        return limits

    def room_for(self, reservation: int) -> bool:
        """False while the runtime itself is short of memory for one more sandbox."""
        return self._driver.has_room(reservation)

    def refused(
        self, principal: Principal, outcome: str = "running", limits: Limits | None = None
    ) -> QuotaExceeded:
        """The error for a refusal by one of the limits: "running", "total" or "memory"."""
        running = limits.running if limits is not None else self.cap
        total = limits.total if limits is not None else self._config.max_sandboxes_per_user
        if outcome == "total":
            return QuotaExceeded(
                f"user {principal.user_id} already has {total} sandboxes (the per-user "
                "total); delete one, then retry",
                retry_after=60,
            )
        if outcome == "memory" and self._driver.pause_releases:
            return QuotaExceeded(
                "the cluster has no room for another sandbox now (the scheduler cannot place "
                "one, or the sandbox nodes' memory is reserved); pause or delete some, then retry",
                retry_after=30,
            )
        if outcome == "memory":
            return QuotaExceeded(
                "the host has no memory left for another sandbox (paused sandboxes keep theirs); "
                "delete or let the reaper retire some, then retry",
                retry_after=60,
            )
        return QuotaExceeded(
            f"user {principal.user_id} already has {running} sandboxes starting or running "
            f"(the per-user limit); pause or delete one, then retry",
            retry_after=30,
        )


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)
