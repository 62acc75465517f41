"""What an operator tells the Docker runtime: its engine, its thread lanes, where ports are
published, the sandbox networks and the host firewall, the host memory guard (the ACS_*
variables below; docs/configuration.md lists them, docs/security.md says what the networks and
the firewall do)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from drivers.runtime import RuntimeSettings

FirewallMode = Literal["auto", "on", "off"]


class DockerSettings(RuntimeSettings):
    """Docker"""

    docker_url: str | None = Field(
        default=None,
        description="Docker engine URL; unset uses `DOCKER_HOST` or the local socket",
    )
    docker_threads: int = Field(
        default=8,
        ge=1,
        le=64,
        description="threads of the slow lane for Docker calls (create and start, restart, "
        "remove, networks): bounds concurrent slow engine calls",
    )
    docker_quick_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        description="threads of the quick lane (inspect, pause, unpause, image look-up, ping, "
        "listing): these never wait behind the slow lane",
    )
    publish_host: str = Field(
        default="127.0.0.1", description="host address sandbox ports are published on"
    )
    sandbox_subnet_pool: str = Field(
        default="10.213.0.0/16",
        description="where the sandbox networks' subnets are taken from (each overlaps no "
        "Docker network and no host route)",
    )
    sandbox_subnet_size: int = Field(
        default=22,
        ge=16,
        le=28,
        description="prefix length of each sandbox network: a /22 holds 1,021 sandboxes, the "
        "default pool 64 such networks. A /24 holds only 253, fewer than the ~345 idle sandboxes "
        "admission admits on a 24 GiB host ([operations](operations.md#capacity)); a network "
        "that exists keeps the size it was created with",
    )
    host_firewall: FirewallMode = Field(
        default="auto",
        description="host firewall rules fencing the sandbox networks (iptables inbound, "
        "nftables outbound): `auto` manages them when running as root with `iptables` and "
        "`nft` (without root or `iptables` it logs `host_firewall_unavailable` and "
        "restricted-egress specs cannot start; as root with `iptables` but no usable `nft` it "
        "refuses to start, since releases before 2026-11-29 fenced such a host with iptables "
        "alone), `on` makes any of these a start-up error, `off` never touches the host's rules "
        "([security](security.md))",
    )
    host_memory_floor: int = Field(
        default=512 * 1024**2,
        ge=0,
        description="bytes: new sandboxes (cold starts, pool refills) are refused with 429 "
        "while the host's `MemAvailable` minus the new reservation is below this; read from "
        "the control plane's `/proc/meminfo`, so only with a local engine (a unix socket); "
        "`0` = off",
        json_schema_extra={"shown_default": "`536870912` (512 MiB)"},
    )

    docker_reuse_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="seconds a Docker rewind waits for the helper that links the checkpoint's "
        "unchanged files from the old workspace (`reuse`); past that the rewind reads every "
        "file from the snapshot store instead (slower, never wrong)",
    )

    @field_validator("sandbox_subnet_pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 network: {exc}") from None
        if network.prefixlen > 24:
            raise ValueError("the pool must be a /24 or larger")
        return str(network)

    @field_validator("sandbox_subnet_size")
    @classmethod
    def _fits_pool(cls, value: int, info: ValidationInfo) -> int:
        pool = info.data.get("sandbox_subnet_pool")
        if pool and value < ipaddress.IPv4Network(pool).prefixlen:
            raise ValueError(f"/{value} networks do not fit in ACS_SANDBOX_SUBNET_POOL {pool}")
        return value
