"""The real OpenHands clients, unchanged, against a live control plane (issue 9):

- `openhands cloud -t …` exits 0 and its conversation really runs in a sandbox;
- `openhands login` completes through the device flow, approved over HTTP as in the page;
- the SDK's OpenHandsCloudWorkspace creates, resumes and cleans up a sandbox.

The model is tests/support/fake_llm.py on the sandbox network's gateway; the clients run from
the pinned venv (tests/support/openhands_clients.py) as subprocesses, while this test's event
loop serves the API.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.support.conversation_helpers import (
    LLM_KEY,
    UserFactory,
    of_kind,
    wait_finished,
)
from tests.support.fake_llm import FakeLLM, reply_finish, reply_tool_call
from tests.support.live_server import Api, LiveServer
from tests.support.openhands_clients import OpenHandsVenv, client_env, openhands_login, run
from tests.support.sandbox_helpers import OwnDocker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.clients,
    pytest.mark.usefixtures("sandbox_images"),
    # The CLI polls for its device code every second.
    pytest.mark.live_config(device_poll_interval=1),
]

HEX32 = re.compile(r"\b[0-9a-f]{32}\b")


async def test_openhands_cloud_runs_a_conversation_in_a_sandbox(
    openhands_venv: OpenHandsVenv,
    user: UserFactory,
    fake_llm: FakeLLM,
    own_docker: OwnDocker,
    tmp_path: Path,
) -> None:
    fake_llm.script(
        [
            reply_tool_call(
                "file_editor",
                {
                    "command": "create",
                    "path": "/workspace/hello.py",
                    "file_text": "print('hello from the sandbox')\n",
                },
            ),
            reply_tool_call("terminal", {"command": "cd /workspace && python3 hello.py"}),
            reply_finish("hello.py written and run"),
        ]
    )
    alice = await user("alice")
    home = tmp_path / "home"
    token = home / ".openhands" / "cloud" / "api_key.txt"
    token.parent.mkdir(parents=True)
    token.write_text(alice.key)  # as `openhands login` leaves it
    work = tmp_path / "project"  # not a git checkout: no repository is sent
    work.mkdir()

    code, out = await run(
        [
            openhands_venv.bin("openhands"),
            "cloud",
            "--server-url",
            alice.base,
            "-t",
            "Write hello.py and run it",
        ],
        client_env(openhands_venv, home),
        work,
        timeout=180,
    )
    assert code == 0, out
    assert "Cloud conversation created successfully" in out, out
    match = re.search(r"Conversation ID:\s*([0-9a-f]{32})", out)
    assert match, out
    conversation_id = match.group(1)
    assert f"{alice.base}/conversations/{conversation_id}" in out

    # The conversation is alice's and it really ran in a sandbox.
    events = await wait_finished(alice, conversation_id, within=120)
    message = of_kind(events, "MessageEvent")[0]
    assert message["source"] == "user"
    assert "Write hello.py and run it" in json.dumps(message)
    (run_action,) = [a for a in of_kind(events, "ActionEvent") if a["tool_name"] == "terminal"]
    (result,) = [
        o for o in of_kind(events, "ObservationEvent") if o["action_id"] == run_action["id"]
    ]
    assert result["observation"]["exit_code"] == 0
    assert "hello from the sandbox" in json.dumps(result["observation"])
    (container,) = own_docker.containers()
    listing = container.exec_run(["cat", "/workspace/hello.py"]).output.decode()
    assert "hello from the sandbox" in listing
    conversation = await alice.ok("GET", f"/api/v1/app-conversations/{conversation_id}")
    assert conversation["sandbox_status"] == "RUNNING"
    assert fake_llm.requests
    assert fake_llm.requests[0].authorization == f"Bearer {LLM_KEY}"
    assert LLM_KEY not in out


async def test_openhands_login_through_the_device_flow(
    openhands_venv: OpenHandsVenv, live: LiveServer, user: UserFactory, tmp_path: Path
) -> None:
    alice: Api = await user("alice")
    home = tmp_path / "home"
    home.mkdir()
    out = await openhands_login(openhands_venv, live.url, alice.key, home, within=90)
    assert "Logged into OpenHands Cloud" in out, out
    assert "Settings synchronized successfully" in out, out
    assert "LLM Model: fake-model" in out, out
    assert LLM_KEY not in out

    stored = (home / ".openhands" / "cloud" / "api_key.txt").read_text().strip()
    assert stored.startswith("acs_")
    assert stored != alice.key
    new = Api(alice.http, live.url, stored)
    me = await new.ok("GET", "/api/v1/users/me")
    assert (me["id"], me["is_admin"]) == ("alice", False)


WORKSPACE_SCRIPT = """
import json, sys
from openhands.workspace import OpenHandsCloudWorkspace

url, key = sys.argv[1], sys.argv[2]
created = OpenHandsCloudWorkspace(cloud_api_url=url, cloud_api_key=key, keep_alive=True)
sandbox_id = created._sandbox_id
print("CREATED " + json.dumps({"sandbox_id": sandbox_id, "host": created.host}), flush=True)
created.cleanup()  # keep_alive: the sandbox stays
sys.stdin.readline()  # the test pauses the sandbox meanwhile
resumed = OpenHandsCloudWorkspace(cloud_api_url=url, cloud_api_key=key, sandbox_id=sandbox_id)
resumed_info = {"sandbox_id": resumed._sandbox_id, "host": resumed.host}
print("RESUMED " + json.dumps(resumed_info), flush=True)
resumed.cleanup()
print("CLEANED", flush=True)
"""


async def _line(stream: asyncio.StreamReader, prefix: str, seen: list[str]) -> str:
    while True:
        line = (await stream.readline()).decode(errors="replace")
        assert line, "".join(seen)
        seen.append(line)
        if line.startswith(prefix):
            return line.removeprefix(prefix).strip()


async def test_cloud_workspace_creates_resumes_and_cleans_up(
    openhands_venv: OpenHandsVenv,
    live: LiveServer,
    user: UserFactory,
    own_docker: OwnDocker,
    tmp_path: Path,
) -> None:
    alice = await user("alice")
    script = tmp_path / "workspace_client.py"
    script.write_text(WORKSPACE_SCRIPT)
    proc = await asyncio.create_subprocess_exec(
        str(openhands_venv.python),
        str(script),
        live.url,
        alice.key,
        env=client_env(openhands_venv, tmp_path),
        cwd=tmp_path,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(240):
            created = json.loads(await _line(proc.stdout, "CREATED ", seen))
            sandbox_id = created["sandbox_id"]
            sandbox = await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
            assert sandbox["status"] == "RUNNING"
            assert sandbox["created_by_user_id"] == "alice"
            (agent,) = [u for u in sandbox["exposed_urls"] if u["name"] == "AGENT_SERVER"]
            assert created["host"] == agent["url"].rstrip("/")
            assert len(own_docker.containers()) == 1  # keep_alive kept it

            await alice.ok("POST", f"/api/v1/sandboxes/{sandbox_id}/pause")
            paused = await alice.ok("GET", f"/api/v1/sandboxes/{sandbox_id}")
            assert paused["status"] == "PAUSED"
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()

            resumed = json.loads(await _line(proc.stdout, "RESUMED ", seen))
            assert resumed == created
            seen.append((await proc.stdout.read()).decode(errors="replace"))
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out = "".join(seen)
    assert code == 0, out
    assert "CLEANED" in out, out
    assert "Cleanup error" not in out, out
    # cleanup() called DELETE /api/v1/sandboxes?sandbox_id=: gone, container and all.
    status, _ = await alice.call("GET", f"/api/v1/sandboxes/{sandbox_id}")
    assert status == 404
    assert own_docker.containers() == []
