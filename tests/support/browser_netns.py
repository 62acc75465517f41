"""Headless Chromium in a network namespace of its own, reached over a veth pair.

Chromium aborts every request in flight with ERR_NETWORK_CHANGED when an address of its network
namespace changes, and on this host addresses change all the time: every container start gives
its veth an IPv6 link-local address (ours and those of every other test run on the shared
engine). In its own namespace the browser sees only its own link. The host end of the pair has an
address of this machine (`host_ip`) where the tests' servers listen and sandbox ports are
published; the browser reaches nothing else. Needs root, as the sandbox tests do.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Carrier-grade NAT space: never a route of this machine's own networks, nor of the sandbox pool.
POOL = ipaddress.IPv4Network("100.80.0.0/16")


@dataclass(frozen=True)
class BrowserNet:
    host_ip: str
    browser_ip: str
    holder: subprocess.Popen[bytes]
    chromium: Path
    """An executable that runs Debian's chromium inside the namespace (Playwright's
    executable_path); its control pipes pass through nsenter."""


def run_ip(*args: str, netns_pid: int | None = None) -> None:
    """`ip ARGS`, in the namespace of process `netns_pid` when given."""
    prefix = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", "--"] if netns_pid else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True)


def free_subnet(pool: ipaddress.IPv4Network = POOL) -> ipaddress.IPv4Network:
    """A /30 of `pool` that overlaps no address of this host."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True)
    taken = [
        ipaddress.IPv4Interface(word).network
        for line in used.stdout.splitlines()
        for word in line.split()
        if "/" in word and word[0].isdigit()
    ]
    for _ in range(100):
        size = 2 ** (30 - pool.prefixlen)
        start = int(pool.network_address) + 4 * secrets.randbelow(size)
        candidate = ipaddress.IPv4Network((start, 30))
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise RuntimeError(f"no free /30 in {pool}")


def create(workdir: Path) -> BrowserNet:
    executable = shutil.which("chromium")
    if executable is None:
        raise RuntimeError("no `chromium` on PATH: `make test` installs Debian's chromium")
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    try:
        subnet = free_subnet()
        host, browser = (str(a) for a in list(subnet.hosts())[:2])
        tag = secrets.token_hex(4)
        outside, inside = f"acsb{tag}h", f"acsb{tag}n"
        run_ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        # No IPv6 on our end: its link-local address would be a change other browsers see.
        Path(f"/proc/sys/net/ipv6/conf/{outside}/disable_ipv6").write_text("1")
        run_ip("link", "set", inside, "netns", str(holder.pid))
        run_ip("addr", "add", f"{host}/30", "dev", outside)
        run_ip("link", "set", outside, "up")
        ns = f"/proc/{holder.pid}/ns/net"
        subprocess.run(
            ["nsenter", f"--net={ns}", "--", "sysctl", "-q", "-w",
             "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
            check=True, capture_output=True,
        )  # fmt: skip
        run_ip("link", "set", "lo", "up", netns_pid=holder.pid)
        run_ip("addr", "add", f"{browser}/30", "dev", inside, netns_pid=holder.pid)
        run_ip("link", "set", inside, "up", netns_pid=holder.pid)
        run_ip("route", "add", "default", "via", host, netns_pid=holder.pid)
        wrapper = workdir / "chromium-in-netns"
        wrapper.write_text(f'#!/bin/sh\nexec nsenter --net={ns} -- {executable} "$@"\n')
        wrapper.chmod(0o755)
        return BrowserNet(host, browser, holder, wrapper)
    except BaseException:
        destroy_holder(holder)
        raise


def destroy_holder(holder: subprocess.Popen[bytes]) -> None:
    """The namespace goes with its last process, and the veth pair with it."""
    if holder.poll() is None:
        os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)


@pytest.fixture
def browser_net(tmp_path: Path) -> Iterator[BrowserNet]:
    net = create(tmp_path)
    yield net
    destroy_holder(net.holder)
