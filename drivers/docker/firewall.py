"""Host firewall rules for one sandbox network (iptables, through the `iptables` commands).

Per network two chains, named after its bridge interface and replaced atomically with
`iptables-restore --noflush` (a declared chain is flushed and refilled in one commit):

- `ACSIN-<id>`, jumped to from INPUT for packets arriving on the bridge: what a sandbox may reach
  on the host itself. Replies to connections the host opened (health probes, API calls to the
  agent) and the listed host ports on the gateway address are accepted; everything else is
  rejected.
- `ACSOUT-<id>`, jumped to from DOCKER-USER (which the engine consults first in FORWARD) for
  packets leaving the bridge: where a sandbox may connect beyond the host. Link-local addresses
  (cloud metadata services) are always rejected; then either everything returns to the engine's
  own rules (internet) or only the allow-list does.

Blocking calls: run them in a thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

LINK_LOCAL = "169.254.0.0/16"
_TIMEOUT = 30


class FirewallError(Exception):
    """iptables refused a change, or cannot be used here."""


@dataclass(frozen=True)
class NetworkRules:
    bridge: str  # the bridge interface, e.g. acs1a2b3c4d5e6f
    gateway: str  # the host's address on it
    host_ports: tuple[int, ...]  # TCP ports open on the gateway address
    allow: tuple[tuple[str, int], ...] | None  # (IPv4 network, TCP port); None: the internet


def chain_names(bridge: str) -> tuple[str, str]:
    suffix = bridge.removeprefix("acs")
    return f"ACSIN-{suffix}", f"ACSOUT-{suffix}"


def ruleset(rules: NetworkRules) -> str:
    """The iptables-restore input that (re)defines both chains of one network."""
    inbound, outbound = chain_names(rules.bridge)
    lines = ["*filter", f":{inbound} - [0:0]", f":{outbound} - [0:0]"]
    lines.append(f"-A {inbound} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    for port in rules.host_ports:
        lines.append(f"-A {inbound} -d {rules.gateway}/32 -p tcp -m tcp --dport {port} -j ACCEPT")
    lines.append(f"-A {inbound} -p tcp -j REJECT --reject-with tcp-reset")
    lines.append(f"-A {inbound} -j REJECT --reject-with icmp-port-unreachable")
    lines.append(f"-A {outbound} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN")
    lines.append(f"-A {outbound} -d {LINK_LOCAL} -j REJECT --reject-with icmp-net-prohibited")
    if rules.allow is None:
        lines.append(f"-A {outbound} -j RETURN")
    else:
        for network, port in rules.allow:
            lines.append(f"-A {outbound} -d {network} -p tcp -m tcp --dport {port} -j RETURN")
        lines.append(f"-A {outbound} -p tcp -j REJECT --reject-with tcp-reset")
        lines.append(f"-A {outbound} -j REJECT --reject-with icmp-net-prohibited")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


class Iptables:
    """The host's iptables (legacy or nf_tables: the same commands drive both)."""

    def __init__(self, binary: str = "iptables") -> None:
        self._binary = binary

    def unavailable(self) -> str | None:
        """Why rules cannot be managed here, or None when they can."""
        if os.geteuid() != 0:
            return "the control plane is not running as root"
        if shutil.which(self._binary) is None or shutil.which(f"{self._binary}-restore") is None:
            return f"{self._binary} is not installed"
        probe = self._run("-S", "DOCKER-USER", check=False)
        if probe.returncode != 0:
            return (
                "the DOCKER-USER chain is missing: the Docker engine does not manage iptables "
                f"here ({probe.stderr.strip()})"
            )
        return None

    def apply(self, rules: NetworkRules) -> None:
        """Replace the network's chains and make sure INPUT and DOCKER-USER jump to them."""
        inbound, outbound = chain_names(rules.bridge)
        result = subprocess.run(  # noqa: S603 (fixed binary, rules built from validated values)
            [f"{self._binary}-restore", "-w", "--noflush"],
            input=ruleset(rules),
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise FirewallError(f"iptables-restore failed: {result.stderr.strip()}")
        self._ensure_jump("INPUT", rules.bridge, inbound)
        self._ensure_jump("DOCKER-USER", rules.bridge, outbound)

    def remove(self, bridge: str) -> None:
        """Remove both chains and the jumps to them; what is already gone is skipped."""
        inbound, outbound = chain_names(bridge)
        for parent, chain in (("INPUT", inbound), ("DOCKER-USER", outbound)):
            while self._run("-D", parent, "-i", bridge, "-j", chain, check=False).returncode == 0:
                pass
            self._run("-F", chain, check=False)
            self._run("-X", chain, check=False)

    def chains(self) -> list[str]:
        """The ACSIN-/ACSOUT- chains that exist (for cleanup and tests)."""
        listing = self._run("-S", check=False).stdout
        return [
            line.split()[1]
            for line in listing.splitlines()
            if line.startswith("-N ACSIN-") or line.startswith("-N ACSOUT-")
        ]

    def _ensure_jump(self, parent: str, bridge: str, chain: str) -> None:
        spec = [parent, "-i", bridge, "-j", chain]
        if self._run("-C", *spec, check=False).returncode != 0:
            # First: before the engine's own ACCEPT rules (DOCKER-USER ends with a RETURN).
            self._run("-I", parent, "1", *spec[1:])

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(  # noqa: S603 - fixed binary, our own arguments
            [self._binary, "-w", *args],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
        if check and result.returncode != 0:
            raise FirewallError(f"{self._binary} {' '.join(args)}: {result.stderr.strip()}")
        return result
