"""Finding 3 of issue 26: the translator (LiteLLM, a process of its own).

- Ambient credentials: the operator's environment holds provider keys and cloud credentials
  (OPENAI_API_KEY, AWS_*, ...). Mallory sets a `llm_base_url` of hers and no key, with models
  LiteLLM would find a key for in the environment: her provider never sees one, and the
  translator's environment holds none of them, nor anything of the control plane's (ACS_*).
- DNS rebinding: her name answers a public address when the gateway checks it and 127.0.0.1
  when LiteLLM looks it up to connect; the translator connects only where the policy allows,
  at the address it connects to, so the canary on 127.0.0.1 never sees a connection. Run with
  `controlplane serve` in a mount namespace whose resolv.conf names the test's DNS server.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from tests.security.conftest import GATEWAY, PROVIDER_KEY, MemberFactory
from tests.support.hostile_llm import Canary, HostileUpstream, contains_canary
from tests.support.live_server import LiveServer, free_port
from tests.support.processes import translators
from tests.support.rebinding_dns import RebindingDns
from tests.support.serve_process import Serve, serve_env

AMBIENT = {
    "OPENAI_API_KEY": "sk-ambient-openai-" + secrets.token_hex(8),
    "ANTHROPIC_API_KEY": "sk-ant-ambient-" + secrets.token_hex(8),
    "GEMINI_API_KEY": "ambient-gemini-" + secrets.token_hex(8),
    "AZURE_API_KEY": "ambient-azure-" + secrets.token_hex(8),
    "AWS_ACCESS_KEY_ID": "AKIAAMBIENT" + secrets.token_hex(4).upper(),
    "AWS_SECRET_ACCESS_KEY": "ambient-aws-secret-" + secrets.token_hex(8),
    "AWS_SESSION_TOKEN": "ambient-aws-session-" + secrets.token_hex(8),
    "ACS_SECRET_KEY": "ambient-acs-" + secrets.token_hex(8),
}
MODELS = ("m", "anthropic/claude-x", "bedrock/anthropic.claude-3-haiku-20240307-v1:0")


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


async def test_litellm_finds_no_credential_of_the_control_planes(
    gateway_server: Callable[..., Awaitable[LiveServer]],
    member: MemberFactory,
    hostile: HostileUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in AMBIENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # not a secret: what bedrock needs
    server = await gateway_server(llm_gateway_direct=False, llm_gateway_timeout=120)
    mallory = await member(server, "mallory")
    key = await mallory.gateway_key()
    for model in MODELS:
        await mallory.settings(llm_model=model, llm_base_url=hostile.base_url)  # and no key
        code, _, body = await mallory.ask(key, model=model)
        assert code != 500, (model, body)
    # The control: with a key of her own, the same call reaches her provider with that key.
    await mallory.settings(llm_model="m", llm_base_url=hostile.base_url, llm_api_key=PROVIDER_KEY)
    code, _, body = await mallory.ask(key)
    assert code == 200, body
    assert hostile.received[-1].headers.get("Authorization") == f"Bearer {PROVIDER_KEY}"
    seen = hostile.seen()
    for name, value in AMBIENT.items():
        assert value.encode() not in seen, f"{name} reached the user's provider"
    (pid,) = translators()
    environ = environ_of(pid)
    assert not {name for name in environ if name.startswith("ACS_") or name in AMBIENT}
    assert not any(value in environ.values() for value in AMBIENT.values())


@pytest.fixture
async def rebinding(canary: Canary) -> AsyncIterator[RebindingDns]:
    """A name that is public at the gateway's check, then this host's loopback."""
    server = await RebindingDns("rebind.acs.test", first="93.184.216.34", then="127.0.0.1").start()
    yield server
    server.close()


async def serve_resolving_with(
    dns: RebindingDns, env: dict[str, str], port: int, tmp_path: Path
) -> Serve:
    """`controlplane serve` in a mount namespace of its own whose /etc/resolv.conf names `dns`
    (the translator it starts inherits the namespace)."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(dns.resolv_conf())
    binary = Path(sys.executable).parent / "controlplane"
    script = f'mount --bind "{resolv}" /etc/resolv.conf && exec "{binary}" serve "$@"'
    process = await asyncio.create_subprocess_exec(
        "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
        "--host", "127.0.0.1", "--port", str(port),
        env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    return Serve(process, port)


@pytest.fixture
def environment(redis_url: str, test_prefix: str, tmp_path: Path) -> dict[str, str]:
    """`controlplane serve`'s, every call through the translator."""
    env = serve_env(redis_url, test_prefix, tmp_path / "data")
    env.update(ACS_LLM_GATEWAY_DIRECT="false", ACS_WARM_POOL="0", ACS_SANDBOX_SUBNET_SIZE="24")
    return env


async def test_a_name_that_rebinds_between_check_and_connect_gains_nothing(
    rebinding: RebindingDns,
    canary: Canary,
    user_headers: Callable[..., Awaitable[dict[str, str]]],
    environment: dict[str, str],
    tmp_path: Path,
) -> None:
    serve = await serve_resolving_with(rebinding, environment, free_port(), tmp_path)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=240)) as http:
            await serve.wait_healthy(http, within=60)
            mallory = await user_headers("mallory")
            settings = {
                "llm_model": "m",
                "llm_base_url": f"http://rebind.acs.test:{canary.port}/v1",
                "llm_api_key": PROVIDER_KEY,
            }
            async with http.post(serve.url + "/api/settings", json=settings, headers=mallory) as r:
                assert r.status == 200, await r.text()
            async with http.get(serve.url + "/api/keys/llm/byor", headers=mallory) as r:
                key = (await r.json())["key"]
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            async with http.post(
                serve.url + GATEWAY + "/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as r:
                status, answer = r.status, await r.read()
        assert rebinding.a_queries >= 2, (rebinding.a_queries, answer, serve.logs())
        assert not contains_canary(answer), answer
        assert canary.connections == 0
        assert status == 400, answer
        assert json.loads(answer)["error"]["code"] == "destination_refused"
    finally:
        await serve.kill()
