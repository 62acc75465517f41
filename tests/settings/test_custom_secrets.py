"""Custom secrets: GET/POST/PUT/DELETE /api/secrets. Values go in, never come out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.settings.models import ProviderType
from tests.support.records import stored_user_record
from tests.support.types import Client, UserHeaders


async def _call(
    client: Client, method: str, path: str, headers: dict[str, str], body: Any = None
) -> tuple[int, Any, str]:
    kwargs: dict[str, Any] = {"headers": headers}
    if body is not None:
        kwargs["json"] = body
    response = await client.request(method, path, **kwargs)
    text = await response.text()
    assert response.content_type == "application/json"
    return response.status, await response.json(), text


@pytest.fixture
async def alice(user_headers: UserHeaders) -> dict[str, str]:
    return await user_headers("alice")


async def test_empty_list(client: Client, alice: dict[str, str]) -> None:
    assert await _call(client, "GET", "/api/secrets", alice) == (
        200,
        {"custom_secrets": []},
        '{"custom_secrets":[]}',
    )


async def test_create_then_list_names_and_descriptions_only(
    client: Client, alice: dict[str, str]
) -> None:
    created = []
    for name, value, description in [
        ("OPENAI_KEY", "value-one-xyz", "for the evals"),
        ("_private", "value-two-xyz", None),
    ]:
        body = {"name": name, "value": value}
        if description is not None:
            body["description"] = description
        status, reply, text = await _call(client, "POST", "/api/secrets", alice, body)
        assert (status, reply) == (201, {"message": "Secret created successfully"})
        assert value not in text
        created.append(value)

    status, reply, text = await _call(client, "GET", "/api/secrets", alice)
    assert status == 200
    assert reply == {
        "custom_secrets": [
            {"name": "OPENAI_KEY", "description": "for the evals"},
            {"name": "_private", "description": None},
        ]
    }
    status, settings, settings_text = await _call(client, "GET", "/api/settings", alice)
    assert settings["secrets_store"]["custom_secrets"] == {
        "OPENAI_KEY": {"secret": None, "description": "for the evals"},
        "_private": {"secret": None, "description": None},
    }
    for value in created:
        assert value not in text
        assert value not in settings_text
    record = await stored_user_record(client, "alice")
    assert record.custom_secrets["OPENAI_KEY"].value == "value-one-xyz"
    assert record.custom_secrets["_private"].value == "value-two-xyz"


async def test_duplicate_name_is_409_and_keeps_the_first_value(
    client: Client, alice: dict[str, str]
) -> None:
    body = {"name": "TOKEN", "value": "first"}
    assert (await _call(client, "POST", "/api/secrets", alice, body))[0] == 201
    status, reply, _ = await _call(
        client, "POST", "/api/secrets", alice, {"name": "TOKEN", "value": "second"}
    )
    assert status == 409
    assert reply == {"detail": "Secret TOKEN already exists"}
    assert (await stored_user_record(client, "alice")).custom_secrets["TOKEN"].value == "first"


async def test_rename_keeps_the_value(client: Client, alice: dict[str, str]) -> None:
    body = {"name": "OLD", "value": "the-value", "description": "d1"}
    assert (await _call(client, "POST", "/api/secrets", alice, body))[0] == 201

    status, reply, _ = await _call(client, "PUT", "/api/secrets/OLD", alice, {"name": "NEW"})
    assert (status, reply) == (200, {"message": "Secret updated successfully"})
    record = await stored_user_record(client, "alice")
    assert set(record.custom_secrets) == {"NEW"}
    assert record.custom_secrets["NEW"].value == "the-value"
    assert record.custom_secrets["NEW"].description == "d1"  # description absent: kept

    status, _, _ = await _call(client, "PUT", "/api/secrets/NEW", alice, {"description": "d2"})
    assert status == 200
    status, _, _ = await _call(client, "PUT", "/api/secrets/NEW", alice, {"name": "NEW"})
    assert status == 200  # renaming onto itself is no conflict
    listed = (await _call(client, "GET", "/api/secrets", alice))[1]
    assert listed == {"custom_secrets": [{"name": "NEW", "description": "d2"}]}
    assert (await stored_user_record(client, "alice")).custom_secrets["NEW"].value == "the-value"

    status, _, _ = await _call(client, "PUT", "/api/secrets/NEW", alice, {"description": None})
    assert status == 200
    listed = (await _call(client, "GET", "/api/secrets", alice))[1]
    assert listed == {"custom_secrets": [{"name": "NEW", "description": None}]}


async def test_rename_onto_an_existing_name_is_409(client: Client, alice: dict[str, str]) -> None:
    for name in ("A", "B"):
        body = {"name": name, "value": f"value-{name}"}
        assert (await _call(client, "POST", "/api/secrets", alice, body))[0] == 201
    status, reply, _ = await _call(client, "PUT", "/api/secrets/A", alice, {"name": "B"})
    assert status == 409
    assert reply == {"detail": "Secret B already exists"}
    record = await stored_user_record(client, "alice")
    assert {n: s.value for n, s in record.custom_secrets.items()} == {
        "A": "value-A",
        "B": "value-B",
    }


async def test_update_and_delete_of_unknown_secret_are_404(
    client: Client, alice: dict[str, str]
) -> None:
    status, reply, _ = await _call(client, "PUT", "/api/secrets/GHOST", alice, {"name": "X"})
    assert status == 404
    assert reply == {"detail": "Secret GHOST not found"}
    status, reply, _ = await _call(client, "DELETE", "/api/secrets/GHOST", alice)
    assert status == 404
    assert reply == {"detail": "Secret GHOST not found"}
    assert (await _call(client, "GET", "/api/secrets", alice))[1] == {"custom_secrets": []}


async def test_delete(client: Client, alice: dict[str, str]) -> None:
    for name in ("KEEP", "DROP"):
        body = {"name": name, "value": "v"}
        assert (await _call(client, "POST", "/api/secrets", alice, body))[0] == 201
    status, reply, _ = await _call(client, "DELETE", "/api/secrets/DROP", alice)
    assert (status, reply) == (200, {"message": "Secret deleted successfully"})
    assert set((await stored_user_record(client, "alice")).custom_secrets) == {"KEEP"}
    assert (await _call(client, "DELETE", "/api/secrets/DROP", alice))[0] == 404


@pytest.mark.parametrize(
    "name", ["", "1STARTS_WITH_DIGIT", "has space", "dash-name", "dot.name", "x" * 65, "ü"]
)
async def test_invalid_name_is_422(client: Client, alice: dict[str, str], name: str) -> None:
    status, reply, _ = await _call(
        client, "POST", "/api/secrets", alice, {"name": name, "value": "v"}
    )
    assert status == 422
    assert [e["loc"] for e in reply["detail"]] == [["body", "name"]]
    assert (await _call(client, "GET", "/api/secrets", alice))[1] == {"custom_secrets": []}


async def test_invalid_new_name_on_rename_is_422(client: Client, alice: dict[str, str]) -> None:
    body = {"name": "OK", "value": "v"}
    assert (await _call(client, "POST", "/api/secrets", alice, body))[0] == 201
    status, reply, _ = await _call(client, "PUT", "/api/secrets/OK", alice, {"name": "not ok"})
    assert status == 422
    assert [e["loc"] for e in reply["detail"]] == [["body", "name"]]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"name": "X"}, ["body", "value"]),
        ({"name": "X", "value": ""}, ["body", "value"]),
        ({"value": "v"}, ["body", "name"]),
        ({"name": "X", "value": "v", "secret": "v"}, ["body", "secret"]),
        ({"name": "X", "value": "v", "description": "d" * 1025}, ["body", "description"]),
    ],
)
async def test_invalid_create_body_is_422(
    client: Client, alice: dict[str, str], body: dict[str, Any], loc: list[str]
) -> None:
    status, reply, text = await _call(client, "POST", "/api/secrets", alice, body)
    assert status == 422
    assert [e["loc"] for e in reply["detail"]] == [loc]
    # The error never echoes the input back.
    assert all(set(e) == {"loc", "msg", "type"} for e in reply["detail"])
    assert '"input"' not in text


async def test_concurrent_writes_of_one_user_lose_nothing(
    client: Client, alice: dict[str, str]
) -> None:
    """Every write is a read-modify-write of one encrypted record; WATCH/MULTI keeps them all."""
    writes = [
        client.post("/api/secrets", headers=alice, json={"name": f"S{i}", "value": f"v{i}"})
        for i in range(12)
    ]
    writes.append(client.post("/api/settings", headers=alice, json={"language": "nl"}))
    writes.append(client.post("/api/settings", headers=alice, json={"llm_api_key": "k"}))
    writes.append(
        client.post(
            "/api/add-git-providers",
            headers=alice,
            json={"provider_tokens": {"github": {"token": "g"}}},
        )
    )
    responses = await asyncio.gather(*writes)
    assert sorted(r.status for r in responses) == [200] * 3 + [201] * 12
    record = await stored_user_record(client, "alice")
    assert {n: s.value for n, s in record.custom_secrets.items()} == {
        f"S{i}": f"v{i}" for i in range(12)
    }
    assert record.settings.language == "nl"
    assert record.llm_api_key == "k"
    assert record.provider_tokens[ProviderType.GITHUB].token == "g"
