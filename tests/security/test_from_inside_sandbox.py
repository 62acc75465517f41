"""Attacks from inside a real sandbox, as the agent's user (`docker exec --user agent`): its
neighbours, the host's services, the control plane's API, raw sockets, device nodes, the root
filesystem. Each must fail, and the webhook path must still work (docs/security.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace
from tests.support.live_server import Api, LiveServer, LiveServerFactory, running_sandbox
from tests.support.redis_server import redis_on_tcp
from tests.support.sandbox_helpers import OwnDocker, exec_as_agent, probe_from

pytestmark = pytest.mark.usefixtures("sandbox_images")


@pytest.fixture
async def plain_live(make_plain_live: LiveServerFactory) -> LiveServer:
    """The control plane over HTTP with the default configuration: no host port is open to
    sandboxes (the `live` of the conversation tests opens the fake LLM's)."""
    return await make_plain_live()


async def new_user(live: LiveServer, http: aiohttp.ClientSession, redis_: Any, name: str) -> Api:
    created = await ApiKeyService(redis_, None).create(name)
    return Api(http, live.url, created.key)


@pytest.fixture
def careless_redis(tmp_path: Path) -> Iterator[Callable[[list[str]], int]]:
    """Starts a redis-server without protected mode on the given addresses (a careless host
    service); returns its port."""
    with contextlib.ExitStack() as servers:

        def start(addresses: list[str]) -> int:
            return servers.enter_context(redis_on_tcp(addresses, tmp_path, protected=False))

        yield start


def network_address(container: Any) -> str:
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    return str(network["IPAddress"])


async def test_a_sandbox_reaches_no_neighbour_and_no_host_service_but_the_webhooks(
    *,
    plain_live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    own_docker: OwnDocker,
    careless_redis: Callable[[list[str]], int],
) -> None:
    alice = await new_user(plain_live, http, raw_redis, "alice")
    bob = await new_user(plain_live, http, raw_redis, "bob")
    mine, theirs = await asyncio.gather(running_sandbox(alice), running_sandbox(bob))
    gateway = await plain_live.sandbox_gateway()
    attacker = own_docker.client.containers.get(f"{own_docker.prefix}{mine['id']}")
    victim = own_docker.client.containers.get(f"{own_docker.prefix}{theirs['id']}")
    victim_port = theirs["exposed_urls"][0]["port"]

    # The API on the gateway too, as `serve --host 0.0.0.0` would have it; a host Redis on the
    # gateway and on docker0. All of them answer the host.
    api_port = int(plain_live.url.rsplit(":", 1)[1])
    await web.TCPSite(plain_live.runner, gateway, api_port).start()
    async with http.get(f"http://{gateway}:{api_port}/health") as resp:
        assert resp.status == 200
    redis_port = careless_redis([gateway, "172.17.0.1"])
    webhook_port = plain_live.webhook_port

    targets = [
        (network_address(victim), 8000),  # the neighbour's agent server, on the bridge
        (gateway, victim_port),  # ... and its published port, through the host
        (gateway, api_port),  # the control plane's API
        (gateway, redis_port),  # the host's Redis
        ("172.17.0.1", redis_port),  # ... on another of the host's addresses
        ("172.17.0.1", webhook_port),  # the webhook port, on another address
        (gateway, 22),
        (gateway, webhook_port),  # the one thing open
    ]
    seen = await probe_from(attacker, targets)
    assert seen.pop((gateway, webhook_port)) == "open"
    assert seen.pop((network_address(victim), 8000)) == "timeout"  # dropped by the bridge
    assert set(seen.values()) == {"ECONNREFUSED"}, seen  # rejected by the host

    # The webhook listener answers webhooks only, and only with the sandbox's own key.
    script = r"""
import json, os, sys, urllib.request, urllib.error
base = os.environ["OH_WEBHOOKS_0_BASE_URL"]
key = os.environ["OH_SESSION_API_KEYS_0"]
def post(url, key, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("X-Session-API-Key", key)
    try:
        return urllib.request.urlopen(req, timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code
root = base.split("/api/")[0]
other = base.rsplit("/", 1)[0] + "/" + sys.argv[1]
print(json.dumps({
    "own": post(base + "/conversations", key, {"id": "0" * 32}),
    "no_key": post(base + "/conversations", None, {"id": "0" * 32}),
    "other_sandbox": post(other + "/conversations", key, {"id": "0" * 32}),
    "api_route": post(root + "/api/v1/sandboxes", sys.argv[2], {}),
    "health": post(root + "/health", None, {}),
}))
"""
    code, out = await asyncio.to_thread(
        exec_as_agent, attacker, "python3", "-c", script, theirs["id"], alice.key
    )
    assert code == 0, out
    answers = json.loads(out.splitlines()[-1])
    assert answers == {
        # Authenticated, and no such conversation in this sandbox: acknowledged and dropped, so
        # agent servers do not retry it for minutes (docs/conversations.md); nothing is stored.
        "own": 200,
        "no_key": 401,
        "other_sandbox": 401,
        "api_route": 404,
        "health": 404,
    }, answers
    assert await raw_redis.exists(keyspace.events("0" * 32), keyspace.conversation("0" * 32)) == 0


async def test_inside_a_sandbox_the_agent_has_no_privilege(
    plain_live: LiveServer,
    http: aiohttp.ClientSession,
    raw_redis: aioredis.Redis,
    own_docker: OwnDocker,
) -> None:
    alice = await new_user(plain_live, http, raw_redis, "alice")
    sandbox = await running_sandbox(alice)
    container = own_docker.client.containers.get(f"{own_docker.prefix}{sandbox['id']}")

    def run(command: str) -> tuple[int, str]:
        return exec_as_agent(container, "bash", "-c", command)

    code, status = await asyncio.to_thread(run, "id -u; id -g; cat /proc/self/status")
    assert code == 0
    uid, gid, *proc = status.splitlines()
    assert (uid, gid) == ("1000", "1000")
    fields = dict(line.split(":\t", 1) for line in proc if ":\t" in line)
    for capability in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[capability], 16) == 0, (capability, fields[capability])
    assert fields["NoNewPrivs"].strip() == "1"
    # The agent server itself (PID 1 is tini) runs as the agent, without capabilities.
    code, server = await asyncio.to_thread(
        run, "ps -o user=,comm= -p 1; ps -o user=,args= -C python"
    )
    assert code == 0
    lines = server.splitlines()
    assert lines[0].split() == ["agent", "tini"], lines
    assert any(line.split()[0] == "agent" and "-m agent" in line for line in lines[1:]), lines

    def socket_of(*args: str) -> str:
        return f"python3 -c 'import socket; socket.socket({', '.join(args)})'"

    attempts = {
        "raw packet socket": socket_of("socket.AF_PACKET", "socket.SOCK_RAW"),
        "raw IP socket": socket_of("socket.AF_INET", "socket.SOCK_RAW", "socket.IPPROTO_TCP"),
        "ping (raw ICMP)": socket_of("socket.AF_INET", "socket.SOCK_RAW", "socket.IPPROTO_ICMP"),
        "mknod": "mknod /tmp/mem c 1 1",
        "mknod in workspace": "mknod /workspace/null c 1 3",
        "write /etc": "echo x >> /etc/passwd",
        "write the agent server": "echo x >> /opt/agent/app/agent/__init__.py",
        "chown": "touch /workspace/f && chown 0:0 /workspace/f",
        "setuid helper": "su -c id root </dev/null",
        "sudo": "command -v sudo",
        "IPv6 address": "grep -v ' lo$' /proc/net/if_inet6",
    }
    for what, command in attempts.items():
        code, out = await asyncio.to_thread(run, command)
        assert code != 0, f"{what} succeeded: {out}"

    # What the agent's work needs still works: its workspace, its home, /tmp, processes.
    code, out = await asyncio.to_thread(
        run,
        "echo a > /workspace/a && echo b > ~/b && echo c > /tmp/c && cat /workspace/a ~/b /tmp/c"
        " && (sleep 0.1 & wait) && git init -q /workspace/repo && echo ok",
    )
    assert (code, out.split()) == (0, ["a", "b", "c", "ok"]), out
