"""The command line: `python3 -m kubecluster [--slot N] COMMAND` (scripts/kube-cluster.sh)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import kubecluster
from kubecluster.commands import (
    binaries,
    kill_node,
    load_images,
    read_info,
    shell_env,
    start_node,
    status,
    up,
)
from kubecluster.host import ClusterError, log
from kubecluster.layout import DEFAULT_NODES, MAX_NODES, SLOTS, Layout
from kubecluster.slots import claim_slot, locked
from kubecluster.teardown import teardown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kube-cluster", description=kubecluster.__doc__)
    parser.add_argument("--slot", type=int, default=int(os.environ.get("ACS_KUBE_SLOT", "0")))
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser(
        "up", help="bring a cluster up (replacing the slot's leftovers)"
    )
    up_parser.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    up_parser.add_argument(
        "--owner-pid", type=int, help="the slot is in use while this process lives"
    )
    up_parser.add_argument("--any-slot", action="store_true", help="the first slot nobody uses")
    up_parser.add_argument(
        "--down-on-failure", action="store_true", help="remove a cluster that failed to come up"
    )
    commands.add_parser("down", help="remove everything the slot's cluster made")
    env_parser = commands.add_parser("env", help="shell exports (or --json) for clients")
    env_parser.add_argument("--json", action="store_true")
    commands.add_parser("status", help="processes, node conditions, memory (JSON)")
    kill_parser = commands.add_parser("kill-node", help="SIGKILL a node's kubelet and dockerd")
    kill_parser.add_argument("node", type=int, help="node number, from 1")
    start_parser = commands.add_parser("start-node", help="start a killed node again")
    start_parser.add_argument("node", type=int)
    load_parser = commands.add_parser("load-image", help="copy host images into every node")
    load_parser.add_argument("images", nargs="+")
    args = parser.parse_args(argv)

    if os.geteuid() != 0:
        parser.error("run as root: it makes network namespaces, cgroups and mounts")
    if not 0 <= args.slot < SLOTS:
        parser.error(f"--slot must be in 0..{SLOTS - 1}")
    try:
        if args.command == "up":
            if not 1 <= args.nodes <= MAX_NODES:
                parser.error(f"--nodes must be in 1..{MAX_NODES}")
            slot = claim_slot(args.owner_pid, None if args.any_slot else args.slot)
            info = up(Layout(slot, args.nodes), binaries(), down_on_failure=args.down_on_failure)
            print(json.dumps(info, indent=1))
            return 0
        layout = Layout(args.slot, nodes_of(args.slot))
        if args.command == "down":
            with locked(layout.lock_file):
                print(json.dumps(teardown(layout)))
        elif args.command == "env":
            info = read_info(layout)
            print(
                json.dumps(info, indent=1) if args.json else shell_env(info),
                end="\n" if args.json else "",
            )
        elif args.command == "status":
            print(json.dumps(status(layout), indent=1))
        elif args.command == "kill-node":
            print(json.dumps({"killed": kill_node(layout, check_node(parser, layout, args.node))}))
        elif args.command == "start-node":
            start_node(layout, check_node(parser, layout, args.node), binaries())
        elif args.command == "load-image":
            print(json.dumps(load_images(layout, args.images)))
    except ClusterError as error:
        log(f"ERROR: {error}")
        return 1
    return 0


def nodes_of(slot: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return len(json.loads(Layout(slot).info_file.read_text())["nodes"])
    return len(list(Layout(slot).state_dir.glob("n[0-9]*"))) or DEFAULT_NODES


def check_node(parser: argparse.ArgumentParser, layout: Layout, node: int) -> int:
    if node not in layout.node_indexes():
        parser.error(f"node must be in 1..{layout.nodes}")
    return node


if __name__ == "__main__":
    sys.exit(main())
