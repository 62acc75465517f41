"""The OpenAPI 3.1 document, generated from the endpoints' own pydantic models."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from controlplane.api.routing import Endpoint

REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")


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
    401: "Missing or invalid API key",
    404: "Not found (also: another user's resource)",
    409: "Conflict with the current state",
    413: "Request body too large",
    429: "Over a quota or rate limit; see Retry-After",
    503: "Redis or the Docker engine is unreachable",
}


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
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(ep.path)
    ]
    if ep.query is not None:
        schema = ep.query.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            params.append(
                {
                    "name": name,
                    "in": "query",
                    "required": name in required,
                    "schema": prop,
                    **({"description": prop["description"]} if "description" in prop else {}),
                }
            )
    return params


def _operation(ep: Endpoint, components: dict[str, Any]) -> dict[str, Any]:
    responses: dict[str, Any] = {
        str(ep.status): {
            "description": "Success",
            "content": {
                "application/json": {"schema": _schema(ep.response, "serialization", components)}
            }
            if ep.response is not None
            else {},
        }
    }
    error_ref = {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}}
    codes = set(ep.errors) | {413} if ep.body is not None else set(ep.errors)
    if not ep.public:
        codes |= {401, 503}
    for code in sorted(codes):
        responses[str(code)] = {"description": _REASONS.get(code, "Error"), "content": error_ref}
    if ep.body is not None or ep.query is not None:
        responses["422"] = {
            "description": "Validation error",
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model="ValidationErrorBody")}}
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
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _schema(ep.body, "validation", components)}},
        }
    if ep.public:
        op["security"] = []
    return op


def build_openapi(endpoints: Iterable[Endpoint], version: str) -> dict[str, Any]:
    components: dict[str, Any] = {}
    _schema(ErrorBody, "serialization", components)
    _schema(ValidationErrorBody, "serialization", components)
    paths: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        path = _PATH_PARAM.sub(lambda m: "{" + m.group(1) + "}", ep.path)
        paths.setdefault(path, {})[ep.method.lower()] = _operation(ep, components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Agent Conversation Service",
            "version": version,
            "description": "Control plane for AI software agents running in Docker sandboxes.",
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
