"""Snapshots of sandboxes, per user: take, read, search, delete, and fork (a snapshot and N
sandboxes made from it). The mechanics of taking one are in taker.py; the records and counts in
store.py; what is deleted from the store is deleted by the collector (collector.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from controlplane.api.pagination import decode_cursor, encode_cursor
from controlplane.auth.models import Principal
from controlplane.background import stop_tasks
from controlplane.config import ServiceConfig
from controlplane.errors import Conflict, ControlPlaneError, QuotaExceeded, StoreUnavailable
from controlplane.sandboxes.models import SandboxInfo, SandboxRecord, SandboxStatus
from controlplane.sandboxes.naming import new_sandbox_id
from controlplane.sandboxes.service import SandboxService
from controlplane.snapshots.models import (
    SNAPSHOT_ID_PATTERN,
    ForkResult,
    SnapshotInfo,
    SnapshotPage,
    SnapshotRecord,
    SnapshotSearchQuery,
)
from controlplane.snapshots.reader import state_key
from controlplane.snapshots.sources import SnapshotData
from controlplane.snapshots.store import SnapshotLimits
from controlplane.snapshots.taker import Stale, Taker
from controlplane.store import keyspace
from drivers.base import SandboxFiles
from drivers.errors import FilesTooLarge

log = structlog.get_logger(__name__)
S = SandboxStatus
LOCK_TTL = 15_000  # ms; renewed by the taker's lease while a snapshot is taken


class NotSupported(ControlPlaneError):
    code = "not_supported"
    status = 501


def info(record: SnapshotRecord) -> SnapshotInfo:
    return SnapshotInfo(
        id=record.id,
        name=record.name,
        sandbox_id=record.sandbox_id,
        sandbox_spec_id=record.spec_id,
        parent_id=record.parent,
        created_at=record.created_at,
        size_bytes=record.size,
        stored_bytes=record.stored,
        files=record.files,
        held_still_seconds=record.held_still,
        read_bytes=record.read,
    )


class SnapshotService:
    def __init__(
        self,
        config: ServiceConfig,
        data: SnapshotData,
        sandboxes: SandboxService,
        taker: Taker,
        files: SandboxFiles | None,
    ) -> None:
        self._config = config
        self._data = data
        self._sandboxes = sandboxes
        self._taker = taker
        self._files = files
        self._taking: set[asyncio.Task[SnapshotRecord]] = set()
        self._forking: set[asyncio.Task[ForkResult]] = set()

    def limits(self) -> SnapshotLimits:
        return SnapshotLimits(
            count=self._config.snapshot_max_per_user or None,
            bytes=self._config.snapshot_max_bytes_per_user or None,
        )

    async def take(
        self, principal: Principal, sandbox_id: str, name: str | None = None
    ) -> SnapshotInfo:
        """A consistent snapshot of the caller's sandbox (RUNNING or PAUSED). Raises
        SandboxNotFound, Conflict (another state, or a snapshot of it already being taken),
        QuotaExceeded, StoreUnavailable, NotSupported (a runtime without the capability)."""
        sandbox = await self._sandboxes.owned(principal, sandbox_id)
        if sandbox.owner != principal.user_id:
            # An admin may see another user's sandbox, not take its files as their own.
            raise Conflict("only the owner of a sandbox may snapshot it")
        return info(await self._carried(sandbox, name))

    async def _carried(
        self, sandbox: SandboxRecord, name: str | None, *, fork: Sequence[str] = ()
    ) -> SnapshotRecord:
        """Take it in a task of its own that the request waits for: a request that ends
        first (its time limit, a client gone) does not abandon the snapshot, which is listed
        when done. The service's close cancels what is left (abandoned, then collected)."""
        return await asyncio.shield(self.begin(sandbox, name, fork=fork))

    def begin(
        self,
        sandbox: SandboxRecord,
        name: str | None,
        captured: asyncio.Event | None = None,
        *,
        fork: Sequence[str] = (),
        based: Callable[[str], None] | None = None,
    ) -> asyncio.Task[SnapshotRecord]:
        """Start taking a snapshot of `sandbox` (its owner's) in a task of the service's own
        (cancelled by its close); `captured` is set once its files are read at their
        consistent moment, before they are sent (a conversation's checkpoint lets the user's
        message go then); `fork`: the ids of sandboxes to start from it on this runtime next
        (the runtime's shared copy of its files is built as they are read, with what each of
        them needs of it: Taker.take's `local_image`), `based` called with the snapshot's id
        once that copy is built (Taker.take). The task raises as `take`."""
        task = asyncio.create_task(
            self._take(sandbox, name, captured, fork=fork, based=based),
            name=f"snapshot-of-{sandbox.id}",
        )
        self._taking.add(task)
        task.add_done_callback(self._taken)
        return task

    async def cancel(self, task: asyncio.Task[SnapshotRecord]) -> None:
        """Stop a snapshot `begin` started and wait until it has ended: when this returns, a
        sandbox it froze is thawed (a freeze the engine was still making too) and nothing it
        began goes on, so what the caller does next (a user's message) meets a running
        sandbox."""
        task.cancel()
        await asyncio.wait({task})

    def _taken(self, task: asyncio.Task[SnapshotRecord]) -> None:
        self._taking.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: logged once
            log.info("snapshot_not_taken", error=str(task.exception()))

    async def close(self) -> None:
        await stop_tasks(list(self._forking))  # each cancels its snapshot, withdraws its forks
        await stop_tasks(list(self._taking))

    async def _take(
        self,
        sandbox: SandboxRecord,
        name: str | None,
        captured: asyncio.Event | None = None,
        *,
        fork: Sequence[str] = (),
        based: Callable[[str], None] | None = None,
    ) -> SnapshotRecord:
        files = self._capability()
        if sandbox.status not in (S.RUNNING, S.PAUSED) or sandbox.deleting_at is not None:
            raise Conflict(
                f"cannot snapshot sandbox {sandbox.id}: it is {sandbox.status.value}; "
                "snapshots are of RUNNING or PAUSED sandboxes"
            )
        spec = self._sandboxes.catalog.find(sandbox.spec_id)
        if spec is None:
            raise Conflict(f"sandbox {sandbox.id}'s spec {sandbox.spec_id!r} no longer exists")
        await self._check_quota(sandbox.owner)
        if not await self._data.registry.ping():
            raise StoreUnavailable(
                f"the snapshot store at {self._data.registry.base_url} does not answer; the "
                "sandbox was not touched"
            )
        # One at a time across replicas; pause, resume, delete and the reaper wait for it (the
        # sandbox's own lock).
        async with self._one_at_a_time(sandbox.id), self._sandboxes.lock(sandbox.id):
            current = await self._sandboxes.record(sandbox.id)
            if current is None or current.status not in (S.RUNNING, S.PAUSED):
                raise Conflict(f"sandbox {sandbox.id} changed while its snapshot began")
            stale = 0
            while True:  # at most three takes: over the bound once, stale once, then it stands
                try:
                    record = await self._taker.take(
                        files,
                        current,
                        spec.working_dir,
                        name,
                        self.limits(),
                        captured=captured,
                        local_image=spec.image if fork else None,
                        fork_ids=fork,
                        based=based if fork else None,
                    )
                    break
                except FilesTooLarge:
                    # Where the runtime builds no local copy the export was incremental
                    # already: taking it again would be refused the same.
                    if not fork or not files.builds_locally:
                        raise
                    # The whole workspace is over the bound where what changed may not be: an
                    # incremental snapshot, and the forks' base built from the store.
                    log.info("fork_copy_over_bound", sandbox_id=sandbox.id)
                    fork = ()
                except Stale:
                    stale += 1
                    if stale == 2:
                        raise Conflict(
                            "data this snapshot reuses was collected meanwhile; retry"
                        ) from None
        log.info(
            "snapshot_taken",
            snapshot_id=record.id,
            sandbox_id=sandbox.id,
            held_still=record.held_still,
            size=record.size,
            stored=record.stored,
            read=record.read,
        )
        return record

    def _capability(self) -> SandboxFiles:
        if self._files is None:
            raise NotSupported(
                "this runtime does not take snapshots: the Docker and Kubernetes drivers do"
            )
        return self._files

    async def _check_quota(self, owner: str) -> None:
        limits = self.limits()
        store = self._data.store
        if limits.count is not None and await store.count(owner) >= limits.count:
            raise QuotaExceeded(
                f"you have {limits.count} snapshots (the per-user limit); delete some, then retry",
                retry_after=60,
            )
        if limits.bytes is not None and await store.bytes_used(owner) >= limits.bytes:
            raise QuotaExceeded(
                f"your snapshots take {limits.bytes} bytes of the store (the per-user limit); "
                "delete some, then retry",
                retry_after=60,
            )

    def _one_at_a_time(self, sandbox_id: str) -> _SnapshotLock:
        return _SnapshotLock(self._data, sandbox_id)

    # -- reads ----------------------------------------------------------------------------------

    async def get(self, principal: Principal, snapshot_id: str) -> SnapshotInfo:
        return info(await self._data.owned(principal, snapshot_id))

    async def search(self, principal: Principal, query: SnapshotSearchQuery) -> SnapshotPage:
        """The caller's snapshots, newest first (of one sandbox when asked)."""
        after = decode_cursor(query.page_id, SNAPSHOT_ID_PATTERN.strip("^$"))
        store = self._data.store
        key = keyspace.user_snapshots(principal.user_id)
        if query.sandbox_id is not None:
            key = keyspace.sandbox_snapshots(query.sandbox_id)
        ids = await store.page_ids(key, after, query.limit + 1)
        records = [
            r
            for r in await store.get_many(ids[: query.limit])
            if r is not None and r.owner == principal.user_id
        ]
        more = len(ids) > query.limit
        next_page = encode_cursor(ids[query.limit - 1]) if more else None
        return SnapshotPage(items=[info(r) for r in records], next_page_id=next_page)

    # -- changes --------------------------------------------------------------------------------

    async def delete(self, principal: Principal, snapshot_id: str) -> None:
        """Unlisted at once; its blobs no other snapshot uses are deleted from the store by
        the collector. Sandboxes made from it keep running. Raises SnapshotNotFound."""
        record = await self._data.owned(principal, snapshot_id)
        await self.remove(record)

    async def discard(self, owner: str, snapshot_id: str) -> None:
        """Delete `owner`'s snapshot if it is still there (a checkpoint's, by retention or
        with its conversation)."""
        record = await self._data.store.get(snapshot_id)
        if record is not None and record.owner == owner:
            await self.remove(record)

    async def remove(self, record: SnapshotRecord) -> None:
        """Delete a snapshot (an API delete, or retention)."""
        if await self._data.store.delete(record):
            self._data.forget(record.id)
            if self._files is not None:
                await self._files.forget(record.id)
                await self._files.forget(state_key(record.id))

    async def fork(self, principal: Principal, sandbox_id: str, count: int) -> ForkResult:
        """A snapshot of the caller's sandbox and `count` new sandboxes started from it, all
        from that one consistent state, each with its own id, key and identity. Raises as
        `take`, and QuotaExceeded when the caps refuse the sandboxes (then none is started;
        the snapshot stays). Carried in a task of its own, as `take` (a request that ends
        first abandons nothing half done)."""
        sandbox = await self._sandboxes.owned(principal, sandbox_id)
        if sandbox.owner != principal.user_id:
            raise Conflict("only the owner of a sandbox may fork it")
        limits = await self._sandboxes.limits()
        if limits.running is not None:
            active = await self._sandboxes.store.count_active(principal.user_id)
            if active + count > limits.running:
                raise self._sandboxes.admission.refused(principal)
        task = asyncio.create_task(self._fork(principal, sandbox, count), name=f"fork-{sandbox.id}")
        self._forking.add(task)
        task.add_done_callback(self._forked)
        return await asyncio.shield(task)

    def _forked(self, task: asyncio.Task[ForkResult]) -> None:
        self._forking.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: logged once
            log.info("sandbox_not_forked", error=str(task.exception()))

    async def _fork(self, principal: Principal, sandbox: SandboxRecord, count: int) -> ForkResult:
        """The snapshot is taken with the forks' base built beside it on this runtime; the
        forks start as soon as that base is built, while the store is still sealing the
        snapshot (they need only the base), and the fork answers once both are done. All or
        nothing: a snapshot that is not listed after all (the store down or full, the service
        closed) takes the forks started from it with it (withdrawn: records and instances).
        Where no base is built (another runtime, a workspace over the export's bound, the
        build failed) the forks start once the snapshot is listed, from the store."""
        began = time.monotonic()
        # Their ids now: their directories in the base built beside the snapshot come with it.
        ids = [new_sandbox_id() for _ in range(count)]
        based: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def on_base(snapshot_id: str) -> None:
            if not based.done():
                based.set_result(snapshot_id)

        taking = self.begin(sandbox, None, fork=ids, based=on_base)
        ahead: str | None = None  # the snapshot the forks were started from before its listing
        started: list[SandboxInfo] | None = None
        marks: dict[str, float] = {}
        try:
            waited: set[asyncio.Future[Any]] = {taking, based}
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            # Recorded first, and only while the snapshot is PENDING (its commit deletes the
            # record in the same script): a control plane that dies before the listing leaves
            # the collector what to withdraw with the abandoned snapshot, and a listed one
            # never has such a record.
            if (
                based.done()
                and not taking.done()
                and await self._data.store.note_forks(based.result(), ids)
            ):
                ahead = based.result()
                marks["base_s"] = time.monotonic() - began
                started = await self._ahead(principal, sandbox, ahead, ids, taking)
                marks["started_s"] = time.monotonic() - began
            record = await taking
        except BaseException:
            if not taking.done():
                await self.cancel(taking)
            if _told(based) and not _listed(taking):
                # The taker leaves a copy it told of to this (Taker.take): the forks made on
                # it (any of them: a start_from cut short leaves some) go first, then it.
                await asyncio.shield(self._withdraw(based.result(), ids))
            raise
        finally:
            if not based.done():
                based.cancel()
        taken = time.monotonic()
        marks["snapshot_s"] = taken - began
        # The same snapshot the forks stand on: the taker does not take it again once it
        # told of its copy (Taker.take raises Conflict instead).
        if started is None:
            started = await self._sandboxes.start_from(principal, record.id, count, ids=ids)
        log.info(
            "sandbox_forked",
            sandbox_id=sandbox.id,
            snapshot_id=record.id,
            count=count,
            ahead=ahead is not None,
            records_s=round(time.monotonic() - taken, 3),
            **{k: round(v, 3) for k, v in marks.items()},
        )
        return ForkResult(snapshot=info(record), sandboxes=started)

    async def _ahead(
        self,
        principal: Principal,
        sandbox: SandboxRecord,
        snapshot_id: str,
        ids: Sequence[str],
        taking: asyncio.Task[SnapshotRecord],
    ) -> list[SandboxInfo]:
        """The forks started from the base of `snapshot_id` while the store seals it. When
        they are refused (none started: start_from is all or none), the snapshot is kept as
        when they are refused after its listing: its own failure first, else theirs."""
        try:
            return await self._sandboxes.start_from(
                principal,
                snapshot_id,
                len(ids),
                ids=ids,
                spec_id=sandbox.spec_id,
                unlisted=True,
            )
        except Exception:
            await self._data.store.drop_forks(snapshot_id)
            await taking
            raise

    async def _withdraw(self, snapshot_id: str, ids: Sequence[str]) -> None:
        """The forks started from a snapshot that is not listed after all, removed (records,
        instances, workspaces), then what the runtime keeps of its copy."""
        if ids:
            await self._sandboxes.withdraw(
                ids, f"its fork's snapshot {snapshot_id} was not stored; nothing was kept"
            )
        await self._data.store.drop_forks(snapshot_id)
        await self._capability().forget(snapshot_id)
        log.info("fork_withdrawn", snapshot_id=snapshot_id, sandbox_ids=list(ids))


def _told(based: asyncio.Future[str]) -> bool:
    return based.done() and not based.cancelled()


def _listed(taking: asyncio.Task[SnapshotRecord]) -> bool:
    return taking.done() and not taking.cancelled() and taking.exception() is None


class _SnapshotLock:
    """One snapshot of a sandbox at a time, across replicas (a Redis key with a TTL, renewed
    while held): a second one meanwhile is a 409."""

    def __init__(self, data: SnapshotData, sandbox_id: str) -> None:
        self._redis = data.store.redis
        self._key = keyspace.snapshot_lock(sandbox_id)
        self._token = ""
        self._renewing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        self._token = secrets.token_hex(8)
        if not await self._redis.set(self._key, self._token, nx=True, px=LOCK_TTL):
            raise Conflict("a snapshot of this sandbox is being taken; retry when it is done")
        self._renewing = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(LOCK_TTL / 3000)
            await self._redis.set(self._key, self._token, xx=True, px=LOCK_TTL)

    async def __aexit__(self, *_: object) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
        if await self._redis.get(self._key) in (self._token, self._token.encode()):
            await self._redis.delete(self._key)
