"""Browser sign-in with an API key, and sign-out: the session cookie's whole life.

Each route answers HTML to a form post and JSON to a JSON body, so the same routes serve the
page and a script. The cookie is HttpOnly, SameSite=Strict, signed, expires with the session
(ACS_SESSION_TTL), and Secure when the request came over HTTPS.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, Field, SecretStr, ValidationError

from controlplane import keys
from controlplane.api.identity import authenticate_request, check_origin, limit_attempts
from controlplane.api.parsing import RequestValidationError, error_items, invalid, json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.models import Principal
from controlplane.auth.pages import sign_in_page, signed_in_page, signed_out_page
from controlplane.auth.sessions import COOKIE_NAME, NewSession
from controlplane.errors import ControlPlaneError, Unauthorized

routes = RouteTable(tag="auth")
M = TypeVar("M", bound=BaseModel)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
SIGN_IN = "/auth/sign-in"


class SignInRequest(BaseModel):
    api_key: SecretStr = Field(min_length=1, max_length=512)
    next: str = Field(default=SIGN_IN, max_length=2048, description="Local path to go to after")


class SignedIn(BaseModel):
    user_id: str
    is_admin: bool
    expires_at: datetime


class SignedOut(BaseModel):
    success: bool = True


class BadForm(ControlPlaneError):
    """Fields a form post got wrong: shown on the page (the JSON path raises the 422 instead)."""

    status = 422


async def read_fields(request: web.Request) -> tuple[dict[str, Any], bool]:
    """The body's fields and whether it was JSON (else a form). Empty: no fields, form.
    Raises RequestValidationError for JSON that is not an object."""
    if request.content_type in FORM_TYPES:
        try:
            form = await request.post()
        except (ValueError, AssertionError, UnicodeDecodeError, HttpProcessingError):
            # aiohttp's multipart reader asserts and raises on a missing or wrong boundary.
            raise RequestValidationError(
                [{"loc": ["body"], "msg": "malformed form body", "type": "value_error"}]
            ) from None
        return {k: v for k, v in form.items() if isinstance(v, str)}, False
    raw = await request.read()
    if not raw.strip():
        return {}, request.content_type == "application/json"
    if request.content_type not in ("application/json", "application/octet-stream", ""):
        raise invalid(
            "header",
            "content-type",
            msg=f"Content-Type must be application/json or a form, not {request.content_type}",
            error_type="content_type",
        )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise RequestValidationError(
            [{"loc": ["body"], "msg": "expected a JSON object or a form", "type": "json_invalid"}]
        )
    return data, True


def validate(model: type[M], data: dict[str, Any], is_json: bool) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        if is_json:
            raise RequestValidationError(error_items(exc, "body")) from None
        first = exc.errors(include_url=False)[0]
        raise BadForm(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def safe_next(value: str | None) -> str:
    """A local path to redirect to: never another site (`//host`, `/\\host`, `https://…`)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return SIGN_IN
    if any(ord(c) < 0x20 for c in value):
        return SIGN_IN
    return value


def is_https(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def base_url(request: web.Request) -> str:
    return f"{'https' if is_https(request) else 'http'}://{request.host}"


def see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def sign_in_redirect(next_url: str) -> web.Response:
    return see_other(f"{SIGN_IN}?next={quote(next_url, safe='')}")


async def browser_principal(request: web.Request) -> Principal | None:
    """The caller if they have a usable credential, else None (a page then offers sign-in)."""
    try:
        return await authenticate_request(request)
    except Unauthorized:
        return None


def _set_cookie(response: web.StreamResponse, request: web.Request, session: NewSession) -> None:
    response.set_cookie(
        COOKIE_NAME,
        session.cookie,
        max_age=request.app[keys.SESSIONS].ttl,
        path="/",
        httponly=True,
        samesite="Strict",
        secure=is_https(request),
    )


@routes.route("GET", SIGN_IN, summary="The sign-in page (HTML)", public=True, browser=True)
async def sign_in_form(request: web.Request) -> web.Response:
    next_url = request.query.get("next")
    principal = await browser_principal(request)
    if principal is not None:
        return signed_in_page(principal.user_id, safe_next(next_url) if next_url else None)
    return sign_in_page(safe_next(next_url))


@routes.route(
    "POST",
    SIGN_IN,
    summary="Sign in with an API key: sets the session cookie (form: 303 to `next`)",
    body=SignInRequest,
    response=SignedIn,
    public=True,
    errors=(401, 403, 429),
    browser=True,
)
async def sign_in(request: web.Request) -> web.StreamResponse:
    data, is_json = await read_fields(request)
    # Login CSRF: another site must not sign this browser in as the attacker.
    check_origin(request, required=False)
    await limit_attempts(request, "sign-in")
    next_url = safe_next(str(data.get("next") or ""))
    try:
        body = validate(SignInRequest, data, is_json)
    except BadForm as exc:
        return sign_in_page(next_url, exc.message, 422)
    try:
        principal = await request.app[keys.API_KEYS].authenticate(body.api_key.get_secret_value())
    except Unauthorized:
        if is_json:
            raise
        return sign_in_page(next_url, "That API key is not valid.", 401)
    session = await request.app[keys.SESSIONS].create(principal)
    response: web.StreamResponse
    if is_json:
        response = json_response(
            SignedIn(
                user_id=principal.user_id,
                is_admin=principal.is_admin,
                expires_at=datetime.fromtimestamp(session.expires_at, UTC),
            )
        )
    else:
        response = see_other(next_url)
    _set_cookie(response, request, session)
    return response


@routes.route(
    "POST",
    "/auth/sign-out",
    summary="End the browser session and clear its cookie (idempotent)",
    response=SignedOut,
    public=True,
    errors=(403,),
    browser=True,
)
async def sign_out(request: web.Request) -> web.StreamResponse:
    _, is_json = await read_fields(request)
    check_origin(request, required=False)
    cookie = request.cookies.get(COOKIE_NAME)
    if cookie:
        await request.app[keys.SESSIONS].revoke(cookie)
    response = json_response(SignedOut()) if is_json else signed_out_page()
    response.del_cookie(COOKIE_NAME, path="/")
    return response
