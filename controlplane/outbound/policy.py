"""The outbound rule: may the control plane connect to this address and port for someone else?

For a user (`scope="user"`: the LLM gateway's calls to `llm_base_url`, LiteLLM's calls for it),
in this order:

1. never: link-local and the other cloud metadata services (drivers/egress.py), multicast,
   unspecified, reserved and "this network" (0.0.0.0/8) addresses, nor an IPv6 address that
   stands for one (IPv4-mapped, 6to4, Teredo);
2. this host (loopback, any address a socket can bind here: its interfaces, the sandbox
   networks' gateways): only on the ports of ACS_SANDBOX_HOST_PORTS (a model server on the
   host);
3. the deployment's own: the networks its sandboxes live on (the driver says which: Docker's
   bridges, a cluster's pod and Service ranges), the Redis and Sentinel endpoints, the other
   replicas' hosts (these only on ACS_SANDBOX_HOST_PORTS, like this one);
4. any other address that is not global (the LAN: RFC 1918, CGNAT, ULA, ...): only inside
   ACS_OUTBOUND_ALLOW, the operator's allow-list (which admits nothing of 1-3);
5. the rest (the internet): yes.

For an operator's URL (`scope="operator"`: lifecycle webhooks), only 1 applies: the operator
named the receiver, on the LAN or on this host as it may be; what the policy still guarantees
there is the address (no redirect, no second lookup: client.py).

Decisions are cached per address (never per name: a name is looked up at every connection and
each address it gives is checked), and forgotten whenever the rules change (`update`).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from drivers.egress import METADATA_V4, METADATA_V6

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Scope = Literal["user", "operator"]

THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
"""Linux connects 0.0.0.0 to itself; nothing else of 0.0.0.0/8 is an address of anything."""
NEVER_NETWORKS = (
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments (a cloud's metadata)
    ipaddress.ip_network("fec0::/10"),  # site-local, deprecated but routed on some networks
    # The cloud metadata services sandboxes never reach either (drivers/egress.py): global ones
    # (Azure's WireServer) and private ones an allow-list (ACS_OUTBOUND_ALLOW) could admit.
    *(ipaddress.ip_network(n) for n in (*METADATA_V4, *METADATA_V6)),
)
"""Not caught by Python 3.11's flags (is_reserved, is_link_local, ...), yet never a destination."""
CACHE_SIZE = 4096
"""Addresses whose decision is kept (a user's resolver could hand out any number of them)."""


class DestinationRefused(ConnectionRefusedError):
    """The address is not one the control plane may connect to for this caller. An OSError (a
    refused connection), so that whatever library is connecting fails as it would for one."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.ECONNREFUSED, reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def _networks(items: Iterable[str]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(item, strict=False) for item in items)


def canonical(address: str) -> str:
    """An address as the policy compares it (IPv4-mapped IPv6 as IPv4, no zone)."""
    parsed = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed)


@dataclass(frozen=True)
class Rules:
    """What the policy is made of (sources.py keeps it current; the translator gets it as JSON)."""

    host_ports: frozenset[int] = frozenset()
    allow: tuple[IPNetwork, ...] = ()
    """ACS_OUTBOUND_ALLOW: its networks, and the addresses its names resolved to."""
    internal: tuple[IPNetwork, ...] = ()
    """The networks sandboxes live on (Docker's bridges and subnet pool; a cluster's pod and
    Service ranges)."""
    endpoints: frozenset[tuple[str, int]] = frozenset()
    """Redis and its Sentinels: (canonical address, port)."""
    peers: frozenset[str] = frozenset()
    """The other replicas' addresses (canonical)."""
    notes: dict[str, str] = field(default_factory=dict, compare=False)
    """What each input came from, for the log line of a change (not part of the rule)."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "host_ports": sorted(self.host_ports),
                "allow": [str(n) for n in self.allow],
                "internal": [str(n) for n in self.internal],
                "endpoints": sorted([a, p] for a, p in self.endpoints),
                "peers": sorted(self.peers),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Rules:
        """Raises ValueError (or KeyError, TypeError) for anything but to_json's output."""
        data = json.loads(text)
        return cls(
            host_ports=frozenset(int(p) for p in data["host_ports"]),
            allow=_networks(data["allow"]),
            internal=_networks(data["internal"]),
            endpoints=frozenset((canonical(a), int(p)) for a, p in data["endpoints"]),
            peers=frozenset(canonical(a) for a in data["peers"]),
        )


def is_local_address(address: IPAddress) -> bool:
    """An address of this host: loopback, or one a socket can bind to (at the time asked)."""
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
    except OSError:
        return False
    return True


def _stands_for(address: IPAddress) -> list[IPAddress]:
    """The address and the IPv4 addresses an IPv6 one carries (where a relay would connect)."""
    found: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        for embedded in (address.ipv4_mapped, address.sixtofour):
            if embedded is not None:
                found.append(embedded)
        if address.teredo is not None:
            found.extend(address.teredo)
    return found


def never_reason(address: IPAddress) -> str | None:
    """Why no connection for anyone may go to `address` (step 1), or None. Loopback is this
    host's (step 2), although IPv6's lies in a reserved range."""
    if address.is_loopback:
        return None
    for one in _stands_for(address):
        if (
            one.is_link_local
            or one.is_multicast
            or one.is_unspecified
            or one.is_reserved
            or (isinstance(one, ipaddress.IPv4Address) and one in THIS_NETWORK)
            or any(one.version == n.version and one in n for n in NEVER_NETWORKS)
        ):
            return f"{address} is link-local, multicast, reserved, unspecified or special-purpose"
        if one is not address and not one.is_global:
            return f"{address} stands for {one}, which is not a global address"
    return None


_ALLOWED = ""
_HOST = "\0host"
_PEER = "\0peer"


class OutboundPolicy:
    """The rule of one scope over the current Rules; `check` is what every connection asks."""

    def __init__(
        self,
        rules: Rules | None = None,
        *,
        scope: Scope = "user",
        is_local: Callable[[IPAddress], bool] = is_local_address,
    ) -> None:
        self.rules = rules or Rules()
        self.scope: Scope = scope
        self._is_local = is_local
        self._verdicts: dict[str, tuple[str, str]] = {}

    def update(self, rules: Rules) -> None:
        """New rules, in force for the next check (decisions made under the old ones dropped)."""
        self.rules = rules
        self._verdicts.clear()

    def check(self, host: str, port: int) -> None:
        """Nothing when the control plane may connect to `host` (an IP address, as a resolver or
        a socket gives it) on `port`; raises DestinationRefused saying why not."""
        entry = self._verdicts.get(host)
        if entry is None:
            entry = self._decide(host)
            if len(self._verdicts) >= CACHE_SIZE:
                self._verdicts.clear()
            self._verdicts[host] = entry
        verdict, address = entry
        if self.scope == "operator":
            if verdict:
                raise DestinationRefused(verdict)
            return
        if (address, port) in self.rules.endpoints:
            raise DestinationRefused(f"{address}:{port} is the deployment's own")
        if verdict == _ALLOWED:
            return
        if verdict in (_HOST, _PEER):
            if port in self.rules.host_ports:
                return
            whose = "this host" if verdict == _HOST else "another replica's host"
            raise DestinationRefused(
                f"{address}:{port} is {whose}; only ACS_SANDBOX_HOST_PORTS may be called there"
            )
        raise DestinationRefused(verdict)

    def _decide(self, host: str) -> tuple[str, str]:
        """(verdict, canonical address): _ALLOWED, _HOST, _PEER or the reason of a refusal."""
        try:
            address = ipaddress.ip_address(canonical(host))
        except ValueError:
            return f"{host} is not an IP address", host
        shown = str(address)
        reason = never_reason(address)
        if reason is not None:
            return reason, shown
        if self.scope == "operator":
            return _ALLOWED, shown
        if self._is_local(address):
            return _HOST, shown
        if any(address in network for network in self.rules.internal):
            return f"{shown} is the deployment's own (its sandboxes' networks)", shown
        if shown in self.rules.peers:
            return _PEER, shown
        if not address.is_global and not any(address in n for n in self.rules.allow):
            return f"{shown} is a private address that ACS_OUTBOUND_ALLOW does not admit", shown
        return _ALLOWED, shown
