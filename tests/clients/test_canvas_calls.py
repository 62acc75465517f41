"""Agent Canvas's calls to an OpenHands cloud backend, sent over HTTP with the shapes of its own
sources (agent-canvas 1.6.1 `src/api/cloud/*.ts`, the typescript client's CloudClient; each test
names the file): onboarding, the settings form's schema and diffs, LLM profiles, agent profiles,
skills, and the cookie-mode login calls. The real app drives them in a browser in
tests/clients/test_agent_canvas.py."""

from __future__ import annotations

from typing import Any

from tests.conftest import BOOTSTRAP_KEY
from tests.support.types import Client, UserHeaders

LLM_KEY = "sk-canvas-SECRET-4d2e"


async def call(
    client: Client, method: str, path: str, headers: dict[str, str], **kwargs: Any
) -> tuple[int, Any]:
    response = await client.request(method, path, headers=headers, **kwargs)
    return response.status, await response.json()


async def ok(client: Client, method: str, path: str, headers: dict[str, str], **kw: Any) -> Any:
    status, body = await call(client, method, path, headers, **kw)
    assert 200 <= status < 300, (method, path, status, body)
    return body


async def test_onboarding_finds_one_organization_and_the_key(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    # organization-service.api.ts: getCloudOrganizations, getCurrentCloudApiKey, …Me.
    orgs = await ok(client, "GET", "/api/organizations", alice)
    (org,) = orgs["items"]
    assert orgs["current_org_id"] == org["id"]
    assert org["name"]
    assert org["is_personal"] is False
    key = await ok(client, "GET", "/api/keys/current", alice)
    assert key["org_id"] == org["id"]
    assert key["user_id"] == "alice"
    assert key["id"] == alice["X-Session-API-Key"].split("_")[1]
    assert key["auth_type"] == "api_key"
    assert alice["X-Session-API-Key"] not in str(key)
    me = await ok(client, "GET", f"/api/organizations/{org['id']}/me", alice)
    assert me == {
        "org_id": org["id"],
        "user_id": "alice",
        "email": None,
        "role": "member",
        "status": "active",
        "permissions": ["edit_org_settings", "sandbox.create"],
        "limits": {
            "max_running_sandboxes": None,
            "max_sandboxes": None,
            "llm_monthly_budget": None,
        },
    }
    admin = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    assert (await ok(client, "GET", f"/api/organizations/{org['id']}/me", admin))["role"] == "admin"
    status, body = await call(client, "GET", "/api/organizations/other-org/me", alice)
    assert (status, body) == (404, {"detail": "organization other-org not found"})
    for path in ("/api/organizations", "/api/keys/current"):
        assert (await client.get(path)).status == 401


async def test_the_settings_form_reads_its_schema_and_saves_diffs(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    # settings-service.api.ts: fetchCloudSettingsSchema / fetchCloudConversationSettingsSchema.
    agent = await ok(client, "GET", "/api/v1/settings/agent-schema", alice)
    fields = {f["key"]: f for s in agent["sections"] for f in s["fields"]}
    assert {"llm.model", "llm.api_key", "llm.base_url"} <= set(fields)
    assert fields["llm.api_key"]["secret"] is True
    assert fields["llm.model"]["prominence"] == "critical"
    conversation = await ok(client, "GET", "/api/v1/settings/conversation-schema", alice)
    keys = {f["key"] for s in conversation["sections"] for f in s["fields"]}
    assert {"max_iterations", "confirmation_mode"} <= keys

    # saveCloudSettings: agent_settings_diff / conversation_settings_diff and flat preferences;
    # keys of the SDK's wider models that our agent does not use are ignored.
    body = {
        "agent_settings_diff": {
            "agent_kind": "openhands",
            "llm": {"model": "fake-model", "api_key": LLM_KEY, "base_url": "", "usage_id": "x"},
            "condenser": {"max_size": 40},
        },
        "conversation_settings_diff": {"max_iterations": 42, "confirmation_mode": True},
        "language": "fr",
        "disabled_skills": [],
        "title_llm_profile": None,
    }
    saved = await ok(client, "POST", "/api/v1/settings", alice, json=body)
    assert saved["llm_model"] == "fake-model"
    assert saved["llm_base_url"] is None
    assert saved["llm_api_key_set"] is True
    assert saved["agent_settings"]["llm"]["model"] == "fake-model"
    assert saved["agent_settings"]["condenser"]["max_size"] == 40
    assert saved["conversation_settings"]["max_iterations"] == 42
    assert saved["confirmation_mode"] is True
    assert saved["language"] == "fr"
    assert LLM_KEY not in str(saved)
    # Only the diff's keys change.
    again = await ok(
        client, "POST", "/api/v1/settings", alice, json={"agent_settings_diff": {"llm": {}}}
    )
    assert (again["llm_model"], again["max_iterations"]) == ("fake-model", 42)

    # Types are checked; a diff next to its nested twin, or an unknown flat key, is a 422.
    for bad, loc in (
        ({"conversation_settings_diff": {"max_iterations": "many"}}, "conversation_settings_diff"),
        ({"agent_settings_diff": {"llm": {"base_url": "ftp://x"}}}, "agent_settings_diff"),
        ({"agent_settings_diff": {}, "agent_settings": {}}, "agent_settings_diff"),
        ({"not_a_setting": 1}, "not_a_setting"),
    ):
        status, answer = await call(client, "POST", "/api/v1/settings", alice, json=bad)
        assert status == 422, (bad, answer)
        assert answer["detail"][0]["loc"][:2] == ["body", loc], answer


async def test_llm_profiles_list_save_activate_rename_delete(
    client: Client, user_headers: UserHeaders
) -> None:
    alice, bob = await user_headers("alice"), await user_headers("bob")
    base = "/api/v1/settings/profiles"
    assert await ok(client, "GET", base, alice) == {"profiles": [], "active_profile": None}
    # profiles-service.api.ts: saveCloudProfile sends the SDK's SaveProfileRequest.
    llm = {"model": "openai/fast", "base_url": "https://llm.example/v1", "api_key": LLM_KEY}
    body = {"llm": llm | {"temperature": 0.2, "usage_id": "agent"}, "include_secrets": True}
    saved = await ok(client, "POST", f"{base}/fast", alice, json=body)
    assert saved == {"name": "fast", "message": "Profile 'fast' saved"}
    await ok(client, "POST", f"{base}/nokey", alice, json={"llm": llm, "include_secrets": False})
    listed = await ok(client, "GET", base, alice)
    assert [(p["name"], p["model"], p["api_key_set"]) for p in listed["profiles"]] == [
        ("fast", "openai/fast", True),
        ("nokey", "openai/fast", False),
    ]
    detail = await ok(client, "GET", f"{base}/fast", alice)
    assert detail["config"]["api_key"] is None
    assert detail["config"]["temperature"] == 0.2
    assert detail["api_key_set"] is True
    assert LLM_KEY not in str(listed) + str(detail)

    # activateCloudProfile: the profile becomes the LLM settings; users/me lists it.
    active = await ok(client, "POST", f"{base}/fast/activate", alice, json={})
    assert (active["name"], active["model"], active["llm_applied"]) == ("fast", "openai/fast", True)
    settings = await ok(client, "GET", "/api/settings", alice)
    assert (settings["llm_model"], settings["llm_api_key_set"]) == ("openai/fast", True)
    me = await ok(client, "GET", "/api/v1/users/me", alice)
    assert me["llm_profiles"]["active_profile"] == "fast"
    assert me["llm_profiles"]["profiles"]["fast"]["model"] == "openai/fast"
    assert me["llm_profiles"]["profiles"]["fast"]["api_key"] is None
    assert LLM_KEY not in str(me)

    renamed = await ok(client, "POST", f"{base}/fast/rename", alice, json={"new_name": "quick"})
    assert renamed["name"] == "quick"
    assert (await ok(client, "GET", base, alice))["active_profile"] == "quick"
    status, body = await call(
        client, "POST", f"{base}/quick/rename", alice, json={"new_name": "nokey"}
    )
    assert (status, body["detail"]) == (409, "Profile 'nokey' already exists")
    status, body = await call(client, "POST", f"{base}/gone/rename", alice, json={"new_name": "x"})
    assert status == 404
    status, body = await call(client, "POST", f"{base}/x/rename", alice, json={"new_name": "-bad"})
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "new_name"]
    assert (await call(client, "POST", f"{base}/bad name", alice, json=body))[0] in (404, 422)
    status, body = await call(client, "POST", f"{base}/x", alice, json={"llm": {"model": ""}})
    assert status == 422

    # The organization's profile routes are the caller's own (profiles-service.api.ts with an
    # org bound); bob sees none of alice's.
    org = (await ok(client, "GET", "/api/organizations", alice))["current_org_id"]
    via_org = await ok(client, "GET", f"/api/organizations/{org}/profiles", alice)
    assert via_org == await ok(client, "GET", base, alice)
    assert (await ok(client, "GET", f"/api/organizations/{org}/profiles", bob))["profiles"] == []
    assert (await call(client, "GET", f"{base}/quick", bob))[0] == 404
    assert (await call(client, "GET", "/api/organizations/nope/profiles", alice))[0] == 404
    await ok(client, "DELETE", f"/api/organizations/{org}/profiles/quick", alice)
    await ok(client, "DELETE", f"{base}/quick", alice)  # idempotent, as the SDK's
    assert [p["name"] for p in (await ok(client, "GET", base, alice))["profiles"]] == ["nokey"]
    assert (await ok(client, "GET", base, alice))["active_profile"] is None


async def test_agent_profiles_skills_and_automation_version(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    # agent-profiles-service.api.ts
    listed = await ok(client, "GET", "/api/agent-profiles", alice)
    assert listed["active_agent_profile_id"] == "default"
    assert [p["name"] for p in listed["profiles"]] == ["default"]
    assert (await ok(client, "GET", "/api/agent-profiles/default", alice))["name"] == "default"
    activated = await ok(client, "POST", "/api/agent-profiles/default/activate", alice, json={})
    assert activated["id"] == "default"
    assert (await call(client, "GET", "/api/agent-profiles/other", alice))[0] == 404
    for method, path in (
        ("POST", "/api/agent-profiles/mine"),
        ("DELETE", "/api/agent-profiles/default"),
        ("POST", "/api/agent-profiles/default/rename"),
    ):
        status, body = await call(client, method, path, alice, json={"new_name": "x"})
        assert status == 409, (method, path, body)
        assert "one agent" in body["detail"]
    # skills-service.api.ts: an empty page, its query checked.
    page = await ok(client, "GET", "/api/v1/skills/search?limit=100", alice)
    assert page == {"items": [], "next_page_id": None}
    for bad in ("limit=0", "limit=101", "page_id=zz", "unknown=1"):
        assert (await call(client, "GET", f"/api/v1/skills/search?{bad}", alice))[0] == 422
    # automation-service.api.ts getSdkVersion: no automation service here.
    assert await ok(client, "GET", "/api/automation/sdk-version", alice) == {"sdk_version": None}


async def test_cookie_mode_login_calls(client: Client, user_headers: UserHeaders) -> None:
    alice = await user_headers("alice")
    # main-app-auth.ts: POST /api/authenticate (withCredentials), then /login?returnTo=.
    assert (await client.post("/api/authenticate")).status == 401
    assert (await ok(client, "POST", "/api/authenticate", alice)) == {"message": "Authenticated"}
    response = await client.get("/login?returnTo=%2Fconversations%2Fabc", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/auth/sign-in?next=%2Fconversations%2Fabc"
    response = await client.get("/login?returnTo=https://evil.example/", allow_redirects=False)
    assert response.headers["Location"] == "/auth/sign-in?next=%2Fauth%2Fsign-in"
    response = await client.get("/login", allow_redirects=False)
    assert response.headers["Location"] == "/auth/sign-in?next=%2F"


async def test_expose_secrets_needs_a_sandbox_of_the_caller(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    key = alice["X-Session-API-Key"]
    status, body = await call(client, "GET", "/api/v1/users/me?expose_secrets=true", alice)
    assert status == 401
    assert "X-Session-API-Key of a running sandbox" in body["detail"]
    # A bearer key with a session key of no sandbox: 401, whatever the route.
    paired = {"Authorization": f"Bearer {key}", "X-Session-API-Key": "not-a-sandbox-key"}
    assert (await call(client, "GET", "/api/v1/users/me", paired))[0] == 401
    # The same key in both headers is one credential, as before; an empty session key is none.
    same = {"Authorization": f"Bearer {key}", "X-Session-API-Key": key}
    assert (await ok(client, "GET", "/api/v1/users/me", same))["id"] == "alice"
    empty = {"Authorization": f"Bearer {key}", "X-Session-API-Key": ""}
    assert (await ok(client, "GET", "/api/v1/users/me", empty))["id"] == "alice"
    assert (await call(client, "GET", "/api/v1/users/me?expose_secrets=maybe", alice))[0] == 422
