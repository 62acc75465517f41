"""Organization and member LLM budgets where an agent spends them: from inside real sandboxes,
with the gateway token each sandbox holds (never a user's API key or gateway key), against the
scripted model (tests/support/fake_llm.py). A sandbox's calls are charged to the organization
the sandbox was made in, whichever organization its owner acts in later; the organization's
usage grows with them; and once the member's or the organization's budget is reached the
gateway refuses the sandbox's next call with its JSON error, before the provider sees it. The
same budgets through users' gateway keys: test_org_budgets.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.keys import GATEWAY
from tests.conftest import BOOTSTRAP_KEY
from tests.gateway.test_from_sandboxes import gateway_url
from tests.support.conversation_helpers import (
    LLM_KEY,
    message,
    start_and_wait,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish
from tests.support.live_server import Api, LiveServer
from tests.support.sandbox_helpers import OwnDocker, call_from, exec_as_agent

pytestmark = pytest.mark.usefixtures("sandbox_images")

CALL = 100 * 0.001 + 20 * 0.002
"""What one call costs: the fake's default usage (100 prompt, 20 completion tokens) at the
live server's price of fake-model."""
USAGE = "/api/organizations/eng/llm-usage"
# Where the agent keeps its conversations' start requests, the gateway token among them.
TOKEN_IN_STATE = r"grep -rhoE 'acsgw\.[A-Za-z0-9_.-]+' /var/lib/acs-agent/conversations"


async def member_of(
    http: aiohttp.ClientSession,
    live: LiveServer,
    raw_redis: aioredis.Redis,
    fake: FakeLLM,
    name: str,
    *,
    org: str,
) -> Api:
    """A user with a key made in `org` and LLM settings pointing at `fake` (as sandboxes
    reach it)."""
    api = Api(http, live.url, (await ApiKeyService(raw_redis, None).create(name, org_id=org)).key)
    await api.ok(
        "POST",
        "/api/settings",
        json={
            "llm_model": "fake-model",
            "llm_base_url": fake.container_base_url,
            "llm_api_key": LLM_KEY,
        },
    )
    return api


async def agent_token(own_docker: OwnDocker, sandbox_id: str) -> str:
    """The gateway token the agent in `sandbox_id` holds, read as the agent user reads it."""
    code, out = await asyncio.to_thread(
        exec_as_agent, own_docker.container(sandbox_id), "sh", "-c", TOKEN_IN_STATE
    )
    assert code == 0, out
    (token,) = set(out.split())
    return token


async def from_sandbox(
    live: LiveServer, own_docker: OwnDocker, sandbox_id: str, token: str
) -> dict[str, Any]:
    """One chat completion made inside the sandbox, as the agent user, with `token`."""
    answer: dict[str, Any] = await call_from(
        own_docker.container(sandbox_id), gateway_url(live), token, "fake-model"
    )
    return answer


async def refused_from(
    live: LiveServer, own_docker: OwnDocker, sandbox_id: str, token: str, fake: FakeLLM
) -> str:
    """The refusal's message; asserts it is the gateway's JSON error and never reached the
    provider."""
    sent = len(fake.requests)
    answer = await from_sandbox(live, own_docker, sandbox_id, token)
    assert answer["status"] == 400, answer
    body = json.loads(answer["body"])
    assert body["error"]["code"] == "budget_exceeded", body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["detail"] == body["error"]["message"]
    assert LLM_KEY not in answer["body"]
    assert len(fake.requests) == sent
    return str(body["error"]["message"])


async def spent(owner: Api, calls: int, org: str = "eng") -> dict[str, Any]:
    """Asserts the organization's usage this month is `calls` calls; its members' by user."""
    usage = await owner.ok("GET", f"/api/organizations/{org}/llm-usage")
    assert usage["requests"] == calls, usage
    assert usage["cost"] == pytest.approx(calls * CALL), usage
    return {m["user_id"]: m for m in usage["members"]}


async def test_sandbox_calls_count_against_the_organization_budgets(
    live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
) -> None:
    fake_llm.when_exhausted = reply_finish("ok")
    admin = Api(http, live.url, BOOTSTRAP_KEY)
    for org, owner in (("eng", "olivia"), ("sales", "sam")):
        await admin.ok("POST", "/api/organizations", json={"id": org, "name": org, "owner": owner})
    for org, name in (("eng", "alice"), ("eng", "bob"), ("sales", "alice")):
        await admin.ok("PUT", f"/api/organizations/{org}/members/{name}", json={"role": "member"})
    olivia = await member_of(http, live, raw_redis, fake_llm, "olivia", org="eng")
    sam = await member_of(http, live, raw_redis, fake_llm, "sam", org="sales")
    alice = await member_of(http, live, raw_redis, fake_llm, "alice", org="eng")
    bob = await member_of(http, live, raw_redis, fake_llm, "bob", org="eng")
    await olivia.ok("PATCH", "/api/organizations/eng", json={"llm_monthly_budget": 0.5})
    await olivia.ok(
        "PUT",
        "/api/organizations/eng/members/alice",
        json={"role": "member", "limits": {"llm_monthly_budget": 0.3}},
    )

    # alice's agent, in a sandbox made in eng, answers her message: its call is eng's.
    task = await start_and_wait(alice, initial_message=message("hello"))
    assert task["status"] == "READY", task
    cid, sid = task["app_conversation_id"], task["sandbox_id"]
    await wait_finished(alice, cid)
    assert len(fake_llm.requests) == 1
    assert fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"  # the gateway's doing
    members = await spent(olivia, 1)
    assert members["alice"]["cost"] == pytest.approx(CALL)

    # The token the agent holds is its sandbox's (for this conversation), not alice's key.
    token = await agent_token(own_docker, sid)
    assert token == live.app[GATEWAY].tokens.issue(sid, cid, "alice")
    assert alice.key not in token

    # alice now acts in sales; what her eng sandbox spends stays eng's.
    await alice.ok("POST", "/api/organizations/sales/switch")
    assert (await from_sandbox(live, own_docker, sid, token))["status"] == 200
    members = await spent(olivia, 2)
    assert members["alice"]["cost"] == pytest.approx(2 * CALL)
    await spent(sam, 0, "sales")

    # Her third call starts at $0.28, under her $0.30 in eng, and runs; the fourth is refused.
    assert (await from_sandbox(live, own_docker, sid, token))["status"] == 200
    refusal = await refused_from(live, own_docker, sid, token, fake_llm)
    assert "in organization eng" in refusal
    assert "budget there of $0.300000" in refusal
    assert (await spent(olivia, 3))["alice"]["cost"] == pytest.approx(3 * CALL)

    # bob has no budget of his own: his agent's call starts at $0.42, under eng's $0.50, and
    # takes eng past it; his sandbox's next call is refused on the organization's budget.
    task = await start_and_wait(bob, initial_message=message("hello"))
    assert task["status"] == "READY", task
    bob_cid, bob_sid = task["app_conversation_id"], task["sandbox_id"]
    await wait_finished(bob, bob_cid)
    assert (await spent(olivia, 4))["bob"]["cost"] == pytest.approx(CALL)
    bob_token = await agent_token(own_docker, bob_sid)
    assert bob_token != token
    refusal = await refused_from(live, own_docker, bob_sid, bob_token, fake_llm)
    assert "organization eng's LLM cost" in refusal
    assert "monthly budget of $0.500000" in refusal
    assert len(fake_llm.requests) == 4
    await spent(olivia, 4)

    # A budget the organization no longer has refuses nothing: bob's sandbox calls again.
    await olivia.ok("PATCH", "/api/organizations/eng", json={"llm_monthly_budget": None})
    assert (await from_sandbox(live, own_docker, bob_sid, bob_token))["status"] == 200
    await spent(olivia, 5)
