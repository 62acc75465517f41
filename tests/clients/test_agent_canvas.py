"""Agent Canvas (npm @openhands/agent-canvas 1.6.1, OpenHands' current web app) in a real
headless Chromium against a live control plane, in both of its cloud modes:

- served from our origin (ACS_WEB_APP_DIR) with the browser session: login redirect and sign-in,
  onboarding, the LLM settings form, a conversation with command output, a follow-up, reopening
  it with its history, the git panel and a file read through /api/cloud-proxy;
- served from another origin (as agent-canvas's own static server does, routing
  /api/cloud-proxy to us) with our URL and an API key added as a cloud backend: CORS for its
  origin, then the same conversation.

The browser runs in a network namespace of its own (tests/browser_netns.py): sandbox starts
elsewhere on the host must not abort its requests. The control plane listens on that link's host
address and publishes sandbox ports there, so the app can open its event socket to the sandbox's
agent server as it does against OpenHands Cloud. The model is tests/fake_llm.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Page, Response, async_playwright, expect

from tests.support.browser_netns import BrowserNet
from tests.support.conversation_helpers import LLM_KEY, UserFactory
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.live_server import Api, LiveServer, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("sandbox_images"),
    pytest.mark.timeout(600),
    pytest.mark.live_config("served_on_the_browser_link"),
]
MAKE_FILE = "cd /workspace && git init -q && echo hello-canvas > notes.txt && cat notes.txt"
STEP = 30_000  # ms: one UI step; a sandbox start on a loaded host is most of it


@pytest.fixture
def canvas_port(browser_net: BrowserNet) -> int:
    """Where the Bearer-mode test serves Agent Canvas (chosen first: CORS names its origin)."""
    return free_port(browser_net.host_ip)


@pytest.fixture
def served_on_the_browser_link(
    browser_net: BrowserNet, agent_canvas: Path, canvas_port: int
) -> dict[str, Any]:
    """The live server's settings: it listens on the browser link's host address and publishes
    sandbox ports there, serves Agent Canvas from our origin, and lets the other origin in."""
    host = browser_net.host_ip
    return {
        "host": host,
        "web_app_dir": agent_canvas,
        "publish_host": host,
        "url_host": host,
        "cors_origins": [f"http://{host}:{canvas_port}"],
    }


class Browser:
    """One page, with every API call it makes recorded."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.calls: list[tuple[str, str, int]] = []
        self.errors: list[str] = []
        self.console: list[str] = []
        page.on("response", self._record)
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text[:500]}"))
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def _record(self, response: Response) -> None:
        path = re.sub(r"^https?://[^/]+", "", response.url)
        if path.startswith("/api/"):
            self.calls.append((response.request.method, path, response.status))

    def failed(self) -> list[tuple[str, str, int]]:
        """API calls answered 4xx/5xx, but the probes the app makes on purpose (a 401 before
        sign-in; the agent server's 404 for git commits, a route newer than ours)."""
        return [
            c
            for c in self.calls
            if c[2] >= 400
            and not (c[1] == "/api/authenticate" and c[2] == 401)
            and not (c[1] == "/api/cloud-proxy" and c[2] == 404)
        ]


@pytest.fixture
async def canvas_page(browser_net: BrowserNet, tmp_path: Path) -> AsyncIterator[Browser]:
    """The page; its last state is left in the test's tmp_path (page.png, page.html and the
    API calls it made, calls.json)."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(browser_net.chromium), args=["--no-sandbox"]
        )
        context = await launched.new_context()
        opened = Browser(await context.new_page())
        yield opened
        await opened.page.screenshot(path=str(tmp_path / "page.png"))
        await asyncio.to_thread((tmp_path / "page.html").write_text, await opened.page.content())
        record = json.dumps(
            {"calls": opened.calls, "errors": opened.errors, "console": opened.console}
        )
        await asyncio.to_thread((tmp_path / "calls.json").write_text, record)
        await launched.close()


async def onboard(page: Page, fake_llm: FakeLLM) -> None:
    """Canvas's first-run steps: the agent, the LLM form (rendered from our schema), hello."""
    await expect(page.get_by_text("Choose your agent")).to_be_visible(timeout=STEP)
    await page.get_by_test_id("onboarding-agent-next").click()
    await expect(page.get_by_text("Set up your LLM")).to_be_visible(timeout=STEP)
    await page.get_by_test_id("llm-custom-model-input").fill("fake-model")
    await page.get_by_test_id("base-url-input").fill(fake_llm.container_base_url)
    await page.get_by_test_id("llm-api-key-input").fill(LLM_KEY)
    await page.get_by_test_id("onboarding-llm-next").click()
    await expect(page.get_by_text("Say hello")).to_be_visible(timeout=STEP)


async def converse(page: Page, fake_llm: FakeLLM) -> None:
    """A first message with a command and its output, then a follow-up."""
    fake_llm.script(
        [
            reply_tool_call("terminal", {"command": MAKE_FILE}),
            reply_finish("the file is written"),
            reply_tool_call("terminal", {"command": "echo second-turn"}),
            reply_finish("done again"),
        ]
    )
    box = page.get_by_test_id("onboarding-hello-input")
    await box.fill("Write notes.txt")
    await box.press("Enter")
    await expect(page.get_by_text("the file is written")).to_be_visible(timeout=3 * STEP)
    ran = page.get_by_text("Ran", exact=False).first
    await expect(ran).to_contain_text("notes.txt")
    await ran.click()  # the command's output, as the terminal printed it
    await expect(page.get_by_text("hello-canvas", exact=True).first).to_be_visible(timeout=STEP)
    await page.get_by_test_id("chat-input").fill("And once more")
    await page.get_by_test_id("submit-button").click()
    await expect(page.get_by_text("done again")).to_be_visible(timeout=STEP)


async def reopen_and_read_files(browser: Browser, origin: str) -> None:
    """Reopen the conversation from the list: history back; then the git panel and a file."""
    page = browser.page
    await page.goto(origin + "/")
    card = page.get_by_test_id("conversation-card").first
    await expect(card).to_be_visible(timeout=STEP)
    await card.click()
    # The title shows twice once the conversation is open (its card and its header).
    await expect(page.get_by_text("Write notes.txt").first).to_be_visible(timeout=STEP)
    await expect(page.get_by_text("done again")).to_be_visible(timeout=STEP)
    await page.get_by_test_id("right-panel-toggle").click()
    await page.get_by_test_id("files-tab-diff-toggle-option-on").click()
    changed = page.get_by_test_id("file-diff-viewer-outer").filter(has_text="notes.txt")
    await expect(changed).to_be_visible(timeout=STEP)
    async with page.expect_response(re.compile(r"/git/diff\?")) as diff:
        await changed.get_by_test_id("collapse").click()
    assert (await diff.value).status == 200
    await page.get_by_test_id("files-tab-diff-toggle-option-off").click()
    await page.get_by_test_id("file-quick-row-item-notes.txt").click()
    await expect(page.get_by_test_id("files-tab-content")).to_contain_text("hello-canvas")
    reads = [c for c in browser.calls if re.search(r"/file\?file_path=.*notes\.txt$", c[1])]
    assert reads, browser.calls
    assert all(status == 200 for _method, _path, status in reads), browser.calls


async def read_through_the_proxy(page: Page, conversation: dict[str, Any]) -> Any:
    """A file read as AgentServerRuntimeService.downloadFile sends it (agent-canvas 1.6.1
    src/api/runtime-service/agent-server-runtime-service.ts), from the app's page: the envelope
    of CloudClient.requestThroughProxy to this origin's /api/cloud-proxy."""
    host = re.match(r"^https?://[^/]+", conversation["conversation_url"])
    assert host is not None
    envelope = {
        "host": host.group(0),
        "method": "GET",
        "path": "/api/file/download?path=%2Fworkspace%2Fnotes.txt",
        "headers": {"X-Session-API-Key": conversation["session_api_key"]},
        "body": None,
    }
    return await page.evaluate(
        """async (envelope) => {
            const r = await fetch("/api/cloud-proxy", {method: "POST",
                headers: {"Content-Type": "application/json"}, body: JSON.stringify(envelope)});
            return {status: r.status, text: await r.text()};
        }""",
        envelope,
    )


async def only_conversation(api: Api) -> dict[str, Any]:
    (item,) = (await api.ok("GET", "/api/v1/app-conversations/search"))["items"]
    return dict(item)


async def test_served_from_our_origin_with_the_session_cookie(
    canvas_page: Browser, live: LiveServer, user: UserFactory, fake_llm: FakeLLM
) -> None:
    alice = await user("alice", llm_model="unset-model", llm_api_key="")
    page = canvas_page.page
    # Not signed in: POST /api/authenticate is a 401, so Canvas sends the browser to /login.
    await page.goto(live.url + "/")
    await page.wait_for_url(re.compile(r"/auth/sign-in\?next=%2F"), timeout=STEP)
    await page.fill("#api_key", alice.key)
    await page.click("#sign-in")
    await page.wait_for_url(live.url + "/", timeout=STEP)

    await onboard(page, fake_llm)
    # Canvas shows its next step before its settings' save has answered (seen on a loaded
    # host): the save must land, within a UI step.
    saved: tuple[Any, Any] = ("", False)
    for _ in range(STEP // 100):
        settings = await alice.ok("GET", "/api/v1/settings")
        saved = (settings["llm_model"], settings["llm_api_key_set"])
        if saved == ("fake-model", True):
            break
        await asyncio.sleep(0.1)
    assert saved == ("fake-model", True)
    await converse(page, fake_llm)
    conversation = await only_conversation(alice)
    assert conversation["title"] == "Write notes.txt"
    await reopen_and_read_files(canvas_page, live.url)
    proxied = await read_through_the_proxy(page, conversation)
    assert proxied == {"status": 200, "text": "hello-canvas\n"}
    assert ("POST", "/api/cloud-proxy", 404) in canvas_page.calls  # the app's own runtime call
    assert canvas_page.failed() == []
    assert canvas_page.errors == []


async def serve_canvas_elsewhere(build: Path, host: str, port: int, api: str) -> web.AppRunner:
    """Agent Canvas on an origin of its own, as its static server runs it (agent-canvas
    scripts/static-server.mjs): the files, index.html for the app's routes, and
    `/api/cloud-proxy` routed to a backend (its `--route`), here ours."""
    build = await asyncio.to_thread(build.resolve)  # the data dir may be a symlink
    http = aiohttp.ClientSession()

    async def proxy(request: web.Request) -> web.Response:
        async with http.post(
            api + "/api/cloud-proxy",
            data=await request.read(),
            headers={"Content-Type": "application/json"},
        ) as resp:
            return web.Response(
                status=resp.status, body=await resp.read(), content_type=resp.content_type
            )

    async def files(request: web.Request) -> web.FileResponse:
        wanted = (build / request.match_info["path"]).resolve()
        if wanted.is_relative_to(build) and wanted.is_file():
            return web.FileResponse(wanted)
        return web.FileResponse(build / "index.html")

    async def close(_app: web.Application) -> None:
        await http.close()

    app = web.Application()
    app.router.add_post("/api/cloud-proxy", proxy)
    app.router.add_get("/{path:.*}", files)
    app.on_cleanup.append(close)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def test_added_as_a_cloud_backend_with_url_and_key(
    *,
    canvas_page: Browser,
    live: LiveServer,
    user: UserFactory,
    fake_llm: FakeLLM,
    agent_canvas: Path,
    browser_net: BrowserNet,
    canvas_port: int,
) -> None:
    alice = await user("alice", llm_model="unset-model", llm_api_key="")
    runner = await serve_canvas_elsewhere(agent_canvas, browser_net.host_ip, canvas_port, live.url)
    origin = f"http://{browser_net.host_ip}:{canvas_port}"
    page = canvas_page.page
    try:
        await page.goto(origin + "/")
        # "Add a backend": our URL, of type Cloud, with an API key.
        await page.get_by_test_id("onboarding-backend-name").fill("ACS")
        await page.get_by_test_id("onboarding-backend-host").fill(live.url)
        await page.get_by_test_id("onboarding-backend-kind-option-cloud").click()
        await page.get_by_test_id("onboarding-backend-api-key").fill(alice.key)
        await page.get_by_test_id("onboarding-backend-next").click()
        await onboard(page, fake_llm)
        await converse(page, fake_llm)
        await reopen_and_read_files(canvas_page, origin)
        conversation = await only_conversation(alice)
        proxied = await read_through_the_proxy(page, conversation)
        assert proxied == {"status": 200, "text": "hello-canvas\n"}
    finally:
        await runner.cleanup()
    # Every API call went to our origin with the key (CORS), none failed.
    assert all(json.dumps(c) for c in canvas_page.calls)
    assert canvas_page.failed() == []
    assert canvas_page.errors == []
