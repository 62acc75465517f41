"""The `controlplane` commands that run with the server's configuration (ACS_*): serve, keys,
audit, networks. controlplane/cli.py imports this module only when one of them runs, so that
`controlplane sandboxes` (a REST client that ops scripts call in loops) starts without the
server's imports."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import signal
import socket
import sys

import structlog
from aiohttp import web

from controlplane.audit.sinks import audit_log
from controlplane.auth.identity import is_loopback_host
from controlplane.auth.service import ApiKeyService
from controlplane.config import ConfigError, ServiceConfig, load_config
from controlplane.crypto import load_secret_box
from controlplane.errors import ControlPlaneError
from controlplane.event_loop import run_loop
from controlplane.heap import freeze_startup_heap
from controlplane.keys import DRAIN
from controlplane.logging import configure_logging
from controlplane.shutdown import begin_drain
from controlplane.store import audit
from controlplane.store.audit_backfill import RETRY as BACKFILL_RETRY
from controlplane.store.audit_backfill import AuditBackfill
from controlplane.store.failover import open_redis
from controlplane.store.redis import ensure_embedded_redis, wait_for_redis
from controlplane.workers import Supervisor, parse_worker, supervised_by
from drivers.runtime import RuntimeHost
from drivers.runtimes import RUNTIMES

log = structlog.get_logger("controlplane.cli")
WILDCARDS = ("0.0.0.0", "::", "")  # noqa: S104 (names them, binds nothing)


def check_bind(config: ServiceConfig, host: str) -> None:
    """Raises ConfigError when the configuration must not serve on `host`: single-user mode
    (no keys) is for this machine only."""
    if config.auth_mode == "none" and not is_loopback_host(host):
        raise ConfigError(
            f"ACS_AUTH_MODE: none serves only on loopback (127.0.0.1, ::1, localhost), not on"
            f" {host}; use API keys (the default) to serve other machines"
        )


async def _serve(config: ServiceConfig, host: str, port: int, *, worker: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then drain (controlplane/shutdown.py): in-flight requests
    and conversation starts get ACS_SHUTDOWN_TIMEOUT (30 s) to finish.

    `worker`: one of ACS_WORKERS (controlplane/workers.py): the API's port is then shared with
    the other workers (SO_REUSEPORT); alone, a second server on the port is refused.

    The API listens on `host` only. Sandboxes post their webhooks to a separate listener, bound
    by the runtime where they reach it (Docker: their network's gateway), by default on the same
    port number.
    """
    if config.webhook_port is None:
        config = config.model_copy(update={"webhook_port": port})
    if host in WILDCARDS and config.webhook_port == port:
        raise ConfigError(
            f"ACS_WEBHOOK_PORT: serve --host {host} listens on every address, the sandbox "
            f"networks' gateways included; set ACS_WEBHOOK_PORT to a port other than {port}"
        )
    bound = config.runtime.listener_address()
    if bound is not None and config.webhook_port == port and bound in (host, *WILDCARDS):
        raise ConfigError(
            f"ACS_WEBHOOK_PORT: the webhook listener binds {bound}:{port} (the {config.driver} "
            f"runtime's setting), where the API listens too; set ACS_WEBHOOK_PORT to a port "
            f"other than {port}"
        )
    hosts = [host]
    # Signals first: as PID 1 in a container, SIGTERM is ignored until a handler exists, and
    # start-up may spend a while retrying Redis.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The whole app is imported by the command that serves it only: `keys` and `sandboxes`
    # start in a fraction of the time (a script calls them in loops).
    from controlplane.app import create_app  # noqa: PLC0415 - see above

    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=config.shutdown_timeout)
    setup = asyncio.create_task(runner.setup())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({setup, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not setup.done():
        setup.cancel()
        await asyncio.gather(setup, return_exceptions=True)
        log.info("stopped_during_startup")
        return
    stopping.cancel()
    setup.result()  # start-up errors (bad spec, Redis down) surface here
    freeze_startup_heap()  # before the first request: controlplane/heap.py
    try:
        for address in hosts:
            await web.TCPSite(runner, address, port, reuse_port=worker).start()
        log.info(
            "serving",
            addresses=[f"http://{h}:{port}" for h in hosts],
            event_loop=type(loop).__module__.split(".")[0],
        )
        await stop.wait()
        log.info("shutting_down")
        await begin_drain(app[DRAIN], config)  # unready first (controlplane/shutdown.py)
    finally:
        await runner.cleanup()


async def _keys(config: ServiceConfig, args: argparse.Namespace) -> None:
    client = await open_redis(config)
    try:
        await wait_for_redis(client, attempts=3)
        service = ApiKeyService(client, None)
        # Keys made or revoked here are in the audit log, by the operator at this host.
        operator = audit.Actor(via="cli", admin=True)
        scope = audit.Scope(
            log=audit_log(config, client),
            actor=lambda: operator,
            user_agent=f"controlplane-cli ({getpass.getuser()}@{socket.gethostname()})",
        )
        with audit.acting(scope):
            await _key_command(service, args)
    finally:
        await client.aclose()


async def _key_command(service: ApiKeyService, args: argparse.Namespace) -> None:
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


async def _audit_backfill(config: ServiceConfig) -> None:
    """`controlplane audit backfill`: the per-organization indexes of every entry of the log
    (controlplane/store/audit_backfill.py), now, waiting for a replica running it first."""
    client = await open_redis(config)
    try:
        await wait_for_redis(client, attempts=3)
        backfill = AuditBackfill(client, retention=config.audit_retention)
        while (done := await backfill.run(again=True)) is None:
            print("controlplane: a replica is running the backfill; waiting", file=sys.stderr)
            await asyncio.sleep(BACKFILL_RETRY)
        print(
            f"read {done.entries} audit entries: {done.user_entries} in "
            f"{done.indexes} per-organization user indexes, {done.target_entries} in "
            "per-organization target indexes"
        )
    finally:
        await client.aclose()


async def _remove_networks(config: ServiceConfig) -> int:
    """`controlplane networks remove`: for uninstalling (the server never removes them: its
    sandboxes outlive it); what the runtime keeps outside its sandboxes, if anything."""
    runtime = RUNTIMES[config.driver]
    if runtime.remove_networks is None:
        print(f"the {config.driver} runtime keeps no networks of its own: nothing to remove")
        return 0
    removal = await runtime.remove_networks(config.runtime, RuntimeHost(config.container_prefix))
    for warning in removal.warnings:
        print(f"controlplane: {warning}", file=sys.stderr)
    if removal.in_use:
        print(f"controlplane: {removal.in_use}", file=sys.stderr)
        return 1
    print(removal.done)
    return 0


def _worker(value: str | None) -> int | None:
    """`serve --worker I/N/PID`: the worker's index; exits when its supervisor is already
    gone."""
    if value is None:
        return None
    try:
        index, _count, supervisor = parse_worker(value)
    except ValueError:
        raise ConfigError(f"--worker {value}: not I/N/PID") from None
    if not supervised_by(supervisor):
        raise SystemExit(0)  # the supervisor died before this worker could follow it
    return index


def run(args: argparse.Namespace) -> int:
    """Runs a parsed command other than `sandboxes`; the exit status (2: configuration)."""
    try:
        config = load_config()
        worker = _worker(args.worker) if args.command == "serve" else None
        configure_logging(
            config.log_format,
            config.log_level,
            stream=sys.stderr if args.command in ("keys", "networks", "audit") else None,
            worker=worker,
        )
        if args.command == "serve":
            check_bind(config, args.host)
            if worker is None and config.workers > 1:
                supervisor = Supervisor(config.workers, args.host, args.port)
                supervisor.catch_signals()  # first: as PID 1, SIGTERM is ignored until then
                # Made once, before the workers would each make them at the same time.
                if config.redis_url is None and not config.redis_sentinels:
                    ensure_embedded_redis(config.data_dir)
                load_secret_box(config.secret_key, config.data_dir)
                return supervisor.run(config.data_dir)
            if config.auth_mode == "none" and worker in (None, 0):
                log.warning("single_user_mode", user_id=config.bootstrap_user, host=args.host)
            serving = _serve(config, args.host, args.port, worker=worker is not None)
            run_loop(config.event_loop, serving)
        elif args.command == "networks":
            return asyncio.run(_remove_networks(config))
        elif args.command == "audit":
            asyncio.run(_audit_backfill(config))
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
