"""Browser sessions: sign in with an API key, a signed HttpOnly SameSite=Strict cookie accepted
wherever a key is, cross-origin refusal for requests that change state, sign-out, revocation."""

from __future__ import annotations

import time
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from controlplane import keys
from controlplane.app import create_app
from controlplane.auth.service import ApiKeyService
from controlplane.auth.sessions import COOKIE_NAME, SIGNING_PURPOSE, SessionService
from controlplane.config import ConfigError, ServiceConfig
from controlplane.crypto import load_secret_box
from controlplane.store import keyspace
from tests.conftest import BOOTSTRAP_KEY
from tests.support.log_capture import capture_logs
from tests.support.types import Client, ClientFactory, UserHeaders


def origin(client: Client) -> dict[str, str]:
    return {"Origin": str(client.make_url("")).rstrip("/")}


async def sign_in(client: Client, key: str, **form: str) -> Any:
    """A browser's form post of the sign-in page, from the page's own origin."""
    return await client.post(
        "/auth/sign-in",
        data={"api_key": key, **form},
        headers=origin(client),
        allow_redirects=False,
    )


def set_cookie(response: Any) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in response.headers.getall("Set-Cookie", []):
        jar.load(header)
    return jar


async def test_sign_in_sets_a_strict_httponly_cookie_that_works_like_a_key(
    client: Client, user_headers: UserHeaders
) -> None:
    key = (await user_headers("alice"))["X-Session-API-Key"]
    response = await sign_in(client, key, next="/api/v1/users/me")
    assert response.status == 303
    assert response.headers["Location"] == "/api/v1/users/me"
    cookie = set_cookie(response)[COOKIE_NAME]
    assert cookie["httponly"] is True
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == "/"
    assert cookie["max-age"] == str(12 * 3600)
    assert not cookie["secure"]  # plain HTTP here; see the HTTPS test below
    assert key not in cookie.value

    me = await client.get("/api/v1/users/me")  # the jar sends the cookie
    assert me.status == 200
    body = await me.json()
    assert (body["id"], body["auth_method"], body["is_admin"]) == ("alice", "session", False)
    assert (await client.get("/api/settings")).status == 200
    # A write with the cookie from our own page.
    response = await client.post("/api/settings", json={"language": "fr"}, headers=origin(client))
    assert response.status == 200
    assert (await (await client.get("/api/settings")).json())["language"] == "fr"


async def test_cookie_writes_need_our_origin(client: Client, user_headers: UserHeaders) -> None:
    await sign_in(client, (await user_headers("alice"))["X-Session-API-Key"])
    body = {"language": "de"}
    no_origin = await client.post("/api/settings", json=body)
    assert no_origin.status == 403
    assert "Origin" in (await no_origin.json())["detail"]
    for other in ("http://evil.example", "null", "http://127.0.0.1:1"):
        response = await client.post("/api/settings", json=body, headers={"Origin": other})
        assert response.status == 403, other
    referer = {"Referer": str(client.make_url("/auth/sign-in"))}
    assert (await client.post("/api/settings", json=body, headers=referer)).status == 200
    # Reads need no Origin (browsers send none on same-origin GETs).
    settings = await (await client.get("/api/settings")).json()
    assert settings["language"] == "de"


async def test_an_api_key_header_decides_alone(client: Client, user_headers: UserHeaders) -> None:
    await sign_in(client, (await user_headers("alice"))["X-Session-API-Key"])
    bob = await user_headers("bob")
    me = await (await client.get("/api/v1/users/me", headers=bob)).json()
    assert me["id"] == "bob"
    assert me["auth_method"] == "api_key"
    # A wrong key is a 401 even with a valid session cookie; and keys need no Origin.
    response = await client.get("/api/v1/users/me", headers={"X-Session-API-Key": "wrong"})
    assert response.status == 401
    response = await client.post("/api/settings", json={"language": "x"}, headers=bob)
    assert response.status == 200


def _changed(text: str) -> str:
    """`text` with its last character replaced by another: a fixed one ("A") was the same one
    for 1 session id in 64, and the "forged" cookie was the real one."""
    return text[:-1] + ("B" if text.endswith("A") else "A")


async def test_bad_keys_and_forged_cookies_are_refused(
    client: Client, user_headers: UserHeaders
) -> None:
    response = await sign_in(client, "acs_000000000000_" + "A" * 43)
    assert response.status == 401
    assert response.content_type == "text/html"
    assert "not valid" in await response.text()
    assert COOKIE_NAME not in set_cookie(response)

    await sign_in(client, (await user_headers("alice"))["X-Session-API-Key"])
    real = next(c.value for c in client.session.cookie_jar if c.key == COOKIE_NAME)
    session_id, expiry, signature = real.split(".")
    client.session.cookie_jar.clear()  # from here on only the cookies sent by hand
    forged = [
        f"{session_id}.{int(expiry) + 3600}.{signature}",  # a longer life
        f"{_changed(session_id)}.{expiry}.{signature}",  # another id
        f"{session_id}.{expiry}.{_changed(signature)}",  # another signature
        f"{session_id}.\u00b3.{signature}",  # a digit to str.isdigit(), not to int(): was a 500
        "garbage",
        "",
    ]
    for value in forged:
        response = await client.get(
            "/api/v1/users/me", headers={"Cookie": f"{COOKIE_NAME}={value}"}
        )
        assert response.status == 401, value


async def test_sign_out_ends_the_session_even_for_a_copied_cookie(
    client: Client, user_headers: UserHeaders
) -> None:
    await sign_in(client, (await user_headers("alice"))["X-Session-API-Key"])
    copied = next(c.value for c in client.session.cookie_jar if c.key == COOKIE_NAME)
    response = await client.post("/auth/sign-out", json={}, headers=origin(client))
    assert not [c for c in client.session.cookie_jar if c.key == COOKIE_NAME]
    assert response.status == 200
    assert await response.json() == {"success": True}
    assert set_cookie(response)[COOKIE_NAME]["max-age"] == "0"
    response = await client.get("/api/v1/users/me", headers={"Cookie": f"{COOKIE_NAME}={copied}"})
    assert response.status == 401
    assert "sign in again" in (await response.json())["detail"]
    # Again: nothing to end, still fine.
    assert (await client.post("/auth/sign-out", json={}, headers=origin(client))).status == 200


async def test_revoking_the_key_ends_its_sessions(
    client: Client, raw_redis: aioredis.Redis
) -> None:
    service = ApiKeyService(raw_redis, None)
    created = await service.create("carol")
    await sign_in(client, created.key)
    assert (await client.get("/api/v1/users/me")).status == 200
    await service.revoke(created.key_id)
    assert (await client.get("/api/v1/users/me")).status == 401


async def test_session_record_expires_with_the_cookie_and_holds_no_secret(
    make_client: ClientFactory, raw_redis: aioredis.Redis
) -> None:
    client = await make_client(session_ttl=120)
    response = await sign_in(client, BOOTSTRAP_KEY)
    cookie = set_cookie(response)[COOKIE_NAME]
    assert cookie["max-age"] == "120"
    session_id = cookie.value.split(".")[0]
    names = [n async for n in raw_redis.scan_iter(match="acs:session:*")]
    assert len(names) == 1
    assert session_id.encode() not in names[0]
    assert 110 <= await raw_redis.ttl(names[0]) <= 120
    row = await raw_redis.hgetall(names[0])
    assert row == {b"user_id": b"admin", b"key_id": b"bootstrap", b"is_admin": b"1"}
    me = await (await client.get("/api/v1/users/me")).json()
    assert (me["id"], me["is_admin"], me["key_id"]) == ("admin", True, "bootstrap")


async def test_an_expired_cookie_is_refused_even_if_its_record_lingers(
    client: Client, raw_redis: aioredis.Redis, config: Any
) -> None:
    client.session.cookie_jar.clear()
    # Built with the server's own signing key, so only the expiry is wrong.
    box = load_secret_box(config.secret_key, config.data_dir)
    service = SessionService(
        raw_redis, ApiKeyService(raw_redis, BOOTSTRAP_KEY), box.derive_key(SIGNING_PURPOSE), 60
    )
    principal = await client.app[keys.API_KEYS].authenticate(BOOTSTRAP_KEY)
    fresh = await service.create(principal)
    headers = {"Cookie": f"{COOKIE_NAME}={fresh.cookie}"}
    assert (await client.get("/api/v1/users/me", headers=headers)).status == 200
    session_id = fresh.cookie.split(".")[0]
    past = int(time.time()) - 1
    stale = f"{session_id}.{past}.{service._sign(session_id, past)}"
    response = await client.get("/api/v1/users/me", headers={"Cookie": f"{COOKIE_NAME}={stale}"})
    assert response.status == 401


async def test_the_signing_key_comes_from_the_secret_key(
    make_client: ClientFactory,
    make_config: Callable[..., ServiceConfig],
    tmp_path: Any,
    raw_redis: aioredis.Redis,
) -> None:
    first = await make_client()
    await sign_in(first, BOOTSTRAP_KEY)
    cookie = next(c.value for c in first.session.cookie_jar if c.key == COOKIE_NAME)
    # Same Redis, another data dir: another secret key file. Such a replica refuses to start
    # (the key check); were it let in, the cookie's signature would fail there.
    runner = web.AppRunner(create_app(make_config(data_dir=tmp_path / "other-data")))
    with pytest.raises(ConfigError, match="key file"):
        await runner.setup()
    await runner.cleanup()
    await raw_redis.delete(keyspace.SECRET_KEY_CHECK)
    other = await make_client(data_dir=tmp_path / "other-data")
    headers = {"Cookie": f"{COOKIE_NAME}={cookie}"}
    assert (await other.get("/api/v1/users/me", headers=headers)).status == 401
    assert (await first.get("/api/v1/users/me", headers=headers)).status == 200


async def test_json_sign_in_and_next_stays_on_this_site(client: Client) -> None:
    response = await client.post(
        "/auth/sign-in", json={"api_key": BOOTSTRAP_KEY}, headers=origin(client)
    )
    assert response.status == 200
    body = await response.json()
    assert body["user_id"] == "admin"
    assert body["is_admin"] is True
    assert COOKIE_NAME in set_cookie(response)
    response = await client.post("/auth/sign-in", json={"api_key": "nope"})
    assert response.status == 401
    assert set(await response.json()) == {"detail"}
    response = await client.post("/auth/sign-in", json={"key": BOOTSTRAP_KEY})
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["body", "api_key"]
    # JSON disguised as text/plain (what a cross-site form can send) is not read.
    response = await client.post(
        "/auth/sign-in",
        data=f'{{"api_key": "{BOOTSTRAP_KEY}"}}',
        headers={"Content-Type": "text/plain"},
    )
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["header", "content-type"]

    for bad in ("//evil.example/x", "https://evil.example", "/\\evil.example", "javascript:x"):
        response = await sign_in(client, BOOTSTRAP_KEY, next=bad)
        assert response.status == 303
        assert response.headers["Location"] == "/auth/sign-in", bad


async def test_sign_in_from_another_site_is_refused(client: Client) -> None:
    response = await client.post(
        "/auth/sign-in",
        data={"api_key": BOOTSTRAP_KEY},
        headers={"Origin": "http://evil.example"},
        allow_redirects=False,
    )
    assert response.status == 403
    assert COOKIE_NAME not in set_cookie(response)


async def test_cookie_is_secure_behind_https(client: Client) -> None:
    response = await client.post(
        "/auth/sign-in",
        json={"api_key": BOOTSTRAP_KEY},
        headers={"X-Forwarded-Proto": "https"},
    )
    assert set_cookie(response)[COOKIE_NAME]["secure"] is True


async def test_sign_in_attempts_are_rate_limited(make_client: ClientFactory) -> None:
    client = await make_client(auth_rate_limit_per_minute=3)
    for _ in range(3):
        assert (await client.post("/auth/sign-in", json={"api_key": "wrong"})).status == 401
    response = await client.post("/auth/sign-in", json={"api_key": BOOTSTRAP_KEY})
    assert response.status == 429
    assert 1 <= int(response.headers["Retry-After"]) <= 60


async def test_the_session_cookie_never_reaches_the_logs(client: Client) -> None:
    with capture_logs("debug") as logs:
        response = await sign_in(client, BOOTSTRAP_KEY)
        cookie = set_cookie(response)[COOKIE_NAME].value
        await client.get("/api/v1/users/me")
        await client.get("/api/v1/users/me", headers={"Cookie": f"{COOKIE_NAME}=forged"})
    assert cookie.split(".")[0] not in logs.text
    assert BOOTSTRAP_KEY not in logs.text
    assert any(r.get("user_id") == "admin" for r in logs.events("request"))


async def test_pages_cannot_be_framed_and_run_no_script(client: Client) -> None:
    response = await client.get("/auth/sign-in")
    assert response.status == 200
    assert response.content_type == "text/html"
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert "script-src" not in response.headers["Content-Security-Policy"]  # default-src 'none'
    assert response.headers["X-Frame-Options"] == "DENY"
    text = await response.text()
    assert 'name="api_key"' in text
    assert "<script" not in text
    # next is echoed into the form escaped.
    response = await client.get('/auth/sign-in?next=/x"><script>alert(1)</script>')
    assert "<script>" not in await response.text()


async def test_the_cookie_opens_metrics_and_the_event_socket(
    make_sandbox_client: ClientFactory, user_headers: UserHeaders
) -> None:
    client = await make_sandbox_client()
    await sign_in(client, BOOTSTRAP_KEY)
    assert (await client.get("/metrics")).status == 200
    socket = "/api/v1/events/socket?conversation_id=" + "a" * 32
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}
    upgrade["Sec-WebSocket-Key"] = "dGhlIHNhbXBsZSBub25jZQ=="
    # Authenticated (an unknown conversation, not a 401) from our own page...
    response = await client.get(socket, headers={**upgrade, **origin(client)})
    assert response.status == 404
    # ...and refused from another origin: CORS does not guard WebSocket handshakes.
    response = await client.get(socket, headers={**upgrade, "Origin": "http://evil.example"})
    assert response.status == 403

    client.session.cookie_jar.clear()
    await sign_in(client, (await user_headers("alice"))["X-Session-API-Key"])
    assert (await client.get("/metrics")).status == 403
