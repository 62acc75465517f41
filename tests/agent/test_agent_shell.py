"""POST /api/bash/execute_bash_command (see test_agent_bash_events.py for the background
commands of start_bash_command)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.shell import pidfds_available, run_command
from tests.support.types import Client, ClientFactory

EXEC = "/api/bash/execute_bash_command"


async def execute(client: Client, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    resp = await client.post(EXEC, json=body, headers=auth)
    assert resp.status == 200, await resp.text()
    result: dict[str, Any] = await resp.json()
    return result


def process_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


async def test_exit_code_stdout_stderr(agent_client: Client, auth: dict[str, str]) -> None:
    result = await execute(agent_client, auth, command="echo out; echo err >&2; exit 7")
    # A BashOutput (as the official server answers) plus timed_out and truncated.
    assert {k: result[k] for k in ("kind", "exit_code", "stdout", "stderr")} == {
        "kind": "BashOutput",
        "exit_code": 7,
        "stdout": "out\n",
        "stderr": "err\n",
    }
    assert result["timed_out"] is False
    assert result["truncated"] is False
    assert len(result["command_id"]) == 32
    assert len(result["id"]) == 32


async def test_success_and_bash_features(agent_client: Client, auth: dict[str, str]) -> None:
    result = await execute(agent_client, auth, command="set -o pipefail; x=$((6*7)); echo $x | cat")
    assert result["exit_code"] == 0
    assert result["stdout"] == "42\n"


async def test_runs_in_workspace_by_default(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    result = await execute(agent_client, auth, command="pwd")
    assert result["stdout"].strip() == str(workspace)


async def test_cwd_relative_and_absolute(
    agent_client: Client, auth: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    (workspace / "sub").mkdir()
    result = await execute(agent_client, auth, command="pwd", cwd="sub")
    assert result["stdout"].strip() == str(workspace / "sub")
    result = await execute(agent_client, auth, command="pwd", cwd=str(tmp_path))
    assert result["stdout"].strip() == str(tmp_path)


async def test_missing_cwd_is_400(agent_client: Client, auth: dict[str, str]) -> None:
    resp = await agent_client.post(EXEC, json={"command": "pwd", "cwd": "nope"}, headers=auth)
    assert resp.status == 400
    assert "nope" in (await resp.json())["detail"]


async def test_stdin_is_closed(agent_client: Client, auth: dict[str, str]) -> None:
    result = await execute(agent_client, auth, command="cat; echo done", timeout=5)
    assert result["stdout"] == "done\n"
    assert not result["timed_out"]


async def test_session_keys_are_hidden_from_commands(
    agent_client: Client, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OH_SESSION_API_KEYS_0", "very-secret")
    monkeypatch.setenv("SESSION_API_KEY", "very-secret")
    monkeypatch.setenv("ACS_TEST_VISIBLE", "visible")
    result = await execute(agent_client, auth, command="env")
    assert "very-secret" not in result["stdout"]
    assert "ACS_TEST_VISIBLE=visible" in result["stdout"]


async def test_timeout_kills_process_group(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    # A grandchild in the background plus a foreground sleep: both must die.
    command = "sleep 120 & echo $! > bg.pid; echo started; sleep 120"
    started = time.monotonic()
    result = await execute(agent_client, auth, command=command, timeout=1)
    assert time.monotonic() - started < 10
    assert result["timed_out"] is True
    assert result["exit_code"] == -1
    assert result["stdout"] == "started\n"
    pid = int((workspace / "bg.pid").read_text())
    for _ in range(50):
        if process_gone(pid):
            break
        await asyncio.sleep(0.1)
    assert process_gone(pid), f"background process {pid} survived the timeout"


async def test_background_job_holding_pipes_does_not_block(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    started = time.monotonic()
    result = await execute(
        agent_client, auth, command="sleep 5 & echo $! > bg.pid; echo ready", timeout=30
    )
    assert time.monotonic() - started < 4
    assert result["exit_code"] == 0
    assert result["stdout"] == "ready\n"
    assert not result["timed_out"]
    os.kill(int((workspace / "bg.pid").read_text()), 9)


async def test_output_is_capped(make_agent_client: ClientFactory, auth: dict[str, str]) -> None:
    client = await make_agent_client(max_output_bytes=1000)
    result = await execute(
        client, auth, command="head -c 5000 /dev/zero | tr '\\0' a; echo -n small >&2"
    )
    assert result["stdout"] == "a" * 1000
    assert result["stderr"] == "small"
    assert result["truncated"] is True
    assert result["exit_code"] == 0


async def test_stderr_is_capped_too(make_agent_client: ClientFactory, auth: dict[str, str]) -> None:
    client = await make_agent_client(max_output_bytes=10)
    result = await execute(client, auth, command="echo -n 0123456789abc >&2; echo -n ok")
    assert result["stderr"] == "0123456789"
    assert result["stdout"] == "ok"
    assert result["truncated"] is True


async def test_default_cap_is_one_mebibyte(agent_client: Client, auth: dict[str, str]) -> None:
    result = await execute(agent_client, auth, command="yes | head -c 3000000")
    assert len(result["stdout"]) == 1024 * 1024
    assert result["truncated"] is True
    assert result["exit_code"] == 0


async def test_output_exactly_at_cap_is_not_truncated(
    make_agent_client: ClientFactory, auth: dict[str, str]
) -> None:
    client = await make_agent_client(max_output_bytes=4)
    result = await execute(client, auth, command="echo -n abcd")
    assert result["stdout"] == "abcd"
    assert result["truncated"] is False


async def test_invalid_utf8_is_replaced(agent_client: Client, auth: dict[str, str]) -> None:
    result = await execute(agent_client, auth, command="printf 'a\\xffb'")
    assert result["stdout"] == "a\ufffdb"


async def test_run_command_directly(tmp_path: Path) -> None:
    result = await run_command("echo $((1+1))", tmp_path, 5, max_output_bytes=100)
    assert result.exit_code == 0
    assert result.stdout == "2\n"


@pytest.mark.parametrize(
    ("body", "loc", "type_"),
    [
        ({}, ["body", "command"], "missing"),
        ({"command": 5}, ["body", "command"], "string_type"),
        ({"command": "ls", "timeout": 0}, ["body", "timeout"], "greater_than_equal"),
        ({"command": "ls", "timeout": 3601}, ["body", "timeout"], "less_than_equal"),
        ({"command": "ls", "timeout": "soon"}, ["body", "timeout"], "int_parsing"),
        ({"command": "ls", "cwd": 3}, ["body", "cwd"], "string_type"),
        ({"command": "ls", "bogus": 1}, ["body", "bogus"], "extra_forbidden"),
    ],
)
async def test_invalid_body_is_422(
    agent_client: Client,
    auth: dict[str, str],
    body: dict[str, Any],
    loc: list[str],
    type_: str,
) -> None:
    resp = await agent_client.post(EXEC, json=body, headers=auth)
    assert resp.status == 422
    detail = (await resp.json())["detail"]
    assert isinstance(detail, list)
    assert len(detail) == 1
    assert detail[0]["loc"] == loc
    assert detail[0]["type"] == type_
    assert isinstance(detail[0]["msg"], str)
    assert detail[0]["msg"]
    assert set(detail[0]) == {"loc", "msg", "type"}


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[1, 2]", b'"text"'])
async def test_malformed_body_is_422(
    agent_client: Client, auth: dict[str, str], raw: bytes
) -> None:
    resp = await agent_client.post(
        EXEC, data=raw, headers={**auth, "Content-Type": "application/json"}
    )
    assert resp.status == 422
    detail = (await resp.json())["detail"]
    assert isinstance(detail, list)
    assert detail
    assert detail[0]["loc"][0] == "body"
    assert {"loc", "msg", "type"} <= set(detail[0])


@pytest.mark.skipif(
    sys.version_info >= (3, 12) or not pidfds_available(),
    reason="3.12+ watches children through pidfds by itself; needs a kernel with pidfds",
)
async def test_commands_start_no_thread_of_their_own(
    agent_client: Client, auth: dict[str, str]
) -> None:
    """Python 3.11's default child watcher waits for every command in a thread of its own
    ("asyncio-waitpid-N"); the server watches its children through pid file descriptors on its loop
    instead, and their exit codes, output and time limits are the same."""

    async def threads_while_running() -> list[str]:
        await asyncio.sleep(0.7)  # the command below has started and still runs
        return [t.name for t in threading.enumerate()]

    running, threads = await asyncio.gather(
        execute(agent_client, auth, command="sleep 1.5; echo done"), threads_while_running()
    )
    assert running["stdout"] == "done\n"
    assert not [name for name in threads if "waitpid" in name], threads
    results = await asyncio.gather(
        *(execute(agent_client, auth, command=f"echo {n}; exit {n}") for n in range(5))
    )
    assert [(r["stdout"], r["exit_code"]) for r in results] == [(f"{n}\n", n) for n in range(5)]
    timed_out = await execute(agent_client, auth, command="sleep 30", timeout=1)
    assert timed_out["timed_out"] is True
    assert timed_out["exit_code"] == -1


@pytest.mark.parametrize(
    ("command", "why"),
    [("echo a\x00b", "embedded null byte"), ("echo \ud800", "surrogates not allowed")],
)
async def test_a_command_exec_cannot_take_is_answered_with_why(
    agent_client: Client, auth: dict[str, str], command: str, why: str
) -> None:
    """A string both readings of the body accept (the plain path's and the model's) that no
    process can be given: the answer says so, as a spawn that fails does (not a bare -1)."""
    result = await execute(agent_client, auth, command=command)
    assert result["exit_code"] == -1
    assert result["stdout"] == ""
    assert result["stderr"].startswith("Error executing command: ")
    assert why in result["stderr"]
