"""What a boot loads: `python -m agent` answers /health and its first command without pydantic or
the conversations' code (agent/README.md, "Boot"), which load at their first use; and the
bash bodies read without pydantic are read as the pydantic models read them."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.bash import Command
from agent.bash_models import ExecuteBashRequest, StartBashRequest
from agent.bash_requests import EXECUTE, START, BashRequest, TimeoutRule, plain_request
from agent.bash_routes import BASH_KEY
from agent.conversations import mount
from agent.conversations.routes import handlers
from controlplane.agent_protocol.kinds import warm_up
from controlplane.specs.models import SandboxSpec
from tests.support.live_server import free_port
from tests.support.types import ClientFactory

KEY = "boot-test-key"
EXEC = "/api/bash/execute_bash_command"
# Modules a boot must not import before they are used: pydantic, and what needs it.
DEFERRED = re.compile(
    r"^(pydantic|pydantic_core|agent\.validation|agent\.bash_models"
    r"|agent\.conversations\.(routes|service|models|conversation))$"
)


class Server:
    """`python -X importtime -P -m agent` on a port of its own, its stderr in a file; `stop()`
    lists the modules it imported (its importtime lines)."""

    def __init__(self, workspace: Path, state_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OH_", "SESSION_API"))}
        env.update(
            OH_SESSION_API_KEYS_0=KEY, ACS_STATE_DIR=str(state_dir), PYTHONDONTWRITEBYTECODE="1"
        )
        command = [sys.executable, "-X", "importtime", "-P", "-m", "agent"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--workspace", str(workspace)]
        self.log = log
        with log.open("w") as stderr:
            self.process = subprocess.Popen(command, env=env, stderr=stderr, cwd=workspace)

    async def wait_healthy(self, http: aiohttp.ClientSession) -> None:
        async with asyncio.timeout(30):
            while True:
                try:
                    async with http.get(f"{self.url}/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    pass
                assert self.process.poll() is None, "the agent server exited"
                await asyncio.sleep(0.02)

    async def run(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"X-Session-API-Key": KEY}
        async with http.post(f"{self.url}{EXEC}", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            result: dict[str, Any] = await resp.json()
            return result

    def stop(self) -> set[str]:
        """Stops the server; every module it imported."""
        self.process.terminate()
        self.process.wait(timeout=30)
        return {
            m.group(1)
            for line in self.log.read_text().splitlines()
            if (m := re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", line))
        }


async def test_boot_and_first_command_load_no_pydantic(
    http: aiohttp.ClientSession, workspace: Path, state_dir: Path, tmp_path: Path
) -> None:
    server = Server(workspace, state_dir, tmp_path / "stderr")
    try:
        await server.wait_healthy(http)
        output = await server.run(http, {"command": "echo interactive", "timeout": 30})
        assert (output["stdout"], output["exit_code"]) == ("interactive\n", 0)
        async with http.get(f"{server.url}/server_info") as resp:
            assert (await resp.json())["usable_tools"][0] == "terminal"
    finally:
        imported = server.stop()
    assert "agent.bash_routes" in imported  # the log is read: the server's own modules are in it
    assert sorted(m for m in imported if DEFERRED.match(m)) == []


async def test_the_deferred_code_loads_at_its_first_use(
    http: aiohttp.ClientSession, workspace: Path, state_dir: Path, tmp_path: Path
) -> None:
    server = Server(workspace, state_dir, tmp_path / "stderr")
    try:
        await server.wait_healthy(http)
        # "5" is not an integer: the model converts it, as it always did.
        output = await server.run(http, {"command": "echo converted", "timeout": "5"})
        assert output["stdout"] == "converted\n"
        headers = {"X-Session-API-Key": KEY}
        async with http.get(f"{server.url}/api/conversations/count", headers=headers) as resp:
            assert await resp.json() == 0
    finally:
        imported = server.stop()
    assert {"pydantic", "agent.bash_models", "agent.conversations.service"} <= imported


async def test_stored_conversations_load_the_code_at_start(
    make_agent_client: ClientFactory, state_dir: Path
) -> None:
    client = await make_agent_client()
    assert not client.app[mount.CONVERSATIONS].loaded
    assert (await client.get("/health")).status == 200
    assert not client.app[mount.CONVERSATIONS].loaded
    await client.close()

    (state_dir / "conversations" / ("0" * 32)).mkdir(parents=True)  # a fork's, kept
    restarted = await make_agent_client()
    assert restarted.app[mount.CONVERSATIONS].loaded  # restored before any request
    assert restarted.app[mount.CONVERSATIONS].service.conversations == {}


async def test_a_warm_pool_member_is_warmed_with_the_conversations_code_loaded(
    make_agent_client: ClientFactory, api_keys: tuple[str, ...]
) -> None:
    # The pool warms a member before it is ready (controlplane/sandboxes/pool.py): a claim's
    # first conversation then waits for no import, its first command pays no first time.
    client = await make_agent_client()
    spec = SandboxSpec.model_validate(
        {"id": "boot", "image": "x", "exposed_ports": {"AGENT_SERVER": 8000}}
    )
    assert not client.app[mount.CONVERSATIONS].loaded
    bash = client.app[BASH_KEY]
    started: list[str] = []
    run = bash.start

    def start(command: str, cwd: Path, timeout: float) -> Command:
        started.append(command)
        return run(command, cwd, timeout)

    bash.start = start  # type: ignore[method-assign]
    await warm_up(spec, str(client.make_url("")).rstrip("/"), api_keys[0])
    assert client.app[mount.CONVERSATIONS].loaded
    # Its first command run (the shell's first exec paid), and nothing of it left to see.
    assert started == ["true"]
    found = await client.get(
        "/api/bash/bash_events/search", headers={"X-Session-API-Key": api_keys[0]}
    )
    assert (await found.json())["items"] == []


def test_every_conversations_route_has_its_handler() -> None:
    assert sorted(handlers()) == sorted(mount.ROUTES)


TIMEOUTS: list[Any] = [
    None,
    1,
    30,
    60,
    300,
    3600,
    3601,
    86_400,
    86_401,
    0,
    -1,
    True,
    5.0,
    "5",
    2**70,
]
BODIES: list[Any] = [
    {"command": "echo hi"},
    {"command": ""},
    {"command": "a\ud800b"},  # a lone surrogate, as json.loads makes from "\\ud800"
    {"command": "ls", "cwd": None},
    {"command": "ls", "cwd": "sub"},
    {"command": "ls", "cwd": 5},
    {"command": 5},
    {"command": None},
    {"command": ["ls"]},
    {"cwd": "x"},
    {},
    {"command": "ls", "extra": 1},
    [],
    "ls",
    5,
]


@pytest.mark.parametrize(
    ("rule", "model"), [(START, StartBashRequest), (EXECUTE, ExecuteBashRequest)]
)
def test_plain_bodies_are_read_as_the_model_reads_them(
    rule: TimeoutRule, model: type[StartBashRequest]
) -> None:
    taken = 0
    for base in BODIES:
        for timeout in TIMEOUTS:
            with_timeout = isinstance(base, dict) and timeout is not None
            body = {**base, "timeout": timeout} if with_timeout else base
            plain = plain_request(body, rule)
            if plain is None:
                continue  # the model decides, as before
            taken += 1
            expected = model.model_validate(body)
            assert plain == BashRequest(expected.command, expected.cwd, expected.timeout), body
    assert taken >= 20  # the plain path is taken for the ordinary bodies


async def test_bash_bodies_off_the_plain_path_get_the_models_answers(
    make_agent_client: ClientFactory, auth: dict[str, str]
) -> None:
    client = await make_agent_client()
    resp = await client.post(EXEC, json={"command": "true", "timeout": 3601}, headers=auth)
    assert resp.status == 422
    assert (await resp.json())["detail"] == [
        {
            "loc": ["body", "timeout"],
            "msg": "Input should be less than or equal to 3600",
            "type": "less_than_equal",
        }
    ]
    resp = await client.post(EXEC, json={"command": "echo $0", "timeout": True}, headers=auth)
    assert resp.status == 200  # the model's reading: true is 1 (s)
    assert (await resp.json())["stdout"] == "bash\n"
    resp = await client.post(EXEC, data=b"{not json", headers=auth)
    assert resp.status == 422
    assert (await resp.json())["detail"][0]["type"] == "json_invalid"
