"""The OAuth device authorization grant (RFC 8628) as `openhands login` drives it, over HTTP:
codes, polling answers, approval by a signed-in user, single use, expiry and rate limits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis

from controlplane.auth.device import GRANT_TYPE, USER_CODE_ALPHABET
from tests.support.types import Client, ClientFactory, UserHeaders


async def authorize(client: Client) -> dict[str, Any]:
    response = await client.post("/oauth/device/authorize", json={})  # what the CLI sends
    assert response.status == 200, await response.text()
    assert response.headers["Cache-Control"] == "no-store"
    body: dict[str, Any] = await response.json()
    return body


async def poll(client: Client, device_code: str, **extra: str) -> tuple[int, dict[str, Any]]:
    response = await client.post(
        "/oauth/device/token", data={"device_code": device_code, **extra}
    )  # form-encoded, as RFC 8628 and the CLI send it
    return response.status, await response.json()


async def decide(
    client: Client, headers: dict[str, str], user_code: str, action: str = "approve"
) -> Any:
    return await client.post(
        "/oauth/device/verify", json={"user_code": user_code, "action": action}, headers=headers
    )


async def test_authorize_answers_rfc_8628_fields(client: Client) -> None:
    body = await authorize(client)
    assert set(body) == {
        "device_code",
        "user_code",
        "verification_uri",
        "verification_uri_complete",
        "expires_in",
        "interval",
    }
    base = str(client.make_url("")).rstrip("/")
    assert body["verification_uri"] == f"{base}/oauth/device/verify"
    assert body["verification_uri_complete"] == (
        f"{base}/oauth/device/verify?user_code={body['user_code']}"
    )
    assert (body["expires_in"], body["interval"]) == (600, 5)
    first, second = body["user_code"].split("-")
    assert len(first) == len(second) == 4
    assert set(first + second) <= set(USER_CODE_ALPHABET)
    assert len(body["device_code"]) >= 43
    other = await authorize(client)
    assert other["device_code"] != body["device_code"]
    assert other["user_code"] != body["user_code"]


async def test_approval_gives_the_device_a_new_key_of_that_user_once(
    client: Client, user_headers: UserHeaders, raw_redis: aioredis.Redis
) -> None:
    alice = await user_headers("alice", admin=True)
    flow = await authorize(client)
    status, body = await poll(client, flow["device_code"])
    assert (status, body["error"]) == (400, "authorization_pending")
    assert body["error_description"] == body["detail"]

    # The code is case- and dash-insensitive, as people type it.
    typed = flow["user_code"].replace("-", "").lower()
    response = await decide(client, alice, typed)
    assert response.status == 200
    assert await response.json() == {"user_code": flow["user_code"], "status": "approved"}

    status, token = await poll(client, flow["device_code"], grant_type=GRANT_TYPE)
    assert status == 200
    assert token["token_type"] == "Bearer"
    key = token["access_token"]
    assert key != alice["X-Session-API-Key"]
    me = await (await client.get("/api/v1/users/me", headers={"X-Session-API-Key": key})).json()
    assert me["id"] == "alice"
    assert me["is_admin"] is False  # device keys are never admin keys

    # Single use: the device code is spent, and the user code cannot be approved again.
    status, body = await poll(client, flow["device_code"])
    assert (status, body["error"]) == (400, "invalid_grant")
    assert (await decide(client, alice, flow["user_code"])).status == 404
    # Redis never held the device code itself.
    async for name in raw_redis.scan_iter(match="acs:device*"):
        assert flow["device_code"].encode() not in name
        if (await raw_redis.type(name)) == b"string":
            assert flow["device_code"].encode() not in (await raw_redis.get(name) or b"")


async def test_concurrent_polls_of_an_approved_code_get_one_key(
    client: Client, user_headers: UserHeaders
) -> None:
    flow = await authorize(client)
    await decide(client, await user_headers("alice"), flow["user_code"])
    results = await asyncio.gather(*(poll(client, flow["device_code"]) for _ in range(8)))
    assert sorted(status for status, _ in results) == [200] + [400] * 7
    assert {body.get("error") for status, body in results if status == 400} == {"invalid_grant"}


async def test_denied_codes_get_access_denied(client: Client, user_headers: UserHeaders) -> None:
    flow = await authorize(client)
    response = await decide(client, await user_headers("alice"), flow["user_code"], "deny")
    assert await response.json() == {"user_code": flow["user_code"], "status": "denied"}
    for _ in range(2):
        status, body = await poll(client, flow["device_code"])
        assert (status, body["error"]) == (400, "access_denied")
    response = await decide(client, await user_headers("alice"), flow["user_code"])
    assert response.status == 409
    assert "denied" in (await response.json())["detail"]


async def test_polling_too_fast_slows_the_client_down(make_client: ClientFactory) -> None:
    client = await make_client(device_poll_interval=2)
    flow = await authorize(client)
    assert flow["interval"] == 2
    status, body = await poll(client, flow["device_code"])
    assert body["error"] == "authorization_pending"
    status, body = await poll(client, flow["device_code"])  # at once: too fast
    assert (status, body["error"], body["interval"]) == (400, "slow_down", 7)
    status, body = await poll(client, flow["device_code"])
    assert (body["error"], body["interval"]) == ("slow_down", 12)


async def test_expired_codes(
    client: Client, user_headers: UserHeaders, raw_redis: aioredis.Redis
) -> None:
    flow = await authorize(client)
    # Time passes: move the record's expiry into the past (its TTL keeps it a while longer).
    names = [n async for n in raw_redis.scan_iter(match="acs:device:*")]
    assert len(names) == 1
    assert 600 < await raw_redis.ttl(names[0]) <= 1200
    await raw_redis.hset(names[0], "expires_at", repr(time.time() - 1))
    status, body = await poll(client, flow["device_code"])
    assert (status, body["error"]) == (400, "expired_token")
    response = await decide(client, await user_headers("alice"), flow["user_code"])
    assert response.status == 404
    assert "expired" in (await response.json())["detail"]


async def test_bad_token_requests(client: Client) -> None:
    status, body = await poll(client, "no-such-code")
    assert (status, body["error"]) == (400, "invalid_grant")
    status, body = await poll(client, "x", grant_type="authorization_code")
    assert (status, body["error"]) == (400, "unsupported_grant_type")
    response = await client.post("/oauth/device/token", data={})
    assert (response.status, (await response.json())["error"]) == (400, "invalid_request")
    response = await client.post(
        "/oauth/device/token", data=b"[1,2]", headers={"Content-Type": "application/json"}
    )
    assert (response.status, (await response.json())["error"]) == (400, "invalid_request")
    # JSON bodies work too, and unknown parameters are ignored (RFC 6749 §3.1).
    flow = await authorize(client)
    response = await client.post(
        "/oauth/device/token",
        json={"device_code": flow["device_code"], "client_id": "cli", "extra": 1},
    )
    assert (await response.json())["error"] == "authorization_pending"


async def test_device_codes_and_guesses_are_rate_limited(
    make_client: ClientFactory, user_headers: UserHeaders
) -> None:
    client = await make_client(auth_rate_limit_per_minute=3)
    for _ in range(3):
        await authorize(client)
    response = await client.post("/oauth/device/authorize", json={})
    assert response.status == 429
    assert (await response.json())["error"] == "slow_down"
    assert int(response.headers["Retry-After"]) >= 1

    for _ in range(3):
        assert (await poll(client, "guess"))[1]["error"] == "invalid_grant"
    status, body = await poll(client, "guess")
    assert (status, body["error"]) == (429, "slow_down")

    # Approval attempts count per user: guessing user codes is bounded too.
    alice = await user_headers("alice")
    codes = [await decide(client, alice, "BCDF-GHJK") for _ in range(3)]
    assert [r.status for r in codes] == [404, 404, 404]
    assert (await decide(client, alice, "BCDF-GHJK")).status == 429
    bob = await user_headers("bob")
    assert (await decide(client, bob, "BCDF-GHJK")).status == 404


async def test_approving_needs_a_signed_in_user(client: Client) -> None:
    flow = await authorize(client)
    response = await client.post(
        "/oauth/device/verify", json={"user_code": flow["user_code"], "action": "approve"}
    )
    assert response.status == 401
    response = await client.post(
        "/oauth/device/verify",
        json={"user_code": flow["user_code"], "action": "approve"},
        headers={"X-Session-API-Key": "wrong"},
    )
    assert response.status == 401
    # A browser without a session is sent to sign in, and back here after.
    response = await client.get(
        f"/oauth/device/verify?user_code={flow['user_code']}", allow_redirects=False
    )
    assert response.status == 303
    assert response.headers["Location"] == (
        f"/auth/sign-in?next=%2Foauth%2Fdevice%2Fverify%3Fuser_code%3D{flow['user_code']}"
    )
    _, body = await poll(client, flow["device_code"])
    assert body["error"] == "authorization_pending"


async def test_approval_in_the_page_with_a_session(
    client: Client, user_headers: UserHeaders
) -> None:
    """What the page does: sign in, open the link, press Approve (form posts, same origin)."""
    own = {"Origin": str(client.make_url("")).rstrip("/")}
    key = (await user_headers("alice"))["X-Session-API-Key"]
    flow = await authorize(client)
    link = flow["verification_uri_complete"].removeprefix(own["Origin"])
    signed = await client.post(
        "/auth/sign-in", data={"api_key": key, "next": link}, headers=own, allow_redirects=False
    )
    assert signed.headers["Location"] == link
    page = await client.get(link)
    assert page.status == 200
    text = await page.text()
    assert f'value="{flow["user_code"]}"' in text
    assert "alice" in text

    # A form post from another site is refused, whatever the session.
    response = await client.post(
        "/oauth/device/verify",
        data={"user_code": flow["user_code"], "action": "approve"},
        headers={"Origin": "http://evil.example"},
    )
    assert response.status == 403
    assert (await poll(client, flow["device_code"]))[1]["error"] == "authorization_pending"

    response = await client.post(
        "/oauth/device/verify",
        data={"user_code": flow["user_code"], "action": "approve"},
        headers=own,
    )
    assert response.status == 200
    assert "is connected" in await response.text()
    status, token = await poll(client, flow["device_code"])
    assert status == 200
    me = await client.get(
        "/api/v1/users/me", headers={"Authorization": f"Bearer {token['access_token']}"}
    )
    assert (await me.json())["id"] == "alice"

    # The page shows mistakes in place.
    response = await client.get("/oauth/device/verify?user_code=ZZZZ-ZZZZ")
    assert response.status == 404
    assert "unknown or expired" in await response.text()
    response = await client.post(
        "/oauth/device/verify", data={"user_code": "hello", "action": "approve"}, headers=own
    )
    assert response.status == 404
    assert "not a code" in await response.text()
