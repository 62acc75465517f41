"""Command line entry point: ``python -m agent --port 8000 [--host 0.0.0.0]``."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Sequence

from .tls import import_aiohttp

# The cyclic collector finds nothing to free among the modules and classes a boot creates, yet
# runs dozens of times over them (about a tenth of a boot's CPU, which a burst of cold starts
# pays per sandbox on shared cores). Off until the server is built (main()); only when run as
# the server, never when the module is imported (tests).
if __name__ == "__main__":
    gc.disable()

# Before anything imports aiohttp: its default client TLS context is made then (agent/tls.py).
import_aiohttp()

from aiohttp import web  # noqa: E402

from . import __version__  # noqa: E402
from .announce import announce_when_started, listening_socket  # noqa: E402
from .app import create_app  # noqa: E402
from .config import FALLBACK_API_KEY_ENV, WORKSPACE_ENV, AgentConfig  # noqa: E402

log = logging.getLogger("agent")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="Agent server running inside an ACS sandbox.",
    )
    # All interfaces on purpose: the server runs in a container, reached via a published port.
    parser.add_argument(
        "--host",
        default="0.0.0.0",  # noqa: S104 - in a container, behind its published port
        help="address to bind (default: 0.0.0.0)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument(
        "--workspace",
        default=None,
        help=f"workspace directory (default: ${WORKSPACE_ENV}, else the current directory)",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve /api/* without any session API key (development only)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = AgentConfig.from_env(workspace=args.workspace, host=args.host, port=args.port)
    if not config.auth_enabled:
        if not args.insecure_no_auth:
            print(
                "agent: no session API key configured: set OH_SESSION_API_KEYS_0 "
                f"(or {FALLBACK_API_KEY_ENV}), or pass --insecure-no-auth",
                file=sys.stderr,
            )
            return 2
        log.warning("authentication DISABLED (--insecure-no-auth)")
    try:
        config.workspace.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"agent: cannot create workspace {config.workspace}: {exc}", file=sys.stderr)
        return 2
    log.info(
        "agent %s listening on %s:%d, workspace %s, %d API key(s)",
        __version__,
        config.host,
        config.port,
        config.workspace,
        len(config.api_keys),
    )
    try:
        sock = listening_socket(config.host, config.port)
    except OSError as exc:
        print(f"agent: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 2
    app = create_app(config)
    announce_when_started(app)
    if not gc.isenabled():
        # What exists now lives as long as the process: frozen, no collection walks it again.
        gc.freeze()
        gc.enable()
    web.run_app(app, sock=sock, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
