"""The outbound policy's rule, address by address (controlplane/outbound/policy.py), and what
holds the translator to it: every address an attacker could write for `llm_base_url` or make
a name resolve to, with the operator's settings that must not open it. The same rule over
real connections: the other modules of tests/security/."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import ServiceConfig
from controlplane.gateway.translator_process import translator_env
from controlplane.outbound.event_loop import GuardedEventLoop, current, refusals
from controlplane.outbound.policy import (
    DestinationRefused,
    IPNetwork,
    OutboundPolicy,
    Rules,
    canonical,
)
from controlplane.outbound.sources import OutboundSources, local_addresses

LAN = "192.168.77.7"
EVERYTHING = ("0.0.0.0/0", "::/0")  # an operator who admits every address there is


def policy(**rules: object) -> OutboundPolicy:
    return OutboundPolicy(Rules(**rules))  # type: ignore[arg-type]


def networks(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


def refused(check: OutboundPolicy, address: str, port: int = 80) -> bool:
    try:
        check.check(address, port)
    except DestinationRefused:
        return True
    return False


def this_hosts_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet: it picks the address a route would use
        return str(probe.getsockname()[0])


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",  # the cloud's metadata service
        "::ffff:169.254.169.254",  # the same, IPv4-mapped
        "2002:a9fe:a9fe::1",  # the same, behind 6to4
        "2002:7f00:1::1",  # this host's loopback, behind 6to4
        "64:ff9b::7f00:1",  # loopback through NAT64
        "0.0.0.0",  # noqa: S104 (Linux connects it to this host)
        "0.1.2.3",
        "::",
        "224.0.0.1",
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
        "fe80::1",
        "fe80::1%eth0",
        "192.0.0.192",  # a cloud's legacy metadata service (IETF assignments, 192.0.0.0/24)
        "fec0::1",  # site-local
        "168.63.129.16",  # Azure's WireServer: global, yet no sandbox's business
        "100.100.100.200",  # Alibaba's metadata service, inside CGNAT that an allow-list may admit
        "fd00:ec2::254",  # AWS's metadata service on IPv6, inside ULA
        "fd20:ce::254",  # GCP's on IPv6
    ],
)
def test_what_no_setting_opens(address: str) -> None:
    wide = policy(host_ports=frozenset({80}), allow=networks(*EVERYTHING))
    assert refused(wide, address)
    assert refused(OutboundPolicy(scope="operator"), address)


def test_this_host_only_on_its_open_ports_whatever_the_allow_list() -> None:
    check = policy(host_ports=frozenset({11434}), allow=networks(*EVERYTHING))
    for address in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1", this_hosts_address()):
        assert refused(check, address, 6379), address
        assert not refused(check, address, 11434), address


def test_the_deployments_own_come_before_the_allow_list() -> None:
    check = policy(
        allow=networks("10.0.0.0/8", "192.168.0.0/16"),
        internal=networks("10.213.0.0/16"),
        endpoints=frozenset({("192.168.5.5", 6379)}),
        peers=frozenset({"192.168.5.6"}),
        host_ports=frozenset({11434}),
    )
    assert refused(check, "10.213.0.5", 8011)  # a sandbox
    assert not refused(check, "10.214.0.5", 8000)  # the LAN the operator admitted
    assert refused(check, "192.168.5.5", 6379)  # Redis
    assert not refused(check, "192.168.5.5", 8000)  # the same machine's model server
    assert refused(check, "::ffff:192.168.5.5", 6379)
    assert refused(check, "192.168.5.6", 3000)  # another replica's host
    assert not refused(check, "192.168.5.6", 11434)  # ... on an open host port


def test_the_lan_only_where_the_operator_admits_it_and_the_internet_always() -> None:
    assert refused(policy(), LAN)
    assert refused(policy(), "100.64.0.1")  # carrier-grade NAT
    assert refused(policy(), "fd00::7")  # unique local IPv6
    admitted = policy(allow=networks("192.168.77.0/24"))
    assert not refused(admitted, LAN, 8000)
    assert refused(admitted, "192.168.78.7")
    assert not refused(policy(), "93.184.216.34", 443)
    assert not refused(policy(), "2606:2800:220:1:248:1893:25c8:1946", 443)


def test_an_operators_url_may_be_on_this_host_or_the_lan() -> None:
    operator = OutboundPolicy(scope="operator")
    assert not refused(operator, "127.0.0.1", 9000)
    assert not refused(operator, LAN, 8080)
    assert refused(operator, "169.254.169.254")


def test_decisions_are_forgotten_when_the_rules_change() -> None:
    check = policy()
    assert refused(check, LAN)
    check.update(Rules(allow=networks(f"{LAN}/32")))
    assert not refused(check, LAN)
    check.update(Rules())
    assert refused(check, LAN)


def test_the_rules_travel_to_the_translator_whole() -> None:
    rules = Rules(
        host_ports=frozenset({1, 2}),
        allow=networks("10.0.0.0/8", "fd00::/8"),
        internal=networks("10.213.0.0/16"),
        endpoints=frozenset({(canonical("::ffff:10.0.0.1"), 6379)}),
        peers=frozenset({"10.0.0.2"}),
    )
    assert Rules.from_json(rules.to_json()) == rules
    assert rules.endpoints == frozenset({("10.0.0.1", 6379)})


def test_the_translators_loop_connects_only_where_its_request_may() -> None:
    """Its every connection passes `sock_connect`: no policy (outside a request), an address
    the request's policy refuses and a unix socket are refused, and noted for the answer."""

    async def attempt(family: socket.AddressFamily, address: tuple[Any, ...] | str) -> str:
        loop = asyncio.get_running_loop()
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
            except DestinationRefused:
                return "refused"
            except OSError:
                return "tried"  # nothing listens there: the connection was attempted
            return "tried"

    async def main() -> list[object]:
        noted: list[str] = []
        refusals.set(noted)
        outside = await attempt(socket.AF_INET, ("127.0.0.1", 9))
        current.set(policy(host_ports=frozenset({9})))
        allowed = await attempt(socket.AF_INET, ("127.0.0.1", 9))
        fenced = await attempt(socket.AF_INET, ("127.0.0.1", 10))
        unix = await attempt(socket.AF_UNIX, "/run/docker.sock")
        return [outside, allowed, fenced, unix, len(noted)]

    with asyncio.Runner(loop_factory=GuardedEventLoop) as runner:
        assert runner.run(main()) == ["refused", "tried", "refused", "refused", 3]


def test_the_translator_inherits_nothing_secret(tmp_path: Path) -> None:
    environ = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/src",
        "OPENAI_API_KEY": "sk-x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "GOOGLE_APPLICATION_CREDENTIALS": "/x.json",
        "ACS_SECRET_KEY": "x",
        "HTTPS_PROXY": "http://proxy:3128",
        "HOME": "/root",
    }
    env = translator_env(tmp_path, environ)
    assert env == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/src",
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # The cloud SDKs' credential chains find nothing: no metadata service, no files.
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "GOOGLE_APPLICATION_CREDENTIALS": os.devnull,
        "NO_GCE_CHECK": "True",
        "MALLOC_ARENA_MAX": "2",
    }
    assert not any((tmp_path / "home").iterdir())


async def test_the_sources_read_names_redis_and_the_driver(
    make_config: Callable[..., ServiceConfig],
) -> None:
    config = make_config(
        redis_url="redis://127.0.0.1:6399/0",
        outbound_allow=["localhost", "192.168.77.0/24"],
        sandbox_host_ports=[11434],
    )

    async def sandbox_networks() -> list[str]:
        return ["10.213.0.0/24", "10.213.1.0/24", "172.17.0.0/16", "fd00:d0c::/64"]

    sources = OutboundSources(config, None, sandbox_networks)
    await sources.refresh()
    rules = sources.user.rules
    assert ipaddress.ip_network("127.0.0.1/32") in rules.allow  # localhost, resolved
    assert ipaddress.ip_network("192.168.77.0/24") in rules.allow
    assert set(rules.internal) == set(networks("10.213.0.0/23", "172.17.0.0/16", "fd00:d0c::/64"))
    assert rules.endpoints == frozenset({("127.0.0.1", 6399)})
    assert rules.host_ports == frozenset({11434})
    assert Rules.from_json(sources.rules_json) == rules
    # localhost is admitted by name, and still this host: only its open ports.
    assert refused(sources.user, "127.0.0.1", 8000)
    assert not refused(sources.user, "127.0.0.1", 11434)
    assert all(not ipaddress.ip_address(a).is_loopback for a in local_addresses())
