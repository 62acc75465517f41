"""Reading sandboxes as a user may see them: ownership, views, batches, cursor search, and
waiting for a sandbox to be RUNNING."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import Iterable

from controlplane.api.pagination import decode_cursor, encode_cursor
from controlplane.auth.models import Principal
from controlplane.config import ServiceConfig
from controlplane.errors import Conflict, Forbidden, SandboxNotFound
from controlplane.organizations.roles import Action, may
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
from controlplane.specs.models import AGENT_SERVER, SandboxSpec

S = SandboxStatus
RECHECK = 1.0
STATUS_SET_READ = 2000
"""Most ids of a status's set a search of every user's sandboxes reads in place of paging the
deployment's index; a larger set is paged through the index, where its matches are dense."""
MAX_SESSION_KEY = 256
"""Longer than any session key we make (secrets.token_urlsafe(32)): not looked up."""
_ID_RE = re.compile(SANDBOX_ID_PATTERN)


def _visible(
    record: SandboxRecord,
    principal: Principal,
    default_org: str,
    action: Action = Action.SANDBOX_READ,
) -> bool:
    """The owner's; another member's for a role that may do `action` in the organization the
    caller acts in (roles.py), any for an admin key; an unclaimed pool member is nobody's
    (admins see the pool at /api/v1/sandbox-pool)."""
    if record.owner == naming.POOL_OWNER:
        return False
    if record.owner == principal.user_id:
        return True
    return may(principal, action, record.org_id or default_org)


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

    async def owned(
        self, principal: Principal, sandbox_id: str, action: Action = Action.SANDBOX_READ
    ) -> SandboxRecord:
        """The record if the caller may see it. Raises SandboxNotFound when they may not (never
        403), Forbidden when they may see it but not do `action` to it (an auditor's pause)."""
        record = await self.store.get(sandbox_id) if _ID_RE.match(sandbox_id) else None
        default = self.config.default_organization
        if record is None or not _visible(record, principal, default):
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        if action != Action.SANDBOX_READ and not _visible(record, principal, default, action):
            raise Forbidden(f"your role ({principal.org_role}) may only read sandbox {sandbox_id}")
        return record

    async def record(self, sandbox_id: str) -> SandboxRecord | None:
        """The record, whoever owns it (for the layers above, which check ownership first)."""
        return await self.store.get(sandbox_id)

    async def records(self, ids: Iterable[str]) -> list[SandboxRecord | None]:
        """Records in the order of `ids`, None for unknown ones; no ownership check."""
        return await self.store.get_many(ids)

    async def id_for_session_key(
        self, key: str | None, sandbox_id: str | None = None
    ) -> str | None:
        """The id of the sandbox whose session API key `key` is: the one lookup of a sandbox's
        key, for every credential that is one (its webhooks, the proxy, the cloud proxy, its
        secrets, a user's key paired with it). With `sandbox_id`, only when it is that sandbox
        (compared in constant time). None for no key, one longer than a key can be, or no such
        sandbox; who the sandbox belongs to is for the caller to check."""
        if not key or len(key) > MAX_SESSION_KEY:
            return None
        found = await self.store.id_for_key(key)
        if found is None:
            return None
        # As bytes: a path's id may hold any character, which compare_digest refuses in a str.
        if sandbox_id is not None and not secrets.compare_digest(
            found.encode(), sandbox_id.encode()
        ):
            return None
        return found

    async def by_session_key(
        self, key: str | None, sandbox_id: str | None = None
    ) -> SandboxRecord | None:
        """The record of the sandbox `id_for_session_key` finds, None where it finds none.
        (The webhook middleware, which needs no more than the id, spares the record's read.)"""
        found = await self.id_for_session_key(key, sandbox_id)
        return await self.store.get(found) if found is not None else None

    async def touch(self, sandbox_id: str) -> None:
        """Activity in the sandbox (an agent event): its idle deadline starts again."""
        await self.store.touch(sandbox_id)

    def spec_of(self, record: SandboxRecord) -> SandboxSpec | None:
        """The spec the sandbox was started from; None once the catalog no longer has it."""
        return self.catalog.find(record.spec_id)

    def view(self, record: SandboxRecord, principal: Principal) -> SandboxInfo:
        running = record.status == S.RUNNING
        key = record.session_api_key if running and record.owner == principal.user_id else None
        # Only a RUNNING sandbox shows its URLs: the others' (polled while they start) are not
        # built.
        spec = self.catalog.find(record.spec_id) if running else None
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
            if running
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
            org_id=record.org_id or self.config.default_organization,
            snapshot_id=record.origin,
            hibernated=record.hibernated_at is not None,
        )

    async def get(self, principal: Principal, sandbox_id: str) -> SandboxInfo:
        return self.view(await self.owned(principal, sandbox_id), principal)

    async def batch_get(self, principal: Principal, ids: list[str]) -> list[SandboxInfo | None]:
        """In request order; None for ids that are unknown or not the caller's."""
        valid = [i if _ID_RE.match(i) else "" for i in ids]
        # Keys are shown only for RUNNING sandboxes (view): the others' are not decrypted.
        records = await self.store.get_many((i for i in valid if i), keys=False)
        found = {r.id: r for r in records if r is not None}
        out: list[SandboxInfo | None] = []
        for sandbox_id in valid:
            record = found.get(sandbox_id)
            visible = record is not None and _visible(
                record, principal, self.config.default_organization
            )
            out.append(self.view(record, principal) if record and visible else None)
        return out

    async def search(self, principal: Principal, query: SandboxSearchQuery) -> SandboxPage:
        """Newest first, cursor-paged; filters by status and spec. The caller's own sandboxes in
        the organization they act in; with all_users (or created_by_user_id) every member's
        there, for a role that may read them (any organization's for an admin key). Raises
        Forbidden for any other role."""
        others = query.all_users or (query.created_by_user_id not in (None, principal.user_id))
        if others and not may(principal, Action.SANDBOX_READ):
            raise Forbidden(
                "all_users and created_by_user_id need an organization owner, admin or auditor "
                "(or an admin key)"
            )
        owner = query.created_by_user_id or (None if query.all_users else principal.user_id)
        default = self.config.default_organization
        org = None if principal.is_admin and others else principal.org_id
        after = decode_cursor(query.page_id, SANDBOX_ID_PATTERN.strip("^$"))
        filtered = set(query.model_fields_set) - {"page_id", "limit", "all_users"} != set()
        filtered = filtered or (org is not None and owner is None)
        batch = max(query.limit + 1, 200) if filtered else query.limit + 1
        # Every user's sandboxes in one status: that status's set, when it is small, instead of
        # the deployment's index (a status few sandboxes are in would read every record).
        in_status = (
            await self.store.ids_in_status(query.status, STATUS_SET_READ)
            if owner is None and query.status is not None
            else None
        )
        if in_status is not None:
            # Its records are in that status: about a page of them fills the page (others'
            # organizations, or a spec filter, read on).
            batch = query.limit + 1
            if after is not None:
                in_status = [i for i in in_status if i < after]
        matches: list[SandboxRecord] = []
        while len(matches) <= query.limit:
            if in_status is not None:
                ids, in_status = in_status[:batch], in_status[batch:]
            else:
                ids = await self.store.page_ids(owner, after, batch)
            for record in await self.store.get_many(ids, keys=False):  # as batch_get
                if record is None or (org is not None and (record.org_id or default) != org):
                    continue
                if query.matches(record):
                    matches.append(record)
                    if len(matches) > query.limit:
                        break
            if len(ids) < batch or in_status == []:
                break
            after = ids[-1]
            if in_status is not None:  # sparse matches (others' organizations): read more
                batch = min(2 * batch, max(query.limit + 1, 200))
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
