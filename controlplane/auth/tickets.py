"""WebSocket tickets: a short-lived, single-use credential for one WebSocket, so that a browser
need not put an API key or a session key in a URL (URLs end up in ingress and proxy logs,
browser history and Referer headers).

An authenticated caller mints a ticket for one target (its conversation's events socket, or its
sandbox's proxy); the handshake presents it as `?acs_ticket=` and the ticket is consumed
(GETDEL): it opens one socket, within TICKET_TTL seconds of being minted, for that target only,
as the user who minted it. Redis holds only its SHA-256, so a copy of Redis holds no usable
ticket. Routes: events/ticket_routes.py (minting), events/routes.py and proxy/routes.py
(redeeming).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from controlplane.auth.models import Principal
from controlplane.store import audit, keyspace
from controlplane.store.audit import AuditAction
from controlplane.store.streams import stored

TICKET_TTL = 30
"""Seconds: long enough for a page to open its socket, short enough that a ticket seen in a log
is useless by the time anyone reads it (and it is single-use besides)."""
QUERY_PARAM = "acs_ticket"
"""The handshake's query parameter (a name a sandbox's own application is unlikely to use)."""
Scope = Literal["conversation", "sandbox"]


class Ticket(BaseModel):
    ticket: str = Field(description=f"Present as `?{QUERY_PARAM}=` on the WebSocket handshake")
    expires_at: datetime
    expires_in: int = Field(description="Seconds")


def _key(ticket: str) -> str:
    return keyspace.ws_ticket(hashlib.sha256(ticket.encode()).hexdigest())


class TicketService:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def mint(self, principal: Principal, scope: Scope, target: str) -> Ticket:
        """A ticket opening one WebSocket of `scope` on `target` as `principal` (the caller has
        checked that `principal` may)."""
        ticket = "wst_" + secrets.token_urlsafe(32)
        body = {
            "user_id": principal.user_id,
            "is_admin": principal.is_admin,
            "key_id": principal.key_id,
            "scope": scope,
            "target": target,
        }
        # Its audit entry names what it opens, never the ticket.
        made = audit.route_entry(AuditAction.TICKET_CREATE, **{f"{scope}_id": target})
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(_key(ticket), json.dumps(body), ex=TICKET_TTL)
            if made is not None:
                made.queue(pipe)
            await pipe.execute()
        stored(made)
        expires = datetime.now(UTC) + timedelta(seconds=TICKET_TTL)
        return Ticket(ticket=ticket, expires_at=expires, expires_in=TICKET_TTL)

    async def redeem(self, ticket: str, scope: Scope, target: str) -> Principal | None:
        """The user the ticket was minted for, if it is for this very target and neither used
        nor expired; None otherwise. Either way the ticket is used up."""
        if not ticket.startswith("wst_") or len(ticket) > 64:
            return None
        raw = await self._redis.getdel(_key(ticket))
        if raw is None:
            return None
        body = json.loads(raw)
        if body.get("scope") != scope or not secrets.compare_digest(
            str(body.get("target", "")), target
        ):
            return None
        return Principal(
            user_id=body["user_id"], is_admin=body["is_admin"], key_id=body["key_id"], via="ticket"
        )
