"""/oauth/device/*: the device authorization grant (RFC 8628) and its verification page.

authorize and token answer in OAuth's shapes (RFC 6749 §5.1/§5.2): errors are
`{"error", "error_description"}` (plus our `detail`), status 400 (429 past the rate limit), so the
OpenHands CLI reads them. Unknown request parameters are ignored, as RFC 6749 §3.1 requires.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane import keys
from controlplane.api.parsing import RequestValidationError, json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.device import GRANT_TYPE, DeviceAuthorization, DeviceToken, OAuthError
from controlplane.auth.forms import (
    BadForm,
    base_url,
    browser_principal,
    read_fields,
    sign_in_redirect,
    validate,
)
from controlplane.auth.identity import authenticate_request, limit_attempts
from controlplane.auth.pages import decided_page, verify_page
from controlplane.errors import Conflict, NotFound, QuotaExceeded, Unauthorized

routes = RouteTable(tag="auth")
VERIFY = "/oauth/device/verify"
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class DeviceTokenRequest(BaseModel):
    """Form-encoded (RFC 8628 §3.4) or JSON. grant_type may be left out (the OpenHands CLI
    does); client_id is accepted and ignored."""

    grant_type: Literal["urn:ietf:params:oauth:grant-type:device_code"] | None = None
    device_code: str = Field(min_length=1, max_length=256)
    client_id: str | None = None


class DeviceDecision(BaseModel):
    user_code: str = Field(min_length=1, max_length=32)
    action: Literal["approve", "deny"]


class DeviceDecided(BaseModel):
    user_code: str
    status: Literal["approved", "denied"]


def _oauth_error(exc: OAuthError, retry_after: int | None = None) -> web.Response:
    body: dict[str, object] = {
        "error": exc.code,
        "error_description": exc.message,
        "detail": exc.message,
    }
    if exc.interval is not None:
        body["interval"] = exc.interval
    headers = dict(NO_STORE)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return web.json_response(body, status=exc.status, headers=headers)


async def _oauth_fields(request: web.Request) -> dict[str, object]:
    try:
        data, _ = await read_fields(request)
    except RequestValidationError:
        raise OAuthError("invalid_request", "send a form-encoded or JSON object body") from None
    return data


@routes.route(
    "POST",
    "/oauth/device/authorize",
    summary="Start a device authorization (RFC 8628 §3.1): device code, user code, page URL",
    response=DeviceAuthorization,
    public=True,
    errors=(400, 429),
)
async def device_authorize(request: web.Request) -> web.Response:
    try:
        await _oauth_fields(request)
        await limit_attempts(request, "device-authorize")
    except OAuthError as exc:
        return _oauth_error(exc)
    except QuotaExceeded as exc:
        return _oauth_error(OAuthError("slow_down", exc.message, status=429), exc.retry_after)
    flow = request.app[keys.DEVICE_FLOW]
    started = await flow.authorize(base_url(request) + VERIFY)
    return web.json_response(started.model_dump(), headers=NO_STORE)


@routes.route(
    "POST",
    "/oauth/device/token",
    summary="Poll for the API key of an approved device code (RFC 8628 §3.4)",
    body=DeviceTokenRequest,
    response=DeviceToken,
    public=True,
    errors=(400, 429),
)
async def device_token(request: web.Request) -> web.Response:
    try:
        data = await _oauth_fields(request)
        grant_type, device_code = data.get("grant_type"), data.get("device_code")
        if grant_type not in (None, GRANT_TYPE):
            raise OAuthError("unsupported_grant_type", f"grant_type must be {GRANT_TYPE}")
        if not isinstance(device_code, str) or not 0 < len(device_code) <= 256:
            raise OAuthError("invalid_request", "device_code is required")
        try:
            token = await request.app[keys.DEVICE_FLOW].exchange(device_code)
        except OAuthError as exc:
            if exc.code == "invalid_grant":
                # Guessing device codes: count the misses per client address.
                await limit_attempts(request, "device-token")
            raise
    except OAuthError as exc:
        return _oauth_error(exc)
    except QuotaExceeded as exc:
        return _oauth_error(OAuthError("slow_down", exc.message, status=429), exc.retry_after)
    return web.json_response(token.model_dump(), headers=NO_STORE)


@routes.route(
    "GET",
    VERIFY,
    summary="The device approval page (HTML); sends a browser without a session to sign in",
    public=True,
    errors=(404, 409, 429),
    browser=True,
)
async def verify_form(request: web.Request) -> web.Response:
    principal = await browser_principal(request)
    if principal is None:
        return sign_in_redirect(request.path_qs)
    user_code = request.query.get("user_code", "")
    if not user_code:
        return verify_page(principal.user_id, "")
    await limit_attempts(request, "device-verify", principal.user_id)
    try:
        pending = await request.app[keys.DEVICE_FLOW].pending(user_code)
    except (NotFound, Conflict) as exc:
        return verify_page(principal.user_id, user_code, exc.message, exc.status)
    return verify_page(principal.user_id, pending.user_code)


@routes.route(
    "POST",
    VERIFY,
    summary="Approve or deny a user code as the caller (API key, session or single-user)",
    body=DeviceDecision,
    response=DeviceDecided,
    public=True,  # authenticates itself: a form post without a session goes to sign in
    errors=(401, 403, 404, 409, 429),
    browser=True,
)
async def verify_decide(request: web.Request) -> web.Response:
    data, is_json = await read_fields(request)
    try:
        principal = await authenticate_request(request)
    except Unauthorized:
        if is_json:
            raise
        return sign_in_redirect(f"{VERIFY}?user_code={quote(str(data.get('user_code', '')))}")
    await limit_attempts(request, "device-verify", principal.user_id)
    user_code = str(data.get("user_code") or "")
    try:
        decision = validate(DeviceDecision, data, is_json)
        approve = decision.action == "approve"
        shown = await request.app[keys.DEVICE_FLOW].decide(principal, user_code, approve=approve)
    except (NotFound, Conflict, BadForm) as exc:
        if is_json:
            raise
        return verify_page(principal.user_id, user_code, exc.message, exc.status)
    if is_json:
        return json_response(
            DeviceDecided(user_code=shown, status="approved" if approve else "denied")
        )
    return decided_page(shown, approve)
