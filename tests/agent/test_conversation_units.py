"""Unit tests: the editor, output capping, LLM answer parsing, webhook batching."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.conversations.editor import EditorArgs, EditorError, run_editor
from agent.conversations.llm import parse_response
from agent.conversations.tools import ToolArgumentsError, Toolbox, ToolContext, cap_stream
from agent.conversations.webhooks import WebhookSender


def edit(tmp_path: Path, **args: Any) -> str:
    return run_editor(EditorArgs.model_validate(args), tmp_path).text


def test_editor_insert_view_range_and_directories(tmp_path: Path) -> None:
    edit(tmp_path, command="create", path="a.txt", file_text="one\ntwo")
    edit(tmp_path, command="insert", path="a.txt", insert_line=2, new_str="three")
    assert (tmp_path / "a.txt").read_text() == "one\ntwo\nthree\n"
    edit(tmp_path, command="insert", path="a.txt", insert_line=1, new_str="1.5\n")
    assert (tmp_path / "a.txt").read_text() == "one\n1.5\ntwo\nthree\n"
    view = edit(tmp_path, command="view", path="a.txt", view_range=[2, 3])
    assert view.endswith("     2\t1.5\n     3\ttwo")
    assert edit(tmp_path, command="view", path="a.txt", view_range=[4, -1]).endswith("4\tthree")
    with pytest.raises(EditorError, match="insert_line 9"):
        edit(tmp_path, command="insert", path="a.txt", insert_line=9, new_str="x")
    with pytest.raises(EditorError, match="view_range"):
        edit(tmp_path, command="view", path="a.txt", view_range=[3, 2])
    with pytest.raises(EditorError, match="already exists"):
        edit(tmp_path, command="create", path="a.txt", file_text="")
    with pytest.raises(EditorError, match="did not appear verbatim"):
        edit(tmp_path, command="str_replace", path="a.txt", old_str="nope", new_str="x")

    (tmp_path / "d/e/f").mkdir(parents=True)
    (tmp_path / "d/e/f/deep.txt").write_text("")
    (tmp_path / "d/.hidden").write_text("")
    listing = edit(tmp_path, command="view", path="d")
    assert f"{tmp_path}/d/e/" in listing
    assert f"{tmp_path}/d/e/f/" in listing
    assert "deep.txt" not in listing
    assert ".hidden" not in listing


def test_editor_keeps_crlf_and_refuses_binary(tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes(b"a\r\nb\r\n")
    edit(tmp_path, command="str_replace", path="w.txt", old_str="b", new_str="c")
    assert (tmp_path / "w.txt").read_bytes() == b"a\r\nc\r\n"
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(EditorError, match="not a UTF-8 text file"):
        edit(tmp_path, command="view", path="bin")


def test_cap_stream_keeps_head_and_tail() -> None:
    text = "a" * 20_000 + "b" * 20_000
    capped, cut = cap_stream(text)
    assert cut
    assert capped.startswith("a" * 15_000)
    assert capped.endswith("b" * 15_000)
    assert "[... 10000 characters cut ...]" in capped
    assert cap_stream("short") == ("short", False)


async def test_terminal_output_is_capped_per_stream(tmp_path: Path) -> None:
    toolbox = Toolbox(ToolContext(working_dir=tmp_path, post_exit_grace=0.2), {"terminal"})
    action = toolbox.check("terminal", '{"command": "head -c 50000 /dev/zero | tr \'\\\\0\' x"}')
    result = await toolbox.run("terminal", action)
    assert "characters cut" in result.model_text
    assert len(result.model_text) < 31_000
    assert result.model_text.endswith("[Command finished with exit code 0]")
    result = await toolbox.run(
        "terminal", toolbox.check("terminal", '{"command": "sleep 5", "timeout": 1}')
    )
    assert result.observation["timeout"] is True
    assert result.observation["exit_code"] is None
    assert result.observation["metadata"]["exit_code"] == -1
    result = await toolbox.run(
        "terminal", toolbox.check("terminal", '{"command": "cat", "is_input": true}')
    )
    assert result.observation["is_error"] is True
    with pytest.raises(ToolArgumentsError, match="unknown tool"):
        toolbox.check("nope", "{}")
    with pytest.raises(ToolArgumentsError, match="unknown tool"):
        toolbox.check("file_editor", "{}")  # not enabled for this toolbox
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        toolbox.check("terminal", "[1]")


def test_parse_response_variants() -> None:
    parsed = parse_response(
        {
            "choices": [
                {
                    "message": {
                        "content": [{"type": "text", "text": "hi"}],
                        "tool_calls": [{"function": {"name": "finish", "arguments": {"m": 1}}}],
                    }
                }
            ]
        }
    )
    assert parsed.content == "hi"
    assert parsed.tool_calls[0].arguments == '{"m": 1}'
    assert parsed.tool_calls[0].id.startswith("call_")
    assert parsed.prompt_tokens == 0
    with pytest.raises(ValueError, match="unexpected chat completion answer"):
        parse_response({"choices": []})


@pytest.fixture
async def slow_receiver() -> AsyncIterator[tuple[str, list[Any], asyncio.Event]]:
    """Receiver whose first answer waits for ``gate``; records the bodies."""
    bodies: list[Any] = []
    gate = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) == 1:
            await gate.wait()
        return web.json_response({"success": True})

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/hooks", bodies, gate
    gate.set()
    await runner.cleanup()


async def test_webhook_sender_batches_what_queued_in_order(
    slow_receiver: tuple[str, list[Any], asyncio.Event],
) -> None:
    url, bodies, gate = slow_receiver
    async with aiohttp.ClientSession() as session:
        sender = WebhookSender(session, url, "c1", "key")
        sender.start()
        sender.send_event({"n": 0})
        async with asyncio.timeout(5):
            while not bodies:  # noqa: ASYNC110 - the receiver has no event of its own
                await asyncio.sleep(0.005)
        for n in range(1, 5):
            sender.send_event({"n": n})
        sender.send_info({"status": "a"})
        sender.send_info({"status": "b"})
        sender.send_event({"n": 5})
        gate.set()
        await sender.close(flush_timeout=5)
    assert bodies == [
        [{"n": 0}],
        [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}],
        {"status": "b"},  # consecutive ConversationInfos: only the newest is sent
        [{"n": 5}],
    ]
