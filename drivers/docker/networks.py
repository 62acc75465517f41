"""Docker networks for sandboxes: one bridge per deployment (and per restricted-egress spec), with
inter-container traffic disabled, on a subnet carved from a pool this module chooses itself.

Docker's default address pools hold about 31 bridge networks; a test run makes one per test, and
several runs share an engine. So subnets are taken deliberately: the first /size of the pool that
overlaps no other Docker network and no host route. Two processes racing for one subnet are
settled by the engine, which refuses an overlapping pool; the loser tries the next.

Blocking: these functions take a docker client and are called from the driver's thread pool.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import structlog
from docker.errors import APIError, NotFound
from docker.types import IPAMConfig, IPAMPool

from drivers.errors import DriverError

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class NetworkInfo:
    """One sandbox network: a bridge with inter-container traffic disabled."""

    name: str
    bridge: str  # the host's interface for it
    subnet: str
    gateway: str  # the host's address on it
    containers: int  # attached containers, when listed
    labels: dict[str, str] = field(default_factory=dict)


ICC_OPTION = "com.docker.network.bridge.enable_icc"
BRIDGE_OPTION = "com.docker.network.bridge.name"


def bridge_name(network: str) -> str:
    """A stable interface name (15 characters at most) derived from the network's name, so the
    firewall's chains can be found and removed even after the network is gone."""
    return "acs" + hashlib.sha256(network.encode()).hexdigest()[:12]


def _info(attrs: dict[str, Any]) -> NetworkInfo:
    configs = (attrs.get("IPAM") or {}).get("Config") or []
    subnet, gateway = "", ""
    for config in configs:
        if config.get("Subnet") and ":" not in config["Subnet"]:
            subnet = config["Subnet"]
            gateway = config.get("Gateway") or str(
                next(ipaddress.IPv4Network(subnet, strict=False).hosts())
            )
            break
    options = attrs.get("Options") or {}
    return NetworkInfo(
        name=attrs["Name"],
        bridge=options.get(BRIDGE_OPTION) or f"br-{attrs['Id'][:12]}",
        subnet=subnet,
        gateway=gateway,
        containers=len(attrs.get("Containers") or {}),
        labels=attrs.get("Labels") or {},
    )


def _host_routes() -> list[ipaddress.IPv4Network]:
    """IPv4 routes of this host (/proc/net/route), so a subnet never shadows a real network."""
    routes: list[ipaddress.IPv4Network] = []
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return routes
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        destination = socket.inet_ntoa(struct.pack("<L", int(fields[1], 16)))
        mask = socket.inet_ntoa(struct.pack("<L", int(fields[7], 16)))
        network = ipaddress.IPv4Network(f"{destination}/{mask}", strict=False)
        if network.prefixlen > 0:  # the default route overlaps everything
            routes.append(network)
    return routes


def _used_subnets(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    used = _host_routes()
    for summary in client.api.networks():
        for config in (summary.get("IPAM") or {}).get("Config") or []:
            subnet = config.get("Subnet", "")
            if subnet and ":" not in subnet:
                used.append(ipaddress.IPv4Network(subnet, strict=False))
    return used


def ensure_network(
    client: docker.DockerClient, name: str, labels: dict[str, str], pool: str, size: int
) -> NetworkInfo:
    try:
        existing = _info(client.api.inspect_network(name))
    except NotFound:
        pass
    else:
        if any(existing.labels.get(k) != v for k, v in labels.items()):
            raise DriverError(
                f"a Docker network named {name} exists and is not this deployment's: remove it "
                "or choose another ACS_CONTAINER_PREFIX"
            )
        return existing
    used = _used_subnets(client)
    for candidate in ipaddress.IPv4Network(pool).subnets(new_prefix=size):
        if any(candidate.overlaps(u) for u in used):
            continue
        gateway = str(next(candidate.hosts()))
        try:
            client.api.create_network(
                name,
                driver="bridge",
                options={ICC_OPTION: "false", BRIDGE_OPTION: bridge_name(name)},
                ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=str(candidate), gateway=gateway)]),
                labels=labels,
                check_duplicate=True,
            )
        except APIError as exc:
            message = str(exc.explanation or exc)
            if "overlap" in message:
                used.append(candidate)  # taken meanwhile by another process
                continue
            if "already exists" in message:
                return _info(client.api.inspect_network(name))
            raise DriverError(f"Docker could not create network {name}: {message}") from None
        log.info("sandbox_network_created", network=name, subnet=str(candidate))
        try:
            return _info(client.api.inspect_network(name))
        except NotFound:
            raise DriverError(f"network {name} was removed as soon as it was made") from None
    raise DriverError(
        f"no free /{size} subnet left in {pool} for network {name}: widen "
        "ACS_SANDBOX_SUBNET_POOL or remove unused networks"
    )


def engine_subnets(client: docker.DockerClient) -> list[str]:
    """The subnets of every network of the engine (IPv4 and IPv6, any driver)."""
    return [
        config["Subnet"]
        for summary in client.api.networks()
        for config in (summary.get("IPAM") or {}).get("Config") or []
        if config.get("Subnet")
    ]


def list_networks(client: docker.DockerClient, labels: dict[str, str]) -> list[NetworkInfo]:
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    infos = []
    for summary in client.api.networks(filters=filters):
        try:
            infos.append(_info(client.api.inspect_network(summary["Id"])))
        except NotFound:
            continue
    return infos


def remove_network(client: docker.DockerClient, name: str) -> bool:
    try:
        info = _info(client.api.inspect_network(name))
        if info.containers:
            return False
        client.api.remove_network(name)
    except NotFound:
        return True
    except APIError as exc:
        if "active endpoints" in str(exc.explanation or exc):
            return False
        raise DriverError(f"Docker could not remove network {name}: {exc.explanation}") from None
    log.info("sandbox_network_removed", network=name)
    return True
