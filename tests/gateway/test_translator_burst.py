"""A burst of gateway calls at a translator that is not running yet (issue 30): the translator
(LiteLLM in a process of its own) is started by the first call that needs it, and answers only
once LiteLLM is imported (seconds; a minute on a loaded host). Every call that comes meanwhile
waits for that start and is served; before, the calls behind the first found the process
running, sent to a socket that did not exist yet, and answered 502 `upstream_unreachable`
(bench.gateway_peer --translated: 127 of 128 calls at once). A translator that cannot start
answers the whole burst 503 `translator_unavailable` in the gateway's error shape, from one
attempt to start it, not one per waiting call."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controlplane.config import ServiceConfig
from controlplane.gateway.translator_process import TranslatorProcess
from tests.gateway.conftest import LLM_KEY
from tests.gateway.test_translator_memory import call
from tests.support.fake_llm import FakeLLM
from tests.support.live_server import LiveServer, start_live_server
from tests.support.log_capture import capture_logs
from tests.support.processes import translators

BURST = 48
BROKEN_EXIT = 3


class BrokenTranslator(TranslatorProcess):
    """A translator whose process exits after a second (a broken installation, slow enough that
    a burst's calls arrive while it starts), counting its starts."""

    starts = 0

    def command(self) -> list[str]:
        self.starts += 1
        return [
            sys.executable,
            "-c",
            f"import time; time.sleep(1); raise SystemExit({BROKEN_EXIT})",
        ]


def _translated(make_config: Callable[..., ServiceConfig], fake: FakeLLM) -> ServiceConfig:
    return make_config(
        llm_gateway_direct=False,  # every call through the translator
        sandbox_host_ports=[fake.port],
        llm_gateway_backoff=0.05,
        llm_gateway_timeout=120,
    )


@pytest.fixture
async def live_translated(
    make_config: Callable[..., ServiceConfig], fake: FakeLLM
) -> AsyncIterator[LiveServer]:
    """A control plane with a translator of its own, not started until a call needs it."""
    server = await start_live_server(_translated(make_config, fake), with_sandboxes=False)
    yield server
    await server.close()


async def _gateway_key(live: LiveServer, headers: dict[str, str], fake: FakeLLM) -> str:
    settings = {"llm_model": "m", "llm_base_url": fake.base_url, "llm_api_key": LLM_KEY}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(live.url + "/api/settings", json=settings) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(live.url + "/api/keys/llm/byor") as resp:
            key: str = (await resp.json())["key"]
    return key


async def _burst(live: LiveServer, key: str, count: int) -> list[tuple[int, dict[str, Any]]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return await asyncio.gather(*(call(http, live, key) for _ in range(count)))


def _code(body: dict[str, Any]) -> str | None:
    error = body.get("error")
    return error.get("code") if isinstance(error, dict) else None


async def test_a_burst_at_a_translator_still_starting_waits_for_it_and_is_served(
    live_translated: LiveServer, user_headers: Callable[..., Any], fake: FakeLLM
) -> None:
    key = await _gateway_key(live_translated, await user_headers("burst"), fake)
    assert translators() == [], "a translator of this process runs already"
    for _ in range(3):
        with capture_logs("info") as logs:
            answers = await _burst(live_translated, key, BURST)
        codes = {_code(body) for _status, body in answers}
        if codes != {"translator_unavailable"}:
            break
        # The start itself outlived START_TIMEOUT (a host too loaded to import LiteLLM in
        # 90 s): the whole burst shared that one answer; the next burst starts it again.
        assert {status for status, _body in answers} == {503}
    statuses = [status for status, _body in answers]
    assert statuses == [200] * BURST, [body for status, body in answers if status != 200][:3]
    assert all(body["choices"][0]["message"]["content"] for _status, body in answers)
    assert len(fake.requests) >= BURST
    # One start served the whole burst.
    started = logs.events("llm_translator_started")
    assert len(started) == 1, started
    assert len(translators()) == 1, translators()


async def test_a_translator_that_cannot_start_fails_the_burst_from_one_start(
    make_config: Callable[..., ServiceConfig],
    fake: FakeLLM,
    user_headers: Callable[..., Any],
    tmp_path: Path,
) -> None:
    broken = BrokenTranslator(tmp_path / "llm")
    live = await start_live_server(
        _translated(make_config, fake), with_sandboxes=False, translator=broken
    )
    try:
        key = await _gateway_key(live, await user_headers("burst"), fake)
        answers = await _burst(live, key, BURST)
        # Every call answered at once, in the gateway's own error shape (OpenAI's, with our
        # detail), from the one start they all waited for.
        assert [status for status, _body in answers] == [503] * BURST
        for _status, body in answers:
            assert _code(body) == "translator_unavailable", body
            assert body["error"]["type"] == "api_error"
            assert f"exited with {BROKEN_EXIT} while starting" in body["detail"]
        # One start for the burst; a loaded host may spread the burst's calls past it, and a
        # call after a failed start tries again (the old code: one start per waiting call).
        assert 1 <= broken.starts <= 3, broken.starts
        before = broken.starts
        assert fake.requests == []
        # A failed start is not remembered: the next call tries again.
        (status, body), = await _burst(live, key, 1)  # fmt: skip
        assert status == 503, body
        assert broken.starts == before + 1
    finally:
        await live.close()
        await broken.close()
