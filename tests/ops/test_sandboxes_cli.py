"""`controlplane sandboxes …` (in the test's process, tests/support/cli.py, and once as the
installed console script) against a live server over real HTTP, with real Docker sandboxes and
Redis: list, pause/resume/delete by id, pause-idle, admin scopes, errors."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig
from controlplane.ops.durations import format_duration, parse_duration
from controlplane.store import keyspace
from tests.conftest import BOOTSTRAP_KEY
from tests.support.cli import Result, environment, run_in_process, run_process
from tests.support.live_server import Api, LiveServer, start_live_server
from tests.support.types import Client

UNKNOWN_ID = "0123456789abcdef012345"


async def cli(
    *args: str,
    url: str | None,
    key: str | None,
    stdin: bytes = b"",
    tty: bool = False,
    process: bool = False,
) -> Result:
    """Run `controlplane sandboxes ARGS` with ACS_URL / ACS_API_KEY (and nothing else ACS_*), in
    this process (tests/support/cli.py) or, process=True, as the installed console script.

    tty=True gives it a pseudo-terminal as stdin, with `stdin` typed into it.
    """
    env = {}
    if url is not None:
        env["ACS_URL"] = url
    if key is not None:
        env["ACS_API_KEY"] = key
    if process:
        return await run_process("sandboxes", *args, env=environment(**env), stdin=stdin)
    if not tty:
        return await run_in_process("sandboxes", *args, env=env, stdin=stdin.decode())
    terminal, typed = pty.openpty()
    try:
        os.write(terminal, stdin)
        with os.fdopen(typed, encoding="utf-8") as terminal_in:  # closes `typed`
            return await run_in_process("sandboxes", *args, env=env, stdin=terminal_in)
    finally:
        os.close(terminal)


@pytest.fixture
async def server(
    test_prefix: str, make_config: Callable[..., ServiceConfig]
) -> AsyncIterator[LiveServer]:
    # idle_timeout=0: no server-side auto-pause racing the command under test.
    live = await start_live_server(
        make_config(container_prefix=test_prefix, reconcile_interval=1.0, idle_timeout=0)
    )
    yield live
    await live.close()


@pytest.fixture
def admin(server: LiveServer, http: aiohttp.ClientSession) -> Api:
    return Api(http, server.url, BOOTSTRAP_KEY)


async def new_user(
    server: LiveServer, http: aiohttp.ClientSession, raw_redis: aioredis.Redis, name: str
) -> Api:
    created = await ApiKeyService(raw_redis, None).create(name)
    return Api(http, server.url, created.key)


async def wait_status(api: Api, sandbox_id: str, status: str, within: float = 45) -> dict[str, Any]:
    deadline = time.monotonic() + within
    body: Any = None
    while time.monotonic() < deadline:
        code, body = await api.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
        if code == 200 and body["status"] == status:
            return dict(body)
        await asyncio.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} not {status} after {within}s: {body}")


async def start_running(api: Api, count: int = 1) -> list[str]:
    ids = [(await api.ok("POST", "/api/v1/sandboxes"))["id"] for _ in range(count)]
    for sandbox_id in ids:
        await wait_status(api, sandbox_id, "RUNNING")
    return ids


async def make_idle(raw_redis: aioredis.Redis, sandbox_id: str, ago: timedelta) -> None:
    """Move last_activity_at back in the record (an ISO string in the sandbox hash)."""
    old = (datetime.now(UTC) - ago).isoformat()
    assert await raw_redis.exists(keyspace.sandbox(sandbox_id))
    await raw_redis.hset(keyspace.sandbox(sandbox_id), "last_activity_at", old)


def json_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.lines]


# -- durations (no services) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("1d2h3m4s", 93784)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "30x", "m", "30m1h", "0s", "1.5h", "-5m", "1h 30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(timedelta(seconds=12)) == "12s"
    assert format_duration(timedelta(minutes=35, seconds=5)) == "35m5s"
    assert format_duration(timedelta(hours=2, minutes=5, seconds=9)) == "2h5m"
    assert format_duration(timedelta(days=1, hours=2, minutes=3)) == "1d2h"
    assert format_duration(timedelta(hours=2, seconds=3)) == "2h"
    assert format_duration(timedelta(0)) == "0s"


# -- usage and API errors without Docker ----------------------------------------------------------


async def test_usage_errors_exit_2(client: Client) -> None:
    url = str(client.make_url("")).rstrip("/")

    # The installed console script once: the rest run in this process.
    missing = await cli("list", url=url, key=None, process=True)
    assert missing.code == 2
    assert "no API key" in missing.err
    assert "ACS_API_KEY" in missing.err

    bad = await cli("pause-idle", "--idle-for", "30x", url=url, key=BOOTSTRAP_KEY)
    assert bad.code == 2
    assert "argument --idle-for: invalid duration '30x'" in bad.err

    no_tty = await cli("delete", UNKNOWN_ID, url=url, key=BOOTSTRAP_KEY, stdin=b"y\n")
    assert no_tty.code == 2
    assert "--yes" in no_tty.err
    assert no_tty.out == ""

    # On a terminal, delete asks; anything but y/yes deletes nothing (exit 1, no request).
    declined = await cli("delete", UNKNOWN_ID, url=url, key=BOOTSTRAP_KEY, stdin=b"n\n", tty=True)
    assert declined.code == 1
    assert f"Delete 1 sandbox(es) and their workspaces: {UNKNOWN_ID}? [y/N]" in declined.err
    assert "nothing deleted" in declined.err
    # "y" goes on to the API (this app has no Docker services: 503).
    accepted = await cli("delete", UNKNOWN_ID, url=url, key=BOOTSTRAP_KEY, stdin=b"y\n", tty=True)
    assert accepted.code == 1
    assert f"delete {UNKNOWN_ID}: 503" in accepted.err

    both = await cli("list", "--user", "a", "--all-users", url=url, key=BOOTSTRAP_KEY)
    assert both.code == 2
    assert "not allowed with argument" in both.err

    scheme = await cli("list", url="127.0.0.1:3000", key=BOOTSTRAP_KEY)
    assert scheme.code == 2
    assert "http://" in scheme.err


async def test_api_errors_exit_1(client: Client) -> None:
    url = str(client.make_url("")).rstrip("/")

    wrong_key = await cli("list", url=url, key="acs_nope_nope")
    assert wrong_key.code == 1
    (line,) = wrong_key.err.splitlines()
    assert line.startswith("controlplane: 401 Unauthorized: ")

    # This app has no Docker services: the API answers 503 and the command says so.
    down = await cli("list", "--url", url, url=None, key=BOOTSTRAP_KEY)
    assert down.code == 1
    assert "503 Service Unavailable: sandboxes are not enabled" in down.err

    unreachable = await cli("list", url="http://127.0.0.1:9", key=BOOTSTRAP_KEY)
    assert unreachable.code == 1
    assert "cannot reach http://127.0.0.1:9" in unreachable.err


# -- with a live server and real sandboxes --------------------------------------------------------


async def test_list_pause_resume_delete_by_id(
    server: LiveServer, http: aiohttp.ClientSession, raw_redis: aioredis.Redis
) -> None:
    alice = await new_user(server, http, raw_redis, "alice")
    (sandbox_id,) = await start_running(alice)

    listed = await cli("list", url=server.url, key=alice.key)
    assert listed.code == 0, listed.err
    header, row = listed.lines
    assert header.split() == ["ID", "USER", "SPEC", "STATUS", "LAST", "ACTIVITY", "REASON"]
    assert row.split()[:4] == [sandbox_id, "alice", "default", "RUNNING"]
    assert row.rstrip().endswith(" ago)")

    (item,) = json_lines(await cli("list", "--json", url=server.url, key=alice.key))
    assert (item["id"], item["status"], item["created_by_user_id"]) == (
        sandbox_id,
        "RUNNING",
        "alice",
    )
    none = await cli("list", "--status", "paused", url=server.url, key=alice.key)
    assert (none.code, none.out, none.err.strip()) == (0, "", "no sandboxes")
    assert (await cli("list", "--spec", "python-dev", url=server.url, key=alice.key)).out == ""

    paused = await cli("pause", sandbox_id, url=server.url, key=alice.key)
    assert (paused.code, paused.lines) == (0, [f"paused {sandbox_id}"]), paused.err
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}"))["status"] == "PAUSED"
    (item,) = json_lines(
        await cli("list", "--json", "--status", "PAUSED", url=server.url, key=alice.key)
    )
    assert item["id"] == sandbox_id

    # Options after the subcommand work too; one failing id does not stop the others.
    resumed = await cli(
        "resume", UNKNOWN_ID, sandbox_id, "--url", server.url, url=None, key=alice.key
    )
    assert resumed.code == 1
    assert resumed.lines == [f"resumed {sandbox_id}"]
    (line,) = resumed.err.splitlines()
    assert line.startswith(f"controlplane: resume {UNKNOWN_ID}: 404 Not Found: "), line
    await wait_status(alice, sandbox_id, "RUNNING")

    unknown = await cli("pause", UNKNOWN_ID, url=server.url, key=alice.key)
    assert unknown.code == 1
    assert f"pause {UNKNOWN_ID}: 404" in unknown.err
    bad_id = await cli("pause", "../settings", url=server.url, key=alice.key)
    assert bad_id.code == 1
    assert "is not a sandbox id" in bad_id.err

    # Someone else's sandbox is a 404 for bob, exactly like an unknown one.
    bob = await new_user(server, http, raw_redis, "bob")
    foreign = await cli("delete", "--yes", sandbox_id, url=server.url, key=bob.key)
    assert foreign.code == 1
    assert f"delete {sandbox_id}: 404" in foreign.err
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}"))["status"] == "RUNNING"

    deleted = await cli("delete", "-y", sandbox_id, url=server.url, key=alice.key)
    assert (deleted.code, deleted.lines) == (0, [f"deleted {sandbox_id}"]), deleted.err
    assert (await alice.call("GET", f"/api/v1/sandboxes/{sandbox_id}"))[0] == 404
    assert (await cli("list", url=server.url, key=alice.key)).out == ""


async def test_pause_idle_pauses_only_idle_running_sandboxes(
    server: LiveServer, http: aiohttp.ClientSession, raw_redis: aioredis.Redis
) -> None:
    alice = await new_user(server, http, raw_redis, "alice")
    idle_id, fresh_id = await start_running(alice, 2)
    await make_idle(raw_redis, idle_id, timedelta(hours=2))

    listed = json_lines(
        await cli("list", "--idle-for", "30m", "--json", url=server.url, key=alice.key)
    )
    assert [i["id"] for i in listed] == [idle_id]
    assert (
        json_lines(await cli("list", "--idle-for", "3h", "--json", url=server.url, key=alice.key))
        == []
    )

    dry = await cli("pause-idle", "--idle-for", "30m", "--dry-run", url=server.url, key=alice.key)
    assert dry.code == 0, dry.err
    assert dry.lines == [
        f"would pause {idle_id} (user alice, idle 2h)",
        "paused 0 of 1 idle sandboxes (dry run)",
    ]
    for sandbox_id in (idle_id, fresh_id):
        assert (await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}"))["status"] == "RUNNING"

    real = await cli("pause-idle", "--idle-for", "1h30m", url=server.url, key=alice.key)
    assert real.code == 0, real.err
    assert real.lines == [f"paused {idle_id} (user alice, idle 2h)", "paused 1 of 1 idle sandboxes"]
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{idle_id}"))["status"] == "PAUSED"
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{fresh_id}"))["status"] == "RUNNING"

    # Paused ones are not RUNNING any more: a second run finds nothing.
    again = await cli("pause-idle", "--idle-for", "30m", url=server.url, key=alice.key)
    assert (again.code, again.lines) == (0, ["paused 0 of 0 idle sandboxes"])


async def test_admin_scopes_and_forbidden_for_users(
    server: LiveServer, admin: Api, http: aiohttp.ClientSession, raw_redis: aioredis.Redis
) -> None:
    alice = await new_user(server, http, raw_redis, "alice")
    bob = await new_user(server, http, raw_redis, "bob")
    (alice_id,) = await start_running(alice)
    (bob_id,) = await start_running(bob)
    for sandbox_id in (alice_id, bob_id):
        await make_idle(raw_redis, sandbox_id, timedelta(days=1, hours=1))

    only_alice = json_lines(
        await cli("list", "--user", "alice", "--json", url=server.url, key=admin.key)
    )
    assert [(i["id"], i["created_by_user_id"]) for i in only_alice] == [(alice_id, "alice")]
    everyone = json_lines(await cli("list", "--all-users", "--json", url=server.url, key=admin.key))
    assert {i["id"] for i in everyone} == {alice_id, bob_id}
    assert (await cli("list", url=server.url, key=admin.key)).out == "", "admin's own: none"

    for args in (["list", "--all-users"], ["pause-idle", "--idle-for", "1m", "--user", "bob"]):
        denied = await cli(*args, url=server.url, key=alice.key)
        assert denied.code == 1, args
        (line,) = denied.err.splitlines()
        assert line.startswith("controlplane: 403 Forbidden: "), line
        assert "admin" in line
        assert denied.out == ""

    dry = await cli(
        "pause-idle", "--idle-for", "1d", "--all-users", "--dry-run", url=server.url, key=admin.key
    )
    assert dry.code == 0, dry.err
    assert sorted(dry.lines[:-1]) == sorted(
        [
            f"would pause {alice_id} (user alice, idle 1d1h)",
            f"would pause {bob_id} (user bob, idle 1d1h)",
        ]
    )
    assert dry.lines[-1] == "paused 0 of 2 idle sandboxes (dry run)"

    bob_only = await cli(
        "pause-idle", "--idle-for", "30m", "--user", "bob", url=server.url, key=admin.key
    )
    assert (bob_only.code, bob_only.lines) == (
        0,
        [f"paused {bob_id} (user bob, idle 1d1h)", "paused 1 of 1 idle sandboxes"],
    ), bob_only.err
    assert (await bob.ok("GET", f"/api/v1/sandboxes/{bob_id}"))["status"] == "PAUSED"
    assert (await alice.ok("GET", f"/api/v1/sandboxes/{alice_id}"))["status"] == "RUNNING"

    # An admin acts on other users' sandboxes by id.
    resumed = await cli("resume", bob_id, url=server.url, key=admin.key)
    assert (resumed.code, resumed.lines) == (0, [f"resumed {bob_id}"]), resumed.err
    await wait_status(bob, bob_id, "RUNNING")
