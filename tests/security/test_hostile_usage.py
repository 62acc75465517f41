"""Finding 4 of issue 26: a provider's answer is trusted unchecked. Mallory's own provider
(her `llm_base_url`) reports negative, non-numeric, NaN or absurd usage, or an absurd
Retry-After: her spend must never go down (the monthly budget is not bypassed), no call
answers 500, a stream ends with an error event instead of an exception. The same answers, and
many more, generated: test_hostile_provider_fuzz.py."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane import keys
from controlplane.gateway.answers import MAX_TOKENS
from tests.security.conftest import PROVIDER_KEY, Member, MemberFactory
from tests.support.hostile_llm import Answer, HostileUpstream
from tests.support.live_server import LiveServer

PRICES = {"m": (0.001, 0.002)}


def completion(usage: Any) -> bytes:
    body = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": usage,
    }
    return json.dumps(body).encode()


def streamed(usage: Any) -> list[bytes]:
    chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
    return [
        f"data: {json.dumps(chunk)}\n\n".encode(),
        f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode(),
        b"data: [DONE]\n\n",
    ]


def error_of(body: bytes) -> dict[str, Any]:
    """Our JSON error format: OpenAI's `error` object and our `detail`."""
    parsed = json.loads(body)
    assert parsed["detail"] == parsed["error"]["message"]
    return dict(parsed["error"])


async def spend_never_falls(mallory: Member, before: dict[str, Any]) -> dict[str, Any]:
    after = await mallory.usage()
    for field in ("cost", "prompt_tokens", "completion_tokens", "requests"):
        assert after[field] >= before[field] >= 0, (field, before, after)
    return after


async def test_a_providers_lies_about_usage_never_lower_the_books(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    hostile: HostileUpstream,
) -> None:
    server = await gateway_server(llm_prices=PRICES, llm_user_monthly_budget=1.0)
    mallory = await member(server, "mallory")
    await mallory.settings(llm_model="m", llm_base_url=hostile.base_url, llm_api_key=PROVIDER_KEY)
    key = await mallory.gateway_key()
    honest = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
    hostile.answer(Answer(chunks=[completion(honest)]))
    assert (await mallory.ask(key))[0] == 200
    spent = await recorded(server, mallory)
    assert spent["cost"] == 0.2
    lies: list[Any] = [
        {"prompt_tokens": -1_000_000, "completion_tokens": 0},
        {"prompt_tokens": "lots", "completion_tokens": 1},
        {"prompt_tokens": 1.5, "completion_tokens": 1},
        {"prompt_tokens": True, "completion_tokens": 1},
        {"prompt_tokens": 1},
        [1, 2],
    ]
    for usage in lies:
        hostile.answer(Answer(chunks=[completion(usage)]))
        code, _, body = await mallory.ask(key)
        assert code == 502, (usage, body)
        assert error_of(body)["code"] == "upstream_error"
        spent = await spend_never_falls(mallory, spent)
        assert spent["requests"] == 1  # nothing delivered, nothing metered
    for constant in (b"NaN", b"-Infinity"):  # what Python's JSON parser takes, JSON does not
        raw = b'{"choices": [], "usage": {"prompt_tokens": %s, "completion_tokens": 1}}' % constant
        hostile.answer(Answer(chunks=[raw]))
        code, _, body = await mallory.ask(key)
        assert code == 502, body
        assert error_of(body)["code"] == "upstream_error"
    spent = await spend_never_falls(mallory, spent)

    # Streamed: the content already went out; the stream ends with an error event, and the
    # call is metered by its text (an estimate), never by the lie.
    for usage in lies[:3]:
        hostile.answer(Answer(chunks=streamed(usage), content_type="text/event-stream"))
        code, _, body = await mallory.ask(key, stream=True)
        assert code == 200, body
        assert b"[DONE]" not in body
        last = body.strip().split(b"\n\n")[-1]
        assert json.loads(last.removeprefix(b"data: "))["error"]["code"] == "upstream_error"
        spent = await spend_never_falls(mallory, spent)

    # Absurd but well-formed: clamped to MAX_TOKENS, not an overflow of the books.
    before = await recorded(server, mallory)
    hostile.answer(Answer(chunks=[completion({"prompt_tokens": 10**30, "completion_tokens": 0})]))
    assert (await mallory.ask(key))[0] == 200
    after = await recorded(server, mallory)
    assert after["prompt_tokens"] - before["prompt_tokens"] == MAX_TOKENS
    # ... and the monthly budget, past now, refuses the next call.
    code, _, body = await mallory.ask(key)
    assert code == 400
    assert error_of(body)["code"] == "budget_exceeded"


async def recorded(server: LiveServer, mallory: Member) -> dict[str, Any]:
    """The usage once every answered call's record is written (they are not waited for)."""
    await server.app[keys.GATEWAY].recorded()
    return await mallory.usage()


async def test_an_absurd_retry_after_is_no_500(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    hostile: HostileUpstream,
) -> None:
    server = await gateway_server()
    mallory = await member(server, "mallory")
    await mallory.settings(llm_model="m", llm_base_url=hostile.base_url, llm_api_key=PROVIDER_KEY)
    key = await mallory.gateway_key()
    for value in ("inf", "nan", "-5", "1e308", "soon"):
        hostile.answer(Answer(status=429, headers={"Retry-After": value}, chunks=[b"{}"]))
        async with mallory.http.post(
            mallory.base + "/api/v1/llm-gateway/v1/chat/completions",
            json={"model": "m", "messages": []},
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            assert resp.status == 429, (value, await resp.text())
            after = resp.headers.get("Retry-After")
            assert after is None or 1 <= int(after) <= 3600, (value, after)
