"""CORS: origins from OH_ALLOW_CORS_ORIGINS_<n> (set by the control plane) plus localhost."""

from __future__ import annotations

from agent.config import load_cors_origins
from tests.support.types import ClientFactory

APP = "https://app.example.com"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "x-session-api-key, content-type",
}


def test_origins_are_read_as_the_official_server_reads_them() -> None:
    env = {
        "OH_ALLOW_CORS_ORIGINS_1": "https://b.example.com",
        "OH_ALLOW_CORS_ORIGINS_0": APP,
        "OH_ALLOW_CORS_ORIGINS_9": "",
        "OTHER": "x",
    }
    assert load_cors_origins(env) == (APP, "https://b.example.com")
    assert load_cors_origins({"OH_ALLOW_CORS_ORIGINS": '["https://c.example.com"]'}) == (
        "https://c.example.com",
    )
    assert load_cors_origins({"OH_ALLOW_CORS_ORIGINS": "not json"}) == ()


async def test_preflight_and_responses_for_allowed_origins(
    make_agent_client: ClientFactory, auth: dict[str, str]
) -> None:
    client = await make_agent_client(cors_origins=(APP + "/",))
    for origin in (APP, "http://localhost:3001", "http://127.0.0.1:8080"):
        resp = await client.options(
            "/api/bash/execute_bash_command", headers={"Origin": origin, **PREFLIGHT}
        )
        assert resp.status == 200, origin
        assert resp.headers["Access-Control-Allow-Origin"] == origin
        assert resp.headers["Access-Control-Allow-Credentials"] == "true"
        assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        assert (
            resp.headers["Access-Control-Allow-Headers"]
            == PREFLIGHT["Access-Control-Request-Headers"]
        )
    # A real request gets the header, also when it fails (so the page can read the 401).
    resp = await client.post(
        "/api/bash/execute_bash_command",
        json={"command": "echo hi"},
        headers={"Origin": APP, **auth},
    )
    assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == APP
    resp = await client.get("/api/info", headers={"Origin": APP})
    assert resp.status == 401
    assert resp.headers["Access-Control-Allow-Origin"] == APP


async def test_other_origins_get_nothing(
    make_agent_client: ClientFactory, auth: dict[str, str]
) -> None:
    client = await make_agent_client(cors_origins=(APP,))
    evil = "https://evil.example.net"
    resp = await client.options("/api/info", headers={"Origin": evil, **PREFLIGHT})
    assert resp.status == 400
    assert "Access-Control-Allow-Origin" not in resp.headers
    resp = await client.get("/api/info", headers={"Origin": evil, **auth})
    assert resp.status == 200
    assert "Access-Control-Allow-Origin" not in resp.headers
    resp = await client.get("/api/info", headers={"Origin": "null", **auth})
    assert "Access-Control-Allow-Origin" not in resp.headers
