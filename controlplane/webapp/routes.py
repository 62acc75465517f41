"""The two calls Agent Canvas makes to log in when it is served from this origin (cookie mode,
agent-canvas `src/api/main-app-auth.ts`): `POST /api/authenticate` says whether the browser's
session is valid (401 sends the app to `/login`), and `GET /login?returnTo=…` is our sign-in
page, coming back to the app once signed in."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.parsing import json_response, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.forms import SIGN_IN, safe_next, see_other

routes = RouteTable(tag="web-app")


class Authenticated(BaseModel):
    message: str = "Authenticated"


class LoginQuery(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    return_to: str | None = Field(
        default=None, alias="returnTo", max_length=2048, description="A local path to go back to"
    )


@routes.route(
    "POST",
    "/api/authenticate",
    summary="Whether the caller's credential (the browser session) is valid: 200, else 401",
    response=Authenticated,
)
async def authenticate(request: web.Request) -> web.Response:
    # The auth middleware has already refused a request without a valid credential.
    return json_response(Authenticated())


@routes.route(
    "GET",
    "/login",
    summary="Agent Canvas's login path: our sign-in page, then back to `returnTo`",
    query=LoginQuery,
    public=True,
    browser=True,
    status=303,
)
async def login(request: web.Request) -> web.Response:
    query = parse_query(request, LoginQuery)
    back = safe_next(query.return_to) if query.return_to else "/"
    return see_other(f"{SIGN_IN}?next={quote(back, safe='')}")
