"""Restarts keep everything; the secret key file, ACS_SECRET_KEY, and a wrong key."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from cryptography.fernet import Fernet

from controlplane.app import create_app
from controlplane.config import ConfigError, ServiceConfig
from controlplane.settings.models import ProviderType
from controlplane.store import keyspace
from tests.support.log_capture import capture_logs
from tests.support.records import stored_user_record
from tests.support.types import Client

MakeClient = Callable[..., Any]

SETTINGS = {
    "language": "it",
    "llm_model": "openai/gpt-5",
    "max_iterations": 77,
    "enable_sound_notifications": True,
    "llm_api_key": "persist-llm-key",
    "search_api_key": "persist-search-key",
    "mcp_config": {"shttp_servers": [{"url": "https://mcp.example.com", "api_key": "persist-mcp"}]},
}


async def _write_everything(client: Client, headers: dict[str, str]) -> None:
    assert (await client.post("/api/settings", headers=headers, json=SETTINGS)).status == 200
    body: dict[str, Any] = {
        "provider_tokens": {"gitlab": {"token": "persist-gl", "host": "gl.example.com"}}
    }
    assert (await client.post("/api/add-git-providers", headers=headers, json=body)).status == 200
    body = {"name": "PERSIST", "value": "persist-custom", "description": "d"}
    assert (await client.post("/api/secrets", headers=headers, json=body)).status == 201


async def test_everything_survives_an_app_restart(
    make_client: MakeClient, user_headers: Callable[..., Any], tmp_path: Path
) -> None:
    headers = await user_headers("alice")
    first: Client = await make_client()
    await _write_everything(first, headers)
    before = await (await first.get("/api/settings", headers=headers)).json()
    secrets_before = await (await first.get("/api/secrets", headers=headers)).json()
    key_file = tmp_path / "data" / "secret.key"
    key_bytes = key_file.read_bytes()
    await first.close()

    second: Client = await make_client()
    assert await (await second.get("/api/settings", headers=headers)).json() == before
    assert await (await second.get("/api/secrets", headers=headers)).json() == secrets_before
    assert before["language"] == "it"
    assert before["llm_api_key_set"] is True
    assert before["provider_tokens_set"] == {"gitlab": "gl.example.com"}
    record = await stored_user_record(second, "alice")
    assert record.llm_api_key == "persist-llm-key"
    assert record.search_api_key == "persist-search-key"
    assert record.provider_tokens[ProviderType.GITLAB].token == "persist-gl"
    assert record.custom_secrets["PERSIST"].value == "persist-custom"
    assert record.settings.mcp_config is not None
    assert record.settings.mcp_config.shttp_servers[0].api_key == "persist-mcp"
    assert key_file.read_bytes() == key_bytes  # reused, not regenerated


async def test_secret_key_file_is_created_0600_and_reused(
    make_client: MakeClient, tmp_path: Path
) -> None:
    key_file = tmp_path / "data" / "secret.key"
    assert not key_file.exists()
    client: Client = await make_client()
    assert key_file.is_file()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_bytes().strip()
    Fernet(key)  # a usable Fernet key
    await client.close()

    again: Client = await make_client()
    assert key_file.read_bytes().strip() == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    await again.close()


async def test_explicit_secret_key_is_used_and_no_key_file_is_written(
    make_client: MakeClient,
    user_headers: Callable[..., Any],
    raw_redis: aioredis.Redis,
    tmp_path: Path,
) -> None:
    secret_key = Fernet.generate_key().decode()
    headers = await user_headers("alice")
    client: Client = await make_client(secret_key=secret_key)
    await _write_everything(client, headers)
    await client.close()
    assert not (tmp_path / "data" / "secret.key").exists()

    # The stored record opens with exactly that key.
    raw = await raw_redis.get(keyspace.user_settings("alice"))
    assert raw is not None
    stored = json.loads(Fernet(secret_key.encode()).decrypt(raw))
    assert stored["llm_api_key"] == "persist-llm-key"

    again: Client = await make_client(secret_key=secret_key)
    settings = await (await again.get("/api/settings", headers=headers)).json()
    assert settings["language"] == "it"
    assert settings["llm_api_key_set"] is True


async def test_a_wrong_key_fails_loudly_without_leaking_or_overwriting(
    make_client: MakeClient,
    make_config: Callable[..., ServiceConfig],
    user_headers: Callable[..., Any],
    raw_redis: aioredis.Redis,
) -> None:
    right = Fernet.generate_key().decode()
    wrong = Fernet.generate_key().decode()
    headers = await user_headers("alice")
    first: Client = await make_client(secret_key=right)
    await _write_everything(first, headers)
    await first.close()

    # A replica with the wrong key does not start (tests/security/test_replica_keys.py)...
    runner = web.AppRunner(create_app(make_config(secret_key=wrong)))
    with pytest.raises(ConfigError, match="ACS_SECRET_KEY"):
        await runner.setup()
    await runner.cleanup()
    # ...and if it ran anyway (the check deleted, or data from before the check), reads fail
    # loudly and nothing is overwritten.
    await raw_redis.delete(keyspace.SECRET_KEY_CHECK)
    with capture_logs() as logs:
        client: Client = await make_client(secret_key=wrong)
        for method, path, body in [
            ("GET", "/api/settings", None),
            ("GET", "/api/secrets", None),
            ("POST", "/api/settings", {"language": "xx"}),
            ("POST", "/api/secrets", {"name": "OTHER", "value": "v"}),
        ]:
            response = await client.request(method, path, headers=headers, json=body)
            assert response.status == 500, (method, path)
            text = await response.text()
            reply = json.loads(text)
            assert set(reply) == {"detail", "request_id"}
            assert reply["request_id"] == response.headers["X-Request-ID"]
            assert "persist-" not in text
        # Users whose data was written with this key are not affected.
        other = await user_headers("bob")
        assert (await client.get("/api/settings", headers=other)).status == 200
        await client.close()

    errors = logs.events("unhandled_error")
    assert len(errors) == 4
    assert all("cannot be decrypted" in e["exception"][0]["exc_value"] for e in errors)
    assert "persist-" not in logs.text

    # Nothing was overwritten: the right key still reads the original data.
    await raw_redis.delete(keyspace.SECRET_KEY_CHECK)
    back: Client = await make_client(secret_key=right)
    settings = await (await back.get("/api/settings", headers=headers)).json()
    assert settings["language"] == "it"
    assert (await stored_user_record(back, "alice")).custom_secrets.keys() == {"PERSIST"}


async def _start(config: ServiceConfig) -> None:
    """Run the app's start-up (cleanup contexts) as `serve` does; clean up whatever happens."""
    runner = web.AppRunner(create_app(config, with_sandboxes=False))
    try:
        await runner.setup()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("bad", ["not-a-fernet-key", "x" * 44])
async def test_an_unusable_secret_key_stops_start_up(
    make_config: Callable[..., ServiceConfig], bad: str
) -> None:
    with pytest.raises(ConfigError, match="ACS_SECRET_KEY"):
        await _start(make_config(secret_key=bad))


async def test_a_corrupt_key_file_stops_start_up(
    make_config: Callable[..., ServiceConfig], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "secret.key").write_bytes(b"garbage\n")
    with pytest.raises(ConfigError, match=r"ACS_SECRET_KEY: key file .*secret\.key"):
        await _start(make_config())
