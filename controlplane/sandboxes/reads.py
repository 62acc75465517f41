"""Reading sandboxes as a user may see them: ownership, views, batches, cursor search, and
waiting for a sandbox to be RUNNING."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterable

from controlplane.api.pagination import decode_cursor, encode_cursor
from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.errors import Conflict, Forbidden, SandboxNotFound
from controlplane.sandboxes import links, naming
from controlplane.sandboxes.models import (
    SANDBOX_ID_PATTERN,
    ExposedUrl,
    SandboxInfo,
    SandboxPage,
    SandboxRecord,
    SandboxSearchQuery,
    SandboxStatus,
)
from controlplane.sandboxes.status_feed import StatusFeed
from controlplane.sandboxes.store import SandboxStore
from controlplane.sandboxes.vscode import exposed_url
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER

S = SandboxStatus
RECHECK = 1.0
_ID_RE = re.compile(SANDBOX_ID_PATTERN)


def _visible(record: SandboxRecord, principal: Principal) -> bool:
    """The owner's, or any for an admin; an unclaimed pool member is nobody's (admins see the
    pool at /api/v1/sandbox-pool)."""
    if record.owner == naming.POOL_OWNER:
        return False
    return record.owner == principal.user_id or principal.is_admin


class SandboxReads:
    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        catalog: SpecCatalog,
        feed: StatusFeed | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.catalog = catalog
        self.feed = feed or StatusFeed()

    async def owned(self, principal: Principal, sandbox_id: str) -> SandboxRecord:
        """The record if the caller may see it. Raises SandboxNotFound otherwise (never 403)."""
        record = await self.store.get(sandbox_id) if _ID_RE.match(sandbox_id) else None
        if record is None or not _visible(record, principal):
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return record

    async def record(self, sandbox_id: str) -> SandboxRecord | None:
        """The record, whoever owns it (for the layers above, which check ownership first)."""
        return await self.store.get(sandbox_id)

    async def records(self, ids: Iterable[str]) -> list[SandboxRecord | None]:
        """Records in the order of `ids`, None for unknown ones; no ownership check."""
        return await self.store.get_many(ids)

    async def id_for_key(self, session_api_key: str) -> str | None:
        """The sandbox a session key belongs to (webhook authentication), None if none."""
        return await self.store.id_for_key(session_api_key)

    async def touch(self, sandbox_id: str) -> None:
        """Activity in the sandbox (an agent event): its idle deadline starts again."""
        await self.store.touch(sandbox_id)

    def view(self, record: SandboxRecord, principal: Principal) -> SandboxInfo:
        running = record.status == S.RUNNING
        key = record.session_api_key if running and record.owner == principal.user_id else None
        spec = self.catalog.find(record.spec_id)
        urls = [
            ExposedUrl(
                name=name,
                url=exposed_url(
                    name,
                    links.port_url(self.config, record, name),
                    key,
                    spec.working_dir if spec else None,
                ),
                port=port,
            )
            for name, port in sorted(record.ports.items())
        ]
        return SandboxInfo(
            id=record.id,
            created_by_user_id=record.owner,
            sandbox_spec_id=record.spec_id,
            status=record.status,
            session_api_key=key,
            exposed_urls=urls if running else None,
            created_at=record.created_at,
            last_activity_at=record.last_activity_at,
            reason=record.reason,
            snapshot_id=record.origin,
            hibernated=record.hibernated_at is not None,
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
            out.append(
                self.view(record, principal) if record and _visible(record, principal) else None
            )
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
        return record.agent_url(self.config.url_host)

    def client_agent_url(self, record: SandboxRecord) -> str:
        """Base URL of the sandbox's agent server, as clients reach it (the proxy's, or the
        direct one: controlplane/sandboxes/links.py)."""
        return links.agent_url(self.config, record)

    async def wait_running(self, sandbox_id: str, timeout: float) -> SandboxRecord:
        """The record once RUNNING, read again at each change of its status (StatusFeed).

        Raises Conflict for ERROR/MISSING/PAUSED or on timeout, SandboxNotFound once deleted.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self.feed.watch(sandbox_id) as changed:
            while True:
                changed.clear()
                record = await self.store.get(sandbox_id)
                if record is None:
                    raise SandboxNotFound(f"sandbox {sandbox_id} was deleted")
                if record.status == S.RUNNING and AGENT_SERVER in record.ports:
                    return record
                if record.status not in (S.STARTING, S.RUNNING):
                    reason = record.reason or "no reason"
                    raise Conflict(f"sandbox {sandbox_id} is {record.status.value}: {reason}")
                left = deadline - loop.time()
                if left <= 0:
                    raise Conflict(f"sandbox {sandbox_id} did not become RUNNING in {timeout:g} s")
                # Re-read at least every RECHECK seconds: a missed message costs that, no more.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, RECHECK))
