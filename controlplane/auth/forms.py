"""Browser forms of the sign-in and device pages: reading a form or JSON body, validating it, and
the redirects between the pages (controlplane/auth/web.py, oauth.py)."""

from __future__ import annotations

import json
from typing import Any, TypeVar
from urllib.parse import quote

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ValidationError

from controlplane.api.parsing import RequestValidationError, error_items, invalid
from controlplane.auth.identity import authenticate_request
from controlplane.auth.models import Principal
from controlplane.errors import ControlPlaneError, Unauthorized

M = TypeVar("M", bound=BaseModel)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
SIGN_IN = "/auth/sign-in"


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
