"""The `controlplane` command: keys create/list/revoke, bad configuration, embedded Redis.

The commands run in the test's process (tests/support/cli.py); the embedded Redis and an
unreachable one run the installed console script, as an operator does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.support.cli import environment, run_in_process, run_process
from tests.support.types import Client


@pytest.fixture
def cli_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    return {"ACS_REDIS_URL": redis_url, "ACS_DATA_DIR": str(tmp_path / "data")}


def _last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


async def test_keys_create_prints_a_working_key_last(
    cli_env: dict[str, str], client: Client
) -> None:
    result = await run_in_process("keys", "create", "--user", "bob", env=cli_env)
    assert result.code == 0, result.err
    key = _last_line(result.out)
    assert key.startswith("acs_")
    assert "bob" in result.err  # the human-readable note goes to stderr

    response = await client.get("/api/settings", headers={"X-Session-API-Key": key})
    assert response.status == 200
    await client.post("/api/settings", headers={"X-Session-API-Key": key}, json={"agent": "b"})
    response = await client.get("/api/settings", headers={"Authorization": f"Bearer {key}"})
    assert (await response.json())["agent"] == "b"


async def test_keys_create_admin(cli_env: dict[str, str], raw_redis: aioredis.Redis) -> None:
    result = await run_in_process("keys", "create", "--user", "bob", "--admin", env=cli_env)
    assert result.code == 0, result.err
    key = _last_line(result.out)
    key_id = key.split("_")[1]
    row = await raw_redis.hgetall(f"acs:apikey:{key_id}")
    assert row[b"user_id"] == b"bob"
    assert row[b"is_admin"] == b"1"
    assert "admin" in result.err


async def test_keys_create_rejects_a_bad_user_name(cli_env: dict[str, str]) -> None:
    result = await run_in_process("keys", "create", "--user", "not a user", env=cli_env)
    assert result.code == 1
    assert result.out == ""
    assert "user names" in result.err


async def test_keys_list_shows_ids_and_users_never_keys(cli_env: dict[str, str]) -> None:
    created = {}
    for user, extra in (("bob", ()), ("carol", ("--admin",))):
        result = await run_in_process("keys", "create", "--user", user, *extra, env=cli_env)
        assert result.code == 0, result.err
        created[user] = _last_line(result.out)

    result = await run_in_process("keys", "list", env=cli_env)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split("\t") == ["KEY_ID", "USER", "ADMIN", "CREATED_AT"]
    rows = [line.split("\t") for line in lines[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (created["bob"].split("_")[1], "bob", "false"),
        (created["carol"].split("_")[1], "carol", "true"),
    ]
    for key in created.values():
        assert key not in result.out + result.err
        assert key.split("_", 2)[2] not in result.out + result.err  # the secret may hold "_"


async def test_keys_revoke_then_the_key_is_401(cli_env: dict[str, str], client: Client) -> None:
    result = await run_in_process("keys", "create", "--user", "bob", env=cli_env)
    key = _last_line(result.out)
    key_id = key.split("_")[1]
    headers = {"X-Session-API-Key": key}
    assert (await client.get("/api/settings", headers=headers)).status == 200

    result = await run_in_process("keys", "revoke", key_id, env=cli_env)
    assert result.code == 0, result.err
    assert key_id in result.out
    assert (await client.get("/api/settings", headers=headers)).status == 401
    listed = await run_in_process("keys", "list", env=cli_env)
    assert key_id not in listed.out


async def test_revoke_of_an_unknown_id_fails_clearly(cli_env: dict[str, str]) -> None:
    result = await run_in_process("keys", "revoke", "0123456789ab", env=cli_env)
    assert result.code != 0
    assert result.out == ""
    assert result.err.strip() == "controlplane: no API key with id 0123456789ab"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ACS_MAX_BODY_BYTES", "abc"),
        ("ACS_LOG_FORMAT", "xml"),
        ("ACS_LOG_LEVEL", "loud"),
        ("ACS_BOOTSTRAP_API_KEY", "short"),
        ("ACS_HOST_FIREWALL", "maybe"),
        ("ACS_SANDBOX_HOST_PORTS", "11434,70000"),
        ("ACS_SANDBOX_SUBNET_POOL", "10.0.0.0/30"),
        ("ACS_SANDBOX_SUBNET_SIZE", "12"),
        ("ACS_WEBHOOK_PORT", "-1"),
        ("ACS_UNAUTHENTICATED_RATE", "-5"),
    ],
)
async def test_bad_configuration_exits_2_naming_the_variable(
    cli_env: dict[str, str], variable: str, value: str
) -> None:
    result = await run_in_process("keys", "list", env={**cli_env, variable: value})
    assert result.code == 2
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert variable in lines[0]
    assert "Traceback" not in result.err


async def test_serve_on_every_address_needs_its_own_webhook_port(cli_env: dict[str, str]) -> None:
    """`--host 0.0.0.0` also covers the sandbox gateways: the webhook listener cannot share the
    API's port there, and the API must not be where sandboxes post."""
    result = await run_in_process("serve", "--host", "0.0.0.0", "--port", "1", env=cli_env)  # noqa: S104 - the refusal is the test
    assert result.code == 2, result.err
    (line,) = result.err.strip().splitlines()[-1:]
    assert line.startswith("controlplane: configuration error: ACS_WEBHOOK_PORT:"), line
    assert "Traceback" not in result.err


async def test_unreachable_redis_url_exits_2(tmp_path: Path) -> None:
    """A subprocess, as an operator runs it: the installed console script's exit path."""
    env = environment(ACS_REDIS_URL=f"unix://{tmp_path}/none.sock", ACS_DATA_DIR=tmp_path / "data")
    result = await run_process("keys", "list", env=env)
    assert result.code == 2
    assert "ACS_REDIS_URL" in result.err.strip().splitlines()[-1]
    assert "Traceback" not in result.err


async def _shutdown(sock: Path) -> None:
    # No retries: SHUTDOWN closes the connection, which is the expected answer.
    client = aioredis.Redis(unix_socket_path=str(sock), retry=Retry(NoBackoff(), 0))
    try:
        await client.shutdown()
    finally:
        await client.aclose()


async def test_embedded_redis_by_default(tmp_path: Path, make_client: Callable[..., Any]) -> None:
    data_dir = tmp_path / "data"
    redis_dir = data_dir / "redis"
    sock = redis_dir / "redis.sock"
    env = environment(ACS_DATA_DIR=data_dir)
    try:
        result = await run_process("keys", "create", "--user", "bob", env=env)
        assert result.code == 0, result.err
        key = _last_line(result.out)
        assert sock.is_socket()
        appendonly = [p.name for p in redis_dir.iterdir() if p.name.startswith("appendonly")]
        assert appendonly, list(redis_dir.iterdir())
        probe = aioredis.Redis(unix_socket_path=str(sock))
        try:
            assert await probe.config_get("appendonly") == {"appendonly": "yes"}
        finally:
            await probe.aclose()

        # The next invocation reuses the running server and sees the key.
        listed = await run_process("keys", "list", env=env)
        assert listed.code == 0, listed.err
        assert key.split("_")[1] in listed.out

        # The API on the same embedded Redis accepts the key.
        client: Client = await make_client(redis_url=f"unix://{sock}", data_dir=data_dir)
        response = await client.get("/api/settings", headers={"X-Session-API-Key": key})
        assert response.status == 200
        await client.close()
    finally:
        if sock.exists():
            await _shutdown(sock)
