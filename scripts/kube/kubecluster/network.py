"""The cluster's network: namespaces, the bridge linking them with the host, routes."""

from __future__ import annotations

from pathlib import Path

from kubecluster.host import in_netns, run
from kubecluster.layout import Layout


def make_netns(path: Path) -> None:
    """A network namespace kept alive by a bind mount on a file of the state directory (not
    /run/netns, which `ip netns add` would turn into a host-wide shared mount)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    run(["unshare", f"--net={path}", "true"])


def ip_in(netns: Path, *commands: str) -> None:
    """Run `ip` commands inside a namespace, in one process (`ip -batch`)."""
    run(in_netns(netns, ["ip", "-batch", "-"]), stdin="\n".join(commands).encode())


def sysctl_in(netns: Path, *settings: str) -> None:
    run(in_netns(netns, ["sysctl", "-q", "-w", *settings]))


def make_network(layout: Layout) -> None:
    ctl = layout.netns("ctl")
    make_netns(ctl)
    # The host's end of the control namespace's bridge; the ctl-side end is created in place.
    run(["ip", "link", "add", layout.host_veth, "type", "veth", "peer", "name", "host",
         "netns", str(ctl)])  # fmt: skip
    commands = [
        "link set lo up",
        "link add br0 type bridge",
        f"addr add {layout.api_ip}/24 dev br0",
        "link set br0 up",
        "link set host master br0",
        "link set host up",
    ]
    for index in layout.node_indexes():
        node_ns = layout.netns(f"n{index}")
        make_netns(node_ns)
        run(["ip", "link", "add", f"n{index}", "netns", str(ctl), "type", "veth", "peer", "name",
             "eth0", "netns", str(node_ns)])  # fmt: skip
        commands += [f"link set n{index} master br0", f"link set n{index} up"]
        commands.append(f"route add {layout.pod_cidr(index)} via {layout.node_ip(index)}")
    commands.append(f"route add {layout.service_cidr} via {layout.node_ip(1)}")
    ip_in(ctl, *commands)
    for index in layout.node_indexes():
        node_ns = layout.netns(f"n{index}")
        # No default route: nothing in a node can reach the internet (a cloud-metadata probe
        # would time out for seconds); pods reach the host at its bridge address.
        node_commands = [
            "link set lo up",
            f"addr add {layout.node_ip(index)}/24 dev eth0",
            "link set eth0 up",
        ]
        for other in layout.node_indexes():
            if other != index:
                node_commands.append(
                    f"route add {layout.pod_cidr(other)} via {layout.node_ip(other)}"
                )
        ip_in(node_ns, *node_commands)
        sysctl_in(
            node_ns,
            "net.ipv4.ip_forward=1",
            "net.bridge.bridge-nf-call-iptables=1",
            "net.ipv4.conf.all.route_localnet=1",
        )
    host = [
        ["ip", "addr", "add", f"{layout.host_ip}/24", "dev", layout.host_veth],
        ["ip", "link", "set", layout.host_veth, "up"],
    ]
    for index in layout.node_indexes():
        host.append(["ip", "route", "add", layout.pod_cidr(index), "via", layout.node_ip(index)])
    host.append(["ip", "route", "add", layout.service_cidr, "via", layout.node_ip(1)])
    for argv in host:
        run(argv)
