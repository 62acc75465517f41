"""Finding 1 of issue 26: a provider the gateway may call answers with a redirect to a port of
this host that no user may call. The attacker is the provider (a user's own `llm_base_url`);
the target, a canary on 127.0.0.1 counting the connections it gets. No redirect is followed:
on the direct path, through LiteLLM, nor by the lifecycle webhooks' deliverer (whose receiver
may be compromised)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest

from controlplane import keys
from controlplane.gateway.translator_process import TranslatorProcess
from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from tests.security.conftest import PROVIDER_KEY, MemberFactory
from tests.support.hostile_llm import Answer, Canary, HostileUpstream, contains_canary
from tests.support.live_server import LiveServer
from tests.support.types import ClientFactory

REDIRECTS = (301, 302, 303, 307, 308)


def redirect(status: int, canary: Canary) -> Answer:
    return Answer(status=status, headers={"Location": f"{canary.url}/v1/chat/completions"})


@pytest.mark.parametrize("stream", [False, True])
async def test_no_redirect_is_followed_on_the_direct_path(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    hostile: HostileUpstream,
    canary: Canary,
    stream: bool,
) -> None:
    server = await gateway_server()
    mallory = await member(server, "mallory")
    await mallory.settings(llm_model="m", llm_base_url=hostile.base_url, llm_api_key=PROVIDER_KEY)
    key = await mallory.gateway_key()
    for status in REDIRECTS:
        hostile.answer(redirect(status, canary))
        code, kind, body = await mallory.ask(key, stream=stream)
        assert code == 502, (status, body)
        assert kind == "application/json"
        error = json.loads(body)["error"]
        assert error["code"] == "upstream_error"
        assert f"answered {status}" in error["message"]
        assert not contains_canary(body)
    assert canary.connections == 0
    assert len(hostile.received) == len(REDIRECTS)


async def test_no_redirect_is_followed_through_litellm(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    hostile: HostileUpstream,
    canary: Canary,
    shared_translator: TranslatorProcess,
) -> None:
    """Every call through the translator (ACS_LLM_GATEWAY_DIRECT=false): LiteLLM's OpenAI
    client follows redirects by itself; the translator's event loop refuses the hop. The
    translator is the worker's (tests/support/shared_translator.py): the redirect is the test."""
    server = await gateway_server(
        shared_translator, llm_gateway_direct=False, llm_gateway_timeout=120
    )
    mallory = await member(server, "mallory")
    await mallory.settings(llm_model="m", llm_base_url=hostile.base_url, llm_api_key=PROVIDER_KEY)
    key = await mallory.gateway_key()
    for status in (302, 307):
        hostile.answer(redirect(status, canary), redirect(status, canary))
        code, _, body = await mallory.ask(key)
        assert code in (400, 502), body
        assert not contains_canary(body)
    assert hostile.received, "the translator never called the provider"
    assert canary.connections == 0


async def test_a_webhook_receiver_cannot_redirect_the_deliverer(
    make_sandbox_client: ClientFactory, hostile: HostileUpstream, canary: Canary
) -> None:
    """The operator's receiver, compromised, answers 307 to a port of this host: the delivery
    fails (and is retried), the port is never connected to."""
    hostile.default = redirect(307, canary)
    client = await make_sandbox_client(
        lifecycle_webhook_urls=[f"{hostile.base_url}/hook"],
        lifecycle_webhook_retry_base=0.1,
        lifecycle_webhook_timeout=0.5,
    )
    event = LifecycleEvent(type=LifecycleType.SANDBOX_PAUSED, user_id="bob", sandbox_id="s1")
    await client.app[keys.LIFECYCLE].publish(event)
    deadline = time.monotonic() + 20
    # The first attempt and a retry, both redirected (a followed redirect delivers at once).
    while len(hostile.received) < 2 and not canary.connections:
        assert time.monotonic() < deadline, hostile.received
        await asyncio.sleep(0.05)
    assert canary.connections == 0
