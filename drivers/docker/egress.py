"""The deployment's sandbox networks on Docker, their host firewall rules, and the control plane's
webhook listener on their gateways (docs/security.md).

Sandboxes of specs with `egress: internet` share one bridge network, `<prefix>net`; a spec with
`egress: none` or an allow-list gets its own, `<prefix>net-<spec id>`, so its rules can be keyed
on the bridge interface rather than on container addresses that change. On every network,
inter-container traffic is disabled, and the host firewall (firewall.py) lets a sandbox reach on
the host only the webhook listener and the operator's host ports on the gateway address.

Networks and rules outlive the process: sandboxes keep running across restarts of the control
plane, and must stay fenced in while it is down. `remove_networks` takes them away when the
deployment has no containers left (tests, `controlplane networks remove`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from drivers.base import HostListener, NetworkPolicy
from drivers.docker.firewall import FirewallError, HostFirewall, NetworkRules, rule_names
from drivers.docker.names import LABEL_NETWORK, LABEL_PREFIX
from drivers.docker.networks import NetworkInfo
from drivers.egress import HOST_GATEWAY, Destination, lookup
from drivers.errors import FirewallRequired, NetworkUnavailable, RuntimeUnavailable, ServiceError

log = structlog.get_logger(__name__)

FirewallMode = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class Attachment:
    """What a container of one spec needs: its network and its /etc/hosts entries."""

    network: str
    gateway: str
    extra_hosts: dict[str, str]


@dataclass(frozen=True)
class Engine:
    """The engine calls the networks need, each sent to the driver's thread lanes."""

    ensure: Callable[[str, dict[str, str], str, int], Awaitable[NetworkInfo]]
    """ensure(name, labels, pool, size): the network, made on the first free /size of pool."""
    list: Callable[[dict[str, str]], Awaitable[list[NetworkInfo]]]
    """list(labels): every network carrying all of labels."""


@dataclass
class _Prepared:
    info: NetworkInfo
    allowed: set[tuple[str, int]] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)
    rules: NetworkRules | None = None  # as last applied (None: no host firewall here)


FENCE_CHECK_SECONDS = 10.0
"""How often the firewall rules of the networks prepared here are looked for, and put back where
they are gone: `nft flush ruleset` (the first line of Debian's /etc/nftables.conf, run when
someone enables nftables.service) removes our tables with everyone else's."""


def network_name(prefix: str, policy: NetworkPolicy) -> str:
    return f"{prefix}net" if policy.egress is None else f"{prefix}net-{policy.spec_id}"


def network_labels(prefix: str, policy: NetworkPolicy | None = None) -> dict[str, str]:
    labels = {LABEL_PREFIX: prefix}
    if policy is not None:
        labels[LABEL_NETWORK] = "shared" if policy.egress is None else policy.spec_id
    return labels


class SandboxNetworks:
    def __init__(
        self,
        engine: Engine,
        *,
        prefix: str,
        listener: HostListener,
        firewall_mode: FirewallMode = "auto",
        host_ports: Sequence[int] = (),
        subnet_pool: str = "10.213.0.0/16",
        subnet_size: int = 22,
        firewall: HostFirewall | None = None,
    ) -> None:
        """`host_ports`: ports of the host every sandbox may reach on its gateway (besides the
        listener's). Raises FirewallRequired when `firewall_mode` is on and the host firewall
        cannot be used here, or when only nftables is missing (root, with iptables)."""
        self._engine = engine
        self._prefix = prefix
        self.listener = listener
        self._host_ports = tuple(host_ports)
        self._subnet_pool = subnet_pool
        self._subnet_size = subnet_size
        self._firewall: HostFirewall | None = None
        self.firewall_off_reason: str | None = None
        if firewall_mode == "off":
            self.firewall_off_reason = "ACS_HOST_FIREWALL=off"
        else:
            candidate = firewall or HostFirewall()
            self.firewall_off_reason = candidate.unavailable()
            if self.firewall_off_reason is None:
                self._firewall = candidate
            elif firewall_mode == "on":
                raise FirewallRequired(
                    f"ACS_HOST_FIREWALL=on but {self.firewall_off_reason}; run the control plane "
                    "as root on the Docker host, or set ACS_HOST_FIREWALL=auto"
                )
            elif self.firewall_off_reason == candidate.nftables_unavailable():
                # Root with iptables: a host an older release fenced (iptables alone). Running
                # on unfenced after an upgrade that lacks nft would open the host to sandboxes.
                raise FirewallRequired(
                    f"the host firewall needs nftables besides iptables, but "
                    f"{self.firewall_off_reason}: install it (apt-get install nftables), or set "
                    "ACS_HOST_FIREWALL=off to run without a host firewall"
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
        self._guard: asyncio.Task[None] | None = None

    @property
    def managed(self) -> bool:
        """True when the host firewall rules are in place for our networks."""
        return self._firewall is not None

    async def prepare_all(self, policies: Sequence[NetworkPolicy]) -> None:
        """Every network the policies need, and the webhook listener on each gateway; the
        deployment's networks of policies no longer given are fenced as the strictest."""
        for policy in policies:
            await self.prepare(policy)
        for info in await self._engine.list(network_labels(self._prefix)):
            if info.name not in self._prepared:  # a removed spec's: fence it anyway
                await self._secure(info, None, set())

    async def prepare(self, policy: NetworkPolicy) -> Attachment:
        """The policy's network, created if needed, fenced, with the webhook listener on its
        gateway. Raises NetworkUnavailable (or RuntimeUnavailable) with the reason."""
        name = network_name(self._prefix, policy)
        async with self._locks.setdefault(name, asyncio.Lock()):
            destinations = policy.egress  # None: the internet; (): nothing
            if destinations is not None and self._firewall is None:
                raise NetworkUnavailable(
                    f"spec {policy.spec_id} restricts egress, which needs the host firewall: "
                    f"{self.firewall_off_reason}"
                )
            prepared = self._prepared.get(name)
            if prepared is None or destinations:
                info = prepared.info if prepared else await self._ensure(name, policy)
                allowed, names = await _resolve(destinations or (), info.gateway)
                if prepared is None or not allowed <= prepared.allowed:
                    known = prepared.allowed if prepared else set()
                    prepared = await self._secure(info, policy, known | allowed)
                prepared.names.update(names)
            hosts = {HOST_GATEWAY: prepared.info.gateway, **prepared.names}
            return Attachment(network=name, gateway=prepared.info.gateway, extra_hosts=hosts)

    async def _ensure(self, name: str, policy: NetworkPolicy) -> NetworkInfo:
        try:
            return await self._engine.ensure(
                name,
                network_labels(self._prefix, policy),
                self._subnet_pool,
                self._subnet_size,
            )
        except RuntimeUnavailable:
            raise
        except ServiceError as exc:
            raise NetworkUnavailable(str(exc)) from None

    async def _secure(
        self, info: NetworkInfo, policy: NetworkPolicy | None, allowed: set[tuple[str, int]]
    ) -> _Prepared:
        """Listener first, then the rules that open its port: a sandbox never sees a hole."""
        try:
            port = await self.listener.bind(info.gateway)
        except OSError as exc:
            raise NetworkUnavailable(
                f"cannot listen for webhooks on {info.gateway}:{self.listener.port}: {exc}"
            ) from None
        rules: NetworkRules | None = None
        if self._firewall is not None:
            host_ports = {port, *self._host_ports}
            host_ports |= {p for net, p in allowed if net == f"{info.gateway}/32"}
            beyond = sorted(a for a in allowed if a[0] != f"{info.gateway}/32")
            rules = NetworkRules(
                bridge=info.bridge,
                gateway=info.gateway,
                host_ports=tuple(sorted(host_ports)),
                allow=None if policy is None or policy.egress is None else tuple(beyond),
            )
            if policy is None and info.labels.get(LABEL_NETWORK) != "shared":
                # A removed spec's network: its sandboxes stay as fenced as the strictest spec.
                rules = NetworkRules(info.bridge, info.gateway, rules.host_ports, ())
            try:
                await asyncio.to_thread(self._firewall.apply, rules)
            except (FirewallError, OSError) as exc:
                raise NetworkUnavailable(f"host firewall rules for {info.name}: {exc}") from None
            if self._guard is None:
                self._guard = asyncio.create_task(self._guard_fences(), name="firewall-guard")
        prepared = _Prepared(info=info, allowed=allowed, rules=rules)
        self._prepared[info.name] = prepared
        log.info("sandbox_network_ready", network=info.name, gateway=info.gateway, webhooks=port)
        return prepared

    async def keep_fenced(self) -> int:
        """Put back the rules of every network prepared here whose chain or table is gone;
        how many networks needed it."""
        if self._firewall is None:
            return 0
        firewall = self._firewall
        installed = set(await asyncio.to_thread(firewall.installed))
        restored = 0
        for name, prepared in list(self._prepared.items()):
            rules = prepared.rules
            if rules is None or set(rule_names(rules.bridge)) <= installed:
                continue
            async with self._locks.setdefault(name, asyncio.Lock()):
                rules = self._prepared[name].rules if name in self._prepared else None
                if rules is not None and not _bridge_exists(rules.bridge):
                    # The network was removed by another process (`controlplane networks
                    # remove`, which took its rules away too): putting them back would leave a
                    # fence on the host for a bridge that no longer exists. The next sandbox
                    # of its policy prepares the network again.
                    self._prepared.pop(name, None)
                    await asyncio.to_thread(firewall.remove, rules.bridge)
                    log.info("sandbox_network_gone", network=name)
                    continue
                if rules is not None:
                    await asyncio.to_thread(firewall.apply, rules)
                    log.warning("host_firewall_rules_restored", network=name)
                    restored += 1
        return restored

    async def _guard_fences(self) -> None:
        while True:
            await asyncio.sleep(FENCE_CHECK_SECONDS)
            try:
                await self.keep_fenced()
            except (FirewallError, OSError, subprocess.SubprocessError) as exc:
                log.error("host_firewall_check_failed", error=str(exc))

    async def close(self) -> None:
        task, self._guard = self._guard, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def forget(self, policy: NetworkPolicy) -> None:
        """Drop what is known about the policy's network (after a failed start: it may be gone)."""
        self._prepared.pop(network_name(self._prefix, policy), None)


def _bridge_exists(bridge: str) -> bool:
    """Whether the network's Linux bridge is on the host (the control plane manages the host's
    firewall, so it runs in the host's network namespace)."""
    return os.path.exists(f"/sys/class/net/{bridge}")


async def _resolve(
    destinations: Sequence[Destination], gateway: str
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
        addresses = await lookup(dest.name, dest.port)
        if not addresses:
            raise NetworkUnavailable(f"egress: {dest.name} does not resolve to a usable address")
        names[dest.name] = addresses[0]
        allowed.update((f"{a}/32", dest.port) for a in addresses)
    return allowed, names
