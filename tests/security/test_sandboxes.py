"""Finding 2 of issue 26, on Docker: Mallory sets her `llm_base_url` to Bob's sandbox (its
container's address, where the host reaches any port) to read what Bob's agent serves there, a
canary started in Bob's sandbox as his agent user. She calls the gateway with her own gateway
key, and from inside her own sandbox, as her agent user, with its sandbox token. Refused, even
by an operator who admitted the whole private 10/8 (the sandbox networks are never admitted);
the canary never sees a connection. The same from inside her sandbox for this host's ports
(through host.docker.internal)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from controlplane import keys
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.ids import uuid7_hex
from tests.security.conftest import PROVIDER_KEY
from tests.support import canary_server
from tests.support.hostile_llm import CANARY, Canary, contains_canary
from tests.support.sandbox_helpers import call_from, exec_as_agent, sandbox_of, start, wait_status
from tests.support.types import Client, ClientFactory

pytestmark = pytest.mark.usefixtures("sandbox_images")

CANARY_PORT = 8011
CANARY_SCRIPT = Path(canary_server.__file__).read_text()
CANARY_LOG = "/tmp/canary.log"
Headers = Callable[..., Awaitable[dict[str, str]]]


async def running_sandbox(client: Client, headers: dict[str, str]) -> str:
    sandbox_id = str((await start(client, headers))["id"])
    await wait_status(client, headers, sandbox_id, "RUNNING", within=60)
    return sandbox_id


async def start_canary(container: Any) -> None:
    """The canary in the sandbox, as its agent user, on CANARY_PORT (every address)."""
    argv = ["python3", "-c", CANARY_SCRIPT, str(CANARY_PORT), CANARY, CANARY_LOG]
    await asyncio.to_thread(container.exec_run, argv, user="agent", detach=True)
    for _ in range(100):
        code, _ = await asyncio.to_thread(exec_as_agent, container, "test", "-e", CANARY_LOG)
        if code == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the canary did not start in Bob's sandbox")


async def canary_connections(container: Any) -> int:
    code, out = await asyncio.to_thread(exec_as_agent, container, "cat", CANARY_LOG)
    assert code == 0, out
    return out.count("connection")


def address_of(container: Any, field: str = "IPAddress") -> str:
    """The container's address on its sandbox network (`field` Gateway: the host's there)."""
    container.reload()
    networks = container.attrs["NetworkSettings"]["Networks"]
    (address,) = [n[field] for n in networks.values() if n[field]]
    return str(address)


def gateway_of(container: Any) -> str:
    return address_of(container, "Gateway")


async def gateway_token(client: Client, sandbox_id: str, user: str) -> str:
    """The token an agent in that sandbox holds for a conversation of `user` there (the
    conversation written by the real store, as a start writes it)."""
    info = AppConversationInfo(
        id=uuid7_hex(), created_by_user_id=user, sandbox_id=sandbox_id, llm_model="m"
    )
    await ConversationStore(client.app[keys.REDIS]).create(info)
    return client.app[keys.GATEWAY].tokens.issue(sandbox_id, info.id, user)


async def test_another_users_sandbox_is_never_a_model_server(
    make_sandbox_client: ClientFactory,
    user_headers: Headers,
    docker_client: docker.DockerClient,
    test_prefix: str,
    canary: Canary,
) -> None:
    client = await make_sandbox_client()
    bob, mallory = await user_headers("bob"), await user_headers("mallory")
    bobs = sandbox_of(docker_client, test_prefix, await running_sandbox(client, bob))
    await start_canary(bobs)
    target = f"http://{address_of(bobs)}:{CANARY_PORT}/v1"
    settings = {"llm_model": "m", "llm_base_url": target, "llm_api_key": PROVIDER_KEY}
    assert (await client.post("/api/settings", json=settings, headers=mallory)).status == 200
    key = (await (await client.get("/api/keys/llm/byor", headers=mallory)).json())["key"]

    # With her own gateway key (her own tools).
    for stream in (False, True):
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream}
        resp = await client.post(
            "/api/v1/llm-gateway/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        )
        answer = await resp.read()
        assert resp.status == 400, answer
        assert json.loads(answer)["error"]["code"] == "destination_refused"
        assert not contains_canary(answer)

    # From inside her own sandbox, as her agent, with its sandbox token.
    mallorys_id = await running_sandbox(client, mallory)
    mallorys = sandbox_of(docker_client, test_prefix, mallorys_id)
    token = await gateway_token(client, mallorys_id, "mallory")
    port = client.app[keys.WEBHOOK_LISTENER].port
    url = f"http://host.docker.internal:{port}/api/v1/llm-gateway/v1/chat/completions"
    answer = await call_from(mallorys, url, token, "m")
    assert answer["status"] == 400, answer
    assert json.loads(answer["body"])["error"]["code"] == "destination_refused"
    assert not contains_canary(answer)

    # A port of this host from there: the host's alias (its sandbox network's gateway) and
    # its loopback.
    on_gateway = await Canary(host=gateway_of(mallorys)).start()
    try:
        for base in (f"http://host.docker.internal:{on_gateway.port}/v1", f"{canary.url}/v1"):
            settings["llm_base_url"] = base
            resp = await client.post("/api/settings", json=settings, headers=mallory)
            assert resp.status == 200
            answer = await call_from(mallorys, url, token, "m")
            assert answer["status"] == 400, (base, answer)
            assert not contains_canary(answer)
    finally:
        await on_gateway.close()
    assert canary.connections == on_gateway.connections == 0
    assert await canary_connections(bobs) == 0

    # An operator who admits the whole private 10/8 (a company LAN) admits no sandbox network.
    lan = await make_sandbox_client(outbound_allow=["10.0.0.0/8"])
    settings["llm_base_url"] = target
    assert (await lan.post("/api/settings", json=settings, headers=mallory)).status == 200
    resp = await lan.post(
        "/api/v1/llm-gateway/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert resp.status == 400, await resp.text()
    assert await canary_connections(bobs) == 0
