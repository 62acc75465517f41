"""A spec's `egress`: where its sandboxes may open connections (docs/security.md).

`internet` (the default), `none`, or an allow-list of `host:port` entries, where host is an IPv4
address, an IPv4 network (CIDR), a DNS name, or `host.docker.internal` (this host's gateway
address on the sandbox network: a service on the host). Every policy forbids the rest of the host
(only the webhook listener and ACS_SANDBOX_HOST_PORTS are open there) and the cloud metadata
services (METADATA_V4, METADATA_V6: link-local and a few more).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Literal

HOST_GATEWAY = "host.docker.internal"
METADATA_V4 = (
    "169.254.0.0/16",  # link-local: the metadata services of AWS, GCP, Azure, OpenStack, Oracle
    "100.100.100.200/32",  # Alibaba Cloud's metadata service
    "168.63.129.16/32",  # Azure's WireServer (the VM agent's channel; AKS blocks it from pods)
    "192.0.0.192/32",  # Oracle Cloud's legacy metadata address
)
METADATA_V6 = (
    "fd00:ec2::254/128",  # AWS's metadata service on IPv6 (Nitro instances)
    "fd20:ce::254/128",  # GCP's metadata server on IPv6
)
"""Cloud metadata services: no sandbox reaches them, whatever its egress (an instance's
credentials are there), nor does the control plane connect to them for anyone
(controlplane/outbound/policy.py). Outside link-local, they are addresses a spec's `internet`
would otherwise reach (global, or private ranges the host routes)."""
_NAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*$"
)

Egress = Literal["internet", "none"] | list[str]


@dataclass(frozen=True)
class Destination:
    """One allow-list entry: `network` set for an address or CIDR, `name` for a DNS name."""

    port: int
    network: ipaddress.IPv4Network | None = None
    name: str | None = None

    @property
    def is_host(self) -> bool:
        return self.name == HOST_GATEWAY


def parse_destination(entry: str) -> Destination:
    """Parse `host:port`. Raises ValueError with the reason."""
    host, sep, port_text = entry.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{entry!r} is not host:port")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
    port = int(port_text)
    if host.startswith("[") or ":" in host:
        raise ValueError(f"{entry!r}: IPv6 is not supported (sandboxes have no IPv6)")
    try:
        network = ipaddress.IPv4Network(host, strict=False)
    except ValueError:
        network = None
    if network is not None:
        if network.is_link_local or network.is_loopback or network.is_multicast:
            raise ValueError(f"{entry!r}: link-local, loopback and multicast are never allowed")
        return Destination(port=port, network=network)
    if not _NAME_RE.match(host) or host.replace(".", "").isdigit():
        raise ValueError(f"{entry!r}: {host!r} is neither an IPv4 address, a CIDR nor a DNS name")
    return Destination(port=port, name=host.lower())


def parse_egress(value: Egress) -> list[Destination] | None:
    """The allow-list's destinations; None for `internet`, [] for `none`."""
    if value == "internet":
        return None
    if value == "none":
        return []
    return [parse_destination(entry) for entry in value]


async def lookup(name: str, port: int) -> list[str]:
    """The IPv4 addresses `name` resolves to (loopback and link-local left out), looked up in a
    thread by the control plane: sandboxes of a restricted egress get no DNS of their own."""
    try:
        infos = await asyncio.to_thread(
            socket.getaddrinfo, name, port, socket.AF_INET, socket.SOCK_STREAM
        )
    except OSError:
        return []
    found: list[str] = []
    for *_, sockaddr in infos:
        address = ipaddress.IPv4Address(sockaddr[0])
        if not (address.is_loopback or address.is_link_local) and str(address) not in found:
            found.append(str(address))
    return found
