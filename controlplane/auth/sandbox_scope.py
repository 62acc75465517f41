"""A user's key together with one of their sandboxes' session keys: OpenHands' rule for the calls
SDK code makes from inside a sandbox (`OpenHandsCloudWorkspace.get_llm()`, `get_mcp_config()`:
`Authorization: Bearer <user key>` plus `X-Session-API-Key: <sandbox key>`).

The bearer key says who calls; the session key must then be that of a sandbox the same user owns
(else 401: a stolen session key does not extend anyone's key, and a key of one user cannot pair
with another's sandbox). The request then carries that sandbox (keys.SANDBOX_SCOPE): the routes
that hand out more to code in a sandbox (`GET /api/v1/users/me?expose_secrets=true`) ask for it
(`running_scope`). A session key alone is not a user's credential; the sandbox-scoped routes
accept it for what that sandbox may see (controlplane/sandboxes/secret_routes.py).
"""

from __future__ import annotations

from aiohttp import web

from controlplane import keys
from controlplane.auth.models import Principal
from controlplane.errors import Unauthorized


def bearer_of(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() != "bearer ":
        return None
    return auth[7:].strip() or None


def paired_session_key(request: web.Request) -> str | None:
    """The X-Session-API-Key sent next to a different bearer key, if any (an empty one, as the
    SDK sends before it knows its sandbox's key, counts as none)."""
    bearer = bearer_of(request)
    session = (request.headers.get("X-Session-API-Key") or "").strip()
    if bearer is None or not session or session == bearer:
        return None
    return session


async def check_sandbox_scope(request: web.Request, principal: Principal, key: str) -> None:
    """Record the caller's sandbox of `key` as SANDBOX_SCOPE. Raises Unauthorized when `key` is
    no session key of a sandbox `principal` owns (admins included: a scope is one user's)."""
    sandboxes = request.app.get(keys.SANDBOXES)
    record = await sandboxes.by_session_key(key) if sandboxes is not None else None
    if record is None or record.owner != principal.user_id:
        raise Unauthorized("X-Session-API-Key is not the session key of one of your sandboxes")
    request[keys.SANDBOX_SCOPE] = record


def running_scope(request: web.Request) -> str | None:
    """The id of the caller's sandbox that `check_sandbox_scope` recorded, while it runs."""
    record = request.get(keys.SANDBOX_SCOPE)
    # SandboxStatus is a StrEnum of sandboxes/, a layer above this one: compared by its value.
    return record.id if record is not None and record.status == "RUNNING" else None
