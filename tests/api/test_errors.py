"""Error bodies: 422 lists, 404/405/413 JSON, unexpected exceptions, request ids."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from controlplane.app import create_app
from controlplane.config import ServiceConfig
from tests.support.log_capture import capture_logs
from tests.support.types import Client


def _assert_validation_list(body: Any) -> list[dict[str, Any]]:
    assert set(body) == {"detail"}
    assert isinstance(body["detail"], list)
    assert body["detail"]
    for item in body["detail"]:
        assert set(item) == {"loc", "msg", "type"}
        assert isinstance(item["loc"], list)
        assert all(isinstance(part, str) for part in item["loc"])
        assert isinstance(item["msg"], str)
        assert isinstance(item["type"], str)
    items: list[dict[str, Any]] = body["detail"]
    return items


async def _refused_settings_body(
    client: Client, admin_headers: dict[str, str], raw: bytes
) -> list[dict[str, Any]]:
    """POST /api/settings with `raw` as its JSON body: a 422 in the validation list's shape."""
    response = await client.post(
        "/api/settings", data=raw, headers={**admin_headers, "Content-Type": "application/json"}
    )
    assert response.status == 422
    return _assert_validation_list(await response.json())


async def test_malformed_json_is_422_json_invalid(
    client: Client, admin_headers: dict[str, str]
) -> None:
    for raw in (b"{bad", b'{"language": "en",}', b"\xff\xfe"):
        items = await _refused_settings_body(client, admin_headers, raw)
        assert len(items) == 1
        assert items[0]["type"] == "json_invalid"
        assert items[0]["loc"][0] == "body"


async def test_deeply_nested_json_is_422_not_500(
    client: Client, admin_headers: dict[str, str]
) -> None:
    for raw in (b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 5_000 + b"1" + b"}" * 5_000):
        items = await _refused_settings_body(client, admin_headers, raw)
        assert items[0]["type"] == "json_invalid"


async def test_wrong_content_type_is_422(client: Client, admin_headers: dict[str, str]) -> None:
    response = await client.post(
        "/api/settings",
        data=b'{"language": "en"}',
        headers={**admin_headers, "Content-Type": "text/plain"},
    )
    assert response.status == 422
    items = _assert_validation_list(await response.json())
    assert items[0]["loc"] == ["header", "content-type"]
    settings = await (await client.get("/api/settings", headers=admin_headers)).json()
    assert settings["language"] is None


async def test_missing_body_is_422(client: Client, admin_headers: dict[str, str]) -> None:
    for path in ("/api/settings", "/api/secrets", "/api/add-git-providers"):
        response = await client.post(path, headers=admin_headers)
        assert response.status == 422, path
        items = _assert_validation_list(await response.json())
        assert items == [{"loc": ["body"], "msg": "Field required", "type": "missing"}]


@pytest.mark.parametrize(
    ("query", "error_type"),
    [("limit=0", "greater_than_equal"), ("limit=101", "less_than_equal"), ("limit=abc", None)],
)
async def test_bad_query_param_is_422(
    client: Client, admin_headers: dict[str, str], query: str, error_type: str | None
) -> None:
    response = await client.get(f"/api/v1/sandbox-specs/search?{query}", headers=admin_headers)
    assert response.status == 422
    items = _assert_validation_list(await response.json())
    assert [i["loc"] for i in items] == [["query", "limit"]]
    if error_type is not None:
        assert items[0]["type"] == error_type


async def test_limit_at_the_bounds_is_accepted(
    client: Client, admin_headers: dict[str, str]
) -> None:
    for limit in (1, 100):
        url = f"/api/v1/sandbox-specs/search?limit={limit}"
        response = await client.get(url, headers=admin_headers)
        assert response.status == 200
        assert len((await response.json())["items"]) <= limit


async def test_unknown_query_param_is_422(client: Client, admin_headers: dict[str, str]) -> None:
    response = await client.get("/api/v1/sandbox-specs/search?limt=5", headers=admin_headers)
    assert response.status == 422
    items = _assert_validation_list(await response.json())
    assert items[0]["loc"] == ["query", "limt"]


async def test_unknown_route_is_404_json(client: Client) -> None:
    for headers in ({}, {"X-Session-API-Key": "wrong"}):
        response = await client.get("/api/does-not-exist", headers=headers)
        assert response.status == 404
        assert response.content_type == "application/json"
        assert await response.json() == {"detail": "Not Found"}


async def test_wrong_method_is_405_json(client: Client) -> None:
    response = await client.delete("/api/settings")
    assert response.status == 405
    assert response.content_type == "application/json"
    assert await response.json() == {"detail": "Method Not Allowed"}
    assert set(response.headers["Allow"].split(",")) == {"GET", "POST"}


async def test_body_over_the_limit_is_413_json(
    make_client: Callable[..., Any], admin_headers: dict[str, str]
) -> None:
    client: Client = await make_client(max_body_bytes=2048)
    big = {"language": "x" * 4096}
    response = await client.post("/api/settings", headers=admin_headers, json=big)
    assert response.status == 413
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body) == {"detail"}
    assert isinstance(body["detail"], str)
    assert "X-Request-ID" in response.headers

    # Without a Content-Length (chunked) the limit holds as well.
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"language": "'
        for _ in range(8):
            yield b"y" * 512
        yield b'"}'

    response = await client.post(
        "/api/settings",
        headers={**admin_headers, "Content-Type": "application/json"},
        data=chunks(),
    )
    assert response.status == 413
    assert response.content_type == "application/json"

    # Nothing was stored; a body under the limit still works.
    settings = await (await client.get("/api/settings", headers=admin_headers)).json()
    assert settings["language"] is None
    response = await client.post("/api/settings", headers=admin_headers, json={"language": "en"})
    assert response.status == 200


async def test_unexpected_exception_is_json_500_and_logged(
    aiohttp_client: Any,
    make_config: Callable[..., ServiceConfig],
    admin_headers: dict[str, str],
) -> None:
    async def boom(_request: web.Request) -> web.Response:
        llm_api_key = "LOCAL-SECRET-IN-A-FRAME"
        raise RuntimeError(f"kaboom-{len(llm_api_key)}")

    app = create_app(make_config(), with_sandboxes=False)
    app.router.add_get("/boom", boom)
    with capture_logs() as logs:
        client: Client = await aiohttp_client(app)
        response = await client.get("/boom", headers=admin_headers)
        assert response.status == 500
        assert response.content_type == "application/json"
        text = await response.text()
        body = await response.json()
        await client.close()

    assert set(body) == {"detail", "request_id"}
    assert body["request_id"] == response.headers["X-Request-ID"]
    for leak in ("Traceback", "kaboom", "RuntimeError", "boom", "test_errors.py"):
        assert leak not in text

    errors = logs.events("unhandled_error")
    assert len(errors) == 1
    assert errors[0]["request_id"] == body["request_id"]
    (exc,) = errors[0]["exception"]
    assert exc["exc_type"] == "RuntimeError"
    assert exc["exc_value"] == "kaboom-23"
    assert any(frame["name"] == "boom" for frame in exc["frames"])
    # Frame locals (the caller's API key, secrets held in variables) never reach the log.
    assert "LOCAL-SECRET-IN-A-FRAME" not in logs.text
    assert admin_headers["X-Session-API-Key"] not in logs.text
    (line,) = [r for r in logs.events("request") if r["route"] == "/boom"]
    assert line["status"] == 500


async def test_every_response_carries_a_request_id(
    client: Client, admin_headers: dict[str, str]
) -> None:
    seen = set()
    for method, path, headers in [
        ("GET", "/health", {}),
        ("GET", "/api/settings", admin_headers),
        ("GET", "/api/settings", {}),
        ("POST", "/api/settings", admin_headers),
        ("GET", "/nowhere", {}),
        ("PATCH", "/api/settings", admin_headers),
        ("GET", "/api/openapi.json", {}),
    ]:
        response = await client.request(method, path, headers=headers)
        request_id = response.headers.get("X-Request-ID")
        assert request_id, (method, path)
        seen.add(request_id)
    assert len(seen) == 7

    # A client's own id is echoed back; an unusable one is replaced.
    response = await client.get("/health", headers={"X-Request-ID": "client-chosen-id-1"})
    assert response.headers["X-Request-ID"] == "client-chosen-id-1"
    response = await client.get("/health", headers={"X-Request-ID": "z" * 65})
    assert response.headers["X-Request-ID"] != "z" * 65
    assert 0 < len(response.headers["X-Request-ID"]) <= 64
