"""The warm pool: sandboxes booted ahead of demand, owned by nobody until a create claims one.

Claims run on every replica (pool_store's Lua makes each member go to exactly one user). The
refiller runs on one replica at a time (a Redis leader lock, as the idle reaper): every
ACS_POOL_INTERVAL seconds, and soon after a claim on its own replica, it drops members that are
stale (their spec's content or image changed), broken or surplus, pauses members of specs that
keep them paused, marks booted ones ready, and launches new ones within the host's capacity.
While claims come it holds its passes and launches until they pause for ACS_POOL_REFILL_DELAY
seconds (every replica's claims: a key with that TTL that each claim sets): a burst of claims is
served first, its first commands included, and the replacements boot after it, on the cores the
burst no longer needs (issue 30).
Nothing user-specific is in a member: its session key is random and is first shown to the user
who claims it; its idle deadline starts at the claim; a claimed member never returns to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from datetime import UTC, datetime, timedelta

import structlog

from controlplane.agent_protocol.kinds import warm_up
from controlplane.auth.models import Principal
from controlplane.background import stop_task
from controlplane.config import ServiceConfig
from controlplane.errors import RuntimeUnavailable
from controlplane.sandboxes import naming
from controlplane.sandboxes.admission import Admission
from controlplane.sandboxes.launcher import Launcher
from controlplane.sandboxes.locks import SandboxLocks
from controlplane.sandboxes.models import Claimed, SandboxRecord, SandboxStatus
from controlplane.sandboxes.pool_models import PoolMember, PoolOfSpec, PoolView
from controlplane.sandboxes.pool_store import PoolStore
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import SandboxSpec
from controlplane.store import audit
from controlplane.store.audit import AuditAction
from controlplane.store.leader import LeaderLock
from controlplane.store.streams import LATE_ID, StreamEntry
from drivers.base import RunState, SandboxDriver, SandboxState
from drivers.errors import DriverError

log = structlog.get_logger(__name__)
S = SandboxStatus


def fingerprint(spec: SandboxSpec, image_id: str) -> str:
    """Changes when the spec's content or its image (a rebuild) changes: members booted from
    another fingerprint are stale."""
    digest = hashlib.sha256(spec.model_dump_json().encode() + b"\0" + image_id.encode())
    return digest.hexdigest()[:24]


class WarmPool:
    def __init__(
        self,
        config: ServiceConfig,
        store: PoolStore,
        sandboxes: SandboxStore,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        *,
        launcher: Launcher,
        locks: SandboxLocks,
        admission: Admission,
        leader: LeaderLock,
    ) -> None:
        self._config = config
        self.store = store
        self._sandboxes = sandboxes
        self._driver = driver
        self.catalog = catalog
        self._launcher = launcher
        self._locks = locks
        self._admission = admission
        self._leader = leader
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._warmed: set[str] = set()
        self._fingerprints: dict[str, tuple[SandboxSpec, str, str]] = {}

    def size(self, spec: SandboxSpec) -> int:
        return self._config.pool_size(spec.id, spec.warm_pool)

    @property
    def enabled(self) -> bool:
        return any(self.size(spec) > 0 for spec in self.catalog.all())

    async def current(self, spec: SandboxSpec) -> str | None:
        """The fingerprint members of `spec` are booted with now; None while its image is
        not on the host."""
        image_id = await self._driver.image_id(spec.image)
        return self._fingerprint(spec, image_id) if image_id else None

    async def view(self) -> PoolView:
        """Per spec: the target size, how members wait, claims and misses, and each member
        (claimable now or not, stale or not)."""
        members = await self.store.members()
        stats = await self.store.stats()
        out: list[PoolOfSpec] = []
        for spec in self.catalog.all():
            mine = [(r, fp) for r, fp in members if r.spec_id == spec.id]
            current = await self.current(spec)
            ready = await self.store.ready_ids(spec.id)
            out.append(
                PoolOfSpec(
                    spec_id=spec.id,
                    size=self.size(spec),
                    state=spec.warm_pool_state,
                    claims=stats.get(f"claims:{spec.id}", 0),
                    misses=stats.get(f"misses:{spec.id}", 0),
                    members=[
                        PoolMember(
                            id=r.id,
                            status=r.status,
                            ready=r.id in ready,
                            stale=fp != current,
                            created_at=r.created_at,
                            reason=r.reason,
                        )
                        for r, fp in mine
                    ],
                )
            )
        return PoolView(specs=out)

    # -- claims (any replica) -------------------------------------------------------------

    async def claim(
        self,
        principal: Principal,
        spec: SandboxSpec,
        image_id: str,
        events: StreamEntry | None = None,
    ) -> tuple[Claimed | None, Limits | None]:
        """A ready member of `spec` for the caller (None when there is none to claim, or the
        organization's share is used: the create starts cold), and the caller's limits as the
        claim's script read them (None: no claim was tried, this spec has no pool). `events`
        (the user's lifecycle events, their sandbox id LATE_ID) go with the claim where the
        member was running (Claimed.events_stored). Raises QuotaExceeded."""
        if self.size(spec) <= 0:
            return None, None
        # The create's audit entry goes with the claim, which picks the sandbox (LATE_ID).
        made = audit.entry(AuditAction.SANDBOX_CREATE, org=principal.org_id, sandbox_id=LATE_ID)
        claim = await self.store.claim(
            spec.id,
            self._fingerprint(spec, image_id),
            principal.user_id,
            self._admission.cap_sources(principal.org_id, principal.user_id),
            org_id=principal.org_id,
            # The organization's share, rounded down (a share of a pool of 3 that is under a
            # third of it claims none), applies where the caller acts in one.
            pool_size=self.size(spec) if principal.org_id else None,
            share_window=self._config.pool_share_window,
            hold=self._config.pool_refill_delay,
            entry=made,
            events=events,
        )
        self._wake.set()
        limits = await self._admission.limits_found(claim.running_cap, claim.total_cap)
        if claim.outcome in ("running", "total"):
            raise self._admission.refused(principal, claim.outcome, limits)
        if claim.sandbox_id is None:
            if claim.outcome == "share":
                log.info("pool_share_used", org_id=principal.org_id, spec_id=spec.id)
            return None, limits  # empty, or the organization's share used: starts cold
        record = claim.record
        if record is None:
            return None, limits
        if claim.was_paused:
            unpaused = await self._unpause(record)
            claimed = Claimed(unpaused, events_stored=False) if unpaused is not None else None
            return claimed, limits
        log.info("pool_claimed", sandbox_id=record.id, user_id=record.owner, spec_id=spec.id)
        return Claimed(record, events_stored=claim.events_stored), limits

    def _fingerprint(self, spec: SandboxSpec, image_id: str) -> str:
        """fingerprint(), kept per spec and image (a claim's and each pass's: a spec's JSON and
        its hash are ~0.1 ms each time)."""
        known = self._fingerprints.get(spec.id)
        if known is None or known[0] is not spec or known[1] != image_id:
            known = (spec, image_id, fingerprint(spec, image_id))
            self._fingerprints[spec.id] = known
        return known[2]

    async def _unpause(self, record: SandboxRecord) -> SandboxRecord | None:
        """A claimed paused member is unpaused before the user sees it; one that cannot be is
        removed, and the create goes on cold."""
        try:
            await self._driver.unpause(record.id)
        except DriverError as exc:
            log.warning("pool_unpause_failed", sandbox_id=record.id, error=str(exc))
            await self._driver.remove(record.id)
            await self._sandboxes.delete(record)
            return None
        await self._sandboxes.transition(record, [S.STARTING], S.RUNNING, touch=True)
        return await self._sandboxes.get(record.id)

    # -- the refiller (one replica) -------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="pool-refiller")

    async def stop(self) -> None:
        # 3.11's wait_for can swallow a cancellation that races the event it waits for: the
        # flag ends the loop then (controlplane/background.py).
        self._stopping = True
        self._wake.set()
        await stop_task(self._task)
        self._task = None
        try:
            await self._leader.release()
        except Exception as exc:
            log.info("pool_release_failed", error=str(exc))

    async def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                quiet = await self._after_claims()
                if await self._leader.hold():
                    await self.refill(hold_launches=quiet)
            except RuntimeUnavailable as exc:
                log.warning("pool_refill_skipped", error=str(exc))
            except Exception:
                log.exception("pool_refill_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.pool_interval)

    async def _after_claims(self) -> bool:
        """Wait until no replica has claimed a member for ACS_POOL_REFILL_DELAY seconds, for at
        most ten times that; False when that bound ended the wait. A pass during a burst of
        claims would boot their replacements (agent servers: CPU-bound) and list the engine's
        containers on the cores the claimed sandboxes' first commands need; held, it boots them
        once the burst is served, and a steady stream of claims still gets its refills (then
        every ten delays). The leader lock is kept meanwhile."""
        delay = self._config.pool_refill_delay
        held_until = time.monotonic() + 10 * delay
        while not self._stopping:
            left = await self.store.claims_hold()
            if left <= 0:
                return True
            if time.monotonic() >= held_until:
                return False
            await asyncio.sleep(min(left, held_until - time.monotonic(), 1.0))
            await self._leader.hold()
        return True

    async def refill(self, *, hold_launches: bool = False) -> int:
        """One pass over every spec; returns how many members it launched. `hold_launches`: a
        claim during the pass stops its launches (the next pass, which the claim woke, holds
        until the claims pause)."""
        await self.store.forget_missing()
        members = await self.store.members()
        # Only members still in the pool need remembering (claimed and dropped ones leave it).
        self._warmed &= {record.id for record, _fp in members}
        if not members and not self.enabled:
            return 0
        containers = {
            c.sandbox_id: c for c in await self._driver.list_sandboxes(owner=naming.POOL_OWNER)
        }
        launched = 0
        for spec in self.catalog.all():
            mine = [(r, fp) for r, fp in members if r.spec_id == spec.id]
            size = self.size(spec)
            if not mine and size <= 0:
                continue
            current = await self.current(spec)
            live = await self._tend(spec, mine, current, containers)
            for record in live[size:]:
                await self._drop(record, "surplus")
            if current is not None and len(live) < size:
                launched += await self._launch(spec, current, size - len(live), hold_launches)
        known = {spec.id for spec in self.catalog.all()}
        for record, _fp in members:
            if record.spec_id not in known:
                await self._drop(record, "spec removed")
        return launched

    async def _tend(
        self,
        spec: SandboxSpec,
        members: list[tuple[SandboxRecord, str]],
        current: str | None,
        containers: dict[str, SandboxState],
    ) -> list[SandboxRecord]:
        """Drop stale and broken members, settle the others; returns the live ones, ready
        first."""
        ready = await self.store.ready_ids(spec.id)
        ready_live: list[SandboxRecord] = []
        booting: list[SandboxRecord] = []
        grace = timedelta(seconds=self._config.start_timeout + 10)
        for record, fp in members:
            launching = self._launcher.is_launching(record.id)
            state = containers.get(record.id)
            if fp != current:
                await self._drop(record, "stale: its spec or image changed")
            elif record.status == S.STARTING:
                if launching or datetime.now(UTC) - record.updated_at < grace:
                    booting.append(record)
                else:
                    await self._drop(record, "start interrupted")
            elif record.status not in (S.RUNNING, S.PAUSED) or state is None:
                await self._drop(record, f"broken ({record.status.value})")
            elif await self._warmed_and_settled(spec, record, state):
                if record.id not in ready:
                    await self.store.mark_ready(spec.id, record.id)
                ready_live.append(record)
            else:
                booting.append(record)
        return ready_live + booting

    async def _warmed_and_settled(
        self, spec: SandboxSpec, record: SandboxRecord, state: SandboxState
    ) -> bool:
        """Once per booted member, before it is ready, what its agent server would otherwise do
        at the first conversation (agent_protocol.kinds.warm_up); then whether it waits as its spec
        wants."""
        if record.status == S.RUNNING and record.id not in self._warmed:
            self._warmed.add(record.id)
            await warm_up(spec, record.agent_url(self._config.url_host), record.session_api_key)
        return await self._settle(spec, record, state)

    async def _settle(self, spec: SandboxSpec, record: SandboxRecord, state: SandboxState) -> bool:
        """True when the member waits as its spec wants (running, or paused). Where a pause
        releases the instance (Kubernetes), a paused member would be a cold start at its claim:
        members wait running."""
        if spec.warm_pool_state == "running" or record.status == S.PAUSED:
            return True
        if self._driver.pause_releases:
            return True
        if state.status != RunState.RUNNING:
            return False
        async with self._locks.of(record.id):
            await self._driver.pause(record.id)
            result = await self._sandboxes.transition(record, [S.RUNNING], S.PAUSED)
        return result.outcome == "ok"  # else the reconciler saw the pause first: next pass

    async def _launch(self, spec: SandboxSpec, current: str, count: int, hold: bool) -> int:
        capacity = (await self._admission.limits()).memory_capacity
        launched = 0
        for _ in range(count):
            if hold and await self.store.claims_hold() > 0:
                break  # a claim came during this pass: the burst goes first
            if not self._admission.room_for(spec.resources.reservation_bytes):
                log.info("pool_refill_host_short", spec_id=spec.id)
                break
            record = SandboxRecord.starting(naming.new_sandbox_id(), naming.POOL_OWNER, spec.id)
            if not await self.store.create(
                record, current, spec.resources.reservation_bytes, capacity
            ):
                log.info("pool_refill_no_capacity", spec_id=spec.id)
                break
            self._launcher.launch(record, self._launcher.gate.place(user=False))
            launched += 1
        if launched:
            log.info("pool_refill", spec_id=spec.id, launched=launched)
        return launched

    async def _drop(self, record: SandboxRecord, why: str) -> None:
        if not await self.store.drop(record):
            return  # claimed first: it is a user's now
        await self._launcher.cancel(record.id)
        try:
            await self._driver.remove(record.id)
        except DriverError as exc:
            # Tombstoned: the reconciler removes what is left.
            log.warning("pool_drop_remove_failed", sandbox_id=record.id, error=str(exc))
        log.info("pool_member_dropped", sandbox_id=record.id, spec_id=record.spec_id, why=why)
