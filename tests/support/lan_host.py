"""A machine of the LAN, for the outbound policy's tests: a network namespace of its own on a
veth pair, with a private address (CGNAT space: not global, not this host's) that this host
routes to, and processes run inside it (a canary, a Redis, a control plane replica). Made as
the browser's namespace is (tests/support/browser_netns.py: a holder process, no /run/netns
entry); it goes, with its veth pair, when the holder is killed. Needs root.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.browser_netns import destroy_holder, free_subnet, run_ip

POOL = ipaddress.IPv4Network("100.81.0.0/16")
"""Carrier-grade NAT space, apart from the browser's (100.80/16)."""


@dataclass
class LanHost:
    address: str
    """Its address, which this host reaches through the veth pair."""
    network: str
    """The /30 it shares with this host's end of the pair."""
    holder: subprocess.Popen[bytes]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *argv: str, log: Path | None = None) -> subprocess.Popen[bytes]:
        """A process inside the namespace (stopped with it); its output to `log`."""
        argv = ("nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--", *argv)
        if log is None:
            process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            with open(log, "ab") as out:  # the child has its own copy
                process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process


@contextmanager
def lan_host() -> Iterator[LanHost]:
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    host: LanHost | None = None
    try:
        subnet = free_subnet(POOL)
        near, far = (str(a) for a in list(subnet.hosts())[:2])
        tag = secrets.token_hex(4)
        outside, inside = f"acsl{tag}h", f"acsl{tag}n"
        run_ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        Path(f"/proc/sys/net/ipv6/conf/{outside}/disable_ipv6").write_text("1")
        run_ip("link", "set", inside, "netns", str(holder.pid))
        run_ip("addr", "add", f"{near}/30", "dev", outside)
        run_ip("link", "set", outside, "up")
        run_ip("link", "set", "lo", "up", netns_pid=holder.pid)
        run_ip("addr", "add", f"{far}/30", "dev", inside, netns_pid=holder.pid)
        run_ip("link", "set", inside, "up", netns_pid=holder.pid)
        run_ip("route", "add", "default", "via", near, netns_pid=holder.pid)
        host = LanHost(address=far, network=str(subnet), holder=holder)
        yield host
    finally:
        for process in host.processes if host is not None else []:
            process.kill()
            process.wait(timeout=10)
        destroy_holder(holder)
