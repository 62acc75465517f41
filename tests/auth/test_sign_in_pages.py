"""The sign-in and device-approval pages in a real headless Chromium (Debian's `chromium`,
driven by Playwright): what a person does, what the browser keeps, and what another site on the
same machine cannot make the browser do."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, async_playwright

from controlplane.auth.sessions import COOKIE_NAME
from tests.support.types import Client, UserHeaders


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail(
            "no `chromium` on PATH: `make test` installs Debian's chromium package", pytrace=False
        )
    async with async_playwright() as playwright:
        # --no-sandbox: Chromium refuses its sandbox as root, which tests here run as.
        launched = await playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox"]
        )
        yield launched
        await launched.close()


@pytest.fixture
async def page(chromium: Browser) -> AsyncIterator[Page]:
    context = await chromium.new_context()
    yield await context.new_page()
    await context.close()


def base(client: Client) -> str:
    return str(client.make_url("")).rstrip("/")


async def key_of(user_headers: UserHeaders, name: str) -> str:
    return (await user_headers(name))["X-Session-API-Key"]


async def sign_in(page: Page, key: str) -> None:
    await page.fill("#api_key", key)
    await page.click("#sign-in")


async def test_sign_in_and_out(page: Page, client: Client, user_headers: UserHeaders) -> None:
    key = await key_of(user_headers, "alice")
    await page.goto(f"{base(client)}/auth/sign-in?next=/api/v1/users/me")
    await sign_in(page, "acs_000000000000_" + "A" * 43)
    assert "That API key is not valid." in await page.inner_text("[role=alert]")
    assert await page.context.cookies() == []

    await sign_in(page, key)
    await page.wait_for_url(f"{base(client)}/api/v1/users/me")
    assert '"id": "alice"' in await page.inner_text("body") or '"id":"alice"' in (
        await page.inner_text("body")
    )
    (cookie,) = await page.context.cookies()
    assert cookie["name"] == COOKIE_NAME
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    assert cookie["expires"] > 0  # a persistent, expiring cookie, not a forever one
    # HttpOnly: page scripts never see it.
    assert COOKIE_NAME not in await page.evaluate("document.cookie")
    assert key not in await page.content()

    await page.goto(f"{base(client)}/auth/sign-in")
    assert "signed in as alice" in await page.inner_text("#who")
    await page.click("#sign-out")
    assert "session has ended" in await page.inner_text("#who")
    assert await page.context.cookies() == []
    response = await page.goto(f"{base(client)}/api/v1/users/me")
    assert response is not None
    assert response.status == 401


async def _authorize(client: Client) -> dict[str, Any]:
    response = await client.post("/oauth/device/authorize", json={})
    assert response.status == 200
    flow: dict[str, Any] = await response.json()
    return flow


async def _token(client: Client, flow: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = await client.post("/oauth/device/token", data={"device_code": flow["device_code"]})
    return response.status, await response.json()


async def test_device_approval_from_the_printed_link(
    page: Page, client: Client, user_headers: UserHeaders
) -> None:
    key = await key_of(user_headers, "alice")
    flow = await _authorize(client)
    await page.goto(flow["verification_uri_complete"])
    # Not signed in: the page sends the browser to sign in, then back with the code.
    assert "/auth/sign-in?next=" in page.url
    await sign_in(page, key)
    await page.wait_for_url(flow["verification_uri_complete"])
    assert await page.input_value("#user_code") == flow["user_code"]
    assert "alice" in await page.inner_text("main")
    assert (await _token(client, flow))[1]["error"] == "authorization_pending"

    await page.click("#approve")
    assert "is connected" in await page.inner_text("[role=status]")
    status, token = await _token(client, flow)
    assert status == 200
    me = await client.get(
        "/api/v1/users/me", headers={"Authorization": f"Bearer {token['access_token']}"}
    )
    assert (await me.json())["id"] == "alice"


async def test_device_denial_with_a_typed_code(
    page: Page, client: Client, user_headers: UserHeaders
) -> None:
    await page.goto(f"{base(client)}/auth/sign-in?next=/oauth/device/verify")
    await sign_in(page, await key_of(user_headers, "bob"))
    await page.wait_for_url(f"{base(client)}/oauth/device/verify")
    await page.fill("#user_code", "zzzz-zzzz")
    await page.click("#approve")
    assert "unknown or expired" in await page.inner_text("[role=alert]")

    flow = await _authorize(client)
    await page.fill("#user_code", flow["user_code"].replace("-", " ").lower())
    await page.click("#deny")
    assert "was denied" in await page.inner_text("[role=status]")
    status, body = await _token(client, flow)
    assert (status, body["error"]) == (400, "access_denied")


EVIL_PAGE = """<!doctype html><html><body>
<form id="f" method="post" action="{target}/oauth/device/verify">
  <input name="user_code" value="{code}"><input name="action" value="approve">
</form>
<script>
  fetch("{target}/api/settings", {{method: "POST", mode: "no-cors", credentials: "include",
        body: new Blob(['{{"llm_base_url": "http://evil.example/v1"}}'])}})
    .finally(() => setTimeout(() => document.getElementById("f").submit(), 500));
</script></body></html>"""


async def test_another_site_on_this_machine_cannot_use_the_session(
    page: Page, client: Client, user_headers: UserHeaders
) -> None:
    """Another port of 127.0.0.1 is the same *site*, so SameSite=Strict still sends the cookie
    there: the Origin check and frame-ancestors are what stop it."""
    await page.goto(f"{base(client)}/auth/sign-in")
    await sign_in(page, await key_of(user_headers, "alice"))
    await page.wait_for_url(f"{base(client)}/auth/sign-in")
    flow = await _authorize(client)

    evil = web.Application()

    async def serve(_: web.Request) -> web.Response:
        html = EVIL_PAGE.format(target=base(client), code=flow["user_code"])
        return web.Response(text=html, content_type="text/html")

    async def frame(_: web.Request) -> web.Response:
        src = f"{base(client)}/oauth/device/verify?user_code={flow['user_code']}"
        html = f'<!doctype html><iframe id="framed" src="{src}"></iframe>'
        return web.Response(text=html, content_type="text/html")

    evil.router.add_get("/", serve)
    evil.router.add_get("/frame", frame)
    server = TestServer(evil, host="127.0.0.1")
    await server.start_server()
    try:
        refused = []
        page.on(
            "response",
            lambda r: refused.append(r.status) if "/oauth/device/verify" in r.url else None,
        )
        # Clickjacking: our approval page inside the other site's frame renders nothing.
        await page.goto(str(server.make_url("/frame")), wait_until="load")
        assert await page.frame_locator("#framed").locator("#approve").count() == 0
        # CSRF: a form post and a credentialed no-cors fetch carry the cookie, and are refused.
        await page.goto(str(server.make_url("/")))
        await page.wait_for_url(f"{base(client)}/oauth/device/verify", timeout=10_000)
        assert "cross-origin request" in await page.inner_text("body")
        assert 403 in refused
    finally:
        await server.close()

    assert (await _token(client, flow))[1]["error"] == "authorization_pending"
    settings = await (await client.get("/api/settings", headers=await user_headers("alice"))).json()
    assert settings["llm_base_url"] is None
