"""`controlplane sandboxes …`: list, pause, resume, delete and pause idle sandboxes.

Everything goes through the REST API with one API key (never Redis or Docker), so the command
has exactly that key's permissions and works from any host that reaches the API. Exit codes:
0 done, 1 an API call failed (or the server did not answer), 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from controlplane.ops.client import ApiError, InvalidId, OpsError, RestClient
from controlplane.ops.durations import duration_arg, format_duration
from controlplane.sandboxes.models import SandboxStatus

DEFAULT_URL = "http://127.0.0.1:3000"
URL_ENV = "ACS_URL"
KEY_ENV = "ACS_API_KEY"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STATUSES = [s.value for s in SandboxStatus]

EPILOG = f"""\
environment:
  {URL_ENV}       base URL of the API (default {DEFAULT_URL}); --url overrides it
  {KEY_ENV}   the API key (prefer it to --key, which other users can see in `ps`)

exit codes: 0 done, 1 an API call failed or the server did not answer, 2 usage error

examples:
  controlplane sandboxes list --all-users --status RUNNING
  controlplane sandboxes pause-idle --idle-for 30m --all-users --dry-run
  controlplane sandboxes delete --yes 0123456789abcdef012345
"""


def _connection_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # Accepted before and after the subcommand; after it, an absent option must not reset
    # the value given before it, hence SUPPRESS there.
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--url", default=default, help=f"API base URL (env {URL_ENV}; default {DEFAULT_URL})"
    )
    parser.add_argument("--key", default=default, help=f"API key (env {KEY_ENV}; required)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS if suppress else 60.0,
        metavar="SECONDS",
        help="per request (default 60)",
    )


def _scope_options(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--user", metavar="USER", help="only this user's sandboxes (admin key; created_by_user_id)"
    )
    scope.add_argument(
        "--all-users", action="store_true", help="every user's sandboxes (admin key)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Configure `parser` (the `sandboxes` command) with its options and subcommands."""
    parser.description = (
        "List, pause, resume and delete sandboxes over the REST API, with one API key:\n"
        "your own sandboxes, or every user's (--all-users, --user U) with an admin key."
    )
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    _connection_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, suppress=True)
    sub = parser.add_subparsers(dest="sandboxes_command", required=True, metavar="COMMAND")

    listing = sub.add_parser(
        "list", parents=[common], help="list sandboxes (all pages), newest first"
    )
    listing.add_argument("--status", type=str.upper, choices=STATUSES)
    listing.add_argument("--spec", metavar="SPEC_ID", help="only sandboxes of this spec")
    _scope_options(listing)
    listing.add_argument(
        "--idle-for",
        type=duration_arg,
        metavar="DURATION",
        help="only sandboxes without activity for longer than this (90s, 30m, 2h, 1d, 1h30m)",
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per line")

    for name, verb in (("pause", "pause"), ("resume", "resume")):
        command = sub.add_parser(name, parents=[common], help=f"{verb} sandboxes by id")
        command.add_argument("ids", nargs="+", metavar="ID")
    delete = sub.add_parser(
        "delete", parents=[common], help="delete sandboxes by id, with their workspaces"
    )
    delete.add_argument("ids", nargs="+", metavar="ID")
    delete.add_argument(
        "--yes", "-y", action="store_true", help="do not ask (required without a terminal)"
    )

    idle = sub.add_parser(
        "pause-idle",
        parents=[common],
        help="pause RUNNING sandboxes idle for longer than --idle-for",
        description="Pause every RUNNING sandbox whose last activity is older than --idle-for "
        "(the caller's own, or --user U / --all-users with an admin key). Each one is "
        "looked at again just before it is paused and skipped if it became active.",
    )
    idle.add_argument(
        "--idle-for",
        type=duration_arg,
        required=True,
        metavar="DURATION",
        help="no activity for longer than this: 90s, 30m, 2h, 1d, 1h30m",
    )
    idle.add_argument("--dry-run", action="store_true", help="list them, pause nothing")
    _scope_options(idle)


def main(argv: Sequence[str] | None = None) -> int:
    """`controlplane sandboxes` on its own (same as `controlplane sandboxes …`)."""
    parser = argparse.ArgumentParser(prog="controlplane sandboxes")
    add_arguments(parser)
    return run(parser.parse_args(argv))


# -- running ------------------------------------------------------------------------------------


def _error(message: str) -> None:
    print(f"controlplane: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get(URL_ENV) or DEFAULT_URL
    key = args.key or os.environ.get(KEY_ENV)
    if not url.startswith(("http://", "https://")):
        _error(f"--url/{URL_ENV} must be an http:// or https:// URL, not {url!r}")
        return EXIT_USAGE
    if not key:
        _error(f"no API key: pass --key KEY or set {KEY_ENV}")
        return EXIT_USAGE
    if args.timeout <= 0:
        _error("--timeout must be more than 0")
        return EXIT_USAGE
    if args.sandboxes_command == "delete" and not args.yes:
        confirmed = _confirm_delete(args.ids)
        if confirmed is not True:
            return EXIT_USAGE if confirmed is None else EXIT_FAILED
    try:
        return asyncio.run(_dispatch(RestClient(url, key, timeout=args.timeout), args))
    except OpsError as exc:
        _error(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _confirm_delete(ids: Sequence[str]) -> bool | None:
    """True to go on, False when the user said no, None when nobody can be asked."""
    if not sys.stdin.isatty():
        _error("delete: stdin is not a terminal; pass --yes to delete without asking")
        return None
    shown = " ".join(ids)
    sys.stderr.write(f"Delete {len(ids)} sandbox(es) and their workspaces: {shown}? [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() in ("y", "yes"):
        return True
    _error("nothing deleted")
    return False


async def _dispatch(client: RestClient, args: argparse.Namespace) -> int:
    async with client as api:
        command = args.sandboxes_command
        if command == "list":
            return await _list(api, args)
        if command == "pause-idle":
            return await _pause_idle(api, args)
        actions: dict[str, tuple[str, Callable[[str], Awaitable[None]]]] = {
            "pause": ("paused", api.pause_sandbox),
            "resume": ("resumed", api.resume_sandbox),
            "delete": ("deleted", api.delete_sandbox),
        }
        done, action = actions[command]
        return await _each(command, done, action, args.ids)


async def _each(
    verb: str, done: str, action: Callable[[str], Awaitable[None]], ids: Sequence[str]
) -> int:
    """Run `action` per id (each once, in order); a failed one does not stop the others."""
    failed = 0
    for sandbox_id in dict.fromkeys(ids):
        try:
            await action(sandbox_id)
        except (ApiError, InvalidId) as exc:
            _error(f"{verb} {sandbox_id}: {exc}")
            failed += 1
            continue
        print(f"{done} {sandbox_id}", flush=True)
    return EXIT_FAILED if failed else EXIT_OK


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _scope(args: argparse.Namespace) -> dict[str, str]:
    if args.user:
        return {"created_by_user_id": args.user}
    if args.all_users:
        return {"all_users": "true"}
    return {}


async def _list(api: RestClient, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    params = _scope(args)
    if args.status:
        params["status"] = args.status
    if args.spec:
        params["sandbox_spec_id"] = args.spec
    if args.idle_for:
        params["last_activity_at__lt"] = _timestamp(now - args.idle_for)
    if args.json:
        async for item in api.search_sandboxes(params):
            print(json.dumps(item, separators=(",", ":")), flush=False)
        sys.stdout.flush()
        return EXIT_OK
    rows = [["ID", "USER", "SPEC", "STATUS", "LAST ACTIVITY", "REASON"]]
    async for item in api.search_sandboxes(params):
        rows.append(
            [
                item["id"],
                item.get("created_by_user_id") or "-",
                item.get("sandbox_spec_id") or "-",
                item.get("status") or "-",
                _activity(item.get("last_activity_at"), now),
                " ".join((item.get("reason") or "").split()),
            ]
        )
    if len(rows) == 1:
        print("no sandboxes", file=sys.stderr)
        return EXIT_OK
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    return EXIT_OK


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _activity(value: Any, now: datetime) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    return f"{_timestamp(moment)} ({format_duration(now - moment)} ago)"


def _who(item: dict[str, Any], now: datetime) -> str:
    moment = _parse_time(item.get("last_activity_at"))
    idle = format_duration(now - moment) if moment else "?"
    return f"(user {item.get('created_by_user_id') or '-'}, idle {idle})"


async def _pause_idle(api: RestClient, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    cutoff = now - args.idle_for
    params = {
        **_scope(args),
        "status": SandboxStatus.RUNNING.value,
        "last_activity_at__lt": _timestamp(cutoff),
    }
    # The whole list first: pausing while paging would be safe (cursors survive changes), but
    # the summary needs the total.
    idle = [item async for item in api.search_sandboxes(params)]
    paused = failed = 0
    for item in idle:
        sandbox_id = item["id"]
        if args.dry_run:
            print(f"would pause {sandbox_id} {_who(item, now)}", flush=True)
            continue
        try:
            skip = await _still_idle(api, sandbox_id, cutoff)
            if skip is None:
                await api.pause_sandbox(sandbox_id)
        except (ApiError, InvalidId) as exc:
            _error(f"pause {sandbox_id}: {exc}")
            failed += 1
            continue
        if skip is not None:
            print(f"skipped {sandbox_id}: {skip}", flush=True)
            continue
        paused += 1
        print(f"paused {sandbox_id} {_who(item, now)}", flush=True)
    suffix = " (dry run)" if args.dry_run else ""
    print(f"paused {paused} of {len(idle)} idle sandboxes{suffix}", flush=True)
    return EXIT_FAILED if failed else EXIT_OK


async def _still_idle(api: RestClient, sandbox_id: str, cutoff: datetime) -> str | None:
    """None when the sandbox should still be paused, else why it is skipped now."""
    try:
        current = await api.get_sandbox(sandbox_id)
    except ApiError as exc:
        if exc.status == 404:
            return "deleted meanwhile"
        raise
    if current.get("status") != SandboxStatus.RUNNING.value:
        return f"now {current.get('status')}"
    moment = _parse_time(current.get("last_activity_at"))
    if moment is not None and moment >= cutoff:
        return f"active again at {_timestamp(moment)}"
    return None
