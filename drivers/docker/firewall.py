"""Host firewall rules for one sandbox network, named after its bridge interface.

- Inbound, the iptables chain `ACSIN-<id>`, jumped to from INPUT for packets arriving on the
  bridge, replaced atomically with `iptables-restore --noflush` (a declared chain is flushed and
  refilled in one commit): what a sandbox may reach on the host itself. Replies to connections
  the host opened (health probes, API calls to the agent) and the listed host ports on the
  gateway address are accepted; everything else is rejected. The engine never touches INPUT,
  and an ACCEPT there is final, so a host whose own INPUT rules are strict still lets sandboxes
  post their events.
- Outbound, the nftables table `acs_out_<id>` (family inet), a base chain of its own on the forward
  hook: where a sandbox may connect beyond the host. The cloud metadata services (link-local and the
  few elsewhere: drivers/egress.py) are always rejected; then either everything goes on to the
  engine's own rules (internet) or only the allow-list does. Not iptables' DOCKER-USER: the engine
  deletes and re-inserts its jump to DOCKER-USER, and puts each new network's ACCEPT rules first in
  FORWARD, whenever anyone makes a network on the host, and for that while forwarded packets meet
  its ACCEPTs first (measured: 107 of 31,026 connects out of an `egress: none` sandbox got through
  while 24 networks came and went). A reject in any nftables base chain is final whatever the other
  chains say or in what order, and the engine never touches our table; one transaction replaces it
  (`nft -f`). Both iptables backends (nf_tables and legacy) run beside it. The same chain drops new
  connections forwarded into the bridge (but a published port's): a peer beyond the host that could
  open one would make the sandbox's replies "established".

Blocking calls: run them in a thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import structlog

from drivers.egress import METADATA_V4, METADATA_V6

log = structlog.get_logger(__name__)

_TIMEOUT = 30
_TABLE_PREFIX = "acs_out_"


class FirewallError(Exception):
    """iptables or nft refused a change, or cannot be used here."""


@dataclass(frozen=True)
class NetworkRules:
    bridge: str  # the bridge interface, e.g. acs1a2b3c4d5e6f
    gateway: str  # the host's address on it
    host_ports: tuple[int, ...]  # TCP ports open on the gateway address
    allow: tuple[tuple[str, int], ...] | None  # (IPv4 network, TCP port); None: the internet


def rule_names(bridge: str) -> tuple[str, str]:
    """The network's inbound iptables chain and outbound nftables table."""
    suffix = bridge.removeprefix("acs")
    return f"ACSIN-{suffix}", f"{_TABLE_PREFIX}{suffix}"


def _legacy_outbound_chain(bridge: str) -> str:
    """The outbound iptables chain of releases before the nftables table (removed on sight)."""
    return f"ACSOUT-{bridge.removeprefix('acs')}"


def inbound_ruleset(rules: NetworkRules) -> str:
    """The iptables-restore input that (re)defines the network's inbound chain."""
    inbound, _ = rule_names(rules.bridge)
    lines = ["*filter", f":{inbound} - [0:0]"]
    lines.append(f"-A {inbound} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    for port in rules.host_ports:
        lines.append(f"-A {inbound} -d {rules.gateway}/32 -p tcp -m tcp --dport {port} -j ACCEPT")
    lines.append(f"-A {inbound} -p tcp -j REJECT --reject-with tcp-reset")
    lines.append(f"-A {inbound} -j REJECT --reject-with icmp-port-unreachable")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def outbound_ruleset(rules: NetworkRules) -> str:
    """The `nft -f` input that replaces the network's outbound table in one transaction (made
    first if missing, so that the delete always has something to delete)."""
    _, table = rule_names(rules.bridge)
    fence = [
        "ct state established,related accept",
        f"ip daddr {{ {', '.join(METADATA_V4)} }} reject with icmp type net-prohibited",
        f"ip6 daddr {{ {', '.join(METADATA_V6)} }} reject with icmpv6 type admin-prohibited",
    ]
    if rules.allow is None:
        fence.append("accept")  # on to the engine's own rules
    else:
        fence += [f"ip daddr {net} tcp dport {port} accept" for net, port in rules.allow]
        fence += [
            "meta l4proto tcp reject with tcp reset",
            "meta nfproto ipv4 reject with icmp type net-prohibited",
            "reject with icmpx type admin-prohibited",
        ]
    body = "".join(f"\t\t{line}\n" for line in fence)
    return (
        f"table inet {table}\n"
        f"delete table inet {table}\n"
        f"table inet {table} {{\n"
        "\tchain forward {\n"
        "\t\ttype filter hook forward priority filter - 1; policy accept;\n"
        f'\t\tiifname "{rules.bridge}" jump fence\n'
        # Nothing beyond the host opens a connection to a sandbox (a published port's DNAT
        # aside): else the peer's packets make the sandbox's replies "established", which the
        # fence lets out (Docker before 28 forwards them when FORWARD's policy is ACCEPT).
        f'\t\toifname "{rules.bridge}" ct status dnat accept\n'
        f'\t\toifname "{rules.bridge}" ct state new drop\n'
        "\t}\n"
        f"\tchain fence {{\n{body}\t}}\n"
        "}\n"
    )


class HostFirewall:
    """The host's iptables (legacy or nf_tables: the same commands drive both) for what sandboxes
    reach on the host, and nftables for where they connect beyond it."""

    def __init__(self, iptables: str = "iptables", nft: str = "nft") -> None:
        self._iptables = iptables
        self._nft = nft

    def unavailable(self) -> str | None:
        """Why rules cannot be managed here, or None when they can."""
        if os.geteuid() != 0:
            return "the control plane is not running as root"
        for binary in (self._iptables, f"{self._iptables}-restore"):
            if shutil.which(binary) is None:
                return f"{binary} is not installed"
        # An engine started with --iptables=false enforces neither its ban on traffic between
        # sandboxes nor the isolation of its networks: our rules alone would not fence them.
        probe = self._iptables_run("-S", "DOCKER-USER", check=False)
        if probe.returncode != 0:
            return (
                "the DOCKER-USER chain is missing: the Docker engine does not manage iptables "
                f"here ({probe.stderr.strip()})"
            )
        return self.nftables_unavailable()

    def nftables_unavailable(self) -> str | None:
        """Why nft cannot be used here, or None when it can. Where iptables can (root, the
        binaries), releases before the nftables table fenced the host with iptables alone: such
        a host must not quietly lose its fence on upgrade (egress.py refuses to start)."""
        if shutil.which(self._nft) is None:
            return f"{self._nft} is not installed"
        probe = self._run(self._nft, "list", "tables", check=False)
        if probe.returncode != 0:
            return f"nftables cannot be used here: {probe.stderr.strip()}"
        return None

    def apply(self, rules: NetworkRules) -> None:
        """Replace the network's outbound table and inbound chain, and make sure INPUT jumps to
        the chain. An outbound chain of an older release goes once the table stands."""
        inbound, _ = rule_names(rules.bridge)
        self._restore([self._nft, "-f", "-"], outbound_ruleset(rules))
        self._restore([f"{self._iptables}-restore", "-w", "--noflush"], inbound_ruleset(rules))
        spec = ["INPUT", "-i", rules.bridge, "-j", inbound]
        if self._iptables_run("-C", *spec, check=False).returncode != 0:
            self._iptables_run("-I", "INPUT", "1", *spec[1:])  # before the host's own rules
        self._remove_chain("DOCKER-USER", rules.bridge, _legacy_outbound_chain(rules.bridge))

    def remove(self, bridge: str) -> None:
        """Remove the network's chain, table and the jump; what is already gone is skipped."""
        inbound, table = rule_names(bridge)
        self._remove_chain("INPUT", bridge, inbound)
        self._remove_chain("DOCKER-USER", bridge, _legacy_outbound_chain(bridge))
        self._run(self._nft, "delete", "table", "inet", table, check=False)

    def installed(self) -> list[str]:
        """The ACSIN- chains and acs_out_ tables that exist (for clean-up and tests)."""
        chains = self._iptables_run("-S", check=False).stdout.splitlines()
        tables = self._run(self._nft, "list", "tables", "inet", check=False).stdout.splitlines()
        return [
            line.split()[1] for line in chains if line.startswith(("-N ACSIN-", "-N ACSOUT-"))
        ] + [line.split()[2] for line in tables if line.startswith(f"table inet {_TABLE_PREFIX}")]

    def _remove_chain(self, parent: str, bridge: str, chain: str) -> None:
        jump = [parent, "-i", bridge, "-j", chain]
        while self._iptables_run("-D", *jump, check=False).returncode == 0:
            pass
        self._iptables_run("-F", chain, check=False)
        self._iptables_run("-X", chain, check=False)

    def _restore(self, argv: list[str], ruleset: str) -> None:
        result = subprocess.run(  # noqa: S603 (fixed binary, rules built from validated values)
            argv, input=ruleset, capture_output=True, text=True, timeout=_TIMEOUT, check=False
        )
        if result.returncode != 0:
            raise FirewallError(f"{argv[0]} refused the rules: {result.stderr.strip()}")

    def _iptables_run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(self._iptables, "-w", *args, check=check)

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(  # noqa: S603 - fixed binary, our own arguments
            argv, capture_output=True, text=True, timeout=_TIMEOUT, check=False
        )
        if check and result.returncode != 0:
            raise FirewallError(f"{' '.join(argv)}: {result.stderr.strip()}")
        return result
