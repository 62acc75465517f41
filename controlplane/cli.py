"""`controlplane` command line: serve the API and manage API keys."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from aiohttp import web

from controlplane.app import create_app
from controlplane.auth.service import ApiKeyService
from controlplane.config import ConfigError, ServiceConfig, load_config
from controlplane.errors import ControlPlaneError
from controlplane.logging import configure_logging
from controlplane.store.redis import make_client, resolve_redis_url, wait_for_redis


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=3000)

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key; prints it as the last line")
    create.add_argument("--user", required=True)
    create.add_argument("--admin", action="store_true")
    keys_sub.add_parser("list", help="list keys (ids, users, never the keys)")
    revoke = keys_sub.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    return parser


def _serve(config: ServiceConfig, host: str, port: int) -> None:
    if config.public_url is None:
        config = config.model_copy(update={"public_url": f"http://host.docker.internal:{port}"})
    web.run_app(
        create_app(config), host=host, port=port, print=None, access_log=None, shutdown_timeout=30
    )


async def _keys(config: ServiceConfig, args: argparse.Namespace) -> None:
    client = make_client(await asyncio.to_thread(resolve_redis_url, config), config.redis_timeout)
    try:
        await wait_for_redis(client, attempts=3)
        service = ApiKeyService(client, None)
        if args.keys_command == "create":
            created = await service.create(args.user, admin=args.admin)
            role = "admin" if created.is_admin else "user"
            print(f"created key {created.key_id} for {created.user_id} ({role})", file=sys.stderr)
            print(created.key)
        elif args.keys_command == "list":
            print("KEY_ID\tUSER\tADMIN\tCREATED_AT")
            for info in await service.list():
                print(
                    f"{info.key_id}\t{info.user_id}\t{str(info.is_admin).lower()}\t"
                    f"{info.created_at.isoformat()}"
                )
        else:
            await service.revoke(args.key_id)
            print(f"revoked {args.key_id}")
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config()
        configure_logging(
            config.log_format,
            config.log_level,
            stream=sys.stderr if args.command == "keys" else None,
        )
        if args.command == "serve":
            _serve(config, args.host, args.port)
        else:
            asyncio.run(_keys(config, args))
    except ConfigError as exc:
        print(f"controlplane: configuration error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if isinstance(exc, ControlPlaneError):
            print(f"controlplane: {exc}", file=sys.stderr)
            return 1
        raise
    return 0
