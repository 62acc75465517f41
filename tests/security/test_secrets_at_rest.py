"""No secret in plain text in Redis, in its AOF, in HTTP responses or in the logs."""

from __future__ import annotations

import asyncio
import io
import secrets
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import structlog

from controlplane.logging import configure_logging
from tests.support.log_capture import LogCapture, capture_logs
from tests.support.redis_dump import dump_redis
from tests.support.redis_server import RedisServer
from tests.support.types import Client, UserHeaders


def _marker(kind: str) -> str:
    return f"MARK{kind}{secrets.token_hex(6)}"


def _aof_bytes(server: RedisServer) -> bytes:
    return b"".join(p.read_bytes() for p in Path(server.directory).rglob("*.aof*") if p.is_file())


async def test_no_secret_in_redis_responses_or_logs(
    client: Client,
    user_headers: UserHeaders,
    raw_redis: aioredis.Redis,
    redis_server: RedisServer,
) -> None:
    marks = {
        name: _marker(name)
        for name in (
            "llm",
            "search",
            "sandbox",
            "github",
            "gitlab",
            "custom1",
            "custom2",
            "sse",
            "shttp",
            "env1",
            "env2",
            "settingsmcp",
        )
    }
    texts: list[str] = []

    with capture_logs() as logs:
        headers = await user_headers("alice")
        api_key = headers["X-Session-API-Key"]

        async def call(method: str, path: str, body: Any = None, status: int = 200) -> Any:
            kwargs: dict[str, Any] = {"headers": headers}
            if body is not None:
                kwargs["json"] = body
            response = await client.request(method, path, **kwargs)
            texts.append(await response.text())
            texts.extend(f"{k}: {v}" for k, v in response.headers.items())
            assert response.status == status, (method, path, texts[-1])
            return await response.json()

        await call(
            "POST",
            "/api/settings",
            {
                "llm_api_key": marks["llm"],
                "search_api_key": marks["search"],
                "sandbox_api_key": marks["sandbox"],
                "mcp_config": {
                    "sse_servers": [{"url": "https://a.example", "api_key": marks["settingsmcp"]}]
                },
            },
        )
        await call(
            "POST",
            "/api/add-git-providers",
            {
                "provider_tokens": {
                    "github": {"token": marks["github"]},
                    "gitlab": {"token": marks["gitlab"], "host": "gitlab.example.com"},
                },
                "mcp_config": {
                    "sse_servers": [{"url": "https://sse.example", "api_key": marks["sse"]}],
                    "shttp_servers": [{"url": "https://h.example", "api_key": marks["shttp"]}],
                    "stdio_servers": [
                        {
                            "name": "tool",
                            "command": "tool-mcp",
                            "env": {"TOKEN_A": marks["env1"]},
                        },
                        {"name": "other", "command": "x", "env": f"PLAIN=1,B={marks['env2']}"},
                    ],
                },
            },
        )
        for name in ("custom1", "custom2"):
            body = {"name": name.upper(), "value": marks[name], "description": "desc"}
            await call("POST", "/api/secrets", body, status=201)
        await call("PUT", "/api/secrets/CUSTOM1", {"name": "RENAMED"})
        await call("POST", "/api/secrets", {"name": "RENAMED", "value": marks["custom1"]}, 409)
        # Read everything back, echo the settings back, and fail some validations.
        settings = await call("GET", "/api/settings")
        await call("POST", "/api/settings", settings)
        await call("GET", "/api/secrets")
        await call("POST", "/api/settings", {"llm_api_key": marks["llm"], "email": "x"}, 422)
        await call("POST", "/api/secrets", {"name": "bad name", "value": marks["custom2"]}, 422)
        await call(
            "POST", "/api/add-git-providers", {"provider_tokens": {"x": marks["github"]}}, 422
        )
        await call("GET", "/api/settings")

    stored = await dump_redis(raw_redis)
    key_id = api_key.split("_")[1]
    # Positive controls: the dumps are real (the key id is stored in the clear, on purpose).
    assert f"acs:apikey:{key_id}".encode() in stored
    assert logs.events("request")
    # The AOF is written in order; once a write made after all others is on file, so is the rest.
    sentinel = _marker("sentinel").encode()
    await raw_redis.set(b"test:aof-sentinel", sentinel)
    deadline = time.monotonic() + 10
    while sentinel not in (aof := _aof_bytes(redis_server)):
        assert time.monotonic() < deadline, "the AOF never received the sentinel write"
        await asyncio.sleep(0.05)
    assert key_id.encode() in aof

    everything_sent = "\n".join(texts)
    for name, mark in marks.items():
        assert mark.encode() not in stored, f"{name} in Redis"
        assert mark.encode() not in aof, f"{name} in the AOF"
        assert mark not in everything_sent, f"{name} in an HTTP response"
        assert mark not in logs.text, f"{name} in the logs"
    for leak in (api_key, api_key.split("_", 2)[2]):  # the secret itself may hold "_"
        assert leak.encode() not in stored
        assert leak.encode() not in aof
        assert leak not in logs.text


def test_redaction_processor_blanks_secret_keys_at_any_depth() -> None:
    with capture_logs() as logs:
        log = structlog.get_logger("test")
        log.info(
            "x",
            llm_api_key="MARK1",
            nested={"token": "MARK2", "inner": {"Authorization": "Bearer MARK3"}},
            servers=[{"api_key": "MARK4"}, {"password": "MARK5"}],
            session_api_key="MARK6",
            github_token="MARK7",
            visible="still-here",
            empty_token="",
        )
    (line,) = logs.records()
    for n in range(1, 8):
        assert f"MARK{n}" not in logs.text
    assert line["llm_api_key"] == "[redacted]"
    assert line["nested"]["token"] == "[redacted]"
    assert line["nested"]["inner"]["Authorization"] == "[redacted]"
    assert line["servers"] == [{"api_key": "[redacted]"}, {"password": "[redacted]"}]
    assert line["visible"] == "still-here"


def test_console_tracebacks_carry_no_frame_locals() -> None:
    previous = structlog.get_config()
    stream = io.StringIO()
    configure_logging("console", "debug", stream=stream)
    try:
        api_key = "MARK-console-local"
        try:
            raise ValueError(f"failed with a key of {len(api_key)} chars")
        except ValueError:
            structlog.get_logger("test").exception("boom")
    finally:
        structlog.configure(**previous)
    text = stream.getvalue()
    assert "Traceback" in text
    assert "failed with a key of 18 chars" in text
    assert "MARK-console-local" not in text


def _request_lines(logs: LogCapture) -> list[dict[str, Any]]:
    return logs.events("request")


async def test_one_canonical_request_line_per_request(
    client: Client, user_headers: UserHeaders
) -> None:
    headers = await user_headers("alice")
    with capture_logs() as logs:
        cases = [
            ("GET", "/api/settings", headers, 200, "/api/settings", "alice"),
            ("GET", "/api/settings", {}, 401, "/api/settings", None),
            ("POST", "/api/settings", headers, 422, "/api/settings", "alice"),
            ("DELETE", "/api/secrets/NOPE", headers, 404, "/api/secrets/{name}", "alice"),
            ("GET", "/health", {}, 200, "/health", None),
        ]
        ids = []
        for method, path, hdrs, status, _route, _user in cases:
            response = await client.request(method, path, headers=hdrs)
            assert response.status == status
            ids.append(response.headers["X-Request-ID"])
        response = await client.get("/not/a/route")
        ids.append(response.headers["X-Request-ID"])
        cases.append(("GET", "/not/a/route", {}, 404, "<unmatched>", None))

    lines = _request_lines(logs)
    assert len(lines) == len(cases)
    for line, request_id, (method, _path, _h, status, route, user) in zip(
        lines, ids, cases, strict=True
    ):
        assert line["request_id"] == request_id
        assert line["method"] == method
        assert line["route"] == route
        assert line["status"] == status
        assert line["user_id"] == user
        assert isinstance(line["duration_ms"], int | float)
        assert line["duration_ms"] >= 0
        assert line["level"] == "info"
        assert "timestamp" in line
