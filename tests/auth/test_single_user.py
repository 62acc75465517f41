"""ACS_AUTH_MODE=none: loopback requests without a key act as the bootstrap user; nothing else
does (other addresses, proxies, rebound DNS names, other sites), and it serves loopback only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.app import create_app
from controlplane.config import ServiceConfig
from tests.support.cli import run_in_process
from tests.support.types import Client, ClientFactory, UserHeaders


@pytest.fixture
async def local(make_client: ClientFactory) -> Client:
    return await make_client(auth_mode="none")


async def test_loopback_requests_are_the_bootstrap_user(local: Client) -> None:
    me = await local.get("/api/v1/users/me")
    assert me.status == 200
    body = await me.json()
    assert (body["id"], body["is_admin"], body["auth_method"]) == ("admin", True, "single_user")
    # Writes from a program (no Origin) and from our own page (own Origin) work.
    assert (await local.post("/api/settings", json={"language": "en"})).status == 200
    own = {"Origin": str(local.make_url("")).rstrip("/")}
    assert (await local.post("/api/settings", json={"language": "fr"}, headers=own)).status == 200
    assert (await (await local.get("/api/settings")).json())["language"] == "fr"


async def test_keys_still_decide_when_sent(local: Client, user_headers: UserHeaders) -> None:
    bob = await user_headers("bob")
    assert (await (await local.get("/api/v1/users/me", headers=bob)).json())["id"] == "bob"
    response = await local.get("/api/v1/users/me", headers={"X-Session-API-Key": "wrong"})
    assert response.status == 401


async def test_other_sites_cannot_use_the_local_user(local: Client) -> None:
    # A page on another site posting to 127.0.0.1 (CSRF): its Origin gives it away.
    response = await local.post(
        "/api/settings",
        json={"llm_base_url": "http://evil.example/v1"},
        headers={"Origin": "http://evil.example"},
    )
    assert response.status == 403
    # DNS rebinding: the browser addresses us by the attacker's name.
    response = await local.get("/api/v1/users/me", headers={"Host": "evil.example:3000"})
    assert response.status == 401
    # Behind a reverse proxy, loopback is not this machine's user.
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP", "Via"):
        response = await local.get("/api/v1/users/me", headers={header: "203.0.113.9"})
        assert response.status == 401, header
    for host in ("localhost:3000", "[::1]:3000", "127.0.0.1"):
        response = await local.get("/api/v1/users/me", headers={"Host": host})
        assert response.status == 200, host


async def test_requests_from_other_addresses_need_a_key(
    make_config: Callable[..., ServiceConfig], user_headers: UserHeaders, docker_gateway: str
) -> None:
    """Bound to the Docker bridge's address: a request from a container or another machine."""
    app = create_app(make_config(auth_mode="none"), with_sandboxes=False)
    server = TestServer(app, host=docker_gateway)
    async with TestClient(server) as remote:
        response = await remote.get("/api/v1/users/me", headers={"Host": "127.0.0.1"})
        assert response.status == 401
        ok = await remote.get("/api/v1/users/me", headers=await user_headers("alice"))
        assert (await ok.json())["id"] == "alice"


async def test_default_mode_has_no_local_user(client: Client) -> None:
    assert (await client.get("/api/v1/users/me")).status == 401


async def test_serve_refuses_to_start_off_loopback(tmp_path: Path) -> None:
    env = {"ACS_AUTH_MODE": "none", "ACS_DATA_DIR": str(tmp_path)}
    for host in ("0.0.0.0", "::", "192.0.2.1"):  # noqa: S104 (what is refused)
        result = await run_in_process("serve", "--host", host, "--port", "1", env=env)
        assert result.code == 2, result.err
        assert "ACS_AUTH_MODE" in result.err
        assert "loopback" in result.err
    result = await run_in_process(
        "serve", "--host", "0.0.0.0", "--port", "1",  # noqa: S104 - the refusal is the test
        env={**env, "ACS_AUTH_MODE": "bogus"},
    )  # fmt: skip
    assert result.code == 2
    assert "ACS_AUTH_MODE" in result.err
