"""The deployment's sandbox networks, their host firewall rules, and the webhook listener on their
gateways (docs/security.md).

Sandboxes of specs with `egress: internet` share one bridge network, `<prefix>net`; a spec with
`egress: none` or an allow-list gets its own, `<prefix>net-<spec id>`, so its rules can be keyed
on the bridge interface rather than on container addresses that change. On every network,
inter-container traffic is disabled, and the host firewall (drivers/firewall.py) lets a sandbox
reach on the host only the webhook listener and ACS_SANDBOX_HOST_PORTS on the gateway address.

Networks and rules outlive the process: sandboxes keep running across restarts of the control
plane, and must stay fenced in while it is down. `remove_networks` takes them away when the
deployment has no containers left (tests, `controlplane network remove`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from dataclasses import dataclass, field

import structlog

from controlplane.config import ServiceConfig
from controlplane.errors import ControlPlaneError, RuntimeUnavailable
from controlplane.sandboxes.naming import LABEL_PREFIX
from controlplane.sandboxes.webhook_listener import WebhookListener
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.egress import HOST_GATEWAY, Destination, parse_egress
from controlplane.specs.models import SandboxSpec
from drivers.base import NetworkInfo, SandboxDriver
from drivers.firewall import FirewallError, Iptables, NetworkRules

log = structlog.get_logger(__name__)

LABEL_NETWORK = "acs.network"
"""On our networks: the spec id of a restricted-egress network, or "shared"."""
RETRY_SECONDS = 5.0


class NetworkUnavailable(ControlPlaneError):
    """A sandbox's network or its firewall rules could not be put in place."""

    code = "sandbox_network_unavailable"
    status = 502


class FirewallRequired(ControlPlaneError):
    """ACS_HOST_FIREWALL=on, and iptables cannot be used here."""

    code = "host_firewall_unavailable"
    status = 500


@dataclass(frozen=True)
class Attachment:
    """What a container of one spec needs: its network and its /etc/hosts entries."""

    network: str
    gateway: str
    extra_hosts: dict[str, str]


@dataclass
class _Prepared:
    info: NetworkInfo
    allowed: set[tuple[str, int]] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)


def network_name(prefix: str, spec: SandboxSpec) -> str:
    return f"{prefix}net" if spec.egress == "internet" else f"{prefix}net-{spec.id}"


def network_labels(prefix: str, spec: SandboxSpec | None = None) -> dict[str, str]:
    labels = {LABEL_PREFIX: prefix}
    if spec is not None:
        labels[LABEL_NETWORK] = "shared" if spec.egress == "internet" else spec.id
    return labels


class SandboxNetworks:
    def __init__(
        self,
        config: ServiceConfig,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        firewall: Iptables | None = None,
    ) -> None:
        self._config = config
        self._driver = driver
        self._catalog = catalog
        self.listener = WebhookListener(config.webhook_port or 0)
        self._firewall: Iptables | None = None
        self.firewall_off_reason: str | None = None
        if config.host_firewall == "off":
            self.firewall_off_reason = "ACS_HOST_FIREWALL=off"
        else:
            candidate = firewall or Iptables()
            self.firewall_off_reason = candidate.unavailable()
            if self.firewall_off_reason is None:
                self._firewall = candidate
            elif config.host_firewall == "on":
                raise FirewallRequired(
                    f"ACS_HOST_FIREWALL=on but {self.firewall_off_reason}; run the control plane "
                    "as root on the Docker host, or set ACS_HOST_FIREWALL=auto"
                )
        if self.firewall_off_reason is not None:
            log.warning(
                "host_firewall_unavailable",
                reason=self.firewall_off_reason,
                effect="sandboxes can reach every service on this host; specs with egress "
                "none or an allow-list cannot start",
            )
        self._prepared: dict[str, _Prepared] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def managed(self) -> bool:
        """True when the host firewall rules are in place for our networks."""
        return self._firewall is not None

    def start(self) -> None:
        """Bring up every network the catalog needs, and the webhook listener on each gateway,
        in the background (retrying while the engine does not answer): sandboxes that outlived
        a restart post their webhooks before any new start."""
        self._task = asyncio.create_task(self._prepare_all(), name="sandbox-networks")

    async def _prepare_all(self) -> None:
        while True:
            try:
                for spec in self._catalog.all():
                    await self.prepare(spec)
                for info in await self._driver.list_networks(network_labels(self._prefix)):
                    if info.name not in self._prepared:  # a removed spec's: fence it anyway
                        await self._secure(info, None, set())
                return
            except (RuntimeUnavailable, NetworkUnavailable) as exc:
                log.warning("sandbox_networks_not_ready", error=str(exc), retry_s=RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)

    @property
    def _prefix(self) -> str:
        return self._config.container_prefix

    async def prepare(self, spec: SandboxSpec) -> Attachment:
        """The spec's network, created if needed, fenced, with the webhook listener on its
        gateway. Raises NetworkUnavailable (or RuntimeUnavailable) with the reason."""
        name = network_name(self._prefix, spec)
        async with self._locks.setdefault(name, asyncio.Lock()):
            destinations = parse_egress(spec.egress)  # None: the internet; []: nothing
            if destinations is not None and self._firewall is None:
                raise NetworkUnavailable(
                    f"spec {spec.id} restricts egress, which needs the host firewall: "
                    f"{self.firewall_off_reason}"
                )
            prepared = self._prepared.get(name)
            if prepared is None or destinations:
                info = prepared.info if prepared else await self._ensure(name, spec)
                allowed, names = await _resolve(destinations or [], info.gateway)
                if prepared is None or not allowed <= prepared.allowed:
                    known = prepared.allowed if prepared else set()
                    prepared = await self._secure(info, spec, known | allowed)
                prepared.names.update(names)
            hosts = {HOST_GATEWAY: prepared.info.gateway, **prepared.names}
            return Attachment(network=name, gateway=prepared.info.gateway, extra_hosts=hosts)

    async def _ensure(self, name: str, spec: SandboxSpec) -> NetworkInfo:
        try:
            return await self._driver.ensure_network(
                name,
                network_labels(self._prefix, spec),
                self._config.sandbox_subnet_pool,
                self._config.sandbox_subnet_size,
            )
        except RuntimeUnavailable:
            raise
        except ControlPlaneError as exc:
            raise NetworkUnavailable(str(exc)) from None

    async def _secure(
        self, info: NetworkInfo, spec: SandboxSpec | None, allowed: set[tuple[str, int]]
    ) -> _Prepared:
        """Listener first, then the rules that open its port: a sandbox never sees a hole."""
        try:
            port = await self.listener.bind(info.gateway)
        except OSError as exc:
            raise NetworkUnavailable(
                f"cannot listen for webhooks on {info.gateway}:{self.listener.port}: {exc}"
            ) from None
        if self._firewall is not None:
            host_ports = {port, *self._config.sandbox_host_ports}
            host_ports |= {p for net, p in allowed if net == f"{info.gateway}/32"}
            beyond = sorted(a for a in allowed if a[0] != f"{info.gateway}/32")
            rules = NetworkRules(
                bridge=info.bridge,
                gateway=info.gateway,
                host_ports=tuple(sorted(host_ports)),
                allow=None if spec is None or spec.egress == "internet" else tuple(beyond),
            )
            if spec is None and info.labels.get(LABEL_NETWORK) != "shared":
                # A removed spec's network: its sandboxes stay as fenced as the strictest spec.
                rules = NetworkRules(info.bridge, info.gateway, rules.host_ports, ())
            try:
                await asyncio.to_thread(self._firewall.apply, rules)
            except (FirewallError, OSError) as exc:
                raise NetworkUnavailable(f"host firewall rules for {info.name}: {exc}") from None
        prepared = _Prepared(info=info, allowed=allowed)
        self._prepared[info.name] = prepared
        log.info("sandbox_network_ready", network=info.name, gateway=info.gateway, webhooks=port)
        return prepared

    def forget(self, spec: SandboxSpec) -> None:
        """Drop what is known about the spec's network (after a failed start: it may be gone)."""
        self._prepared.pop(network_name(self._prefix, spec), None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.listener.close()


async def _resolve(
    destinations: list[Destination], gateway: str
) -> tuple[set[tuple[str, int]], dict[str, str]]:
    """Allowed (network, port) pairs and /etc/hosts entries for an allow-list. Names are looked up
    by the control plane: the sandbox itself gets no DNS beyond its network."""
    allowed: set[tuple[str, int]] = set()
    names: dict[str, str] = {}
    for dest in destinations:
        if dest.network is not None:
            allowed.add((str(dest.network), dest.port))
            continue
        assert dest.name is not None
        if dest.is_host:
            allowed.add((f"{gateway}/32", dest.port))
            continue
        addresses = await _lookup(dest.name, dest.port)
        if not addresses:
            raise NetworkUnavailable(f"egress: {dest.name} does not resolve to a usable address")
        names[dest.name] = addresses[0]
        allowed.update((f"{a}/32", dest.port) for a in addresses)
    return allowed, names


async def _lookup(name: str, port: int) -> list[str]:
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


async def remove_networks(driver: SandboxDriver, prefix: str, firewall: Iptables | None) -> int:
    """Remove the deployment's networks that have no containers, and their firewall chains.
    Returns how many still have containers (and were kept)."""
    kept = 0
    for info in await driver.list_networks({LABEL_PREFIX: prefix}):
        if await driver.remove_network(info.name):
            if firewall is not None:
                await asyncio.to_thread(firewall.remove, info.bridge)
        else:
            kept += 1
    return kept
