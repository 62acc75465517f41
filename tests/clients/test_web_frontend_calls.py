"""The OpenHands web frontend's calls to the control plane, sent over HTTP with the request
shapes of its own sources (OpenHands/OpenHands `frontend/src/api/`; each test names the file).

Pending messages are in tests/conversations/test_pending_messages.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.conversation_helpers import (
    UserFactory,
    message,
    of_kind,
    start_and_wait,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish
from tests.support.types import UserHeaders


def frontend_start_body(text: str, **overrides: Any) -> dict[str, Any]:
    """V1ConversationService.createConversation (conversation-service/
    v1-conversation-service.api.ts), as the home page sends it with no repository, plus
    `dependency_repos`, which newer builds add (the app server's AppConversationStartRequest)."""
    body: dict[str, Any] = {
        "title": None,
        "trigger": "gui",
        "parent_conversation_id": None,
        "agent_type": "default",
        "plugins": None,
        "sandbox_id": None,
        "llm_model": None,
        "dependency_repos": [],
        "initial_message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }
    return body | overrides


async def test_web_client_config_needs_no_sign_in_and_says_open_source(make_client: Any) -> None:
    client = await make_client()
    # OptionService.getConfig (option-service/option-service.api.ts): no credential at all.
    resp = await client.get("/api/v1/web-client/config")
    assert resp.status == 200, await resp.text()
    config = await resp.json()
    # The WebClientConfig fields of option-service/option.types.ts.
    assert config["app_mode"] == "oss"
    assert config["posthog_client_key"] is None
    assert config["auth_url"] is None
    assert config["providers_configured"] == []
    assert config["faulty_models"] == []
    assert config["maintenance_start_time"] is None
    assert config["error_message"] is None
    assert config["updated_at"]
    flags = config["feature_flags"]
    assert flags["enable_billing"] is False
    assert flags["hide_llm_settings"] is False
    assert flags["deployment_mode"] == "self_hosted"
    # Older builds: GetConfigResponse of the same file, upper-case keys.
    resp = await client.get("/api/options/config")
    legacy = await resp.json()
    assert resp.status == 200
    assert legacy["APP_MODE"] == "oss"
    assert set(legacy["FEATURE_FLAGS"]) == {
        "ENABLE_BILLING",
        "HIDE_LLM_SETTINGS",
        "ENABLE_JIRA",
        "ENABLE_JIRA_DC",
        "ENABLE_LINEAR",
    }


async def test_option_lists_come_from_the_deployment_and_the_callers_settings(
    make_client: Any, user_headers: UserHeaders
) -> None:
    client = await make_client(
        llm_models=["openai/gpt-4o", "anthropic/claude-sonnet-4"],
        llm_prices={"priced-model": (0.001, 0.002)},
    )
    alice = await user_headers("alice")
    resp = await client.post(
        "/api/settings", json={"llm_model": "litellm_proxy/alice-model"}, headers=alice
    )
    assert resp.status == 200, await resp.text()

    # OptionService.getModels / getAgents / getSecurityAnalyzers: plain string lists.
    resp = await client.get("/api/options/models", headers=alice)
    assert await resp.json() == [
        "anthropic/claude-sonnet-4",
        "openai/gpt-4o",
        "litellm_proxy/alice-model",
        "priced-model",
    ]
    assert await (await client.get("/api/options/agents", headers=alice)).json() == ["CodeActAgent"]
    resp = await client.get("/api/options/security-analyzers", headers=alice)
    assert await resp.json() == ["none"]

    # ConfigService.searchModels (config-service/config-service.api.ts): its query parameters.
    resp = await client.get("/api/v1/config/models/search?limit=2", headers=alice)
    page = await resp.json()
    assert page["items"] == [
        {"provider": "anthropic", "name": "claude-sonnet-4", "verified": True},
        {"provider": "openai", "name": "gpt-4o", "verified": True},
    ]
    resp = await client.get(
        f"/api/v1/config/models/search?limit=2&page_id={page['next_page_id']}", headers=alice
    )
    rest = await resp.json()
    assert [m["name"] for m in rest["items"]] == ["alice-model", "priced-model"]
    assert rest["next_page_id"] is None
    resp = await client.get(
        "/api/v1/config/models/search?query=GPT&verified__eq=true&provider__eq=openai",
        headers=alice,
    )
    assert [m["name"] for m in (await resp.json())["items"]] == ["gpt-4o"]
    resp = await client.get("/api/v1/config/models/search?verified__eq=false", headers=alice)
    assert [m["provider"] for m in (await resp.json())["items"]] == ["litellm_proxy", None]
    # ConfigService.getProviders: the verified providers.
    resp = await client.get("/api/v1/config/providers", headers=alice)
    assert await resp.json() == ["anthropic", "openai"]

    # Another user's own model is not in alice's lists; bad input is a 422; no caller a 401.
    bob = await user_headers("bob")
    resp = await client.get("/api/options/models", headers=bob)
    assert "litellm_proxy/alice-model" not in await resp.json()
    resp = await client.get("/api/v1/config/models/search?limit=0", headers=alice)
    assert resp.status == 422
    assert (await resp.json())["detail"][0]["loc"] == ["query", "limit"]
    for path in ("/api/options/models", "/api/v1/config/models/search", "/api/v1/config/providers"):
        assert (await client.get(path)).status == 401


@pytest.mark.usefixtures("sandbox_images")
async def test_the_frontends_start_body_is_accepted_and_its_meaningful_fields_honoured(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish(), reply_finish()])
    alice = await user("alice")
    first = await start_and_wait(alice, **frontend_start_body("first"))
    assert first["status"] == "READY", first
    assert "plugins" in first["request"]
    assert "secrets" not in first["request"]

    # sandbox_id: the same sandbox; llm_model: this conversation's model, sent to the LLM.
    second = await start_and_wait(
        alice,
        **frontend_start_body(
            "second",
            sandbox_id=first["sandbox_id"],
            llm_model="override-model",
            suggested_task=None,
            secrets={"IGNORED": "not-stored"},
            some_future_field={"x": 1},
        ),
    )
    assert second["status"] == "READY", second
    assert second["sandbox_id"] == first["sandbox_id"]
    cid = second["app_conversation_id"]
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{cid}")
    assert conversation["llm_model"] == "override-model"
    await wait_finished(alice, cid)
    assert any(r.body.get("model", "").endswith("override-model") for r in fake_llm.requests)
    assert "not-stored" not in str(second)

    # Fields we use keep strict types, with FastAPI's detail list.
    for field, value in (("llm_model", 5), ("sandbox_id", ["x"]), ("dependency_repos", "x")):
        status, body = await alice.call(
            "POST", "/api/v1/app-conversations", json=frontend_start_body("x", **{field: value})
        )
        assert status == 422, body
        assert body["detail"][0]["loc"][:2] == ["body", field]


@pytest.mark.usefixtures("sandbox_images")
async def test_a_suggested_task_becomes_the_first_message(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish()])
    alice = await user("alice")
    # suggested_task (utils/types.ts SuggestedTask) and no initial_message, as the frontend sends.
    task = await start_and_wait(
        alice,
        **frontend_start_body("unused", initial_message=None)
        | {
            "suggested_task": {
                "git_provider": "github",
                "task_type": "FAILING_CHECKS",
                "repo": "octo/widgets",
                "issue_number": 42,
                "title": "Fix the build",
            },
            "trigger": "suggested_task",
        },
    )
    assert task["status"] == "READY", task
    events = await wait_finished(alice, task["app_conversation_id"])
    first = of_kind(events, "MessageEvent")[0]
    text = first["llm_message"]["content"][0]["text"]
    assert first["source"] == "user"
    assert "octo/widgets" in text
    assert "#42 Fix the build" in text


@pytest.mark.usefixtures("sandbox_images")
async def test_patch_search_by_sandbox_singular_events_and_v0_reads(
    user: UserFactory, fake_llm: FakeLLM
) -> None:
    fake_llm.script([reply_finish(), reply_finish()])
    alice, bob = await user("alice"), await user("bob")
    task = await start_and_wait(alice, initial_message=message("hello"))
    cid, sandbox_id = task["app_conversation_id"], task["sandbox_id"]
    other = await start_and_wait(alice, initial_message=message("elsewhere"))
    events = await wait_finished(alice, cid)
    base = f"/api/v1/app-conversations/{cid}"

    # updateConversationPublicFlag / updateConversationRepository / a rename: the conversation back.
    updated = await alice.ok("PATCH", base, json={"public": True})
    assert updated["id"] == cid
    assert updated["public"] is True
    assert updated["sandbox_status"] == "RUNNING"
    assert updated["conversation_url"]
    updated = await alice.ok(
        "PATCH",
        base,
        json={
            "selected_repository": "octo/widgets",
            "selected_branch": "main",
            "git_provider": "github",
        },
    )
    assert (updated["selected_repository"], updated["selected_branch"]) == ("octo/widgets", "main")
    updated = await alice.ok("PATCH", base, json={"title": "Renamed", "selected_repository": None})
    assert updated["title"] == "Renamed"
    assert updated["selected_repository"] is None
    assert updated["public"] is True
    assert updated["git_provider"] == "github"
    status, body = await alice.call("PATCH", base, json={"title": ""})
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "title"]
    status, body = await alice.call("PATCH", base, json={"public": "yes please"})
    assert status == 422, body
    assert (await bob.call("PATCH", base, json={"public": False}))[0] == 404
    assert (await alice.ok("GET", base))["public"] is True

    # searchConversationsBySandboxId: sandbox_id__eq, in search and count.
    found = await alice.ok(
        "GET", f"/api/v1/app-conversations/search?sandbox_id__eq={sandbox_id}&limit=100"
    )
    assert [c["id"] for c in found["items"]] == [cid]
    assert other["sandbox_id"] != sandbox_id
    count = f"/api/v1/app-conversations/count?sandbox_id__eq={sandbox_id}"
    assert await alice.ok("GET", count) == 1
    assert await bob.ok("GET", count) == 0

    # EventService.searchEventsV1 (event-service/event-service.api.ts): the singular path.
    page = await alice.ok("GET", f"/api/v1/conversation/{cid}/events/search", params={"limit": 100})
    assert [e["id"] for e in page["items"]] == [e["id"] for e in events]
    assert (await bob.call("GET", f"/api/v1/conversation/{cid}/events/search"))[0] == 404
    assert (await alice.call("GET", "/api/v1/conversation/not-an-id/events/search"))[0] == 404

    # ConversationService.searchConversations / getConversationConfig (V0, ResultSet).
    listed = await alice.ok("GET", "/api/conversations", params={"limit": 1})
    assert [c["conversation_id"] for c in listed["results"]] == [other["app_conversation_id"]]
    rest = await alice.ok(
        "GET", "/api/conversations", params={"limit": 1, "page_id": listed["next_page_id"]}
    )
    legacy = rest["results"][0]
    assert legacy["conversation_id"] == cid
    assert rest["next_page_id"] is None
    assert legacy["status"] == "RUNNING"
    assert legacy["runtime_status"] == "STATUS$READY"
    assert legacy["title"] == "Renamed"
    assert legacy["conversation_version"] == "V1"
    assert legacy["url"] == updated["conversation_url"]
    assert await alice.ok("GET", f"/api/conversations/{cid}") == legacy
    config = await alice.ok("GET", f"/api/conversations/{cid}/config")
    assert config == {"runtime_id": sandbox_id, "session_id": cid}
    assert (await bob.ok("GET", "/api/conversations"))["results"] == []
    for path in (f"/api/conversations/{cid}", f"/api/conversations/{cid}/config"):
        assert (await bob.call("GET", path))[0] == 404
    filtered = await alice.ok(
        "GET", "/api/conversations", params={"conversation_trigger": "resolver"}
    )
    assert filtered["results"] == []
