"""The audit middleware: every request of a route that changes state (controlplane/audit/actions.py)
runs inside an audit scope (controlplane/store/audit.py), which the stores below the handler
read to add the request's entry to their own write (one transaction: an action that happened has
its entry). What no store recorded is recorded here once the outcome is known:

- a refusal or failure of an authenticated caller (403, 404, 409, 422, 429, 5xx…), with the
  error's code as its reason;
- a failed sign-in (`auth.sign_in`, failure), whoever sent it (but its 429s: the sign-in rate
  limit's refusals are in the request log);
- a success whose change happened outside this service's Redis (a message forwarded to the
  sandbox's agent, a no-op such as pausing a paused sandbox): written after the answer is known.

Unauthenticated requests to other routes leave no entry: anyone could send them, without
limit but the pacing (controlplane/api/pacing.py), and an entry each would let them fill Redis.
They are in the request log line.

It sits inside the error middleware, outside authentication: it sees the domain error (its
code), and the principal authentication finds.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import RequestValidationError
from controlplane.api.routing import Handler
from controlplane.audit.actions import action_of
from controlplane.auth.identity import PRINCIPAL
from controlplane.errors import ControlPlaneError
from controlplane.store import audit
from controlplane.store.audit import Actor, AuditAction

REQUEST_ID_HEADER = "X-Request-ID"
_ID_SHAPE = re.compile(r"^[A-Za-z0-9_.@:-]{1,128}$")
ALWAYS = frozenset({AuditAction.SIGN_IN})
"""Actions whose failures are recorded even without a caller: a failed sign-in is the point."""


def _targets(request: web.Request) -> dict[str, str]:
    """The ids in the route's path (and `name`: a profile's, a secret's), well-formed only."""
    return {
        name: value
        for name, value in request.match_info.items()
        if (name.endswith("_id") or name == "name") and _ID_SHAPE.match(value)
    }


def _request_id(request: web.Request) -> str | None:
    """The client's X-Request-ID as the context middleware keeps it (else it makes its own,
    which the entry then lacks)."""
    given = request.headers.get(REQUEST_ID_HEADER)
    return given if given and len(given) <= 64 and given.isprintable() else None


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"http_{status}"


@web.middleware
async def audit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    log = request.app.get(keys.AUDIT_LOG)
    resource = request.match_info.route.resource
    if log is None or resource is None or request.match_info.http_exception is not None:
        return await handler(request)
    # Every request has a scope, audited route or not: what a read can set off is recorded
    # with its own action (the provider refusing a signed-in user at a session check ends the
    # session and suspends their keys; a device's poll makes the key its user approved).
    action = action_of(request.method, resource.canonical)

    def actor() -> Actor | None:
        principal = request.get(PRINCIPAL)
        return principal.actor() if principal is not None else None

    scope = audit.Scope(
        log=log,
        actor=actor,
        ip=request.remote,
        user_agent=request.headers.get("User-Agent"),
        request_id=_request_id(request),
        action=action,
        targets=_targets(request),
    )
    with audit.acting(scope):
        if action is None:
            return await handler(request)
        try:
            response = await handler(request)
        except ControlPlaneError as exc:
            await _failed(request, scope, exc.status, exc.code)
            raise
        except RequestValidationError:
            await _failed(request, scope, 422, "invalid_input")
            raise
        except web.HTTPException as exc:
            if exc.status >= 400:
                await _failed(request, scope, exc.status, _reason(exc.status))
            raise
        except Exception:
            await _failed(request, scope, 500, "internal_error")
            raise
        if response.status >= 400:
            await _failed(request, scope, response.status, _reason(response.status))
        elif not scope.has_recorded(action.value) and request.get(PRINCIPAL) is not None:
            await audit.record(status=response.status)
        return response


async def _failed(request: web.Request, scope: audit.Scope, status: int, reason: str) -> None:
    if scope.action is None or scope.has_recorded(scope.action.value):
        return
    if request.get(PRINCIPAL) is None and (scope.action not in ALWAYS or status == 429):
        return  # anyone may send these, as many as they like: the request log has them
    await audit.record(outcome="failure", status=status, reason=reason)
