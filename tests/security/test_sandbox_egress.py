"""Per-spec egress, enforced by the engine and the host firewall: `internet`, `none`, and an
allow-list. "Beyond the host" is a network namespace of this test, routed through the host like
any other network (this machine has no internet to test against): two servers on a private
address, and one on a link-local address standing for a cloud metadata service."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controlplane import keys
from drivers.docker.driver import DockerDriver
from drivers.docker.firewall import HostFirewall, NetworkRules, rule_names
from drivers.docker.networks import bridge_name
from tests.support.live_server import attachment, free_port
from tests.support.run_id import RUN_ID
from tests.support.sandbox_helpers import (
    DEFAULT_IMAGE,
    OwnDocker,
    exec_as_agent,
    probe_from,
    spec_dir,
    start,
    wait_status,
)
from tests.support.types import Client, ClientFactory

pytestmark = pytest.mark.usefixtures("sandbox_images")

ALLOWED, OTHER = 8081, 8082  # the servers' ports in the namespace
WIRE_SERVER = "168.63.129.16"  # a cloud metadata address outside link-local (drivers/egress.py)


@dataclass(frozen=True)
class Outside:
    address: str  # the namespace's address, beyond the host
    link_local: str  # also the namespace's, routed through the host
    wire_server: str  # Azure's WireServer, a global metadata address: the namespace's too
    namespace: str  # its name, for `ip netns exec`


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)


@pytest.fixture
def outside() -> Iterator[Outside]:
    """A namespace on a veth pair: 198.51.100.4k+2 (TEST-NET-2), and a link-local /32 and Azure's
    WireServer routed to it; HTTP servers on ALLOWED and OTHER. Removed afterwards, with the
    routes."""
    k = int(RUN_ID, 16) % 60 + 1
    ns, host_if, ns_if = f"acs-eg-{RUN_ID}", f"acseg{RUN_ID}h", f"acseg{RUN_ID}n"
    host_ip, ns_ip, link_local = (
        f"198.51.100.{4 * k + 1}",
        f"198.51.100.{4 * k + 2}",
        f"169.254.{k}.9",
    )
    servers: list[subprocess.Popen[bytes]] = []
    try:
        ip("netns", "add", ns)
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        ip("-n", ns, "addr", "add", f"{link_local}/32", "dev", ns_if)
        ip("-n", ns, "addr", "add", f"{WIRE_SERVER}/32", "dev", ns_if)
        ip("-n", ns, "link", "set", ns_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "route", "add", "default", "via", host_ip)
        ip("route", "add", f"{link_local}/32", "via", ns_ip)
        # One address for every run: `replace`, should another suite's namespace hold it now.
        ip("route", "replace", f"{WIRE_SERVER}/32", "via", ns_ip)
        for port in (ALLOWED, OTHER):
            argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(port)]
            servers.append(
                # Every address of the namespace: its own two, nothing of the host's.
                subprocess.Popen([*argv, "--bind", "0.0.0.0"], stderr=subprocess.DEVNULL)  # noqa: S104 - in its own netns
            )
        yield Outside(address=ns_ip, link_local=link_local, wire_server=WIRE_SERVER, namespace=ns)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
        ip("route", "del", f"{link_local}/32", check=False)
        ip("route", "del", f"{WIRE_SERVER}/32", "via", ns_ip, check=False)
        ip("netns", "del", ns, check=False)  # takes the veth pair with it
        ip("link", "del", host_if, check=False)


CLOSED = """
id: closed
description: no egress at all
image: {image}
command: ["/opt/agent/bin/python", "-P", "-m", "agent", "--port", "8000"]
exposed_ports: {{AGENT_SERVER: 8000}}
egress: none
"""

LISTED = """
id: listed
description: one server beyond the host and one service on the host
image: {image}
command: ["/opt/agent/bin/python", "-P", "-m", "agent", "--port", "8000"]
exposed_ports: {{AGENT_SERVER: 8000}}
egress:
  - {address}:{allowed}
  - host.docker.internal:{host_port}
"""


@pytest.fixture
def host_port() -> int:
    return free_port()


@pytest.fixture
async def egress_sbx(
    make_sandbox_client: ClientFactory, tmp_path: Path, outside: Outside, host_port: int
) -> Client:
    """A client of an app with sandboxes whose specs `closed` and `listed` (egress none, and
    a list naming the outside server and this host's port) stand beside the default."""
    specs = {
        "closed": CLOSED.format(image=DEFAULT_IMAGE),
        "listed": LISTED.format(
            image=DEFAULT_IMAGE, address=outside.address, allowed=ALLOWED, host_port=host_port
        ),
    }
    client: Client = await make_sandbox_client(spec_dir=spec_dir(tmp_path, specs))
    return client


@pytest.fixture
async def host_service(egress_sbx: Client, host_port: int) -> AsyncIterator[dict[str, str]]:
    """An HTTP server on the host, on every sandbox network's gateway at host_port: open only to
    the spec that lists it. Returns the gateways by spec."""
    catalog = egress_sbx.app[keys.SPECS]
    gateways = {s.id: (await attachment(egress_sbx.app, s)).gateway for s in catalog.all()}
    runner = web.AppRunner(web.Application())
    await runner.setup()
    for gateway in gateways.values():
        await web.TCPSite(runner, gateway, host_port).start()
    yield gateways
    await runner.cleanup()


async def test_egress_internet_none_and_allow_list(
    *,
    egress_sbx: Client,
    user_headers: Any,
    own_docker: OwnDocker,
    outside: Outside,
    host_service: dict[str, str],
    host_port: int,
) -> None:
    alice = await user_headers("alice")
    specs = ("default", "closed", "listed")
    started = [await start(egress_sbx, alice, spec) for spec in specs]
    await asyncio.gather(*(wait_status(egress_sbx, alice, s["id"], "RUNNING") for s in started))
    webhook = egress_sbx.app[keys.WEBHOOK_LISTENER].port
    far, metadata = outside.address, outside.link_local

    seen: dict[str, dict[tuple[str, int], str]] = {}
    for spec, sandbox in zip(specs, started, strict=True):
        container = own_docker.client.containers.get(f"{own_docker.prefix}{sandbox['id']}")
        gateway = host_service[spec]
        seen[spec] = await probe_from(
            container,
            [
                (far, ALLOWED),
                (far, OTHER),
                (metadata, ALLOWED),
                (outside.wire_server, ALLOWED),
                (gateway, host_port),
                (gateway, webhook),
            ],
        )
    # Rejected at once: a TCP reset, or an ICMP "prohibited" for link-local addresses.
    no, prohibited = "ECONNREFUSED", "ENETUNREACH"
    assert {spec: list(probes.values()) for spec, probes in seen.items()} == {
        "default": ["open", "open", prohibited, prohibited, no, "open"],
        "closed": [no, no, prohibited, prohibited, no, "open"],
        "listed": ["open", no, prohibited, prohibited, "open", "open"],
    }

    # Each restricted spec has its own network; internet specs share the deployment's.
    nets = {}
    for spec, sandbox in zip(specs, started, strict=True):
        attrs = own_docker.client.containers.get(f"{own_docker.prefix}{sandbox['id']}").attrs
        (nets[spec],) = attrs["NetworkSettings"]["Networks"]
    assert nets == {
        "default": f"{own_docker.prefix}net",
        "closed": f"{own_docker.prefix}net-closed",
        "listed": f"{own_docker.prefix}net-listed",
    }

    # `controlplane networks remove` takes the networks and their firewall chains away, but not
    # a network that still has sandboxes.
    for sandbox in started[1:]:
        resp = await egress_sbx.delete(f"/api/v1/sandboxes/{sandbox['id']}", headers=alice)
        assert resp.status == 200
    code, _out, err = await remove_networks_cli(own_docker.prefix)
    assert code == 1, err
    assert "1 network(s) still have containers" in err
    left = [n["Name"] for n in own_docker.client.api.networks(filters={"name": own_docker.prefix})]
    assert left == [f"{own_docker.prefix}net"]
    # The next start of a removed network's spec, before the server's fence check has noticed
    # the removal, makes the network and its fence again at the first try (the control plane
    # had that network and its attachment remembered).
    firewall = HostFirewall()
    again = await start(egress_sbx, alice, "closed")
    await wait_status(egress_sbx, alice, again["id"], "RUNNING")
    container = own_docker.client.containers.get(f"{own_docker.prefix}{again['id']}")
    assert list(container.attrs["NetworkSettings"]["Networks"]) == [
        f"{own_docker.prefix}net-closed"
    ]
    assert (await probe_from(container, [(far, ALLOWED)])) == {(far, ALLOWED): no}
    # The server's fence check (every FENCE_CHECK_SECONDS) may run after that removal: it must
    # not put back the rules of networks another process removed (a fence left on the host for
    # a bridge that is gone), and the remaining networks keep their own.
    driver = egress_sbx.app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)
    assert driver.networks is not None
    await driver.networks.keep_fenced()
    installed = set(firewall.installed())
    for name in ("net", "net-closed"):
        assert set(rule_names(bridge_name(f"{own_docker.prefix}{name}"))) <= installed
    assert not set(rule_names(bridge_name(f"{own_docker.prefix}net-listed"))) & installed

    for sandbox in (started[0], again):
        resp = await egress_sbx.delete(f"/api/v1/sandboxes/{sandbox['id']}", headers=alice)
        assert resp.status == 200
    code, out, err = await remove_networks_cli(own_docker.prefix)
    assert (code, out.strip()) == (0, f"removed the sandbox networks of {own_docker.prefix!r}"), err
    assert not own_docker.client.api.networks(filters={"name": own_docker.prefix})
    assert not set(rule_names(bridge_name(f"{own_docker.prefix}net"))) & set(firewall.installed())


# Connects from inside the sandbox for `seconds`, as fast as it can: how many connected, and
# how many tries in all.
_HAMMER = r"""
import json, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
opened = tries = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect((host, port))
        opened += 1
    except OSError:
        pass
    finally:
        s.close()
    tries += 1
print(json.dumps([opened, tries]))
"""


async def test_egress_holds_while_the_engine_rearranges_its_rules(
    *, egress_sbx: Client, user_headers: Any, own_docker: OwnDocker, outside: Outside
) -> None:
    """The engine moves its own rules around whenever anyone makes a network on the host (it
    deletes and re-inserts its jump to DOCKER-USER, and puts each new network's ACCEPT rules
    first): for a while then, forwarded packets meet those ACCEPTs before DOCKER-USER. The
    sandbox's fence must hold all the while: an attacker in an `egress: none` sandbox connects
    in a loop while networks come and go, and never gets through."""
    alice = await user_headers("alice")
    sandbox = await start(egress_sbx, alice, "closed")
    await wait_status(egress_sbx, alice, sandbox["id"], "RUNNING")
    container = own_docker.client.containers.get(f"{own_docker.prefix}{sandbox['id']}")
    stop = threading.Event()

    def churn() -> int:
        made = 0
        while not stop.is_set():
            network = own_docker.client.networks.create(f"{own_docker.prefix}churn{made}")
            network.remove()
            made += 1
        return made

    churning = asyncio.ensure_future(asyncio.to_thread(churn))
    try:
        code, out = await asyncio.to_thread(
            exec_as_agent, container, "python3", "-c", _HAMMER, outside.address, str(ALLOWED), "8"
        )
    finally:
        stop.set()
        made = await churning
    assert code == 0, out
    opened, tries = json.loads(out.splitlines()[-1])
    # The race was run, many times over.
    assert made >= 5, made
    assert tries >= 100, tries
    assert opened == 0, (
        f"{opened} of {tries} connections got out while {made} networks came and went"
    )


_IN_NAMESPACE = ["ip", "netns", "exec"]

# A TCP connect from where it runs: "open", "timeout" or the errno's name.
_CONNECT = r"""
import errno, socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("open")
except socket.timeout:
    print("timeout")
except OSError as exc:
    print(errno.errorcode.get(exc.errno or 0, str(exc)))
"""


async def test_nothing_beyond_the_host_opens_a_connection_into_a_sandbox(
    *, egress_sbx: Client, user_headers: Any, own_docker: OwnDocker, outside: Outside
) -> None:
    """A peer beyond the host that opens a connection to a sandbox makes the sandbox's replies
    "established", which the fence lets out: an `egress: none` sandbox would have a channel to
    it (and its agent server would be open to it). Docker before 28 forwards such connections
    when FORWARD's policy is ACCEPT, which it leaves so where forwarding was on before the
    engine started. This host's policy is DROP: the test accepts the peer's packets in
    DOCKER-USER, for this bridge and this peer only, as such a host would. The fence holds."""
    alice = await user_headers("alice")
    sandbox = await start(egress_sbx, alice, "closed")
    await wait_status(egress_sbx, alice, sandbox["id"], "RUNNING")
    network = f"{own_docker.prefix}net-closed"
    container = own_docker.client.containers.get(f"{own_docker.prefix}{sandbox['id']}")
    address = container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
    # The host itself reaches the agent server (its own connections are not forwarded).
    _, writer = await asyncio.wait_for(asyncio.open_connection(address, 8000), 10)
    writer.close()
    await writer.wait_closed()

    peer = await asyncio.to_thread(connect_forwarded, outside, bridge_name(network), address)
    assert peer == "timeout", peer


def connect_forwarded(outside: Outside, bridge: str, address: str) -> str:
    """A connect from the namespace to address:8000 while DOCKER-USER accepts the namespace's
    packets into the bridge (as a FORWARD policy of ACCEPT would). Blocking."""
    forward = ["-s", outside.address, "-o", bridge, "-j", "ACCEPT"]
    subprocess.run(["iptables", "-w", "-I", "DOCKER-USER", "1", *forward], check=True)
    try:
        peer = subprocess.run(
            [*_IN_NAMESPACE, outside.namespace, sys.executable, "-c", _CONNECT, address, "8000"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        subprocess.run(["iptables", "-w", "-D", "DOCKER-USER", *forward], check=True)
    return peer.stdout.strip() or peer.stderr.strip()


async def test_a_fence_removed_behind_our_back_is_put_back(
    *, egress_sbx: Client, user_headers: Any, own_docker: OwnDocker, outside: Outside
) -> None:
    """`nft flush ruleset` (the first line of Debian's /etc/nftables.conf) takes our tables
    with everyone else's, and the engine's own rules then let an `egress: none` sandbox out.
    The control plane's check (every FENCE_CHECK_SECONDS) puts the rules back."""
    alice = await user_headers("alice")
    sandbox = await start(egress_sbx, alice, "closed")
    await wait_status(egress_sbx, alice, sandbox["id"], "RUNNING")
    container = own_docker.client.containers.get(f"{own_docker.prefix}{sandbox['id']}")
    target = [(outside.address, ALLOWED)]
    assert list((await probe_from(container, target)).values()) == ["ECONNREFUSED"]
    _, table = rule_names(bridge_name(f"{own_docker.prefix}net-closed"))
    await asyncio.to_thread(subprocess.run, ["nft", "delete", "table", "inet", table], check=True)
    assert list((await probe_from(container, target)).values()) == ["open"]  # the hole

    driver = egress_sbx.app[keys.DRIVER]
    assert isinstance(driver, DockerDriver)
    assert driver.networks is not None
    assert await driver.networks.keep_fenced() == 1
    assert list((await probe_from(container, target)).values()) == ["ECONNREFUSED"]
    assert await driver.networks.keep_fenced() == 0  # nothing missing: nothing done


async def remove_networks_cli(prefix: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "controlplane"),
        *("networks", "remove"),
        env={**os.environ, "ACS_CONTAINER_PREFIX": prefix},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def test_rules_replace_an_older_releases_outbound_chain() -> None:
    """An older release fenced outbound traffic with an ACSOUT- chain jumped to from
    DOCKER-USER: the first apply after an upgrade leaves only the nftables table; a second
    apply replaces the table's allow-list whole; removal leaves nothing."""
    firewall = HostFirewall()
    bridge = f"acs{RUN_ID}eg0ld"
    inbound, table = rule_names(bridge)
    legacy = f"ACSOUT-{bridge.removeprefix('acs')}"
    subprocess.run(["iptables", "-w", "-N", legacy], check=True)
    subprocess.run(
        ["iptables", "-w", "-I", "DOCKER-USER", "1", "-i", bridge, "-j", legacy], check=True
    )
    try:
        firewall.apply(NetworkRules(bridge, "10.250.0.1", (1234,), (("192.0.2.1/32", 443),)))
        firewall.apply(NetworkRules(bridge, "10.250.0.1", (1234,), (("192.0.2.2/32", 443),)))
        assert {inbound, table} <= set(firewall.installed())
        assert legacy not in firewall.installed()
        docker_user = subprocess.run(
            ["iptables", "-w", "-S", "DOCKER-USER"], check=True, capture_output=True, text=True
        )
        assert bridge not in docker_user.stdout
        listing = subprocess.run(
            ["nft", "list", "table", "inet", table], check=True, capture_output=True, text=True
        )
        assert "192.0.2.2 tcp dport 443 accept" in listing.stdout, listing.stdout
        assert "192.0.2.1" not in listing.stdout
    finally:
        firewall.remove(bridge)
    assert not {inbound, table, legacy} & set(firewall.installed())
