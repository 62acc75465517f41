"""GET /api/v1/users/me, GET /api/keys/llm/byor and GET/POST /api/v1/settings in the shapes the
OpenHands CLI reads (openhands_cli/auth/api_client.py), secrets never included."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import BOOTSTRAP_KEY
from tests.support.settings_fields import EVERY_FIELD, SPEC_FIELDS
from tests.support.types import Client, UserHeaders

LLM_KEY = "sk-v1-SECRET-a81b2c"


async def get(client: Client, path: str, headers: dict[str, str]) -> Any:
    response = await client.get(path, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


async def post_v1(client: Client, headers: dict[str, str], body: Any) -> tuple[int, Any]:
    response = await client.post("/api/v1/settings", json=body, headers=headers)
    return response.status, await response.json()


async def test_users_me_is_the_caller(client: Client, user_headers: UserHeaders) -> None:
    alice = await user_headers("alice")
    me = await get(client, "/api/v1/users/me", alice)
    assert me["id"] == "alice"
    assert me["is_admin"] is False
    assert me["key_id"] == alice["X-Session-API-Key"].split("_")[1]
    assert me["auth_method"] == "api_key"
    assert set(SPEC_FIELDS) <= set(me)  # OpenHands' UserInfo: the settings fields too
    admin = await get(client, "/api/v1/users/me", {"Authorization": f"Bearer {BOOTSTRAP_KEY}"})
    assert (admin["id"], admin["is_admin"], admin["key_id"]) == ("admin", True, "bootstrap")
    # The CLI tells a bad key by the 401.
    for headers in ({}, {"Authorization": "Bearer acs_000000000000_" + "x" * 43}):
        response = await client.get("/api/v1/users/me", headers=headers)
        assert response.status == 401
        assert set(await response.json()) == {"detail"}


async def test_no_route_hands_out_the_llm_key(client: Client, user_headers: UserHeaders) -> None:
    alice = await user_headers("alice")
    response = await client.post(
        "/api/settings", json={"llm_api_key": LLM_KEY, "llm_model": "m"}, headers=alice
    )
    assert response.status == 200
    # The BYOR key is the user's LLM gateway key (docs/llm-gateway.md), never the provider's.
    byor = await get(client, "/api/keys/llm/byor", alice)
    assert set(byor) == {"key", "llm_model", "llm_base_url"}
    assert byor["key"].startswith("acs-llm.")
    # With it, where to call it: the gateway, the model as LiteLLM names it there.
    assert byor["llm_model"] == "litellm_proxy/m"
    assert byor["llm_base_url"].endswith("/api/v1/llm-gateway")
    assert LLM_KEY not in json.dumps(byor)
    for path in ("/api/v1/users/me", "/api/v1/settings", "/api/settings"):
        body = await get(client, path, alice)
        assert LLM_KEY not in json.dumps(body), path
        assert body["llm_api_key"] is None
        assert body["llm_api_key_set"] is True
    # What OpenHands' SDK reads (OpenHandsCloudWorkspace.get_llm) is for code in one of the
    # user's sandboxes (the user's key plus the sandbox's): the gateway, its URL and this key,
    # asserted in tests/sandboxes/test_sandbox_scoped_calls.py. Without a sandbox's key: 401,
    # nothing leaks.
    response = await client.get("/api/v1/users/me?expose_secrets=true", headers=alice)
    assert response.status == 401
    assert LLM_KEY not in await response.text()
    assert byor["key"] not in await response.text()
    assert (await client.get("/api/keys/llm/byor")).status == 401


async def test_v1_settings_nest_the_agent_settings(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    fresh = await get(client, "/api/v1/settings", alice)
    assert set(SPEC_FIELDS) <= set(fresh)
    assert fresh["agent_settings"] == {
        "agent": None,
        "llm": {"model": None, "base_url": None, "api_key": None, "api_key_set": False},
        "mcp_config": None,
        "condenser": {"enabled": True, "max_size": None},
    }
    response = await client.post(
        "/api/settings", json={**EVERY_FIELD, "llm_api_key": LLM_KEY}, headers=alice
    )
    assert response.status == 200
    v0 = await get(client, "/api/settings", alice)
    v1 = await get(client, "/api/v1/settings", alice)
    assert {k: v for k, v in v1.items() if k in v0} == v0
    agent = v1["agent_settings"]
    assert agent["agent"] == EVERY_FIELD["agent"]
    assert agent["llm"] == {
        "model": EVERY_FIELD["llm_model"],
        "base_url": EVERY_FIELD["llm_base_url"],
        "api_key": None,
        "api_key_set": True,
    }
    assert agent["mcp_config"] == v0["mcp_config"]
    assert agent["condenser"] == {"enabled": False, "max_size": 120}
    assert v1["conversation_settings"] == {
        "max_iterations": 250,
        "confirmation_mode": True,
        "security_analyzer": "llm",
        "max_budget_per_task": 12.5,
    }


async def test_v1_post_merges_flat_and_nested_fields(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    status, body = await post_v1(client, alice, {"language": "de", "llm_model": "flat-model"})
    assert status == 200, body
    assert (body["language"], body["agent_settings"]["llm"]["model"]) == ("de", "flat-model")

    nested = {
        "agent_settings": {
            "agent": "CodeActAgent",
            "llm": {"model": "nested-model", "base_url": "http://llm.test/v1", "api_key": LLM_KEY},
            "condenser": {"enabled": False, "max_size": 40},
        },
        "conversation_settings": {"max_iterations": 30, "confirmation_mode": True},
    }
    status, body = await post_v1(client, alice, nested)
    assert status == 200, body
    assert body["llm_model"] == "nested-model"
    assert body["llm_base_url"] == "http://llm.test/v1"
    assert body["llm_api_key_set"] is True
    assert (body["enable_default_condenser"], body["condenser_max_size"]) == (False, 40)
    assert (body["max_iterations"], body["confirmation_mode"]) == (30, True)
    assert body["language"] == "de"  # untouched: merge, not replace
    assert LLM_KEY not in json.dumps(body)

    # Posting back what GET returned changes nothing (and keeps the key).
    before = await get(client, "/api/v1/settings", alice)
    status, after = await post_v1(client, alice, before)
    assert status == 200, after
    assert after == before
    # A client that edits one copy of a field and echoes the other: the edit wins.
    edited = {**before, "llm_model": "edited-flat"}
    assert (await post_v1(client, alice, edited))[1]["agent_settings"]["llm"]["model"] == (
        "edited-flat"
    )
    before = await get(client, "/api/v1/settings", alice)
    edited = json.loads(json.dumps(before))
    edited["conversation_settings"]["max_iterations"] = 77
    assert (await post_v1(client, alice, edited))[1]["max_iterations"] == 77
    # "" clears the key, nested as flat.
    status, body = await post_v1(client, alice, {"agent_settings": {"llm": {"api_key": ""}}})
    assert body["llm_api_key_set"] is False


async def test_v1_post_validates_with_the_detail_list(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    cases: list[tuple[Any, list[str]]] = [
        ({"agent_settings": {"llm": {"model": 5}}}, ["body", "agent_settings", "llm", "model"]),
        (
            {"agent_settings": {"llm": {"temperature": 1}}},
            ["body", "agent_settings", "llm", "temperature"],
        ),
        (
            {"conversation_settings": {"max_iterations": 0}},
            ["body", "conversation_settings", "max_iterations"],
        ),
        (
            {"agent_settings": {"llm": {"base_url": "ftp://x"}}},
            ["body", "agent_settings", "llm", "base_url"],
        ),
        ({"nope": 1}, ["body", "nope"]),
    ]
    for body, loc in cases:
        status, answer = await post_v1(client, alice, body)
        assert status == 422, (body, answer)
        assert [item["loc"] for item in answer["detail"]] == [loc], answer
    # Each valid alone, the two spellings of one field disagree: a conflict, not a bad value.
    for body, names in (
        ({"llm_model": "a", "agent_settings": {"llm": {"model": "b"}}}, "agent_settings.llm.model"),
        (
            {"llm_api_key": "k1", "agent_settings": {"llm": {"api_key": "k2"}}},
            "agent_settings.llm.api_key",
        ),
    ):
        status, answer = await post_v1(client, alice, body)
        assert status == 409, (body, answer)
        assert names in answer["detail"], answer
    # Nothing of the refused bodies was stored.
    assert (await get(client, "/api/v1/settings", alice))["llm_model"] is None
