"""Finding 2 of issue 26, on the LAN: Mallory, with her own API key, sets her `llm_base_url` to
a machine of the network the control plane sits in (a namespace standing for it, at a private
address): a LAN service, the deployment's own Redis, another replica of the control plane.
Refused by default; the operator's allow-list (ACS_OUTBOUND_ALLOW) admits the LAN, never Redis
nor a replica. Each target counts what reached it. Sandboxes' networks (Docker, Kubernetes):
test_sandboxes.py and tests/drivers/kubernetes/test_gateway_fence.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.security.conftest import PROVIDER_KEY, MemberFactory
from tests.support import canary_server
from tests.support.hostile_llm import CANARY, contains_canary
from tests.support.lan_host import LanHost, lan_host
from tests.support.live_server import LiveServer

CANARY_PORT = 8123


async def wait_for(check: Callable[[], bool], what: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@dataclass
class Lan:
    host: LanHost
    canary: Path
    """The log of a canary on CANARY_PORT of that machine: a line per connection."""

    @property
    def address(self) -> str:
        return self.host.address


@pytest.fixture
async def lan(tmp_path: Path) -> AsyncIterator[Lan]:
    """A machine of the LAN with a canary."""
    with lan_host() as host:
        log = tmp_path / "lan-canary.log"
        host.run(sys.executable, canary_server.__file__, str(CANARY_PORT), CANARY, str(log))
        await wait_for(log.exists, "the LAN canary did not start")
        yield Lan(host, log)


def allowing(networks: list[str]) -> dict[str, list[str]]:
    """The setting, when it admits something (the default is named nowhere: the attack as any
    version of the control plane is configured)."""
    return {"outbound_allow": networks} if networks else {}


def connections(log: Path) -> int:
    return log.read_text().count("connection") if log.exists() else 0


async def test_a_lan_machine_is_refused_unless_the_operator_admits_it(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    lan: Lan,
) -> None:
    fenced = await gateway_server()
    mallory = await member(fenced, "mallory")
    target = f"http://{lan.address}:{CANARY_PORT}/v1"
    await mallory.settings(llm_model="m", llm_base_url=target, llm_api_key=PROVIDER_KEY)
    key = await mallory.gateway_key()
    for stream in (False, True):
        code, _, body = await mallory.ask(key, stream=stream)
        assert code == 400, body
        assert json.loads(body)["error"]["code"] == "destination_refused"
        assert "ACS_OUTBOUND_ALLOW" in json.loads(body)["error"]["message"]
        assert not contains_canary(body)
    assert connections(lan.canary) == 0
    # The control: admitted by the operator, the same machine answers (the canary is reachable,
    # and what stopped Mallory was the policy).
    admitted = await gateway_server(outbound_allow=[lan.host.network])
    code, _, body = await (await member(admitted, "mallory")).ask(key)
    assert code == 200, body
    assert contains_canary(body)
    assert connections(lan.canary) == 1


async def test_redis_on_the_lan_is_refused_even_where_the_lan_is_admitted(
    lan: Lan,
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    tmp_path: Path,
) -> None:
    """The control plane's Redis on another machine: Mallory aims at it through the gateway
    (Redis logs any HTTP request it gets as a "SECURITY ATTACK"), by default and where the
    operator admits that machine's network (whose other port, the canary, then answers).
    `lan` comes first, so it goes last: the servers using its Redis close while it still
    answers (closed after it, one reconnected to an address no longer routed, 15 s of
    teardown)."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed (make test installs it)"
    port, log = 6390, tmp_path / "lan-redis.log"
    lan.host.run(
        *(binary, "--port", str(port), "--bind", lan.address, "--protected-mode", "no"),
        *("--save", "", "--appendonly", "no", "--dir", str(tmp_path), "--logfile", str(log)),
    )
    url = f"redis://{lan.address}:{port}"
    redis = aioredis.Redis.from_url(url)
    try:
        await wait_for(lambda: log.exists() and "Ready to accept" in log.read_text(), "no Redis")
        for admitted in ([], [lan.host.network]):
            server = await gateway_server(redis_url=url, **allowing(admitted))
            mallory = await member(server, "mallory", redis)
            target = f"http://{lan.address}:{port}/v1"
            await mallory.settings(llm_model="m", llm_base_url=target, llm_api_key="k")
            code, _, body = await mallory.ask(await mallory.gateway_key())
            assert code == 400, (admitted, body)
            assert json.loads(body)["error"]["code"] == "destination_refused"
            assert "SECURITY ATTACK" not in log.read_text()
        canary = f"http://{lan.address}:{CANARY_PORT}/v1"
        await mallory.settings(llm_model="m", llm_base_url=canary, llm_api_key="k")
        code, _, body = await mallory.ask(await mallory.gateway_key())
        assert code == 200, body
        assert connections(lan.canary) == 1
    finally:
        await redis.aclose()


async def test_another_replica_is_refused_even_where_the_lan_is_admitted(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    lan: Lan,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """A replica of the control plane on another machine (it tells the others its addresses
    through Redis as it starts, before it serves): Mallory aims her `llm_base_url` at its API,
    by default and where the operator admits that machine's network."""
    port, log, data = 3111, tmp_path / "replica.log", tmp_path / "data"
    data.mkdir()
    replica = ("-m", "tests.support.gateway_replica", redis_url, lan.address, str(port), str(data))
    lan.host.run(sys.executable, *replica, log=log)
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 60
        while True:
            try:
                async with http.get(f"http://{lan.address}:{port}/health") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            await asyncio.sleep(0.1)
    target = f"http://{lan.address}:{port}/api/v1/llm-gateway/v1"
    for admitted in ([], [lan.host.network]):
        server = await gateway_server(
            data_dir=data,
            sandbox_host_ports=[CANARY_PORT],  # a model server on a replica's host may be called
            **allowing(admitted),
        )
        mallory = await member(server, "mallory")
        await mallory.settings(llm_model="m", llm_base_url=target, llm_api_key="k")
        code, _, body = await mallory.ask(await mallory.gateway_key())
        assert code == 400, (admitted, body)
        assert json.loads(body)["error"]["code"] == "destination_refused"
        assert "/chat/completions" not in log.read_text()
    # A replica's host is as this one: its ACS_SANDBOX_HOST_PORTS (the canary's) answer.
    canary = f"http://{lan.address}:{CANARY_PORT}/v1"
    await mallory.settings(llm_model="m", llm_base_url=canary, llm_api_key="k")
    code, _, body = await mallory.ask(await mallory.gateway_key())
    assert code == 200, body
    assert connections(lan.canary) == 1
