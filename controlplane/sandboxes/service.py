"""The sandbox manager: start, pause, resume, delete and read sandboxes, per user.

Redis records intent and ownership; the driver decides liveness. Every status change is a
compare-and-set in the store, so two replicas (or a replica and the reconciler) cannot both win.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog

from controlplane.api.pagination import decode_cursor, encode_cursor
from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.errors import (
    Conflict,
    Forbidden,
    QuotaExceeded,
    SandboxNotFound,
)
from controlplane.sandboxes import naming
from controlplane.sandboxes.launcher import HealthProbe, container_request, host_ports
from controlplane.sandboxes.models import (
    SANDBOX_ID_PATTERN,
    ExposedUrl,
    SandboxInfo,
    SandboxPage,
    SandboxRecord,
    SandboxSearchQuery,
    SandboxStatus,
)
from controlplane.sandboxes.store import SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER
from drivers.base import SandboxDriver

log = structlog.get_logger(__name__)
S = SandboxStatus
_ID_RE = re.compile(SANDBOX_ID_PATTERN)


class SandboxService:
    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        probe: HealthProbe,
    ) -> None:
        self.config = config
        self.store = store
        self.driver = driver
        self.catalog = catalog
        self.probe = probe
        self._locks: dict[str, asyncio.Lock] = {}
        self._launches: dict[str, asyncio.Task[None]] = {}

    # -- reading -----------------------------------------------------------------------------

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises operations on one sandbox within this process."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def is_launching(self, sandbox_id: str) -> bool:
        return sandbox_id in self._launches

    @property
    def cap(self) -> int | None:
        return self.config.max_running_per_user or None

    async def owned(self, principal: Principal, sandbox_id: str) -> SandboxRecord:
        """The record if the caller may see it. Raises SandboxNotFound otherwise (never 403)."""
        record = await self.store.get(sandbox_id) if _ID_RE.match(sandbox_id) else None
        if record is None or (record.owner != principal.user_id and not principal.is_admin):
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return record

    def view(self, record: SandboxRecord, principal: Principal) -> SandboxInfo:
        running = record.status == S.RUNNING
        urls = [
            ExposedUrl(name=name, url=f"http://{self.config.url_host}:{port}", port=port)
            for name, port in sorted(record.ports.items())
        ]
        return SandboxInfo(
            id=record.id,
            created_by_user_id=record.owner,
            sandbox_spec_id=record.spec_id,
            status=record.status,
            session_api_key=record.session_api_key
            if running and record.owner == principal.user_id
            else None,
            exposed_urls=urls if running else None,
            created_at=record.created_at,
            last_activity_at=record.last_activity_at,
            reason=record.reason,
        )

    async def get(self, principal: Principal, sandbox_id: str) -> SandboxInfo:
        return self.view(await self.owned(principal, sandbox_id), principal)

    async def batch_get(self, principal: Principal, ids: list[str]) -> list[SandboxInfo | None]:
        """In request order; None for ids that are unknown or not the caller's."""
        valid = [i if _ID_RE.match(i) else "" for i in ids]
        records = await self.store.get_many(i for i in valid if i)
        found = {r.id: r for r in records if r is not None}
        out: list[SandboxInfo | None] = []
        for sandbox_id in valid:
            record = found.get(sandbox_id)
            visible = record is not None and (
                record.owner == principal.user_id or principal.is_admin
            )
            out.append(self.view(record, principal) if visible and record else None)
        return out

    async def search(self, principal: Principal, query: SandboxSearchQuery) -> SandboxPage:
        """Newest first, cursor-paged; filters by status and spec."""
        if (query.all_users or query.created_by_user_id) and not principal.is_admin:
            raise Forbidden("all_users and created_by_user_id need an admin key")
        owner = query.created_by_user_id or (None if query.all_users else principal.user_id)
        after = decode_cursor(query.page_id, SANDBOX_ID_PATTERN.strip("^$"))
        filtered = set(query.model_fields_set) - {"page_id", "limit", "all_users"} != set()
        batch = max(query.limit + 1, 200) if filtered else query.limit + 1
        matches: list[SandboxRecord] = []
        while len(matches) <= query.limit:
            ids = await self.store.page_ids(owner, after, batch)
            for record in await self.store.get_many(ids):
                if record is not None and query.matches(record):
                    matches.append(record)
                    if len(matches) > query.limit:
                        break
            if len(ids) < batch:
                break
            after = ids[-1]
        page = matches[: query.limit]
        next_page = encode_cursor(page[-1].id) if len(matches) > query.limit else None
        return SandboxPage(items=[self.view(r, principal) for r in page], next_page_id=next_page)

    def agent_url(self, record: SandboxRecord) -> str:
        """Base URL of the sandbox's agent server, as this control plane reaches it."""
        return f"http://{self.config.url_host}:{record.ports[AGENT_SERVER]}"

    async def wait_running(self, sandbox_id: str, timeout: float) -> SandboxRecord:
        """Poll the record until RUNNING. Raises Conflict for ERROR/MISSING/PAUSED or on timeout."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            record = await self.store.get(sandbox_id)
            if record is None:
                raise SandboxNotFound(f"sandbox {sandbox_id} was deleted")
            if record.status == S.RUNNING and AGENT_SERVER in record.ports:
                return record
            if record.status not in (S.STARTING, S.RUNNING):
                raise Conflict(
                    f"sandbox {sandbox_id} is {record.status.value}: {record.reason or 'no reason'}"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise Conflict(f"sandbox {sandbox_id} did not become RUNNING in {timeout:g} s")
            await asyncio.sleep(0.02)

    async def ensure_running(self, principal: Principal, sandbox_id: str) -> SandboxRecord:
        """Resume the sandbox if needed and wait until its agent server is up."""
        record = await self.owned(principal, sandbox_id)
        if record.status != S.RUNNING:
            await self.resume(principal, sandbox_id)
        else:
            await self.store.touch(sandbox_id)
        return await self.wait_running(sandbox_id, self.config.start_timeout + 10)

    async def runtime_available(self) -> bool:
        return await self.driver.ping()

    # -- lifecycle ---------------------------------------------------------------------------

    def _quota(self, principal: Principal) -> QuotaExceeded:
        return QuotaExceeded(
            f"user {principal.user_id} already has {self.cap} sandboxes starting or running "
            f"(the per-user limit); pause or delete one, then retry",
            retry_after=30,
        )

    async def start(self, principal: Principal, spec_id: str | None) -> SandboxInfo:
        """Record a STARTING sandbox and launch its container in the background.

        Raises SpecNotFound or QuotaExceeded, or RuntimeUnavailable when the engine does not
        answer; in each case nothing is created. A missing image is reported by the launch (ERROR).
        """
        spec = self.catalog.get(spec_id)
        await self.driver.image_exists(spec.image)
        now = datetime.now(UTC)
        record = SandboxRecord(
            id=naming.new_sandbox_id(),
            owner=principal.user_id,
            spec_id=spec.id,
            status=S.STARTING,
            session_api_key=secrets.token_urlsafe(32),
            created_at=now,
            updated_at=now,
            last_activity_at=now,
        )
        if not await self.store.create(record, self.cap):
            raise self._quota(principal)
        self._spawn(record.id, self._launch(record))
        log.info("sandbox_starting", sandbox_id=record.id, spec_id=spec.id)
        return self.view(record, principal)

    def _spawn(self, sandbox_id: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"launch-{sandbox_id}")
        self._launches[sandbox_id] = task
        task.add_done_callback(lambda _t: self._launches.pop(sandbox_id, None))

    async def _launch(self, record: SandboxRecord, *, fresh: bool = True) -> None:
        """Create (or re-create) the container and wait for health; ERROR with a reason on failure.

        A failed fresh start removes everything it made; a failed re-create keeps the workspace.
        """
        spec = self.catalog.find(record.spec_id)
        request = container_request(self.config, record, spec) if spec else None
        try:
            if spec is None or request is None:
                raise Conflict(f"sandbox spec {record.spec_id!r} no longer exists")
            state = await self.driver.create_and_start(request)
            ports = host_ports(spec, state)
            await self.store.transition(record, [S.STARTING], S.STARTING, ports=ports)
            await self.probe.wait(request.name, ports)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._fail_start(record, str(exc), keep_volume=not fresh)
            return
        result = await self.store.transition(
            record, [S.STARTING], S.RUNNING, ports=ports, touch=True
        )
        if result.outcome == "missing":
            # Deleted while starting: the delete may have run before our container existed.
            await self.driver.remove(request.name, request.volume)
        log.info("sandbox_running", sandbox_id=record.id, outcome=result.outcome)

    async def _fail_start(self, record: SandboxRecord, reason: str, keep_volume: bool) -> None:
        log.warning("sandbox_start_failed", sandbox_id=record.id, reason=reason)
        prefix = self.config.container_prefix
        volume = None if keep_volume else naming.volume_name(prefix, record.id)
        try:
            await self.driver.remove(naming.container_name(prefix, record.id), volume)
        except Exception as exc:
            log.warning("sandbox_cleanup_failed", sandbox_id=record.id, error=str(exc))
        await self.store.transition(record, [S.STARTING], S.ERROR, reason=f"start failed: {reason}")

    async def pause(self, principal: Principal, sandbox_id: str) -> None:
        """Freeze a RUNNING sandbox; pausing a PAUSED one succeeds. Raises Conflict otherwise."""
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id)
            if record.status == S.PAUSED:
                return
            if record.status != S.RUNNING:
                raise Conflict(f"cannot pause sandbox {sandbox_id}: it is {record.status.value}")
            await self.driver.pause(naming.container_name(self.config.container_prefix, record.id))
            result = await self.store.transition(record, [S.RUNNING], S.PAUSED, touch=True)
            if result.outcome != "ok" and result.previous != S.PAUSED:
                raise Conflict(f"sandbox {sandbox_id} changed while pausing ({result.previous})")
            log.info("sandbox_paused", sandbox_id=sandbox_id)

    async def resume(self, principal: Principal, sandbox_id: str) -> None:
        """Unpause, start a stopped container, or re-create a vanished one (workspace kept).

        RUNNING and STARTING succeed as no-ops. Raises Conflict for ERROR, QuotaExceeded.
        """
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id)
            if record.status in (S.RUNNING, S.STARTING):
                await self.store.touch(record.id)
                return
            if record.status == S.ERROR:
                raise Conflict(
                    f"cannot resume sandbox {sandbox_id}: it is ERROR ({record.reason}); "
                    "delete it and start a new one"
                )
            name = naming.container_name(self.config.container_prefix, record.id)
            state = await self.driver.inspect(name) if record.status == S.PAUSED else None
            result = await self.store.transition(
                record, [record.status], S.STARTING, cap=self.cap, reason=None, touch=True
            )
            if result.outcome == "quota":
                raise self._quota(principal)
            if result.outcome != "ok":
                raise Conflict(f"sandbox {sandbox_id} changed while resuming ({result.previous})")
            if state is None:
                self._spawn(record.id, self._launch(record, fresh=False))
            elif state.status == "paused":
                await self.driver.unpause(name)
                await self.store.transition(record, [S.STARTING], S.RUNNING, touch=True)
            else:
                self._spawn(record.id, self._restart(record, name))
            log.info("sandbox_resumed", sandbox_id=sandbox_id, container=state and state.status)

    async def _restart(self, record: SandboxRecord, name: str) -> None:
        spec = self.catalog.find(record.spec_id)
        try:
            if spec is None:
                raise Conflict(f"sandbox spec {record.spec_id!r} no longer exists")
            state = await self.driver.start(name)
            ports = host_ports(spec, state)
            await self.store.transition(record, [S.STARTING], S.STARTING, ports=ports)
            await self.probe.wait(name, ports)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Keep the container and workspace: a failed restart is not a failed first start.
            await self.store.transition(
                record, [S.STARTING], S.ERROR, reason=f"restart failed: {exc}"
            )
            return
        await self.store.transition(record, [S.STARTING], S.RUNNING, ports=ports, touch=True)

    async def delete(self, principal: Principal, sandbox_id: str) -> None:
        """Remove the container, its workspace volume and the record. Raises SandboxNotFound."""
        async with self.lock(sandbox_id):
            record = await self.owned(principal, sandbox_id)
            task = self._launches.get(sandbox_id)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            prefix = self.config.container_prefix
            await self.driver.remove(
                naming.container_name(prefix, record.id), naming.volume_name(prefix, record.id)
            )
            await self.store.delete(record)
            log.info("sandbox_deleted", sandbox_id=sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def close(self) -> None:
        """Stop in-process launches; the next start-up's sweep picks their sandboxes up."""
        tasks = list(self._launches.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
