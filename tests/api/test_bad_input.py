"""Hand-made bad inputs: each gets our JSON error format (never a 500, never plain text) and
leaves nothing half-done. The fuzzer (tests/api/test_fuzz_openapi.py) covers the document at
large."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from controlplane import keys
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from tests.support.records import NO_ENGINE, RecordedSandbox, event, sandbox_record, stats
from tests.support.types import Client, UserHeaders

HUGE = b"1" + b"0" * 5000  # over Python's 4,300-digit limit for int()


def assert_json_error(status: int, body: Any, expected: int) -> None:
    assert status == expected, body
    assert isinstance(body, dict), body
    assert "detail" in body, body


async def raw_request(client: Client, data: bytes) -> tuple[int, str, dict[str, Any]]:
    """Send bytes as they are (no client library would send these) and read the answer."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(data)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        length = int(headers.get("Content-Length", "0"))
        body = json.loads(await reader.readexactly(length))
        return status, headers.get("Content-Type", ""), body
    finally:
        writer.close()


@pytest.mark.parametrize(
    "path", ["/api/settings", "/api/v1/settings", "/api/secrets", "/api/v1/app-conversations"]
)
async def test_a_huge_integer_is_a_422(
    client: Client, user_headers: UserHeaders, path: str
) -> None:
    alice = await user_headers("alice")
    body = b'{"max_iterations": ' + HUGE + b"}"
    resp = await client.post(path, data=body, headers={**alice, "Content-Type": "application/json"})
    payload = await resp.json()
    assert_json_error(resp.status, payload, 422)
    assert payload["detail"][0]["type"] == "json_invalid"


async def test_webhooks_check_the_key_before_the_body(recorded: RecordedSandbox) -> None:
    client, sandbox_id, conversation_id, sandbox, _alice = recorded
    for url in (
        f"/api/v1/webhooks/{sandbox_id}/conversations",
        f"/api/v1/webhooks/{sandbox_id}/events/{conversation_id}",
    ):
        # No key, a wrong key: 401 whatever the body (it is never read).
        for headers in ({}, {"X-Session-API-Key": "wrong"}):
            resp = await client.post(url, data=b'{"id": ' + HUGE + b"}", headers=headers)
            assert_json_error(resp.status, await resp.json(), 401)
        # The right key: the body is read and refused in our format.
        resp = await client.post(url, data=b'{"id": ' + HUGE + b"}", headers=sandbox)
        assert_json_error(resp.status, await resp.json(), 422)


async def test_invalid_metrics_on_the_conversations_webhook_are_a_422(
    recorded: RecordedSandbox, raw_redis: aioredis.Redis
) -> None:
    client, sandbox_id, conversation_id, sandbox, alice = recorded
    url = f"/api/v1/webhooks/{sandbox_id}/conversations"
    bad_bodies: list[dict[str, Any]] = [
        {"id": conversation_id, "metrics": {"accumulated_cost": "lots"}},
        {"id": conversation_id, "metrics": {"accumulated_token_usage": [1, 2]}},
        {"id": conversation_id, "stats": {"usage_to_metrics": {"a": {"accumulated_cost": "x"}}}},
        {
            "id": conversation_id,
            "stats": {
                "usage_to_metrics": {"a": {"accumulated_token_usage": {"prompt_tokens": "many"}}}
            },
        },
    ]
    for body in bad_bodies:
        resp = await client.post(url, json=body, headers=sandbox)
        payload = await resp.json()
        assert_json_error(resp.status, payload, 422)
        assert payload["detail"][0]["loc"][0] == "body"
    # Nothing was kept from them; a good one still is.
    got = await client.get(f"/api/v1/app-conversations/{conversation_id}", headers=alice)
    assert (await got.json())["metrics"] is None
    good = {"id": conversation_id, "stats": stats(0.5, 10, 5)}
    assert (await client.post(url, json=good, headers=sandbox)).status == 200
    got = await client.get(f"/api/v1/app-conversations/{conversation_id}", headers=alice)
    assert (await got.json())["metrics"]["accumulated_cost"] == 0.5


async def test_an_unreadable_stats_update_stores_no_event(recorded: RecordedSandbox) -> None:
    client, sandbox_id, conversation_id, sandbox, alice = recorded
    url = f"/api/v1/webhooks/{sandbox_id}/events/{conversation_id}"
    bad = event(
        "ConversationStateUpdateEvent",
        key="stats",
        value={"usage_to_metrics": {"a": {"accumulated_cost": "x"}}},
    )
    resp = await client.post(url, json=[event(), bad], headers=sandbox)
    assert_json_error(resp.status, await resp.json(), 422)
    count = await client.get(
        "/api/v1/events/count", params={"conversation_id__eq": conversation_id}, headers=alice
    )
    assert await count.json() == 0


@pytest.mark.parametrize(
    ("request_bytes", "detail"),
    [
        (b"GET /health?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "longer than"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", "longer than"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", "malformed"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", "malformed"),
        (b"G(T /health HTTP/1.1\r\nHost: x\r\n\r\n", "malformed"),
        (b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", "malformed"),
        (
            b"POST /api/settings HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
            b"Content-Length: 2\r\n\r\n{}",
            "malformed",
        ),
        (
            b"POST /api/settings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"zz\r\n{}\r\n0\r\n\r\n",
            "malformed",
        ),
    ],
)
async def test_http_parser_errors_answer_json(
    client: Client, request_bytes: bytes, detail: str
) -> None:
    status, content_type, body = await raw_request(client, request_bytes)
    assert status == 400
    assert content_type.startswith("application/json")
    assert detail in body["detail"]
    # Never an echo of what was refused (a URL may carry a key).
    assert "aaaa" not in json.dumps(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sandbox_idle_timeout": False}, "sandbox_idle_timeout"),
        ({"sandbox_idle_timeout": "600"}, "sandbox_idle_timeout"),
        ({"max_iterations": True}, "max_iterations"),
        ({"max_iterations": "10"}, "max_iterations"),
        ({"confirmation_mode": 1}, "confirmation_mode"),
        ({"confirmation_mode": "true"}, "confirmation_mode"),
        ({"max_budget_per_task": "5"}, "max_budget_per_task"),
        ({"enable_default_condenser": 0}, "enable_default_condenser"),
    ],
)
async def test_coercions_that_change_meaning_are_refused(
    client: Client, user_headers: UserHeaders, body: dict[str, Any], field: str
) -> None:
    alice = await user_headers("alice")
    before = await (await client.get("/api/settings", headers=alice)).json()
    resp = await client.post("/api/settings", json=body, headers=alice)
    payload = await resp.json()
    assert_json_error(resp.status, payload, 422)
    assert payload["detail"][0]["loc"] == ["body", field]
    assert await (await client.get("/api/settings", headers=alice)).json() == before


async def test_whole_numbers_are_integers_in_either_spelling(
    client: Client, user_headers: UserHeaders
) -> None:
    alice = await user_headers("alice")
    resp = await client.post("/api/settings", json={"max_iterations": 40.0}, headers=alice)
    assert resp.status == 200, await resp.text()
    assert (await (await client.get("/api/settings", headers=alice)).json())["max_iterations"] == 40
    resp = await client.post("/api/settings", json={"max_iterations": 40.5}, headers=alice)
    assert resp.status == 422


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-3", "1e9"])
async def test_query_datetimes_must_be_iso(recorded: RecordedSandbox, value: str) -> None:
    client, _sandbox, _conversation, _key, alice = recorded
    resp = await client.get(
        "/api/v1/app-conversations/count", params={"updated_at__lt": value}, headers=alice
    )
    payload = await resp.json()
    assert_json_error(resp.status, payload, 422)
    assert payload["detail"][0]["loc"] == ["query", "updated_at__lt"]
    ok = await client.get(
        "/api/v1/app-conversations/count",
        params={"updated_at__lt": "2030-01-01T00:00:00Z"},
        headers=alice,
    )
    assert ok.status == 200


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/api/v1/app-conversations/count", "GET"),
        ("/api/v1/app-conversations/search", "GET"),
        ("/api/v1/app-conversations/start-tasks", "GET"),
        ("/api/v1/app-conversations/stream-start", "POST"),
        ("/api/v1/sandboxes/search", "GET"),
    ],
)
async def test_allow_lists_the_methods_of_that_path_only(
    client: Client, user_headers: UserHeaders, path: str, allow: str
) -> None:
    alice = await user_headers("alice")
    resp = await client.request("PUT", path, headers=alice)
    assert_json_error(resp.status, await resp.json(), 405)
    assert resp.headers["Allow"] == allow


async def test_a_multipart_form_without_a_boundary_is_a_422(client: Client) -> None:
    for path in ("/oauth/device/authorize", "/auth/sign-in"):
        resp = await client.post(path, data=b"x", headers={"Content-Type": "multipart/form-data"})
        assert resp.status in (400, 422), await resp.text()
        assert resp.content_type == "application/json"
        assert "detail" in await resp.json() or "error" in await resp.json()


async def test_webhooks_are_rate_limited_per_sandbox(
    make_client: Callable[..., Awaitable[Client]],
    raw_redis: aioredis.Redis,
    user_headers: UserHeaders,
) -> None:
    client = await make_client(
        with_sandboxes=True, docker_url=NO_ENGINE, webhook_rate_limit_per_minute=3
    )
    box = client.app[keys.SECRET_BOX]
    sandboxes = []
    for n in range(2):
        key = f"sandbox-key-{n}-" + "x" * 32
        record = sandbox_record("alice", SandboxStatus.RUNNING, key)
        assert await SandboxStore(raw_redis, box).create(record, 0, Limits())
        sandboxes.append((record.id, {"X-Session-API-Key": key}))
    (first, first_key), (second, second_key) = sandboxes
    url = f"/api/v1/webhooks/{first}/conversations"
    body = {"id": "0" * 32}
    for _ in range(3):  # under the limit: the conversation is unknown, acknowledged
        assert (await client.post(url, json=body, headers=first_key)).status == 200
    refused = await client.post(url, json=body, headers=first_key)
    assert_json_error(refused.status, await refused.json(), 429)
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Another sandbox has its own budget; a wrong key is a 401, not counted against anyone.
    other = f"/api/v1/webhooks/{second}/conversations"
    assert (await client.post(other, json=body, headers=second_key)).status == 200
    assert (await client.post(other, json=body, headers={"X-Session-API-Key": "no"})).status == 401


HANDSHAKE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


async def test_the_events_socket_answers_json_before_the_upgrade(recorded: RecordedSandbox) -> None:
    client, _sandbox, conversation_id, _key, alice = recorded
    url = "/api/v1/events/socket"
    unknown = {"conversation_id": "0" * 32}
    # Not a handshake (a plain GET, or one header missing): 400, whoever asks.
    for headers in ({}, alice, {**alice, **HANDSHAKE, "Upgrade": "h2c"}):
        resp = await client.get(url, params=unknown, headers=headers)
        assert_json_error(resp.status, await resp.json(), 400)
    for name in HANDSHAKE:
        partial = {k: v for k, v in HANDSHAKE.items() if k != name}
        resp = await client.get(url, params=unknown, headers={**alice, **partial})
        assert_json_error(resp.status, await resp.json(), 400)
    # A handshake: the query, the key, the conversation are checked before the upgrade.
    checks = [
        ({"conversation_id": "not-a-uuid"}, {**alice, **HANDSHAKE}, 422),
        (unknown, HANDSHAKE, 401),
        (unknown, {**alice, **HANDSHAKE}, 404),
    ]
    for params, headers, status in checks:
        resp = await client.get(url, params=params, headers=headers)
        assert_json_error(resp.status, await resp.json(), status)
        # The connection asked for an upgrade: it is not reused after a refusal.
        assert resp.headers.get("Connection", "").lower() == "close"
    ws = await client.ws_connect(f"{url}?conversation_id={conversation_id}", headers=alice)
    await ws.close()
