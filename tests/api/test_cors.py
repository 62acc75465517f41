"""CORS: only the origins in ACS_CORS_ORIGINS, with credentials; nobody else by default."""

from __future__ import annotations

import pytest

from controlplane.config import ConfigError, load_config
from tests.support.types import Client, ClientFactory, UserHeaders

APP = "http://localhost:3001"


def preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "content-type,x-session-api-key",
    }


async def test_no_origin_is_allowed_by_default(client: Client, user_headers: UserHeaders) -> None:
    response = await client.options("/api/settings", headers=preflight(APP))
    assert response.status == 403
    assert "not allowed" in (await response.json())["detail"]
    response = await client.get("/api/settings", headers={**await user_headers(), "Origin": APP})
    assert response.status == 200
    assert "Access-Control-Allow-Origin" not in response.headers


async def test_configured_origins_get_cors_with_credentials(
    make_client: ClientFactory, user_headers: UserHeaders
) -> None:
    client = await make_client(cors_origins=f"{APP}, https://ui.example.com/")
    response = await client.options("/api/v1/app-conversations", headers=preflight(APP))
    assert response.status == 204
    assert response.headers["Access-Control-Allow-Origin"] == APP
    assert response.headers["Access-Control-Allow-Credentials"] == "true"
    assert "X-Session-API-Key" in response.headers["Access-Control-Allow-Headers"]
    assert "PATCH" in response.headers["Access-Control-Allow-Methods"]
    assert response.headers["Vary"] == "Origin"

    headers = {**await user_headers(), "Origin": "https://ui.example.com"}
    response = await client.get("/api/settings", headers=headers)
    assert response.status == 200
    assert response.headers["Access-Control-Allow-Origin"] == "https://ui.example.com"
    assert "X-Request-ID" in response.headers["Access-Control-Expose-Headers"]
    # Errors carry the headers too, so the page can read them.
    response = await client.get("/api/settings", headers={"Origin": APP})
    assert response.status == 401
    assert response.headers["Access-Control-Allow-Origin"] == APP

    for other in ("http://localhost:3002", "https://ui.example.com.evil.example", "null"):
        response = await client.options("/api/settings", headers=preflight(other))
        assert response.status == 403, other
        response = await client.get("/api/settings", headers={**headers, "Origin": other})
        assert "Access-Control-Allow-Origin" not in response.headers, other
        assert response.headers["Vary"] == "Origin"


async def test_allowed_origins_may_use_the_session_cookie(
    make_client: ClientFactory, user_headers: UserHeaders
) -> None:
    client = await make_client(cors_origins=APP)
    key = (await user_headers("alice"))["X-Session-API-Key"]
    await client.post("/auth/sign-in", json={"api_key": key})
    response = await client.post("/api/settings", json={"language": "it"}, headers={"Origin": APP})
    assert response.status == 200
    response = await client.post(
        "/api/settings", json={"language": "it"}, headers={"Origin": "http://localhost:3002"}
    )
    assert response.status == 403


@pytest.mark.parametrize(
    "value", ["*", "http://a.example/path", "a.example", "ftp://a.example", "http://"]
)
def test_bad_origins_stop_start_up(value: str) -> None:
    with pytest.raises(ConfigError, match="ACS_CORS_ORIGINS"):
        load_config({"ACS_CORS_ORIGINS": value})
