"""Request context, canonical log line and HTTP metrics, error mapping, body size limit,
authentication, per-key rate limit and the request time limit.

Order (outermost first): context → pacing → errors → size limit → audit
(controlplane/audit/middleware.py) → auth → webhook auth → rate limit → time limit → handler.

Nothing before the handler reads the request body (aiohttp reads it lazily), so a request refused
by a middleware costs no body read; and a refusal whose body is still arriving closes the
connection instead of reading the rest (`_drop_unread_body`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import structlog
from aiohttp import web

from controlplane import keys
from controlplane.api.parsing import RequestValidationError
from controlplane.api.ratelimit import webhook_refusal
from controlplane.api.routing import Handler, has_own_key_check, has_own_limits, is_public
from controlplane.auth.identity import ORGS_READ, PRINCIPAL, authenticate_request
from controlplane.crypto import hash_api_key
from controlplane.errors import ControlPlaneError, InvalidInput, QuotaExceeded, Unauthorized
from controlplane.sandboxes.reads import MAX_SESSION_KEY
from controlplane.store.pool import StoreBusy
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger("controlplane.http")

REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id")
DEADLINE: web.RequestKey[asyncio.Timeout | None] = web.RequestKey("deadline")
PACED: web.RequestKey[bool] = web.RequestKey("paced")
WEBHOOK_PATH = "/api/v1/webhooks/"
ORG_HEADER = "X-Org-Id"
SMALL_BODY = 64 * 1024
"""Refusals read a declared body up to this size (keeping the connection); above, they close."""


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "<unmatched>"


@web.middleware
async def context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind a request id to the log context and write one canonical line per request."""
    request_id = request.headers.get("X-Request-ID") or secrets.token_hex(8)
    if len(request_id) > 64 or not request_id.isprintable():
        request_id = secrets.token_hex(8)
    request[REQUEST_ID] = request_id
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        response.headers["X-Request-ID"] = request_id
        return response
    finally:
        principal = request.get(PRINCIPAL)
        route = _route_name(request)
        elapsed = time.perf_counter() - started
        if not request.get(PACED):  # paced ones are counted in one line every few seconds
            log.info(
                "request",
                method=request.method,
                route=route,
                path=request.path,
                status=status,
                duration_ms=round(elapsed * 1000, 2),
                user_id=principal.user_id if principal else None,
            )
        metrics = request.app.get(keys.METRICS)
        if metrics is not None:
            metrics.observe_request(request.method, route, status, elapsed)


def _is_webhook(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical.startswith(WEBHOOK_PATH)


@web.middleware
async def pacing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Requests that end without a principal (refusals, public routes; not a sandbox's accepted
    webhook) share the app's Pacer budget; past it their answers wait (controlplane/api/pacing.py).
    """
    response = await handler(request)
    pacer = request.app.get(keys.PACER)
    if pacer is None or request.get(PRINCIPAL) is not None or response.prepared:
        return response
    if response.status < 400 and _is_webhook(request):
        return response
    wait = pacer.delay()
    if wait > 0:
        request[PACED] = True
        count = pacer.count_paced()
        if count:
            log.warning("unauthenticated_requests_paced", count=count, budget_per_s=pacer.rate)
        await asyncio.sleep(wait)
    return response


def _detail(status: int, detail: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"detail": detail}, status=status, headers=headers)


def _drop_unread_body(request: web.Request, response: web.StreamResponse) -> None:
    """An error answered before its body arrived: close the connection after the answer instead
    of reading the rest. aiohttp would otherwise read and discard it (up to 10 s) to keep the
    connection alive: a megabyte of unauthenticated upload would cost what an upload does.

    A client that sends its whole body before reading may see the connection reset rather than
    this answer; that is the price of not reading what nobody may send.
    """
    if not request.body_exists or request.content.is_eof():
        return
    if request.content_length is not None and request.content_length <= SMALL_BODY:
        # Closing on a small body that is still in flight (clients often send it in a second
        # segment) resets the connection before the client reads the answer: read it instead.
        return
    response.force_close()
    request.protocol.close()  # ignore whatever else arrives on this connection, unparsed
    request.content.feed_eof()  # nothing left to linger for
    if request.transport is not None:
        request.transport.pause_reading()  # and leave the rest in the kernel, uncopied


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every failure in the documented JSON shapes; log unexpected ones once."""
    response = await _render_errors(request, handler)
    if response.status >= 400 and not response.prepared:
        _drop_unread_body(request, response)
        if "Upgrade" in request.headers:
            # aiohttp parses nothing more on a connection that asked for an upgrade: say so, or
            # the client reuses it and its next request dies unanswered.
            response.force_close()
    return response


async def _render_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestValidationError as exc:
        return _detail(422, exc.items)
    except InvalidInput as exc:
        return _detail(422, [{"loc": exc.loc, "msg": exc.message, "type": exc.error_type}])
    except QuotaExceeded as exc:
        return _detail(exc.status, exc.message, {"Retry-After": str(exc.retry_after)})
    except ControlPlaneError as exc:
        if exc.status >= 500:
            log.warning("request_failed", code=exc.code, error=exc.message)
        return _detail(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return _detail(exc.status, exc.reason, headers)
    except StoreBusy as exc:
        # Redis answers; this replica's connections to it were all in use for the whole wait.
        log.warning("store_busy", code=exc.code, error=str(exc))
        metrics = request.app.get(keys.METRICS)
        if metrics is not None:
            metrics.store_busy.inc()
        return _detail(
            503,
            "the service is busy (every Redis connection stayed in use); retry shortly",
            {"Retry-After": str(exc.retry_after)},
        )
    except REDIS_DOWN as exc:
        log.warning("redis_unavailable", error=str(exc))
        return _detail(503, "Redis is unreachable; the service retries on every request")
    except Exception:
        log.exception("unhandled_error")
        return web.json_response(
            {"detail": "Internal server error", "request_id": request.get(REQUEST_ID)},
            status=500,
        )


def size_limit_middleware(limit: int) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if has_own_limits(request):
            return await handler(request)  # a model call: the gateway's own, larger limit
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(
                max_size=limit,
                actual_size=request.content_length,
                text=f"request body is larger than {limit} bytes",
            )
        return await handler(request)

    return middleware


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every route but the public ones needs an API key, a browser session or single-user mode
    (controlplane/auth/identity.py); the principal then carries the organization it acts in
    and its role there."""
    if is_public(request) or request.method == "OPTIONS":
        return await handler(request)
    principal = await authenticate_request(request)
    organizations = request.app.get(keys.ORGANIZATIONS)
    if organizations is not None:
        # Where the caller acts: X-Org-Id (what Agent Canvas sends), else their key's or
        # current organization (organizations/service.py); from the memberships read with
        # the key, in its round trip, where the caller came with one.
        principal = await organizations.scope(
            principal, request.headers.get(ORG_HEADER), request.get(ORGS_READ)
        )
    request[PRINCIPAL] = principal
    structlog.contextvars.bind_contextvars(user_id=principal.user_id)
    return await handler(request)


class SeenKeys:
    """The session key each sandbox last posted events with successfully to this replica, as
    its SHA-256: which webhook posts may go to their handler's one round trip (whose script
    checks the key again, so a key that stopped being good is refused there and forgotten
    here). Only a hint of where to check, never the check itself; at most `size` sandboxes (all
    forgotten when full, then learnt again at one GET each)."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._hashes: dict[str, str] = {}

    def matches(self, sandbox_id: str, key: str) -> bool:
        known = self._hashes.get(sandbox_id)
        return known is not None and secrets.compare_digest(known, hash_api_key(key))

    def note(self, sandbox_id: str, key: str) -> None:
        if len(self._hashes) >= self.size:
            self._hashes.clear()
        self._hashes[sandbox_id] = hash_api_key(key)

    def forget(self, sandbox_id: str) -> None:
        self._hashes.pop(sandbox_id, None)


@web.middleware
async def webhook_auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Sandbox webhooks (public to the API-key check) need the sandbox's own session key, checked
    here before the handler reads the body, and noted on the request (keys.WEBHOOK_SANDBOX) for
    the handler's service, which checks it itself when called without it. Then the
    per-sandbox rate limit (ACS_WEBHOOK_RATE_LIMIT_PER_MINUTE): a runaway agent cannot flood
    Redis, and its 429 never costs the body read either.

    A route with `own_key_check` (the events webhook), a key of a key's length and a body of
    at most SMALL_BODY bytes (which a refusal reads anyway, `_drop_unread_body`) is left to its
    handler, which makes the same checks in the Redis round trip that stores the events (one
    round trip a post instead of four), once the key is known good here (SeenKeys: the
    sandbox's key of its last good post; any other is looked up first, before the body, and
    refused there when wrong). The order of the answers stays: a body the handler
    refuses (422) before that round trip is answered 401 or 429 first where the key or the rate
    says so."""
    sandbox_id = request.match_info.get("sandbox_id")
    if (
        sandbox_id is None
        or not _is_webhook(request)
        or request.match_info.http_exception is not None
    ):
        return await handler(request)
    key, length = request.headers.get("X-Session-API-Key"), request.content_length
    if (
        has_own_key_check(request)
        and key
        and len(key) <= MAX_SESSION_KEY  # no key (of a key's length): refused before the body
        and length is not None
        and length <= SMALL_BODY
    ):
        seen = request.app.get(keys.WEBHOOK_KEYS)
        if seen is None or not seen.matches(sandbox_id, key):
            # Not this replica's last good key of the sandbox: looked up before the body is
            # read, so that a wrong key costs one GET, never a 64 KiB parse (a flood of them
            # would otherwise cost what the agents' own posts do).
            sandboxes = request.app.get(keys.SANDBOXES)
            if sandboxes is None or await sandboxes.id_for_session_key(key, sandbox_id) is None:
                raise Unauthorized("invalid sandbox session key")
            if seen is not None:
                seen.note(sandbox_id, key)
        try:
            return await handler(request)
        except (RequestValidationError, InvalidInput):
            await _check_webhook(request, sandbox_id)
            raise
        except Unauthorized:
            if seen is not None:
                seen.forget(sandbox_id)  # the script's own check refused it: deleted, or changed
            raise
    await _check_webhook(request, sandbox_id)
    request[keys.WEBHOOK_SANDBOX] = sandbox_id
    return await handler(request)


async def _check_webhook(request: web.Request, sandbox_id: str) -> None:
    """The sandbox's session key (401), then one request counted against its rate (429)."""
    key = request.headers.get("X-Session-API-Key")
    sandboxes = request.app.get(keys.SANDBOXES)
    if sandboxes is None or await sandboxes.id_for_session_key(key, sandbox_id) is None:
        raise Unauthorized("invalid sandbox session key")
    limiter = request.app.get(keys.WEBHOOK_LIMITER)
    if limiter is not None:
        decision = await limiter.hit(f"sandbox:{sandbox_id}")
        if not decision.allowed:
            raise webhook_refusal(decision)


@web.middleware
async def rate_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """At most config.rate_limit_per_minute requests per API key (Principal.key_id).

    Requests without a principal (public routes: health, webhooks from sandboxes, the WebSocket
    and /metrics, which authenticate themselves) are not limited. Over the limit: 429 with
    Retry-After, the seconds until the key's window resets.
    """
    limiter = request.app.get(keys.RATE_LIMITER)
    principal = request.get(PRINCIPAL)
    if limiter is None or principal is None:
        return await handler(request)
    decision = await limiter.hit(principal.key_id)
    if not decision.allowed:
        raise QuotaExceeded(
            f"rate limit of {decision.limit} requests per minute for this API key reached;"
            f" retry in {decision.reset_after} s",
            retry_after=decision.reset_after,
        )
    response = await handler(request)
    if not response.prepared:
        response.headers["X-RateLimit-Limit"] = str(decision.limit)
        response.headers["X-RateLimit-Remaining"] = str(decision.remaining)
    return response


def timeout_middleware(seconds: float) -> Any:
    """Cancel a handler that takes longer than `seconds` and answer 504 JSON.

    A streaming response (the events WebSocket, stream-start) is bounded only until it starts:
    `lift_deadline`, on the app's on_response_prepare signal, removes the deadline then. A route
    declared with `own_limits` (the LLM gateway's model calls) has none: its own time-outs apply.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if has_own_limits(request):
            request[DEADLINE] = None
            return await handler(request)  # a model call: the gateway's own time-outs bound it
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                request[DEADLINE] = deadline
                return await handler(request)
        except TimeoutError:
            if not deadline.expired():
                raise  # a timeout of the handler's own, not ours
            log.warning("request_timeout", limit_s=seconds)
            return _detail(504, f"request took longer than {seconds:g} s")
        finally:
            request[DEADLINE] = None

    return middleware


async def lift_deadline(request: web.Request, _response: web.StreamResponse) -> None:
    """on_response_prepare: a response that starts streaming inside its handler has passed its
    set-up within the time limit; from here on it lasts as long as the stream does."""
    deadline = request.get(DEADLINE)
    if deadline is not None:
        deadline.reschedule(None)
