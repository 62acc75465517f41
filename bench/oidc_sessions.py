"""Sign-in through a real OpenID provider, and what a browser session opened through it costs.

Run with `make bench`, or `.venv/bin/python -m bench.oidc_sessions [--quick]`. bench/README.md
says what is measured. Targets (issue 29):

- an authenticated request with an OIDC session costs at most 1.1x the same request with an API
  key, measured in the same run: requests of both kinds alternate on kept-alive connections, and
  the time is the server's own (every middleware and the handler, `server:` samples), p50;
- a sign-in round trip through the provider on loopback, our own work (the start and callback
  handlers, less the time spent waiting for the provider's answers inside them), p50 <= 300 ms.

The provider is npm oidc-provider (tests/support/oidc_provider.py), on loopback; the control
plane is create_app over real HTTP with a private redis-server (bench/common.py).

Exit status: 0 when the table was printed (a missed target is marked in it), 1 on an error.
"""

from __future__ import annotations

import argparse
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.common import BenchError, Samples, main_of, ms, serve, served_config
from controlplane import keys
from controlplane.auth.service import ApiKeyService
from tests.support.live_server import free_port
from tests.support.oidc_provider import CLIENT_ID, OidcProvider, install, make_provider
from tests.support.oidc_sign_in import GROUP_ROLES, browser_session, sign_in

REQUEST_RATIO = 1.1
SIGN_IN_TARGET = 0.300
ROUTE = "/api/keys/current"
"""A route whose own work is tiny: what differs between the two kinds is authentication."""
ROUTE_KEY = f"server:GET {ROUTE}"
SECRET = secrets.token_urlsafe(24)


@dataclass
class Options:
    quick: bool
    json_path: Path | None


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and sign-ins")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    return Options(quick=args.quick, json_path=args.json_path)


class ProviderClock:
    """Time spent waiting for the provider's answers, per request to our app: httpx's event
    hooks on the relying party's client (Authlib makes its httpx clients with these kwargs)."""

    def __init__(self) -> None:
        self.waited = 0.0
        self._started: dict[int, float] = {}

    async def on_request(self, request: httpx.Request) -> None:
        self._started[id(request)] = time.perf_counter()

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        started = self._started.pop(id(response.request), None)
        if started is not None:
            self.waited += time.perf_counter() - started


class OidcBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.tmp = tmp
        self.redis_url = redis_url
        self.notes: list[str] = []
        self.samples = Samples()
        self.provider: OidcProvider | None = None
        self.summary: dict[str, Any] = {}

    async def measure(self) -> tuple[list[str], list[str]]:
        provider_port = free_port()  # the app needs its issuer, the provider the app's callback
        config = served_config(
            self.redis_url,
            self.tmp,
            # 40 sign-ins from one address in a minute: past the per-address limit of sign-ins.
            auth_rate_limit_per_minute=100_000,
            oidc_issuer=f"http://127.0.0.1:{provider_port}",
            oidc_client_id=CLIENT_ID,
            oidc_client_secret=SECRET,
            oidc_scopes="openid,email,profile,groups",
            oidc_group_roles=GROUP_ROLES,
        )
        async with serve(config, self.samples, with_sandboxes=False) as served:
            self.provider = make_provider(
                install(), self.tmp / "oidc", [served.url + "/auth/oidc/callback"]
            )
            self.provider.port, self.provider.client_secret = provider_port, SECRET
            self.provider.start()
            clock = ProviderClock()
            relying_party = served.app[keys.OIDC_SIGN_IN]._client._app
            relying_party.client_kwargs["event_hooks"] = {
                "request": [clock.on_request],
                "response": [clock.on_response],
            }
            await self._sign_ins(served.url, clock)
            await self._requests(served.url, served.app)
        return self._table()

    async def _sign_ins(self, url: str, clock: ProviderClock) -> None:
        count = 10 if self.options.quick else 40
        for i in range(count + 1):
            self.samples.drop("server:GET /auth/oidc")
            clock.waited = 0.0
            started = time.perf_counter()
            async with browser_session() as browser:
                status, page = await sign_in(browser, url, "alice")
            total = time.perf_counter() - started
            if status != 200:
                raise BenchError(f"sign-in failed: {status} {page[:300]}")
            ours = self.samples.p("server:GET /auth/oidc/start", 50) + self.samples.p(
                "server:GET /auth/oidc/callback", 50
            )
            if i == 0:
                continue  # the first one reads discovery and the JWKS
            self.samples.add("signin.total", total)
            self.samples.add("signin.handlers", ours)
            self.samples.add("signin.provider_wait", clock.waited)
            self.samples.add("signin.ours", ours - clock.waited)

    async def _requests(self, url: str, app: Any) -> None:
        count = 500 if self.options.quick else 3000
        api_key = (await ApiKeyService(app[keys.REDIS], None).create("bob")).key
        async with browser_session() as browser:
            status, page = await sign_in(browser, url, "bob")
            if status != 200:
                raise BenchError(f"sign-in failed: {status} {page[:300]}")
            async with aiohttp.ClientSession() as scripts:
                for kind in ("key", "oidc") * 50:  # warm both paths
                    await self._one(kind, url, browser, scripts, api_key)
                self.samples.drop("server:")
                self.samples.drop("client:")
                for _ in range(count):
                    for kind in ("key", "oidc"):
                        await self._one(kind, url, browser, scripts, api_key)

    async def _one(
        self,
        kind: str,
        url: str,
        browser: aiohttp.ClientSession,
        scripts: aiohttp.ClientSession,
        api_key: str,
    ) -> None:
        before = len(self.samples.values.get(ROUTE_KEY, []))
        started = time.perf_counter()
        if kind == "key":
            headers = {"Authorization": f"Bearer {api_key}"}
            async with scripts.get(url + ROUTE, headers=headers) as response:
                await response.read()
        else:
            async with browser.get(url + ROUTE) as response:
                await response.read()
        if response.status != 200:
            raise BenchError(f"{kind} request answered {response.status}")
        self.samples.add(f"client:{kind}", time.perf_counter() - started)
        server = self.samples.values[ROUTE_KEY]
        assert len(server) == before + 1
        self.samples.add(f"server:{kind}", server.pop())

    def _table(self) -> tuple[list[str], list[str]]:
        s = self.samples
        missed: list[str] = []
        ratio = s.p("server:oidc", 50) / s.p("server:key", 50)
        client_ratio = s.p("client:oidc", 50) / s.p("client:key", 50)
        lines = [
            f"requests: GET {ROUTE}, {s.count('server:key')} of each kind, alternating",
            "| measure | API key | OIDC session | ratio |",
            "| --- | --- | --- | --- |",
            f"| server p50 (ms) | {ms(s.p('server:key', 50))} | {ms(s.p('server:oidc', 50))} "
            f"| {ratio:.3f} |",
            f"| server p95 (ms) | {ms(s.p('server:key', 95))} | {ms(s.p('server:oidc', 95))} "
            f"| {s.p('server:oidc', 95) / s.p('server:key', 95):.3f} |",
            f"| client round trip p50 (ms) | {ms(s.p('client:key', 50))} "
            f"| {ms(s.p('client:oidc', 50))} | {client_ratio:.3f} |",
            "",
            f"sign-ins through the provider: {s.count('signin.total')} (after one warm-up)",
            "| measure | p50 (ms) | p95 (ms) |",
            "| --- | --- | --- |",
        ]
        for name, label in (
            ("signin.ours", "our own work (start + callback, less provider waits)"),
            ("signin.handlers", "start + callback handlers"),
            ("signin.provider_wait", "waiting for the provider inside them"),
            ("signin.total", "whole round trip (provider's pages included)"),
        ):
            lines.append(f"| {label} | {ms(s.p(name, 50))} | {ms(s.p(name, 95))} |")
        if ratio > REQUEST_RATIO:
            missed.append(f"OIDC session / API key {ratio:.3f} > {REQUEST_RATIO}")
        if s.p("signin.ours", 50) > SIGN_IN_TARGET:
            missed.append(f"sign-in own work p50 {ms(s.p('signin.ours', 50))} ms > 300 ms")
        self.summary = {
            "ratio_p50": ratio,
            "client_ratio_p50": client_ratio,
            "signin_ours_p50_ms": s.p("signin.ours", 50) * 1000,
            "signin_total_p50_ms": s.p("signin.total", 50) * 1000,
        }
        return lines, missed

    def remove_everything(self) -> int:
        return 0

    def close(self) -> None:
        if self.provider is not None:
            self.provider.stop()

    def results(self) -> Any:
        return {"summary": self.summary, "samples": self.samples.values}


main = main_of(parse, OidcBench, "acs-bench-oidc-")

if __name__ == "__main__":
    raise SystemExit(main(None))
