"""Health, auth, configuration, error shapes and the CLI."""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent import __main__ as cli
from agent.app import create_app
from agent.auth import key_is_valid
from agent.config import AgentConfig, is_secret_env_name, load_api_keys
from tests.support.types import Client, ClientFactory

EXEC = "/api/bash/execute_bash_command"


@pytest.mark.parametrize("path", ["/health", "/alive"])
async def test_health_and_alive_without_auth(agent_client: Client, path: str) -> None:
    resp = await agent_client.get(path)
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}


async def test_ready_and_server_info_without_auth(
    agent_client: Client, auth: dict[str, str]
) -> None:
    assert await (await agent_client.get("/ready")).json() == {"status": "ready"}
    await agent_client.get("/api/info", headers=auth)
    resp = await agent_client.get("/server_info")
    assert resp.status == 200
    info = await resp.json()
    assert info["usable_tools"] == ["terminal", "file_editor", "finish", "think"]
    assert info["protocol"] == "openhands-agent-server 1.58"
    assert info["uptime"] >= 0
    assert 0 <= info["idle_time"] <= 1


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Session-API-Key": ""},
        {"X-Session-API-Key": "wrong"},
        {"X-Session-API-Key": "test-key-0x"},
        {"Authorization": "test-key-0"},
    ],
    ids=["missing", "empty", "wrong", "key-prefix", "other-header"],
)
async def test_api_rejects_bad_key(agent_client: Client, headers: dict[str, str]) -> None:
    resp = await agent_client.post(EXEC, json={"command": "echo hi"}, headers=headers)
    assert resp.status == 401
    assert await resp.json() == {"detail": "Unauthorized"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/file/download/x"),
        ("POST", "/api/file/upload/x"),
        ("GET", "/api/file/list/"),
        ("GET", "/api/info"),
        ("GET", "/api/does-not-exist"),
        ("GET", "/api"),
    ],
)
async def test_every_api_route_needs_the_key(agent_client: Client, method: str, path: str) -> None:
    resp = await agent_client.request(method, path)
    assert resp.status == 401
    assert await resp.json() == {"detail": "Unauthorized"}


async def test_any_configured_key_is_accepted(
    agent_client: Client, api_keys: tuple[str, ...]
) -> None:
    for key in api_keys:
        resp = await agent_client.post(
            EXEC, json={"command": "echo hi"}, headers={"X-Session-API-Key": key}
        )
        assert resp.status == 200
        assert (await resp.json())["stdout"] == "hi\n"


async def test_no_keys_means_no_auth(make_agent_client: ClientFactory) -> None:
    client = await make_agent_client(api_keys=())
    resp = await client.post(EXEC, json={"command": "echo open"})
    assert resp.status == 200
    assert (await resp.json())["stdout"] == "open\n"


async def test_unknown_api_route_is_json_404(agent_client: Client, auth: dict[str, str]) -> None:
    resp = await agent_client.get("/api/nope", headers=auth)
    assert resp.status == 404
    assert resp.content_type == "application/json"
    assert isinstance((await resp.json())["detail"], str)


async def test_wrong_method_is_json_405(agent_client: Client, auth: dict[str, str]) -> None:
    resp = await agent_client.get(EXEC, headers=auth)
    assert resp.status == 405
    assert isinstance((await resp.json())["detail"], str)


async def test_info_reports_workspace(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    resp = await agent_client.get("/api/info", headers=auth)
    assert resp.status == 200
    assert (await resp.json())["workspace"] == str(workspace)


async def test_unhandled_error_is_json_500_without_traceback(
    aiohttp_client: Any, workspace: Path, api_keys: tuple[str, ...], auth: dict[str, str]
) -> None:
    app = create_app(AgentConfig(workspace=workspace, api_keys=api_keys))

    async def boom(_: web.Request) -> web.Response:
        raise RuntimeError("secret internals")

    app.router.add_get("/api/boom", boom)
    client: Client = await aiohttp_client(app)
    resp = await client.get("/api/boom", headers=auth)
    assert resp.status == 500
    text = await resp.text()
    assert "secret internals" not in text
    assert "Traceback" not in text
    assert await resp.json() == {"detail": "Internal server error"}


def test_load_api_keys_numbered_sorted_and_fallback() -> None:
    env = {
        "OH_SESSION_API_KEYS_10": "ten",
        "OH_SESSION_API_KEYS_0": "zero",
        "OH_SESSION_API_KEYS_2": "two",
        "OH_SESSION_API_KEYS_3": "",
        "OH_SESSION_API_KEYS_X": "ignored",
        "SESSION_API_KEY": "fallback",
    }
    assert load_api_keys(env) == ("zero", "two", "ten")
    assert load_api_keys({"SESSION_API_KEY": "fallback"}) == ("fallback",)
    assert load_api_keys({"SESSION_API_KEY": ""}) == ()
    assert load_api_keys({}) == ()


def test_key_is_valid() -> None:
    assert key_is_valid("a", ["b", "a"])
    assert not key_is_valid("a", [])
    assert not key_is_valid(None, ["a"])
    assert not key_is_valid("", [""])
    assert not key_is_valid("ab", ["a"])
    assert key_is_valid("ключ", ["ключ"])  # non-ASCII keys do not crash


def test_secret_env_names() -> None:
    assert is_secret_env_name("OH_SESSION_API_KEYS_0")
    assert is_secret_env_name("SESSION_API_KEY")
    assert not is_secret_env_name("PATH")


def test_config_from_env(tmp_path: Path) -> None:
    env = {"ACS_WORKSPACE": str(tmp_path), "OH_SESSION_API_KEYS_0": "k"}
    config = AgentConfig.from_env(env, port=9000)
    assert config.workspace == tmp_path.resolve()
    assert config.api_keys == ("k",)
    assert config.port == 9000
    assert config.auth_enabled
    assert AgentConfig.from_env(env, workspace=tmp_path / "other").workspace == tmp_path / "other"


def _clear_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if is_secret_env_name(name):
            monkeypatch.delenv(name)


def test_cli_refuses_to_start_without_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _clear_key_env(monkeypatch)
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(web, "run_app", lambda app, **kw: started.append(kw))
    local = ["--host", "127.0.0.1", "--port", "0"]
    assert cli.main(["--workspace", str(tmp_path), *local]) == 2
    assert "OH_SESSION_API_KEYS_0" in capsys.readouterr().err
    assert started == []
    # --insecure-no-auth starts anyway
    assert cli.main(["--workspace", str(tmp_path), "--insecure-no-auth", *local]) == 0
    assert len(started) == 1
    started[0]["sock"].close()


def test_cli_starts_with_key_and_creates_workspace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _clear_key_env(monkeypatch)
    monkeypatch.setenv("SESSION_API_KEY", "k")
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(web, "run_app", lambda app, **kw: calls.append(kw))
    ws = tmp_path / "new" / "ws"
    assert cli.main(["--workspace", str(ws), "--port", "0", "--host", "127.0.0.1"]) == 0
    assert ws.is_dir()
    # The socket listens before the application starts (agent/announce.py: a probe made when
    # the control plane hears the announcement waits in the backlog).
    sock = calls[0]["sock"]
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1"
        assert port > 0
        with socket.create_connection((host, port), timeout=5):
            pass
    finally:
        sock.close()


def test_cli_serves_with_the_collector_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `python -m agent` boots with the cyclic collector off (agent/__main__.py); it must be on,
    # with the boot's objects frozen, by the time the server serves.
    _clear_key_env(monkeypatch)
    monkeypatch.setenv("SESSION_API_KEY", "k")
    seen: list[tuple[bool, int]] = []

    def run_app(app: web.Application, **kw: Any) -> None:
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        kw["sock"].close()

    monkeypatch.setattr(web, "run_app", run_app)
    gc.disable()
    try:
        assert cli.main(["--workspace", str(tmp_path), "--port", "0", "--host", "127.0.0.1"]) == 0
    finally:
        gc.unfreeze()
        gc.enable()
    assert len(seen) == 1
    enabled, frozen = seen[0]
    assert enabled
    assert frozen > 0


def test_cli_defaults() -> None:
    args = cli.parse_args([])
    assert (args.host, args.port, args.insecure_no_auth) == ("0.0.0.0", 8000, False)  # noqa: S104 - the default asserted
