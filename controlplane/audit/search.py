"""Reading the audit log: search (newest first, paged by stream id) and the JSON-lines export.

Every entry has an index entry with its own stream id in the streams of its organization, its
action and its user (each deployment-wide and per organization) and in the sorted sets of each
target id (the same two), written from the log by the indexer (controlplane/store/audit_index.py)
up to its watermark. A search reads the log's entries past the watermark first (the newest, not
indexed yet: every filter checked on them, so a search right after a write finds it), then the
most selective index its filters allow (target, then user, then action, then organization), an
organization's own for a search within one: an auditor's search never reads, skips or stops at
another organization's entry in an index, whatever its filters. It reads between the stream ids
of its time window (XREVRANGE: O(log n) to the window's end, then what it returns), fetches the
entries in one script call and checks the other filters on them. Nothing scans the log but its
un-indexed tail: a page reads at most MAX_SCANNED entries, and a page cut short by that still
carries a cursor where it stopped. Cursors are sealed (`Cursors`).
Entries are answered as JSON built straight from their fields (audit_event.event_json), not
through the AuditEvent model: validating its ten parts for each of 100 entries cost more than
the search (the model stays the shape the OpenAPI document and the sinks use).

Who reads what (docs/api.md#audit-events): a deployment admin every entry; an organization's
owners, admins and auditors that organization's (the one they act in: another one is a 404, as
for everything of another organization); members nobody's (403).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.api.parsing import invalid
from controlplane.audit.models import AuditQuery
from controlplane.auth.models import Principal
from controlplane.errors import Forbidden, NotFound
from controlplane.organizations.roles import Action, may
from controlplane.store import keyspace, text
from controlplane.store.audit import indexed_targets
from controlplane.store.audit_event import AuditRecord, decoded_record, event_json, json_line
from controlplane.store.streams import id_order, lex_member, stream_id_of

# ARGV: stream ids of KEYS[1]: each one's fields (flat), or false for one no longer there.
_FETCH = """
local out = {}
for i, id in ipairs(ARGV) do
  local rows = redis.call('XRANGE', KEYS[1], id, id, 'COUNT', 1)
  out[i] = rows[1] and rows[1][2] or false
end
return out
"""
CURSOR_PURPOSE = "audit-search-cursors"
MAX_SCANNED = 2000
"""Index entries one page may read past the filters it could not use as its index."""
EXPORT_PAGE = 100


@dataclass(frozen=True)
class Plan:
    index: str
    org_id: str | None
    """Entries of this organization only (None: any)."""
    low: str
    high: str
    """Stream ids, as XREVRANGE takes them (`(` before one: exclusive)."""
    lex: bool = False
    """The index is a sorted set of lex_member ids (a target's), not a stream."""


class Cursors:
    """Sealed cursors: a position (a stream id) encrypted and authenticated (AES-GCM) with the
    index it is a position in. A stream id's sequence counts every entry of the deployment
    written in its millisecond, which is not a reader's to know; and a cursor only ever goes
    on the search that made it."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, stream_id: str, index: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, lex_member(stream_id).encode(), index.encode())
        return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def open(self, page_id: str, index: str) -> str:
        """The stream id `page_id` stands for; raises a 422 for one this search did not make."""
        try:
            raw = base64.urlsafe_b64decode(page_id + "=" * (-len(page_id) % 4))
            member = self._aead.decrypt(raw[:12], raw[12:], index.encode()).decode()
        except (ValueError, InvalidTag):
            raise invalid(
                "query",
                "page_id",
                msg="page_id is not a cursor of this search",
                error_type="value_error",
            ) from None
        return stream_id_of(member)


@dataclass(frozen=True)
class EventPage:
    """AuditEventPage as JSON data (audit_event.event_json): what the route answers."""

    items: list[dict[str, Any]]
    next_page_id: str | None

    def json(self) -> str:
        return json.dumps(
            {"items": self.items, "next_page_id": self.next_page_id},
            separators=(",", ":"),
            ensure_ascii=False,
        )


class AuditSearch:
    def __init__(self, redis: aioredis.Redis, cursor_key: bytes) -> None:
        """`cursor_key`: 32 bytes sealing the cursors (SecretBox.derive_key(CURSOR_PURPOSE))."""
        self._redis = redis
        self._cursors = Cursors(cursor_key)
        self._fetch = redis.register_script(_FETCH)

    def _org_of(self, principal: Principal, query: AuditQuery) -> str | None:
        """The organization the caller may read and asked for (None: every one, admins)."""
        if principal.is_admin:
            return query.org_id
        if principal.org_id is None or (query.org_id and query.org_id != principal.org_id):
            raise NotFound(f"organization {query.org_id or ''} not found".strip())
        if not may(principal, Action.AUDIT_READ):
            raise Forbidden(
                f"your role ({principal.org_role}) may not read this organization's audit log"
            )
        return principal.org_id

    def _plan(self, org_id: str | None, query: AuditQuery) -> Plan:
        lex = bool(query.target)
        if query.target:
            index = (
                keyspace.audit_org_target(org_id, query.target)
                if org_id
                else keyspace.audit_target(query.target)
            )
        elif query.user_id:
            index = (
                keyspace.audit_org_user(org_id, query.user_id)
                if org_id
                else keyspace.audit_user(query.user_id)
            )
        elif query.action:
            index = (
                keyspace.audit_org_action(org_id, query.action)
                if org_id
                else keyspace.audit_action(query.action)
            )
        elif org_id:
            index = keyspace.audit_org(org_id)
        else:
            index = keyspace.AUDIT
        # Whole milliseconds: since inclusive, until exclusive, in streams and sorted sets alike.
        low = f"{int(query.since.timestamp() * 1000)}-0" if query.since else "-"
        high = f"({int(query.until.timestamp() * 1000)}-0" if query.until else "+"
        if query.page_id:
            high = f"({self._cursors.open(query.page_id, index)}"
        return Plan(index, org_id, low, high, lex)

    async def search(self, principal: Principal, query: AuditQuery) -> EventPage:
        """One page, newest first (AuditEventPage's JSON). Raises NotFound (another
        organization) or Forbidden (a role that may not read the log)."""
        plan = self._plan(self._org_of(principal, query), query)
        mark = await self._redis.get(keyspace.AUDIT_INDEXED)
        items: list[dict[str, Any]] = []
        scanned = 0
        last: str | None = None
        for source in _sources(plan, text(mark) if mark else None):
            high = source.high
            while True:
                if len(items) >= query.limit or scanned >= MAX_SCANNED:
                    return EventPage(items, self._cursors.seal(last, plan.index) if last else None)
                want = min(max(query.limit - len(items), 16), MAX_SCANNED - scanned)
                ids = await self._ids(source, high, want)
                if not ids:
                    break
                scanned += len(ids)
                stream_ids = [text(i) for i, _ in ids]
                rows = (
                    [_decoded(fields) for _, fields in ids]
                    if source.index == keyspace.AUDIT
                    else await self._entries(stream_ids)
                )
                for stream_id, row in zip(stream_ids, rows, strict=True):
                    last = stream_id
                    if row is None:
                        continue  # trimmed from the log before its index entry
                    record = decoded_record(row)
                    if record is None:
                        continue  # undecodable (the indexer logs it): not every search's 500
                    if _matches(record, plan.org_id, query):
                        items.append(event_json(record))
                        if len(items) == query.limit:
                            break
                if len(ids) < want and last == stream_ids[-1]:
                    break
                high = f"({last}"
        return EventPage(items, None)

    async def _ids(self, plan: Plan, high: str, count: int) -> list[tuple[Any, Any]]:
        """(id, fields or None) of the index's newest `count` entries between plan.low and
        `high`."""
        if not plan.lex:
            found: Any = await self._redis.xrevrange(plan.index, high, plan.low, count=count)
            return list(found)
        members: Any = await self._redis.zrange(
            plan.index, _lex(high), _lex(plan.low), desc=True, bylex=True, offset=0, num=count
        )
        return [(stream_id_of(text(m)), None) for m in members]

    async def export(self, principal: Principal, query: AuditQuery) -> AsyncIterator[str]:
        """Every matching entry, newest first, one JSON line each (the rights checked first)."""
        page = await self.search(principal, query.model_copy(update={"limit": EXPORT_PAGE}))
        return self._lines(principal, query, page)

    async def _lines(
        self, principal: Principal, query: AuditQuery, page: EventPage
    ) -> AsyncIterator[str]:
        while True:
            for item in page.items:
                yield json_line(item) + "\n"
            if page.next_page_id is None:
                return
            page = await self.search(
                principal,
                query.model_copy(update={"limit": EXPORT_PAGE, "page_id": page.next_page_id}),
            )

    async def _entries(self, stream_ids: list[str]) -> list[dict[str, str] | None]:
        """The entries of `stream_ids` (None: trimmed), in one script call: a pipeline of as
        many XRANGEs costs the client several times more (each command packed and parsed)."""
        found: Any = await self._fetch(keys=[keyspace.AUDIT], args=stream_ids)
        return [_decoded(_pairs(flat)) if flat else None for flat in found]


def _sources(plan: Plan, mark: str | None) -> list[Plan]:
    """Where `plan`'s entries are, newest first: the log itself past the indexer's watermark
    `mark` (entries not indexed yet: every filter checked on them), then the index up to it."""
    if mark is None:
        return [replace(plan, index=keyspace.AUDIT, lex=False)]
    if plan.high != "+" and id_order(plan.high[1:]) <= id_order(mark):
        return [plan]  # the window (or the page) ends before the watermark
    tail_low = plan.low if plan.low != "-" and id_order(plan.low) > id_order(mark) else f"({mark}"
    tail = replace(plan, index=keyspace.AUDIT, lex=False, low=tail_low)
    if tail_low == plan.low:
        return [tail]  # the window starts past the watermark
    return [tail, replace(plan, high=mark)]


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _decoded(fields: dict[Any, Any]) -> dict[str, str]:
    return {text(k): text(v) for k, v in fields.items()}


def _lex(bound: str) -> str:
    """A stream id bound as a bound of the lex_member sorted set."""
    if bound in ("-", "+"):
        return bound
    if bound.startswith("("):
        return "(" + lex_member(bound[1:])
    return "[" + lex_member(bound)


def _matches(record: AuditRecord, org_id: str | None, query: AuditQuery) -> bool:
    if org_id is not None and (record.org_id or keyspace.AUDIT_NO_ORG) != org_id:
        return False
    if query.user_id and record.user_id != query.user_id:
        return False
    if query.action and record.action != query.action:
        return False
    return not query.target or query.target in indexed_targets(record.targets)
