"""Whether one more sandbox may start: the per-user caps and the host's memory capacity (checked
atomically by the store's scripts, with the Limits from here), the live host memory guard, and
the 429 each refusal is answered with."""

from __future__ import annotations

from dataclasses import dataclass, replace

from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.errors import QuotaExceeded
from controlplane.organizations.service import OrganizationService
from controlplane.sandboxes.store import Limits
from controlplane.store import keyspace
from drivers.base import SandboxDriver

MEMBER_CAPS = """
-- A member's caps as Admission.member_limits makes them (the two are kept alike, and tested
-- so: tests/organizations/test_member_limits.py): the member's own (hash `member`), else the
-- organization's (hash `org`), else the deployment's (`running`, `total`; -1: none); 0 set
-- there: no cap (-1). With the organization's warm-pool share of a pool of `size` members,
-- rounded down (-1: no share, or none applies).
local function member_caps(org, member, running, total, size)
  local function cap(field, default)
    local v = redis.call('HGET', member, field)
    if not v or v == '' then v = redis.call('HGET', org, field) end
    if not v or v == '' then return default end
    v = tonumber(v)
    if v == 0 then return -1 end
    return v
  end
  local share_cap = -1
  local share = redis.call('HGET', org, 'warm_pool_share')
  if size >= 0 and share and share ~= '' then
    share_cap = math.floor(tonumber(share) * size + 1e-9)
  end
  return cap('max_running_sandboxes', running), cap('max_sandboxes', total), share_cap
end
"""


@dataclass(frozen=True)
class CapSources:
    """Where a script finds a member's caps itself (MEMBER_CAPS), instead of being handed
    them: one round trip fewer for a warm pool claim."""

    org: str
    """The organization's hash (its limits and warm-pool share)."""
    member: str
    """The member's own limits there."""
    running: int
    """The deployment's per-user cap on running sandboxes; -1: none."""
    total: int
    """The deployment's per-user cap on sandboxes; -1: none."""


class Admission:
    def __init__(
        self,
        config: ServiceConfig,
        driver: SandboxDriver,
        organizations: OrganizationService,
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

    def cap_sources(self, org_id: str | None, user_id: str) -> CapSources:
        """Where `member_limits` reads `user_id`'s caps in `org_id`, for a script (MEMBER_CAPS)
        that reads them itself in the write they bound."""
        org = org_id or self._config.default_organization
        return CapSources(
            keyspace.organization(org),
            keyspace.org_member_limits(org, user_id),
            -1 if self.cap is None else self.cap,
            self._config.max_sandboxes_per_user or -1,
        )

    async def limits_found(self, running: int, total: int) -> Limits:
        """limits() with the caps a script found (MEMBER_CAPS; -1: none)."""
        limits = await self.limits()
        return replace(
            limits, running=None if running < 0 else running, total=None if total < 0 else total
        )

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
