"""`controlplane` command line: serve the API, manage API keys, operate sandboxes over the API."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from controlplane.ops import sandboxes as ops_sandboxes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=3000)
    # One worker of ACS_WORKERS, as its supervisor starts it (controlplane/workers.py).
    serve.add_argument("--worker", default=None, help=argparse.SUPPRESS)

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key; prints it as the last line")
    create.add_argument("--user", required=True)
    create.add_argument("--admin", action="store_true")
    keys_sub.add_parser("list", help="list keys (ids, users, never the keys)")
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")

    networks = sub.add_parser("networks", help="the deployment's sandbox networks")
    networks_sub = networks.add_subparsers(dest="networks_command", required=True)
    networks_sub.add_parser(
        "remove",
        help="remove this deployment's sandbox networks and their firewall rules "
        "(refused for a network that still has sandboxes)",
    )

    audit_log_ = sub.add_parser("audit", help="the audit log kept in Redis")
    audit_sub = audit_log_.add_subparsers(dest="audit_command", required=True)
    audit_sub.add_parser(
        "backfill",
        help="give every entry of the log its per-organization index entries, again (the "
        "server does it once after an upgrade; run this after a rolling upgrade from a "
        "version without them); prints the counts",
    )

    sandboxes = sub.add_parser(
        "sandboxes", help="list, pause, resume, delete sandboxes over the REST API"
    )
    ops_sandboxes.add_arguments(sandboxes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "worker", None) is None:
        # prometheus_client's multiprocess mode is for an ACS_WORKERS worker only (its
        # supervisor sets this); it is read when prometheus_client is first imported.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if args.command == "sandboxes":
        # A REST client: it needs neither the server's ACS_* configuration nor Redis.
        return ops_sandboxes.run(args)
    # The server's imports (configuration, Redis, the runtimes, the audit log: about a second of
    # CPU) only for the commands that use them.
    from controlplane import commands  # noqa: PLC0415 - see above

    return commands.run(args)
