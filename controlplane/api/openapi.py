"""The OpenAPI 3.1 document, generated from the endpoints' own pydantic models."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from controlplane.api.routing import Endpoint

REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"\{([^}:]+)(?::([^}]*))?\}")


class ValidationErrorItem(BaseModel):
    loc: list[str]
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    detail: list[ValidationErrorItem]


class ErrorBody(BaseModel):
    detail: str
    request_id: str | None = None


_REASONS = {
    303: "A form post or a page without a session: redirected (browsers)",
    400: "Malformed HTTP request (request line or a header over 8,190 bytes, a bad header, ...)",
    401: "Missing or invalid API key",
    403: "Not allowed for this key, or a cross-origin request refused",
    404: "Not found (also: another user's resource)",
    409: "Conflict with the current state",
    413: "Request body too large",
    429: "Over a quota or rate limit; see Retry-After",
    503: "Redis or the sandbox runtime is unreachable",
    504: "The request took longer than ACS_REQUEST_TIMEOUT",
}
WEBHOOK_PREFIX = "/api/v1/webhooks/"
HTML = {"text/html": {"schema": {"type": "string"}}}
# Browsers post sign-in and approval forms url-encoded; multipart is read too but not offered.
FORMS = ("application/x-www-form-urlencoded",)


def status_codes(ep: Endpoint) -> set[int]:
    """Every error status the route can answer, besides 422 (which has its own body).

    Any route: 400 from aiohttp's parser, 504 from the time limit. Routes behind an API key: 401,
    the per-key rate limit's 429, 503 when Redis is down. Webhooks: the sandbox key's 401, the
    per-sandbox rate limit's 429, 404 for a conversation the sandbox does not hold, 503.
    """
    codes = set(ep.errors) | {400, 504}
    if ep.body is not None:
        codes.add(413)
    if not ep.public:
        codes |= {401, 429, 503}
    if ep.path.startswith(WEBHOOK_PREFIX):
        codes |= {401, 404, 413, 429, 503}
    if ep.browser:
        codes.add(303)
    return codes


def _schema(
    tp: Any, mode: Literal["validation", "serialization"], components: dict[str, Any]
) -> dict[str, Any]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        schema = tp.model_json_schema(ref_template=REF, mode=mode)
        components.update(schema.pop("$defs", {}))
        components[tp.__name__] = schema
        return {"$ref": REF.format(model=tp.__name__)}
    schema = TypeAdapter(tp).json_schema(ref_template=REF, mode=mode)
    components.update(schema.pop("$defs", {}))
    return schema


def _parameters(ep: Endpoint, components: dict[str, Any]) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", **({"pattern": f"^{regex}$"} if regex else {})},
        }
        for name, regex in _PATH_PARAM.findall(ep.path)
    ]
    for where, model in (("query", ep.query), ("header", ep.headers)):
        if model is None:
            continue
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            params.append(
                {
                    "name": name,
                    "in": where,
                    "required": name in required,
                    "schema": prop,
                    **({"description": prop["description"]} if "description" in prop else {}),
                }
            )
    return params


def _operation(ep: Endpoint, components: dict[str, Any]) -> dict[str, Any]:
    html = HTML if ep.browser else {}
    success: dict[str, Any] = {}
    if ep.response is not None:
        success["application/json"] = {"schema": _schema(ep.response, "serialization", components)}
    responses: dict[str, Any] = {
        str(ep.status): {"description": "Success", "content": {**success, **html}}
    }
    error_ref = {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}, **html}
    for code in sorted(status_codes(ep)):
        if code == 303:
            responses["303"] = {"description": _REASONS[303]}
            continue
        responses[str(code)] = {"description": _REASONS.get(code, "Error"), "content": error_ref}
    if ep.body is not None or ep.query is not None or ep.path.startswith(WEBHOOK_PREFIX):
        responses["422"] = {
            "description": "Validation error",
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model="ValidationErrorBody")}},
                **html,
            },
        }
    op: dict[str, Any] = {
        "summary": ep.summary,
        "operationId": f"{ep.tag}_{ep.handler.__name__}",
        "tags": [ep.tag],
        "parameters": _parameters(ep, components),
        "responses": responses,
    }
    if ep.body is not None:
        body = {"schema": _schema(ep.body, "validation", components)}
        content = {"application/json": body}
        if ep.browser:
            content |= {form: body for form in FORMS}
        op["requestBody"] = {"required": not ep.body_optional, "content": content}
    if ep.public:
        op["security"] = []
    return op


def doc_path(path: str) -> str:
    """A route's path as the document names it: `{name}` without the route's regex."""
    return _PATH_PARAM.sub(lambda m: "{" + m.group(1) + "}", path)


def build_openapi(endpoints: Iterable[Endpoint], version: str) -> dict[str, Any]:
    components: dict[str, Any] = {}
    _schema(ErrorBody, "serialization", components)
    _schema(ValidationErrorBody, "serialization", components)
    paths: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        path = doc_path(ep.path)
        paths.setdefault(path, {})[ep.method.lower()] = _operation(ep, components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Agent Conversation Service",
            "version": version,
            "description": "Control plane for AI software agents running in sandboxes (Docker or "
            "Kubernetes).",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "SessionApiKey": {"type": "apiKey", "in": "header", "name": "X-Session-API-Key"},
                "Bearer": {"type": "http", "scheme": "bearer"},
                # The browser session from POST /auth/sign-in (docs/api.md#browsers).
                "SessionCookie": {"type": "apiKey", "in": "cookie", "name": "acs_session"},
            },
        },
        "security": [{"SessionApiKey": []}, {"Bearer": []}, {"SessionCookie": []}],
    }
