"""Signing in through the test's OpenID provider as a person would, over plain HTTP: our sign-in
link, the provider's login page (its form filled), back to our callback. Also a control plane
served on a port chosen beforehand (the provider must know its callback URL before it starts).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin

import aiohttp
import pytest
from aiohttp import web

from controlplane.app import create_app
from controlplane.config import ServiceConfig
from tests.support.live_server import free_port
from tests.support.oidc_provider import CLIENT_ID, OidcProvider

GROUP_ROLES = "eng-admins=eng:admin,eng=eng:member,audit=eng:auditor"
"""alice: eng admin; bob: eng member; carol: eng auditor; dave: no group (the default org)."""


def browser_session() -> aiohttp.ClientSession:
    """A client keeping cookies as a browser does (for IP-address hosts too)."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def provider_login(
    browser: aiohttp.ClientSession, login_page: aiohttp.ClientResponse, user: str
) -> aiohttp.ClientResponse:
    """Fill the provider's login form on `login_page` and follow where it sends the browser."""
    html = await login_page.text()
    action = re.search(r'<form[^>]*action="([^"]+)"', html)
    assert action is not None, html[:2000]
    target = urljoin(str(login_page.url), action.group(1).replace("&amp;", "&"))
    return await browser.post(
        target, data={"prompt": "login", "login": user, "password": "any"}, allow_redirects=True
    )


async def sign_in(
    browser: aiohttp.ClientSession, base: str, user: str, next_path: str = "/auth/sign-in"
) -> tuple[int, str]:
    """Through our start link and the provider's login (skipped by the provider while its own
    session of the user lasts): our callback's status and page."""
    start = f"{base}/auth/oidc/start?next={quote(next_path, safe='')}"
    async with browser.get(start) as login_page:
        if str(login_page.url).startswith(base):
            return login_page.status, await login_page.text()  # signed in at the provider
        assert login_page.status == 200, await login_page.text()
        async with await provider_login(browser, login_page, user) as back:
            return back.status, await back.text()


@dataclass
class OidcLive:
    url: str
    provider: OidcProvider
    app: web.Application
    runner: web.AppRunner

    async def close(self) -> None:
        if self.runner.server is not None:
            await self.runner.cleanup()


OidcLiveFactory = Callable[..., Any]


@pytest.fixture
async def oidc_live(
    make_config: Callable[..., ServiceConfig], oidc_provider_factory: Any
) -> AsyncIterator[OidcLiveFactory]:
    """`await oidc_live(**config)`: a provider and a control plane (no sandboxes unless
    `with_sandboxes=True`), both on `host` (loopback by default), signing browsers in through
    it; closed after the test. `recheck_interval`: seconds between a session's checks with the
    provider, below the setting's 5 s minimum (ACS_OIDC_RECHECK_INTERVAL spares a real
    provider): the recheck's code is the same at any interval, and the tests that wait for it
    wait less."""
    made: list[OidcLive] = []

    async def make(
        *,
        with_sandboxes: bool = False,
        host: str = "127.0.0.1",
        recheck_interval: int | None = None,
        **overrides: Any,
    ) -> OidcLive:
        port = free_port(host)
        base = f"http://{host}:{port}"
        provider = oidc_provider_factory([base + "/auth/oidc/callback"], host=host)
        values: dict[str, Any] = {
            "oidc_issuer": provider.issuer,
            "oidc_client_id": CLIENT_ID,
            "oidc_client_secret": provider.client_secret,
            "oidc_scopes": "openid,email,profile,groups",
            "oidc_group_roles": GROUP_ROLES,
        }
        values.update(overrides)
        config = make_config(**values)
        if recheck_interval is not None:
            # After validation, which holds operators to the minimum.
            config = config.model_copy(update={"oidc_recheck_interval": recheck_interval})
        app = create_app(config, with_sandboxes=with_sandboxes)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        live = OidcLive(url=base, provider=provider, app=app, runner=runner)
        made.append(live)
        return live

    yield make
    for live in reversed(made):
        await live.close()
