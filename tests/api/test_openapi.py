"""/api/openapi.json: a valid OpenAPI 3.1 document that matches the routes actually served."""

from __future__ import annotations

import re
from typing import Any

import pytest
from openapi_spec_validator import validate

from controlplane.api.openapi import doc_path
from controlplane.app import route_tables
from tests.support.settings_fields import SPEC_FIELDS
from tests.support.types import Client


@pytest.fixture
async def doc(client: Client) -> dict[str, Any]:
    response = await client.get("/api/openapi.json")
    assert response.status == 200
    assert response.content_type == "application/json"
    body: dict[str, Any] = await response.json()
    return body


def _resolve(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/components/schemas/"), ref
    schema: dict[str, Any] = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema


def test_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"]
    assert doc["info"]["version"]
    validate(doc)  # raises OpenAPIValidationError with the offending path


def test_every_served_route_is_documented(client: Client, doc: dict[str, Any]) -> None:
    served = set()
    for route in client.app.router.routes():
        if route.method == "HEAD":
            continue
        resource = route.resource
        assert resource is not None
        path = re.sub(r"\{([^}:]+)(:[^}]*)?\}", r"{\1}", resource.canonical)
        served.add((route.method.lower(), path))
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert served == documented
    # Sanity: the foundation's routes are there.
    for item in [
        ("get", "/api/settings"),
        ("post", "/api/settings"),
        ("post", "/api/add-git-providers"),
        ("post", "/api/unset-provider-tokens"),
        ("put", "/api/secrets/{name}"),
        ("get", "/api/v1/sandbox-specs/search"),
    ]:
        assert item in documented


def test_path_parameters_are_declared(doc: dict[str, Any]) -> None:
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"\{([^}]+)\}", path))
        for op in ops.values():
            declared = {p["name"] for p in op["parameters"] if p["in"] == "path"}
            assert declared == names, path


def test_public_routes_need_no_security(doc: dict[str, Any]) -> None:
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert doc["paths"]["/api/openapi.json"]["get"]["security"] == []
    settings = doc["paths"]["/api/settings"]["get"]
    assert "security" not in settings  # the global requirement applies
    assert {"SessionApiKey": []} in doc["security"]
    schemes = doc["components"]["securitySchemes"]
    assert schemes["SessionApiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-Session-API-Key",
    }
    assert "401" in settings["responses"]


def test_settings_schema_has_every_spec_field(doc: dict[str, Any]) -> None:
    get_op = doc["paths"]["/api/settings"]["get"]
    ref = get_op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    schema = _resolve(doc, ref)
    properties = schema["properties"]
    missing = set(SPEC_FIELDS) - set(properties)
    assert not missing
    assert "llm_api_key_set" in schema["required"]
    for name in ("mcp_config", "secrets_store"):
        assert "$ref" in str(properties[name])
    assert properties["enable_default_condenser"]["default"] is True
    assert properties["enable_sound_notifications"]["default"] is False


def test_request_bodies_reference_the_pydantic_models(doc: dict[str, Any]) -> None:
    expected = {
        (ep.method.lower(), doc_path(ep.path)): (ep.body.__name__, not ep.body_optional)
        for table in route_tables()
        for ep in table.endpoints
        if isinstance(ep.body, type)
    }
    assert ("post", "/api/settings") in expected
    # A body the route may go without (an empty one means `{}`) is not required.
    assert expected[("post", "/api/v1/keys")] == ("NewKey", False)
    for (method, path), (model, required) in expected.items():
        op = doc["paths"][path][method]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}
        assert op["requestBody"]["required"] is required
        assert "422" in op["responses"]
        component = _resolve(doc, schema["$ref"])
        assert component["type"] == "object"
    # The events webhook takes one event or a list of them.
    webhook = doc["paths"]["/api/v1/webhooks/{sandbox_id}/events/{conversation_id}"]["post"]
    variants = webhook["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    assert {"$ref": "#/components/schemas/Event"} in variants
    assert {"type": "array", "items": {"$ref": "#/components/schemas/Event"}} in variants
    # Operations without a body declare none.
    assert "requestBody" not in doc["paths"]["/api/settings"]["get"]
    # Secret inputs are write-only passwords in the schema.
    update = doc["components"]["schemas"]["SettingsUpdate"]["properties"]
    for name in ("llm_api_key", "search_api_key", "sandbox_api_key"):
        assert {"format": "password", "type": "string", "writeOnly": True} in update[name]["anyOf"]
    assert doc["components"]["schemas"]["SettingsUpdate"]["additionalProperties"] is False


def test_validation_error_shape_is_documented(doc: dict[str, Any]) -> None:
    item = doc["components"]["schemas"]["ValidationErrorItem"]
    assert set(item["properties"]) == {"loc", "msg", "type"}
    assert item["properties"]["loc"] == {
        "items": {"type": "string"},
        "title": "Loc",
        "type": "array",
    }
    search = doc["paths"]["/api/v1/sandbox-specs/search"]["get"]
    limit = next(p for p in search["parameters"] if p["name"] == "limit")
    assert limit["in"] == "query"
    assert limit["schema"]["minimum"] == 1
    assert limit["schema"]["maximum"] == 100
