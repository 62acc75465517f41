"""A sandbox's NetworkPolicy on Kubernetes: who may reach it, where it may connect
(docs/security.md, "Kubernetes").

Ingress: only the control plane, on the sandbox's exposed ports. Egress, always: the control
plane on its webhook listener's port and the operator's host ports (ACS_SANDBOX_HOST_PORTS);
then the spec's `egress`:
- `internet`: every address but the cluster's own networks and link-local ones
  (ACS_KUBE_INTERNET_EXCEPT), and the cluster DNS on port 53;
- `none`: nothing more (no DNS either);
- an allow-list: each `address:port` or `cidr:port`; each `name:port` as the addresses the
  control plane resolves it to, pinned in the pod's /etc/hosts (hostAliases) since the sandbox
  gets no DNS; `host.docker.internal:port` is the control plane's host.

A policy is enforced only by a network plugin that implements NetworkPolicy (Calico, Cilium,
…); elsewhere it is stored and ignored (docs/deployment.md says how to check).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from drivers.base import NetworkPolicy
from drivers.egress import HOST_GATEWAY, lookup
from drivers.errors import NetworkUnavailable
from drivers.kubernetes.settings import KubernetesSettings

Json = dict[str, Any]


@dataclass(frozen=True)
class Peers:
    """The control plane as NetworkPolicies name it: its pods (by labels, in a namespace) and/or
    the addresses it connects from when it runs outside the cluster."""

    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None
    cidrs: tuple[str, ...] = ()

    def rules(self, sandbox_namespace: str) -> list[Json]:
        out: list[Json] = []
        if self.labels and self.namespace:
            peer: Json = {"podSelector": {"matchLabels": dict(self.labels)}}
            if self.namespace != sandbox_namespace:
                # The automatic namespace label (Kubernetes 1.21+).
                peer["namespaceSelector"] = {
                    "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                }
            out.append(peer)
        out.extend({"ipBlock": {"cidr": cidr}} for cidr in self.cidrs)
        return out

    @property
    def empty(self) -> bool:
        return not (self.labels and self.namespace) and not self.cidrs


@dataclass(frozen=True)
class Egress:
    """A policy as this driver applies it: the NetworkPolicy's egress rules and the pod's
    hostAliases (resolved names)."""

    rules: tuple[Json, ...]
    aliases: tuple[Json, ...]


def _tcp(*ports: int) -> list[Json]:
    return [{"protocol": "TCP", "port": port} for port in sorted(set(ports))]


async def plan(
    policy: NetworkPolicy,
    settings: KubernetesSettings,
    peers: Peers,
    ports: Sequence[int],
    host_address: str | None,
) -> Egress:
    """The egress of `policy`. `ports`: the control plane's own that every sandbox reaches (the
    webhook listener's, ACS_SANDBOX_HOST_PORTS); `host_address`: the control plane's address as
    sandboxes reach it (host.docker.internal), when it is known. Raises NetworkUnavailable when
    an allow-listed name does not resolve, or when no control plane is named (an empty peer
    list in a NetworkPolicy rule would match every address)."""
    if peers.empty:
        raise NetworkUnavailable("no control plane peers to admit (ACS_KUBE_CONTROL_PLANE_*)")
    cp = peers.rules(settings.kube_namespace)
    rules: list[Json] = [{"to": cp, "ports": _tcp(*ports)}]
    aliases: list[Json] = []
    if host_address is not None:
        aliases.append({"ip": host_address, "hostnames": [HOST_GATEWAY]})
    if policy.egress is None:
        block: Json = {"cidr": "0.0.0.0/0"}
        if settings.kube_internet_except:
            block["except"] = list(settings.kube_internet_except)
        rules.append({"to": [{"ipBlock": block}]})
        if settings.kube_dns_labels:
            dns = {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": settings.kube_dns_labels},
            }
            dns_ports = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
            rules.append({"to": [dns], "ports": dns_ports})
        return Egress(tuple(rules), tuple(aliases))
    names: dict[str, str] = {}
    for dest in policy.egress:
        if dest.network is not None:
            rules.append(
                {"to": [{"ipBlock": {"cidr": str(dest.network)}}], "ports": _tcp(dest.port)}
            )
        elif dest.is_host:
            rules.append({"to": cp, "ports": _tcp(dest.port)})
        else:
            assert dest.name is not None  # a Destination is an address or a name
            addresses = await lookup(dest.name, dest.port)
            if not addresses:
                raise NetworkUnavailable(
                    f"egress: {dest.name} does not resolve to a usable address"
                )
            names[dest.name] = addresses[0]
            blocks = [{"ipBlock": {"cidr": f"{a}/32"}} for a in addresses]
            rules.append({"to": blocks, "ports": _tcp(dest.port)})
    by_address: dict[str, list[str]] = {}
    for name, address in sorted(names.items()):
        by_address.setdefault(address, []).append(name)
    aliases.extend({"ip": ip, "hostnames": hosts} for ip, hosts in by_address.items())
    return Egress(tuple(rules), tuple(aliases))


def policy_spec(
    selector: dict[str, str], ports: Sequence[int], peers: Peers, egress: Egress, namespace: str
) -> Json:
    """The NetworkPolicy's spec for the pod `selector` picks."""
    return {
        "podSelector": {"matchLabels": dict(selector)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": peers.rules(namespace), "ports": _tcp(*ports)}],
        "egress": list(egress.rules),
    }


def ipv4(host: str) -> str | None:
    """`host` when it is an IPv4 address other than 0.0.0.0, else None."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        return None
    return None if address.is_unspecified else str(address)
