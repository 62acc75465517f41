"""`openhands login` (the real CLI 1.16.0) receives the user's LLM gateway key from
GET /api/keys/llm/byor, and its local agent completes a task through the gateway: the provider
key never reaches the user's machine.

The CLI writes its local agent from /api/v1/settings (the user's provider model and URL) and
the BYOR key; the gateway's URL and model come with that key from GET /api/keys/llm/byor
(`llm_model`, `llm_base_url`) and are applied with the CLI's own `--override-with-envs`
(LLM_BASE_URL, LLM_MODEL), the documented path (docs/llm-gateway.md#the-openhands-cli)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.conversation_helpers import LLM_KEY, UserFactory
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.live_server import Api, LiveServer
from tests.support.openhands_clients import OpenHandsVenv, client_env, openhands_login, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.clients,
    pytest.mark.usefixtures("sandbox_images"),
    # The CLI polls for its device code every second.
    pytest.mark.live_config(device_poll_interval=1),
]


async def test_openhands_login_gets_a_gateway_key_and_its_local_agent_uses_it(
    openhands_venv: OpenHandsVenv,
    live: LiveServer,
    user: UserFactory,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    alice: Api = await user("alice")  # fake-model at host.docker.internal, as sandboxes see it
    home = tmp_path / "home"
    home.mkdir()
    out = await openhands_login(openhands_venv, live.url, alice.key, home, within=120)
    assert "LLM API key retrieved: acs" in out, out
    assert "No LLM API key available" not in out
    assert LLM_KEY not in out

    cli_key = (home / ".openhands" / "cloud" / "api_key.txt").read_text().strip()
    cli = Api(alice.http, live.url, cli_key)
    me = await cli.ok("GET", "/api/keys/llm/byor")
    byor = me["key"]
    agent = json.loads((home / ".openhands" / "agent_settings.json").read_text())
    assert agent["llm"]["api_key"] == byor
    assert me["llm_model"] == "litellm_proxy/fake-model"
    assert me["llm_base_url"] == f"{live.url}/api/v1/llm-gateway"
    # users/me?expose_secrets answers the same only with a sandbox's session key too
    # (OpenHands' rule, tests/clients/test_sdk_158.py); the user's key alone is refused.
    assert (await cli.call("GET", "/api/v1/users/me?expose_secrets=true"))[0] == 401

    work = tmp_path / "project"
    work.mkdir()
    fake_llm.untooled = reply_finish("(untooled)")
    target = work / "local.txt"
    fake_llm.script(
        [
            # The CLI's agent asks the model for a security_risk with every action.
            reply_tool_call(
                "terminal",
                {"command": f"echo local-through-gateway > {target}", "security_risk": "LOW"},
            ),
            reply_finish("local.txt written"),
        ]
    )
    fake_llm.when_exhausted = reply_finish("done")
    env = client_env(openhands_venv, home) | {
        "LLM_BASE_URL": me["llm_base_url"],
        "LLM_MODEL": me["llm_model"],
    }
    code, output = await run(
        [
            openhands_venv.bin("openhands"),
            "--headless",
            "--override-with-envs",
            "-t",
            "Write local.txt",
        ],
        env,
        work,
        timeout=240,
    )
    assert code == 0, output
    assert target.exists(), output
    assert target.read_text().strip() == "local-through-gateway"
    # Every call reached the provider from the gateway, with the key only the gateway holds.
    tooled = [r for r in fake_llm.requests if r.body.get("tools")]
    assert len(tooled) >= 2
    assert {r.authorization for r in fake_llm.requests} == {f"Bearer {LLM_KEY}"}
    usage = await alice.ok("GET", "/api/v1/llm-gateway/usage")
    assert usage["requests"] == len(fake_llm.requests)
    for path in home.rglob("*"):
        if path.is_file():
            assert LLM_KEY not in path.read_text(errors="replace"), path
