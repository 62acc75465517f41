"""Chromium signing in through the OpenID provider's own login page: into Agent Canvas served
from our origin (its cookie mode: /login, our sign-in page, the provider, back to the app, which
then finds the user's real organizations), and the classic web app's calls with the same
session cookie."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.support.browser_netns import BrowserNet
from tests.support.oidc_sign_in import OidcLive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
STEP = 30_000  # ms
FIRST_LOAD = 90_000  # ms: Agent Canvas's bundles, the first time, on a host loaded by the suite


@pytest.fixture
async def browser(browser_net: BrowserNet) -> AsyncIterator[Browser]:
    """Chromium in a network namespace of its own (tests/support/browser_netns.py): Canvas takes
    a loopback origin for a local agent server, so the app and the provider are served on the
    link's host address, as tests/test_agent_canvas.py serves Canvas."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(browser_net.chromium), args=["--no-sandbox"]
        )
        yield launched
        await launched.close()


async def provider_login(page: Page, user: str) -> None:
    """The provider's login page, as a person fills it."""
    await page.wait_for_selector("input[name=login]", timeout=STEP)
    await page.fill("input[name=login]", user)
    await page.fill("input[name=password]", "a password")
    await page.click("button[type=submit]")


async def test_agent_canvas_and_the_classic_api_through_the_provider(
    browser: Browser, browser_net: BrowserNet, oidc_live: Any, agent_canvas: Path, tmp_path: Path
) -> None:
    live: OidcLive = await oidc_live(web_app_dir=agent_canvas, host=browser_net.host_ip)
    context = await browser.new_context()
    page = await context.new_page()
    calls: list[tuple[str, int]] = []
    page.on("response", lambda r: calls.append((re.sub(r"^https?://[^/]+", "", r.url), r.status)))
    try:
        # Not signed in: Canvas's POST /api/authenticate is a 401, so it opens /login, which is
        # our sign-in page; it offers the provider.
        await page.goto(live.url + "/", timeout=FIRST_LOAD)
        await page.wait_for_url(re.compile(r"/auth/sign-in\?next=%2F"), timeout=STEP)
        await page.click("#sign-in-oidc")
        await provider_login(page, "alice")
        # Back through our callback to the app, which now onboards the signed-in user.
        await page.wait_for_url(live.url + "/", timeout=STEP)
        await expect(page.get_by_text("Choose your agent")).to_be_visible(timeout=STEP)
        # Playwright hands the page's response events over after the page drew them: wait.
        await _until_in(calls, ("/api/organizations", 200))
        await _until_in(calls, ("/api/authenticate", 200))

        # Canvas's organization calls answer alice's real organization and role.
        orgs = await page.evaluate("fetch('/api/organizations').then(r => r.json())")
        assert [(o["id"], o["role"]) for o in orgs["items"]] == [("eng", "admin")]
        key = await page.evaluate("fetch('/api/keys/current').then(r => r.json())")
        assert (key["auth_type"], key["org_id"], key["user_id"]) == ("oidc", "eng", "alice")

        # The classic web app's calls in cookie mode: who am I, settings read and written.
        me = await page.evaluate("fetch('/api/v1/users/me').then(r => r.json())")
        assert (me["id"], me["auth_method"]) == ("alice", "oidc")
        saved = await page.evaluate(
            """fetch('/api/settings', {method: 'POST', headers: {'Content-Type':
            'application/json'}, body: JSON.stringify({language: 'fr'})}).then(r => r.status)"""
        )
        assert saved == 200
        settings = await page.evaluate("fetch('/api/settings').then(r => r.json())")
        assert settings["language"] == "fr"
        cookies = {c["name"]: c for c in await context.cookies()}
        assert cookies["acs_session"]["httpOnly"]
        assert cookies["acs_session"]["sameSite"] == "Strict"
    finally:
        await page.screenshot(path=str(tmp_path / "page.png"))
        (tmp_path / "calls.txt").write_text("\n".join(f"{s} {p}" for p, s in calls))
        await context.close()


async def _until_in(calls: list[tuple[str, int]], call: tuple[str, int]) -> None:
    deadline = time.monotonic() + STEP / 1000
    while call not in calls:
        assert time.monotonic() < deadline, f"{call} not among the page's responses: {calls}"
        await asyncio.sleep(0.1)
