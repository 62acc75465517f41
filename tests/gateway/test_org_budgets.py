"""LLM budgets per organization and per member, through the real gateway (users' gateway keys,
the real `openai` client) against the scripted model (tests/support/fake_llm.py): an org admin
sets them through the organizations API, the gateway refuses before forwarding once the
organization's or the member's month has reached them, a call is charged to the organization
its caller acts in, and the organization's usage is readable by owners, admins and auditors
only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig
from tests.conftest import BOOTSTRAP_KEY
from tests.gateway.conftest import LLM_KEY
from tests.gateway.test_over_http import GATEWAY, PRICES, User
from tests.support.fake_llm import FakeLLM, reply_text
from tests.support.live_server import LiveServer, start_live_server

ADMIN = {"X-Session-API-Key": BOOTSTRAP_KEY}
USAGE = "/api/organizations/eng/llm-usage"


@pytest.fixture
async def budget_server(
    make_config: Callable[..., ServiceConfig], fake: FakeLLM
) -> AsyncIterator[Any]:
    server = await start_live_server(
        make_config(llm_prices=PRICES, sandbox_host_ports=[fake.port]), with_sandboxes=False
    )
    yield server
    await server.close()


async def ask(live: LiveServer, key: str) -> None:
    async with openai.AsyncOpenAI(base_url=live.url + GATEWAY, api_key=key, max_retries=0) as llm:
        await llm.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}]
        )


async def refused(live: LiveServer, key: str, fake: FakeLLM) -> str:
    """The refusal's message; asserts the call never reached the provider."""
    sent = len(fake.requests)
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(live, key)
    assert caught.value.code == "budget_exceeded"
    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert body["code"] == "budget_exceeded"  # the gateway's JSON error, as for a user's budget
    assert len(fake.requests) == sent
    return str(caught.value)


async def test_organization_and_member_budgets(
    budget_server: LiveServer, fake: FakeLLM, raw_redis: aioredis.Redis
) -> None:
    live = budget_server
    async with aiohttp.ClientSession() as http:
        admin = User(http, live.url, BOOTSTRAP_KEY)
        for org, owner in (("eng", "olivia"), ("sales", "sam")):
            status, _ = await admin.call(
                "POST", "/api/organizations", json={"id": org, "name": org, "owner": owner}
            )
            assert status == 201
        for org, user, role in (("eng", "ann", "member"), ("eng", "ben", "member"),
                                ("eng", "aud", "auditor"), ("sales", "ben", "member")):  # fmt: skip
            status, _ = await admin.call(
                "PUT", f"/api/organizations/{org}/members/{user}", json={"role": role}
            )
            assert status == 200
        keys = ApiKeyService(raw_redis, None)
        users = {
            name: User(http, live.url, (await keys.create(name, org_id=org)).key)
            for name, org in (
                ("olivia", "eng"),
                ("ann", "eng"),
                ("ben", "eng"),
                ("aud", "eng"),
                ("sam", "sales"),
            )
        }
        olivia, ann, ben, aud, sam = (users[n] for n in ("olivia", "ann", "ben", "aud", "sam"))

        # Budgets are the organization's owners' and admins' to set, not a member's.
        assert (await ann.call("PATCH", "/api/organizations/eng",
                               json={"llm_monthly_budget": 100}))[0] == 403  # fmt: skip
        assert (await ann.call("PUT", "/api/organizations/eng/members/ann",
                               json={"role": "member", "limits": {"llm_monthly_budget": 100}})
                )[0] == 403  # fmt: skip
        status, org = await olivia.call(
            "PATCH", "/api/organizations/eng", json={"llm_monthly_budget": 0.5}
        )
        assert status == 200, org
        assert org["llm_monthly_budget"] == 0.5
        status, member = await olivia.call(
            "PUT",
            "/api/organizations/eng/members/ann",
            json={"role": "member", "limits": {"llm_monthly_budget": 0.15}},
        )
        assert status == 200, member
        assert member["limits"]["llm_monthly_budget"] == 0.15
        assert (await olivia.call("PATCH", "/api/organizations/eng",
                                  json={"llm_monthly_budget": -1}))[0] == 422  # fmt: skip

        gateway_keys = {}
        for name in ("ann", "ben"):
            await users[name].settings(
                llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY
            )
            gateway_keys[name] = await users[name].gateway_key()
        fake.script([reply_text("a", usage=(100, 50))] * 10)  # $0.20 a call

        # ann: her first call starts under her $0.15 and runs; the next is refused.
        await ask(live, gateway_keys["ann"])
        message = await refused(live, gateway_keys["ann"], fake)
        assert "in organization eng" in message
        assert "budget there of $0.150000" in message
        # ben has no budget of his own: the organization's $0.50 stops him at $0.60.
        await ask(live, gateway_keys["ben"])
        await ask(live, gateway_keys["ben"])
        message = await refused(live, gateway_keys["ben"], fake)
        assert "organization eng's LLM cost" in message
        assert "$0.500000" in message

        # ben acting in sales is charged to sales, which has no budget.
        assert (await ben.call("POST", "/api/organizations/sales/switch"))[0] == 200
        await ask(live, gateway_keys["ben"])

        # The usage: owners and auditors read it, members and outsiders do not.
        assert (await ann.call("GET", USAGE))[0] == 403
        assert (await sam.call("GET", USAGE))[0] == 404
        status, usage = await aud.call("GET", USAGE)
        assert status == 200, usage
        assert usage["org_id"] == "eng"
        assert usage["monthly_budget"] == 0.5
        assert usage["requests"] == 3
        assert usage["cost"] == pytest.approx(0.6)
        by_member = {m["user_id"]: m for m in usage["members"]}
        assert by_member["ann"]["cost"] == pytest.approx(0.2)
        assert by_member["ann"]["monthly_budget"] == 0.15
        assert by_member["ben"]["cost"] == pytest.approx(0.4)
        assert by_member["ben"]["monthly_budget"] is None
        status, sales = await sam.call("GET", "/api/organizations/sales/llm-usage")
        assert status == 200, sales
        assert sales["cost"] == pytest.approx(0.2)

        # The budget removed (null), ben's calls in eng run again; a budget for each member
        # set on the organization stops him at once.
        assert (await ben.call("POST", "/api/organizations/eng/switch"))[0] == 200
        status, org = await olivia.call(
            "PATCH", "/api/organizations/eng", json={"llm_monthly_budget": None}
        )
        assert status == 200
        assert org["llm_monthly_budget"] is None
        await ask(live, gateway_keys["ben"])
        status, _ = await olivia.call(
            "PATCH", "/api/organizations/eng", json={"limits": {"llm_monthly_budget": 0.3}}
        )
        assert status == 200
        assert "budget there of $0.300000" in await refused(live, gateway_keys["ben"], fake)
