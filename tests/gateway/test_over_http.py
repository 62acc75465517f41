"""The LLM gateway over real HTTP with a user's gateway key (GET /api/keys/llm/byor), against
the scripted OpenAI-compatible model (tests/support/fake_llm.py, called directly) and the scripted
Anthropic Messages endpoint (tests/support/fake_anthropic.py, through LiteLLM in the translator),
driven by the real `openai` client: translation, streaming, tools, usage and cost, budgets,
rate limits, revocation, failures and where the gateway refuses to connect.
Sandbox tokens and both agent kinds: tests/gateway/test_from_sandboxes.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionToolParam

from controlplane.config import ServiceConfig
from controlplane.gateway.translator_process import TranslatorProcess
from tests.conftest import BOOTSTRAP_KEY
from tests.gateway.conftest import LLM_KEY
from tests.support.fake_anthropic import FakeAnthropic, anthropic_text, anthropic_tool_use
from tests.support.fake_llm import FakeLLM, reply_text, reply_tool_call
from tests.support.live_server import LiveServer, free_port, start_live_server

ANTHROPIC_KEY = "sk-ant-SECRET-77c3d4"
PRICES = {"fake-model": (0.001, 0.002), "claude-fake-1": (0.003, 0.015)}
GATEWAY = "/api/v1/llm-gateway/v1"
SHORT_TIMEOUT = 2.0
"""The gateway's time-out where a test waits for it: three attempts of it are waited out."""


@pytest.fixture
async def local_anthropic() -> AsyncIterator[FakeAnthropic]:
    server = FakeAnthropic(api_key=ANTHROPIC_KEY)
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def live_no_docker(
    request: pytest.FixtureRequest,
    make_config: Callable[..., ServiceConfig],
    fake: FakeLLM,
    local_anthropic: FakeAnthropic,
    shared_translator: TranslatorProcess,
) -> AsyncIterator[LiveServer]:
    """A control plane without Docker services; the fakes live on this host, so their ports
    are the host ports the gateway may call (ACS_SANDBOX_HOST_PORTS). A test's
    `pytest.mark.live_config(**settings)` changes its configuration. Its LLM translator is the
    worker's (tests/support/shared_translator.py), started on the first call through it."""
    marker = request.node.get_closest_marker("live_config")
    settings: dict[str, Any] = {
        "llm_prices": PRICES,
        "sandbox_host_ports": [fake.port, local_anthropic.port],
        "llm_gateway_backoff": 0.05,
        # Long enough for LiteLLM's first call in the translator on a loaded host (5 s timed
        # out there); the test of the time-out sets a short one.
        "llm_gateway_timeout": 30,
    }
    config = make_config(**settings | (marker.kwargs if marker else {}))
    app_server = await start_live_server(config, with_sandboxes=False, translator=shared_translator)
    yield app_server
    await app_server.close()


class User:
    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http, self.base, self.headers = http, base, {"X-Session-API-Key": key}

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        headers = kwargs.pop("headers", self.headers)
        async with self.http.request(method, self.base + path, headers=headers, **kwargs) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def settings(self, **body: Any) -> None:
        status, answer = await self.call("POST", "/api/settings", json=body)
        assert status == 200, answer

    async def gateway_key(self) -> str:
        status, answer = await self.call("GET", "/api/keys/llm/byor")
        assert status == 200, answer
        return str(answer["key"])


@pytest.fixture
async def gateway_user(
    live_no_docker: LiveServer, user_headers: Callable[..., Any]
) -> AsyncIterator[Callable[..., Any]]:
    async with aiohttp.ClientSession() as http:

        async def make(name: str = "alice") -> User:
            headers = await user_headers(name)
            return User(http, live_no_docker.url, headers["X-Session-API-Key"])

        yield make


def client(live: LiveServer, key: str, **kwargs: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=live.url + GATEWAY, api_key=key, max_retries=0, **kwargs)


async def ask(live: LiveServer, key: str, model: str = "fake-model") -> Any:
    """One non-streaming call with a client of its own, closed after."""
    async with client(live, key) as llm:
        return await llm.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}]
        )


TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


async def test_openai_compatible_model_through_the_gateway(
    live_no_docker: LiveServer, gateway_user: Callable[..., Any], fake: FakeLLM
) -> None:
    alice = await gateway_user("alice")
    await alice.settings(llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY)
    key = await alice.gateway_key()
    assert key.startswith("acs-llm.")
    assert await alice.gateway_key() == key  # the same key again, not a new one each time
    fake.script(
        [reply_tool_call("terminal", {"command": "ls"}, usage=(100, 20)), reply_text("hello")]
    )
    llm = client(live_no_docker, key)
    models = await llm.models.list()
    assert [m.id for m in models.data] == ["fake-model"]

    answer = await llm.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "list"}], tools=TOOLS
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "terminal"
    assert json.loads(call.function.arguments) == {"command": "ls"}
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == 100
    # The provider saw the real key, the model's own name and the tools, as sent.
    sent = fake.requests[-1]
    assert sent.authorization == f"Bearer {LLM_KEY}"
    assert sent.body["model"] == "fake-model"
    assert sent.body["tools"] == TOOLS

    # Streaming: the chunks as the provider sent them; usage asked for by the gateway and not
    # passed on to a client that did not ask for it.
    stream = await llm.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello"
    assert all(c.usage is None for c in chunks)
    assert fake.requests[-1].body["stream_options"] == {"include_usage": True}
    await llm.close()

    status, usage = await alice.call("GET", "/api/v1/llm-gateway/usage")
    assert status == 200, usage
    assert usage["requests"] == 2
    assert usage["prompt_tokens"] == 100 + fake.prompt_tokens
    expected = (
        100 * 0.001 + 20 * 0.002 + fake.prompt_tokens * 0.001 + fake.completion_tokens * 0.002
    )
    assert usage["cost"] == pytest.approx(expected)
    metrics = await (await live_get(live_no_docker, "/metrics")).text()
    assert 'acs_llm_requests_total{provider="openai_compatible",status="200"} 2.0' in metrics
    assert 'acs_llm_tokens_total{kind="prompt",provider="openai_compatible"} 200.0' in metrics
    assert "acs_llm_cost_usd_total" in metrics
    assert "acs_llm_request_seconds_bucket" in metrics
    assert LLM_KEY not in metrics


async def live_get(live: LiveServer, path: str) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(live.url + path, headers={"X-Session-API-Key": BOOTSTRAP_KEY})
        await resp.read()
        return resp


async def test_anthropic_model_is_translated_streaming_included(
    live_no_docker: LiveServer,
    gateway_user: Callable[..., Any],
    local_anthropic: FakeAnthropic,
) -> None:
    alice = await gateway_user("alice")
    await alice.settings(
        llm_model="anthropic/claude-fake-1",
        llm_base_url=local_anthropic.base_url,
        llm_api_key=ANTHROPIC_KEY,
    )
    key = await alice.gateway_key()
    local_anthropic.script(
        [
            anthropic_tool_use("terminal", {"command": "pwd"}, usage=(40, 12)),
            anthropic_text("the answer is 42", usage=(30, 7)),
        ]
    )
    llm = client(live_no_docker, key, timeout=120)  # the translator's first start imports LiteLLM
    answer = await llm.chat.completions.create(
        model="anthropic/claude-fake-1",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "where am I?"},
        ],
        tools=TOOLS,
        max_tokens=100,
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "terminal",
        {"command": "pwd"},
    )
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (40, 12)
    # What reached the provider is Anthropic's shape, with the real key.
    first = local_anthropic.requests[0]
    assert first.headers["x-api-key"] == ANTHROPIC_KEY
    assert first.body["model"] == "claude-fake-1"
    assert (
        first.body["system"][0]["text"] == "You are terse."
        if isinstance(first.body["system"], list)
        else first.body["system"] == "You are terse."
    )
    assert first.body["tools"][0]["name"] == "terminal"
    assert "input_schema" in first.body["tools"][0]

    stream = await llm.chat.completions.create(
        model="anthropic/claude-fake-1",
        messages=[{"role": "user", "content": "and?"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=100,
    )
    chunks = [chunk async for chunk in stream]
    await llm.close()
    assert local_anthropic.requests[1].body["stream"] is True
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "the answer is 42"
    final = [c.usage for c in chunks if c.usage is not None]
    assert final
    assert (final[-1].prompt_tokens, final[-1].completion_tokens) == (30, 7)

    status, usage = await alice.call("GET", "/api/v1/llm-gateway/usage")
    assert status == 200
    assert usage["requests"] == 2
    assert usage["cost"] == pytest.approx(70 * 0.003 + 19 * 0.015)


async def test_revoked_or_replaced_key_loses_access_at_once(
    live_no_docker: LiveServer, gateway_user: Callable[..., Any], fake: FakeLLM
) -> None:
    alice, bob = await gateway_user("alice"), await gateway_user("bob")
    await alice.settings(llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY)
    key = await alice.gateway_key()
    llm = client(live_no_docker, key)
    await llm.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "x"}]
    )
    status, fresh = await alice.call("POST", "/api/keys/llm/byor/refresh")
    assert status == 200
    assert fresh["key"] != key
    with pytest.raises(openai.AuthenticationError):
        await llm.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}]
        )
    assert (await alice.call("DELETE", "/api/keys/llm/byor"))[0] == 204
    for presented in (fresh["key"], key, "acs-llm.YWxpY2U.000000000000." + "x" * 43, "sk-anything"):
        with pytest.raises(openai.AuthenticationError):
            await ask(live_no_docker, presented)
    # An API key of the control plane is not a gateway credential, nor the gateway key an API key.
    with pytest.raises(openai.AuthenticationError):
        await ask(live_no_docker, alice.headers["X-Session-API-Key"])
    new = await alice.gateway_key()
    status, _ = await alice.call("GET", "/api/v1/users/me", headers={"X-Session-API-Key": new})
    assert status == 401
    # Bob's key calls bob's settings only: he has no model, and alice's is not his to name.
    bob_key = await bob.gateway_key()
    with pytest.raises(openai.BadRequestError):
        await ask(live_no_docker, bob_key)
    await bob.settings(llm_model="other-model", llm_base_url=fake.base_url, llm_api_key="sk-b")
    with pytest.raises(openai.NotFoundError):
        await ask(live_no_docker, bob_key)
    assert all(r.authorization != "Bearer sk-b" for r in fake.requests)
    await llm.close()


async def test_a_call_waits_for_no_replica_while_changes_do(
    live_no_docker: LiveServer,
    gateway_user: Callable[..., Any],
    fake: FakeLLM,
    make_config: Callable[..., ServiceConfig],
    raw_redis: aioredis.Redis,
) -> None:
    """With ACS_REDIS_WAIT_REPLICAS a change through the API waits for a replica; a model call's
    bookkeeping (the rate count before it, the usage after) does not. Here no replica exists:
    a setting is refused (503) while calls go through at once and are metered."""
    alice = await gateway_user("alice")
    await alice.settings(llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY)
    key = await alice.gateway_key()
    waiting = await start_live_server(
        make_config(
            llm_prices=PRICES,
            sandbox_host_ports=[fake.port],
            llm_rate_limit_per_minute=1000,
            redis_wait_replicas=1,
            redis_wait_timeout=1.0,
        ),
        with_sandboxes=False,
    )
    try:
        async with aiohttp.ClientSession() as http:
            # The same settings again: the write is on the master, unacknowledged.
            body = {
                "llm_model": "fake-model",
                "llm_base_url": fake.base_url,
                "llm_api_key": LLM_KEY,
            }
            url = waiting.url + "/api/settings"
            async with http.post(url, json=body, headers=alice.headers) as resp:
                assert resp.status == 503, await resp.text()  # no replica acknowledged it
        waits = await wait_count(raw_redis)
        for stream in (False, True):
            async with client(waiting, key) as llm:
                if stream:
                    chunks = await llm.chat.completions.create(
                        model="fake-model", messages=[{"role": "user", "content": "x"}], stream=True
                    )
                    assert [c async for c in chunks]
                else:
                    await llm.chat.completions.create(
                        model="fake-model", messages=[{"role": "user", "content": "x"}]
                    )
        deadline = time.monotonic() + 5
        while True:
            status, usage = await alice.call("GET", "/api/v1/llm-gateway/usage")
            assert status == 200, usage
            if usage["requests"] == 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert usage["requests"] == 2
        assert await wait_count(raw_redis) == waits  # neither call's writes asked for a replica
    finally:
        await waiting.close()


async def wait_count(redis: aioredis.Redis) -> int:
    """How many WAIT commands the Redis server has run."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


async def test_budgets_and_rate_limit_refuse_before_forwarding(
    make_config: Callable[..., ServiceConfig],
    redis_url: str,
    user_headers: Callable[..., Any],
    fake: FakeLLM,
) -> None:
    config = make_config(
        llm_prices=PRICES,
        sandbox_host_ports=[fake.port],
        llm_user_monthly_budget=0.25,
        llm_rate_limit_per_minute=4,
    )
    server = await start_live_server(config, with_sandboxes=False)
    try:
        async with aiohttp.ClientSession() as http:
            alice = User(http, server.url, (await user_headers("alice"))["X-Session-API-Key"])
            await alice.settings(
                llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY
            )
            llm = client(server, await alice.gateway_key())
            fake.script([reply_text("a", usage=(100, 50))] * 3)  # $0.2 per call
            await llm.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}]
            )
            await llm.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}]
            )  # started under the budget: runs, and takes the month to $0.40
            sent = len(fake.requests)
            with pytest.raises(openai.BadRequestError) as refused:
                await llm.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "x"}]
                )
            assert refused.value.code == "budget_exceeded"
            assert "monthly budget of $0.250000" in str(refused.value)
            assert len(fake.requests) == sent  # never forwarded
            # Bob's calls are cheap: his fifth in a minute is over the rate limit (4).
            bob = User(http, server.url, (await user_headers("bob"))["X-Session-API-Key"])
            await bob.settings(
                llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY
            )
            bob_key = await bob.gateway_key()
            fake.script([reply_text("b", usage=(1, 1))] * 5)
            for i in range(4):
                if i == 2:  # a Redis restarted from its data has none of the scripts loaded
                    scripts = aioredis.Redis.from_url(redis_url)
                    await scripts.script_flush()
                    await scripts.aclose()
                await ask(server, bob_key)
                async with client(server, bob_key) as listing:
                    await listing.models.list()  # not counted: only model calls are
            with pytest.raises(openai.RateLimitError) as limited:
                await ask(server, bob_key)
            assert int(limited.value.response.headers["Retry-After"]) >= 1
            await llm.close()
            metrics = await (await live_get(server, "/metrics")).text()
            assert 'acs_llm_refused_total{reason="user_budget"}' in metrics
            assert 'acs_llm_refused_total{reason="rate_limit"} 1.0' in metrics
    finally:
        await server.close()


@pytest.mark.live_config(llm_gateway_timeout=SHORT_TIMEOUT)
async def test_provider_failures_retry_then_answer_an_error(
    live_no_docker: LiveServer, gateway_user: Callable[..., Any], fake: FakeLLM
) -> None:
    alice = await gateway_user("alice")
    await alice.settings(llm_model="fake-model", llm_base_url=fake.base_url, llm_api_key=LLM_KEY)
    llm = client(live_no_docker, await alice.gateway_key())
    ask: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
    # 429 then 500: retried with backoff, the third attempt answers.
    fake.fail_next(1, status=429, retry_after=0.1)
    fake.fail_next(1, status=500)
    fake.script([reply_text("after retries")])
    started = time.monotonic()
    answer = await llm.chat.completions.create(**ask)
    assert answer.choices[0].message.content == "after retries"
    assert time.monotonic() - started >= 0.1  # Retry-After honoured
    # Down for longer than the retries: the provider's status, said plainly, in OpenAI's shape.
    fake.fail_next(3, status=503)
    with pytest.raises(openai.InternalServerError) as down:
        await llm.chat.completions.create(**ask)
    assert down.value.status_code == 502
    assert "after 3 attempts" in str(down.value)
    fake.fail_next(3, status=429, retry_after=0.05)
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(**ask)
    # A 4xx of the provider is not retried.
    before = len(fake.requests)
    fake.fail_next(1, status=400, body='{"error": {"message": "bad tools"}}')
    with pytest.raises(openai.BadRequestError) as bad:
        await llm.chat.completions.create(**ask)
    assert "bad tools" in str(bad.value)
    assert len(fake.requests) == before + 1
    # A provider that echoes the key in its refusal: the caller never reads it.
    echo = json.dumps({"error": {"message": f"Incorrect API key provided: {LLM_KEY}."}})
    fake.fail_next(1, status=401, body=echo)
    with pytest.raises(openai.AuthenticationError) as echoed:
        await llm.chat.completions.create(**ask)
    assert LLM_KEY not in echoed.value.response.text
    assert "Incorrect API key provided: ***" in echoed.value.response.text
    # Slow: the call ends at the gateway's time-out (2 s here) with a 504, nothing hangs.
    fake.hold()
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as slow:
        await llm.chat.completions.create(**ask)
    fake.release()
    assert slow.value.status_code == 504
    assert time.monotonic() - started < SHORT_TIMEOUT * 3 + 3  # three attempts at most
    # Unreachable.
    port = fake.port
    await fake.close()
    with pytest.raises(openai.InternalServerError) as gone:
        await llm.chat.completions.create(**ask)
    assert "unreachable" in str(gone.value)
    assert port
    await llm.close()


async def test_gateway_never_calls_the_hosts_own_services_for_a_user(
    live_no_docker: LiveServer, gateway_user: Callable[..., Any]
) -> None:
    """llm_base_url aimed at a service of this host (not in ACS_SANDBOX_HOST_PORTS), the API
    itself by name, or a metadata address: refused before any connection."""
    hits: list[str] = []

    async def internal(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"secret": "internal"})

    service = web.Application()
    service.router.add_route("*", "/{tail:.*}", internal)
    runner = web.AppRunner(service)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    alice = await gateway_user("alice")
    key = await alice.gateway_key()
    api_port = int(live_no_docker.url.rsplit(":", 1)[1])
    try:
        for base in (
            f"http://127.0.0.1:{port}/v1",
            f"http://localhost:{port}/v1",
            f"http://[::ffff:127.0.0.1]:{port}/v1",
            f"http://localhost:{api_port}/api",
            "http://169.254.169.254/latest",
        ):
            await alice.settings(llm_model="some-model", llm_base_url=base, llm_api_key="sk-x")
            with pytest.raises(openai.BadRequestError) as refused:
                await ask(live_no_docker, key, "some-model")
            assert refused.value.code == "destination_refused", base
        assert hits == []
    finally:
        await runner.cleanup()


async def test_a_restart_mid_stream_ends_the_stream_with_an_error(
    make_config: Callable[..., ServiceConfig], user_headers: Callable[..., Any]
) -> None:
    # A provider that starts a stream and then stalls.
    stall = asyncio.Event()

    async def stalled(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "par"}}]}
        await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await stall.wait()
        return out

    provider = web.Application()
    provider.router.add_post("/v1/chat/completions", stalled)
    runner = web.AppRunner(provider, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    server = await start_live_server(make_config(sandbox_host_ports=[port]), with_sandboxes=False)
    try:
        async with aiohttp.ClientSession() as http:
            alice = User(http, server.url, (await user_headers("alice"))["X-Session-API-Key"])
            await alice.settings(
                llm_model="fake-model", llm_base_url=f"http://127.0.0.1:{port}/v1", llm_api_key="k"
            )
            key = await alice.gateway_key()
            body = {"model": "fake-model", "messages": [], "stream": True}
            async with http.post(
                server.url + GATEWAY + "/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as resp:
                assert resp.status == 200
                assert b"par" in await resp.content.readline()
                closing = asyncio.create_task(server.close())
                rest = await asyncio.wait_for(resp.content.read(), 15)
            await closing
        assert b'"code": "stream_interrupted"' in rest
        assert b"shutting down" in rest
        assert b"[DONE]" not in rest
    finally:
        stall.set()
        await runner.cleanup()
        await server.close()


async def test_a_stream_is_relayed_as_it_arrives_whatever_its_pieces(
    make_config: Callable[..., ServiceConfig], user_headers: Callable[..., Any]
) -> None:
    # A provider whose writes cut lines anywhere and carry several events at once: the client
    # gets the same lines, the usage chunk only when it asked, the provider key masked.
    first = b'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\r\n\r\n'
    second = b'data: {"choices":[{"index":0,"delta":{"content":" world"}}]}\n\n'
    echoed = b'data: {"error":{"message":"key ' + LLM_KEY.encode() + b' is over quota"}}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
    done = b"data: [DONE]\n\n"
    stream = first + second + echoed + usage + done
    cuts = [20, len(first) + 5, len(first) + len(second) + 30, len(stream) - 4]
    long_line = False
    slow_start = 0.0

    async def pieces(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await asyncio.sleep(slow_start)
        if long_line:
            await out.write(b'data: {"choices":[{"delta":{"content":"' + b"x" * (1 << 18))
            return out
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            await out.write(stream[start:end])
            await asyncio.sleep(0.02)  # each piece its own segment
        return out

    provider = web.Application()
    provider.router.add_post("/v1/chat/completions", pieces)
    runner = web.AppRunner(provider)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    server = await start_live_server(make_config(sandbox_host_ports=[port]), with_sandboxes=False)
    try:
        async with aiohttp.ClientSession() as http:
            alice = User(http, server.url, (await user_headers("alice"))["X-Session-API-Key"])
            await alice.settings(
                llm_model="fake-model",
                llm_base_url=f"http://127.0.0.1:{port}/v1",
                llm_api_key=LLM_KEY,
            )
            key = await alice.gateway_key()

            async def relayed(**extra: Any) -> bytes:
                body = {"model": "fake-model", "messages": [], "stream": True, **extra}
                async with http.post(
                    server.url + GATEWAY + "/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as resp:
                    assert resp.status == 200
                    return await resp.read()

            masked = echoed.replace(LLM_KEY.encode(), b"***")
            assert await relayed() == first + second + masked + done
            with_usage = await relayed(stream_options={"include_usage": True})
            assert with_usage == first + second + masked + usage + done
            for _ in range(100):  # usage is written after the answer, not waited for
                status, spent = await alice.call("GET", "/api/v1/llm-gateway/usage")
                if spent["requests"] == 2:
                    break
                await asyncio.sleep(0.05)
            assert status == 200, spent
            assert (spent["requests"], spent["prompt_tokens"], spent["completion_tokens"]) == (
                2,
                14,
                6,
            )

            # The headers wait for the first event to go out with it, but not for long: a
            # provider slow to its first token still lets the client see its 200 at once.
            slow_start = 1.0
            started = time.perf_counter()
            async with http.post(
                server.url + GATEWAY + "/chat/completions",
                json={"model": "fake-model", "messages": [], "stream": True},
                headers={"Authorization": f"Bearer {key}"},
            ) as resp:
                assert resp.status == 200
                assert time.perf_counter() - started < 0.8
                assert await resp.read() == first + second + masked + done
            assert time.perf_counter() - started >= 1.0
            slow_start = 0.0

            long_line = True
            broken = await relayed()
            assert b'"code": "upstream_error"' in broken
            assert b"xxxx" not in broken
    finally:
        await runner.cleanup()
        await server.close()
