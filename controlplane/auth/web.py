"""Browser sign-in (through the OpenID provider, or with an API key), and sign-out: the session
cookie's whole life.

Each API-key route answers HTML to a form post and JSON to a JSON body, so the same routes serve
the page and a script. The cookie is HttpOnly, SameSite=Strict, signed, expires with the session
(ACS_SESSION_TTL), and Secure when the request came over HTTPS. The OpenID sign-in's own cookie
(`acs_oidc`) binds a started sign-in to the browser that started it: SameSite=Lax, since the
provider's redirect back is a cross-site navigation, and only for `/auth/oidc/`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web
from pydantic import BaseModel, Field, SecretStr

from controlplane import keys
from controlplane.api.parsing import json_response
from controlplane.api.routing import RouteTable
from controlplane.auth.forms import (
    SIGN_IN,
    BadForm,
    base_url,
    browser_principal,
    is_https,
    read_fields,
    safe_next,
    see_other,
    validate,
)
from controlplane.auth.identity import check_origin, limit_attempts
from controlplane.auth.oidc_flow import STATE_TTL, SignInFlow
from controlplane.auth.pages import (
    SignInOptions,
    continue_page,
    sign_in_page,
    signed_in_page,
    signed_out_page,
)
from controlplane.auth.sessions import COOKIE_NAME, NewSession
from controlplane.errors import ControlPlaneError, Forbidden, RuntimeUnavailable, Unauthorized

routes = RouteTable(tag="auth")
OIDC_COOKIE = "acs_oidc"
OIDC_PATH = "/auth/oidc/"
CALLBACK = "/auth/oidc/callback"


class SignInRequest(BaseModel):
    api_key: SecretStr = Field(min_length=1, max_length=512)
    next: str = Field(default=SIGN_IN, max_length=2048, description="Local path to go to after")


class SignedIn(BaseModel):
    user_id: str
    is_admin: bool
    expires_at: datetime


class SignedOut(BaseModel):
    success: bool = True


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


def _options(request: web.Request) -> SignInOptions:
    config = request.app[keys.CONFIG]
    oidc = keys.OIDC_SIGN_IN in request.app
    return SignInOptions(
        provider=config.oidc_display_name if oidc else None,
        api_key=config.api_key_sign_in or not oidc,
    )


@routes.route("GET", SIGN_IN, summary="The sign-in page (HTML)", public=True, browser=True)
async def sign_in_form(request: web.Request) -> web.Response:
    next_url = request.query.get("next")
    principal = await browser_principal(request)
    if principal is not None:
        return signed_in_page(principal.user_id, safe_next(next_url) if next_url else None)
    return sign_in_page(safe_next(next_url), options=_options(request))


def _flow(request: web.Request) -> SignInFlow:
    flow = request.app.get(keys.OIDC_SIGN_IN)
    if flow is None:
        raise web.HTTPNotFound()
    return flow


def _redirect_uri(request: web.Request) -> str:
    return request.app[keys.CONFIG].oidc_redirect_url or base_url(request) + CALLBACK


@routes.route(
    "GET",
    "/auth/oidc/start",
    summary="Sign in through the OpenID provider: a redirect to its login (303)",
    public=True,
    errors=(404, 429, 503),
    browser=True,
)
async def oidc_start(request: web.Request) -> web.Response:
    flow = _flow(request)
    await limit_attempts(request, "sign-in")
    started = await flow.start(_redirect_uri(request), safe_next(request.query.get("next")))
    response = see_other(started.url)
    response.set_cookie(
        OIDC_COOKIE,
        started.binding,
        max_age=STATE_TTL,
        path=OIDC_PATH,
        httponly=True,
        samesite="Lax",
        secure=is_https(request),
    )
    return response


@routes.route(
    "GET",
    CALLBACK,
    summary="Where the OpenID provider sends the browser back: opens the session (HTML)",
    public=True,
    errors=(401, 404, 429, 503),
    browser=True,
)
async def oidc_callback(request: web.Request) -> web.Response:
    flow = _flow(request)
    await limit_attempts(request, "sign-in")
    state, code = request.query.get("state", ""), request.query.get("code", "")
    error = request.query.get("error")
    try:
        if error or not state or not code or len(state) > 512 or len(code) > 2048:
            raise Unauthorized(f"the provider did not sign you in ({(error or 'no code')[:64]})")
        finished = await flow.finish(state, code, request.cookies.get(OIDC_COOKIE))
    except RuntimeUnavailable:
        raise
    except ControlPlaneError as exc:
        response = sign_in_page(SIGN_IN, exc.message, 401, _options(request))
        response.del_cookie(OIDC_COOKIE, path=OIDC_PATH)
        return response
    response = continue_page(finished.next_url)
    _set_cookie(response, request, finished.session)
    response.del_cookie(OIDC_COOKIE, path=OIDC_PATH)
    return response


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
    if not _options(request).api_key:
        raise Forbidden("sign in through the OpenID provider: /auth/oidc/start")
    try:
        body = validate(SignInRequest, data, is_json)
    except BadForm as exc:
        return sign_in_page(next_url, exc.message, 422, _options(request))
    try:
        principal = await request.app[keys.API_KEYS].authenticate(body.api_key.get_secret_value())
    except Unauthorized:
        if is_json:
            raise
        return sign_in_page(next_url, "That API key is not valid.", 401, _options(request))
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
