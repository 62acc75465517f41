"""GET/POST /api/settings: spec table 2.1 fields, defaults, merge semantics, bounds."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.settings.models import ProviderType
from tests.support.records import stored_user_record
from tests.support.settings_fields import EVERY_FIELD, NULL, SECRET_FIELDS, SPEC_FIELDS
from tests.support.types import Client, UserHeaders


async def _get(client: Client, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.get("/api/settings", headers=headers)
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


async def _post(client: Client, headers: dict[str, str], body: Any) -> tuple[int, Any]:
    response = await client.post("/api/settings", headers=headers, json=body)
    return response.status, await response.json()


async def test_fresh_user_gets_every_spec_field_with_defaults(
    client: Client, user_headers: UserHeaders
) -> None:
    body = await _get(client, await user_headers("alice"))
    for name, (types, default) in SPEC_FIELDS.items():
        assert name in body, name
        value = body[name]
        assert type(value) in types, (name, value)
        assert value == default, (name, value)
        if isinstance(default, bool):
            assert value is default, name


async def test_round_trip_of_every_non_secret_field(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    status, body = await _post(client, headers, EVERY_FIELD)
    assert (status, body) == (200, {"message": "Settings stored"})
    got = await _get(client, headers)
    for name, value in EVERY_FIELD.items():
        assert got[name] == value, name
    # The indicators did not move.
    assert got["llm_api_key_set"] is False
    assert got["search_api_key_set"] is False
    assert got["provider_tokens_set"] == {}


async def test_absent_fields_keep_their_value_and_null_sets_null(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    assert (await _post(client, headers, EVERY_FIELD))[0] == 200

    assert (await _post(client, headers, {"agent": "Other"}))[0] == 200
    got = await _get(client, headers)
    assert got["agent"] == "Other"
    for name, value in EVERY_FIELD.items():
        if name != "agent":
            assert got[name] == value, name

    nullable = [n for n, (types, _) in SPEC_FIELDS.items() if NULL in types]
    to_null = {n: None for n in nullable if n in EVERY_FIELD}
    to_null["condenser_max_size"] = None
    to_null["v1_enabled"] = None
    assert (await _post(client, headers, to_null))[0] == 200
    got = await _get(client, headers)
    for name in to_null:
        assert got[name] is None, name
    # Booleans that are not nullable kept their stored (non-default) values.
    assert got["enable_default_condenser"] is False
    assert got["enable_sound_notifications"] is True


async def test_null_on_a_non_nullable_field_is_422(
    client: Client, user_headers: UserHeaders
) -> None:
    status, body = await _post(
        client, await user_headers("alice"), {"enable_default_condenser": None}
    )
    assert status == 422
    assert [e["loc"] for e in body["detail"]] == [["body", "enable_default_condenser"]]


@pytest.mark.parametrize("secret", SECRET_FIELDS)
async def test_secret_merge_absent_or_null_keeps_and_empty_clears(
    client: Client, user_headers: UserHeaders, secret: str
) -> None:
    headers = await user_headers("alice")
    indicator = f"{secret}_set"
    assert (await _post(client, headers, {secret: "first-value"}))[0] == 200
    assert (await _get(client, headers))[indicator] is True
    assert getattr(await stored_user_record(client, "alice"), secret) == "first-value"

    for body in ({"language": "fr"}, {secret: None}, {}):
        assert (await _post(client, headers, body))[0] == 200
        got = await _get(client, headers)
        assert got[indicator] is True, body
        assert got[secret] is None
        assert getattr(await stored_user_record(client, "alice"), secret) == "first-value", body

    assert (await _post(client, headers, {secret: "second-value"}))[0] == 200
    assert getattr(await stored_user_record(client, "alice"), secret) == "second-value"

    assert (await _post(client, headers, {secret: ""}))[0] == 200
    got = await _get(client, headers)
    assert got[indicator] is False
    assert getattr(await stored_user_record(client, "alice"), secret) is None
    assert got["language"] == "fr"


async def test_secret_fields_are_always_null_in_get(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    body = {name: f"value-of-{name}" for name in SECRET_FIELDS}
    assert (await _post(client, headers, body))[0] == 200
    response = await client.get("/api/settings", headers=headers)
    text = await response.text()
    got = await response.json()
    for name in SECRET_FIELDS:
        assert got[name] is None
        assert f"value-of-{name}" not in text
    assert got["llm_api_key_set"] is True
    assert got["search_api_key_set"] is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_iterations", 0),
        ("max_iterations", 10001),
        ("max_iterations", -5),
        ("max_iterations", "many"),
        ("max_budget_per_task", -1),
        ("remote_runtime_resource_factor", 3),
        ("remote_runtime_resource_factor", 0),
        ("condenser_max_size", 19),
        ("llm_base_url", "ftp://llm.example.com"),
        ("git_user_email", "not-an-email"),
        ("language", "x" * 257),
    ],
)
async def test_out_of_bounds_values_are_422(
    client: Client, user_headers: UserHeaders, field: str, value: Any
) -> None:
    headers = await user_headers("alice")
    status, body = await _post(client, headers, {field: value, "agent": "kept-out"})
    assert status == 422
    locs = [e["loc"] for e in body["detail"]]
    assert ["body", field] in locs
    for item in body["detail"]:
        assert set(item) == {"loc", "msg", "type"}
        assert all(isinstance(part, str) for part in item["loc"])
    # Nothing of a rejected body is stored.
    assert (await _get(client, headers))["agent"] is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_iterations", 10000),
        ("max_iterations", 1),
        ("max_budget_per_task", 0),
        ("remote_runtime_resource_factor", 2),
        ("remote_runtime_resource_factor", 8),
        ("condenser_max_size", 20),
    ],
)
async def test_values_at_the_bounds_are_accepted(
    client: Client, user_headers: UserHeaders, field: str, value: Any
) -> None:
    headers = await user_headers("alice")
    assert (await _post(client, headers, {field: value}))[0] == 200
    assert (await _get(client, headers))[field] == value


async def test_bad_email_names_the_field(client: Client, user_headers: UserHeaders) -> None:
    status, body = await _post(client, await user_headers("alice"), {"email": "nope"})
    assert status == 422
    assert len(body["detail"]) == 1
    assert body["detail"][0]["loc"] == ["body", "email"]
    assert body["detail"][0]["type"] == "value_error"


async def test_unknown_key_is_extra_forbidden(client: Client, user_headers: UserHeaders) -> None:
    status, body = await _post(client, await user_headers("alice"), {"languag": "en"})
    assert status == 422
    assert body["detail"] == [
        {
            "loc": ["body", "languag"],
            "msg": "Extra inputs are not permitted",
            "type": "extra_forbidden",
        }
    ]


async def test_body_that_is_not_an_object_is_422(client: Client, user_headers: UserHeaders) -> None:
    status, body = await _post(client, await user_headers("alice"), ["language", "en"])
    assert status == 422
    assert body["detail"][0]["loc"] == ["body"]


async def test_echoing_a_get_body_back_is_accepted_and_changes_nothing(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    fresh = await _get(client, headers)
    status, body = await _post(client, headers, fresh)
    assert (status, body) == (200, {"message": "Settings stored"})
    assert await _get(client, headers) == fresh

    # With secrets, a provider token, a custom secret and masked MCP values stored.
    config = {
        "sse_servers": [{"url": "https://sse.example.com", "api_key": "sse-key"}],
        "stdio_servers": [{"name": "gh", "command": "gh-mcp", "env": {"GH_TOKEN": "env-value"}}],
    }
    assert (await _post(client, headers, {**EVERY_FIELD, "mcp_config": config}))[0] == 200
    secrets = {name: f"v-{name}" for name in SECRET_FIELDS}
    assert (await _post(client, headers, secrets))[0] == 200
    response = await client.post(
        "/api/add-git-providers",
        headers=headers,
        json={"provider_tokens": {"gitlab": {"token": "glpat", "host": "gitlab.example.com"}}},
    )
    assert response.status == 200
    response = await client.post("/api/secrets", headers=headers, json={"name": "A", "value": "b"})
    assert response.status == 201

    before = await _get(client, headers)
    assert before["sandbox_api_key_set"] is True
    status, body = await _post(client, headers, before)
    assert status == 200, body
    assert await _get(client, headers) == before
    record = await stored_user_record(client, "alice")
    for name in SECRET_FIELDS:
        assert getattr(record, name) == f"v-{name}"
    assert record.provider_tokens[ProviderType.GITLAB].token == "glpat"
    assert record.custom_secrets["A"].value == "b"
    assert record.settings.mcp_config is not None
    assert record.settings.mcp_config.sse_servers[0].api_key == "sse-key"
    assert record.settings.mcp_config.stdio_servers[0].env == {"GH_TOKEN": "env-value"}
