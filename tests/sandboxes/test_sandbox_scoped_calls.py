"""OpenHands' sandbox-scoped calls, as SDK code in a sandbox makes them
(openhands-workspace 1.58 `OpenHandsCloudWorkspace`): `get_llm()` and `get_mcp_config()` read
GET /api/v1/users/me with the user's bearer key plus the sandbox's session key; `get_secrets()`
lists names at /api/v1/sandboxes/{id}/settings/secrets and values are looked up one by one with
the session key alone. The real SDK runs them in tests/clients/test_sdk_158.py; here the
rules are attacked from every side."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.support.conversation_helpers import LLM_KEY, UserFactory
from tests.support.live_server import LiveServer, running_sandbox

pytestmark = pytest.mark.usefixtures("sandbox_images")


async def get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, str, str]:
    async with http.get(url, headers=headers) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_a_users_key_with_their_sandboxs_key_and_nothing_else(
    user: UserFactory, live: LiveServer
) -> None:
    alice, bob = await user("alice"), await user("bob")
    await alice.ok(
        "POST", "/api/secrets", json={"name": "DEPLOY_TOKEN", "value": "v-1", "description": "d"}
    )
    await alice.ok(
        "POST", "/api/add-git-providers", json={"provider_tokens": {"github": {"token": "ghp_A"}}}
    )
    sandbox, other = await running_sandbox(alice), await running_sandbox(bob)
    key, bobs = sandbox["session_api_key"], other["session_api_key"]
    me = f"{live.url}/api/v1/users/me"
    http = alice.http

    # get_llm(): bearer + the session key of a RUNNING sandbox of hers.
    both = {"Authorization": f"Bearer {alice.key}", "X-Session-API-Key": key}
    status, _, text = await get(http, me + "?expose_secrets=true", both)
    assert status == 200, text
    # The LLM as the gateway serves it, with her gateway key; the provider key never leaves.
    exposed = json.loads(text)
    assert exposed["llm_model"] == "litellm_proxy/fake-model"
    assert exposed["llm_base_url"] == f"{live.url}/api/v1/llm-gateway"
    assert exposed["llm_api_key"] == (await alice.ok("GET", "/api/keys/llm/byor"))["key"]
    assert LLM_KEY not in text
    # get_mcp_config(): the same headers, no expose_secrets.
    assert (await get(http, me, both))[0] == 200
    # Someone else's sandbox key, or a user key in its place, does not pair with hers.
    for wrong in (bobs, bob.key, "not-a-key"):
        headers = {"Authorization": f"Bearer {alice.key}", "X-Session-API-Key": wrong}
        status, _, text = await get(http, me + "?expose_secrets=true", headers)
        assert status == 401, (wrong, text)
    # The session key alone is not a user's credential.
    assert (await get(http, me, {"X-Session-API-Key": key}))[0] == 401
    # Paused: the key still pairs, but expose_secrets needs the sandbox RUNNING.
    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox['id']}/pause")
    assert (await get(http, me + "?expose_secrets=true", both))[0] == 401
    assert (await get(http, me, both))[0] == 200
    await alice.ok("POST", f"/api/v1/sandboxes/{sandbox['id']}/resume")


async def test_sandbox_secrets_answer_the_sandbox_of_the_key_only(
    user: UserFactory, live: LiveServer
) -> None:
    alice, bob = await user("alice"), await user("bob")
    await alice.ok(
        "POST", "/api/secrets", json={"name": "DEPLOY_TOKEN", "value": "v-1", "description": "d"}
    )
    await alice.ok(
        "POST", "/api/add-git-providers", json={"provider_tokens": {"github": {"token": "ghp_A"}}}
    )
    sandbox, other = await running_sandbox(alice), await running_sandbox(bob)
    key, sid = sandbox["session_api_key"], sandbox["id"]
    base = f"{live.url}/api/v1/sandboxes/{sid}/settings/secrets"
    http = alice.http
    session = {"X-Session-API-Key": key}

    status, _, text = await get(http, base, session)
    assert status == 200, text
    assert text.replace(" ", "") == (
        '{"secrets":[{"name":"DEPLOY_TOKEN","description":"d"},'
        '{"name":"GITHUB_TOKEN","description":"GITHUB_TOKENprovidertoken"}]}'
    )
    assert (await get(http, base + "?agent_profile_id=default", session))[0] == 200
    assert (await get(http, base + "?agent_profile_id=other", session))[0] == 404
    status, kind, value = await get(http, base + "/DEPLOY_TOKEN", session)
    assert (status, kind, value) == (200, "text/plain; charset=utf-8", "v-1")
    assert (await get(http, base + "/GITHUB_TOKEN", session))[2] == "ghp_A"
    assert (await get(http, base + "/NOPE", session))[0] == 404

    # Bob's sandbox key on alice's sandbox is a 404, as on a sandbox that does not exist; user
    # keys (hers included) and no key are 401: this route answers sandboxes only.
    bobs = {"X-Session-API-Key": other["session_api_key"]}
    for path in ("", "/DEPLOY_TOKEN"):
        assert (await get(http, base + path, bobs))[0] == 404
        assert (await get(http, base.replace(sid, "f" * 22) + path, session))[0] == 404
        for headers in (
            {"X-Session-API-Key": alice.key},
            {"Authorization": f"Bearer {alice.key}"},
            {},
        ):
            assert (await get(http, base + path, headers))[0] == 401
    # A paused sandbox looks nothing up.
    await alice.ok("POST", f"/api/v1/sandboxes/{sid}/pause")
    assert (await get(http, base + "/DEPLOY_TOKEN", session))[0] == 409


async def test_sandboxes_look_secrets_up_on_the_webhook_listener(
    user: UserFactory, live: LiveServer
) -> None:
    """What the sandbox reaches of the control plane serves the look-ups too: a LookupSecret
    pointing there resolves from inside the sandbox."""
    alice = await user("alice")
    await alice.ok("POST", "/api/secrets", json={"name": "DEPLOY_TOKEN", "value": "v-1"})
    sandbox = await running_sandbox(alice)
    gateway = await live.sandbox_gateway()
    url = (
        f"http://{gateway}:{live.webhook_port}/api/v1/sandboxes/{sandbox['id']}"
        "/settings/secrets/DEPLOY_TOKEN"
    )
    status, _, value = await get(alice.http, url, {"X-Session-API-Key": sandbox["session_api_key"]})
    assert (status, value) == (200, "v-1")
    # The API's own routes are not there.
    assert (await get(alice.http, url.split("/api/", maxsplit=1)[0] + "/api/v1/users/me", {}))[
        0
    ] == 404
