"""A scripted server speaking Anthropic's Messages API (`POST /v1/messages`), for proving that
the LLM gateway translates (real HTTP, no mocks).

    fake = FakeAnthropic(api_key="sk-ant-...")
    await fake.start()
    fake.script([anthropic_text("hi"), anthropic_tool_use("terminal", {"command": "ls"})])

Requests need `x-api-key` (when `api_key` is set) and `anthropic-version`; answers are
Messages (`content` blocks, `stop_reason`, `usage.input_tokens`/`output_tokens`), or with
`"stream": true` Anthropic's event stream (message_start, content_block_start/delta/stop,
message_delta with the output tokens, message_stop). `.requests` records every body.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Reply = dict[str, Any]


def anthropic_text(text: str, usage: tuple[int, int] = (30, 7)) -> Reply:
    return {"content": [{"type": "text", "text": text}], "usage": usage, "stop": "end_turn"}


def anthropic_tool_use(
    name: str, arguments: dict[str, Any], usage: tuple[int, int] = (40, 12)
) -> Reply:
    block = {"type": "tool_use", "name": name, "input": arguments}
    return {"content": [block], "usage": usage, "stop": "tool_use"}


@dataclass
class AnthropicRequest:
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FakeAnthropic:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None):
        self.host = host
        self.port = port
        self.api_key = api_key
        self.requests: list[AnthropicRequest] = []
        self._replies: deque[Reply] = deque()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeAnthropic:
        app = web.Application()
        for path in ("/v1/messages", "/messages"):
            app.router.add_post(path, self._messages)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def script(self, replies: Iterable[Reply]) -> None:
        self._replies = deque(replies)

    def _next(self) -> Reply:
        return self._replies.popleft() if self._replies else anthropic_text("(script exhausted)")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(AnthropicRequest(request.path, body, dict(request.headers)))
        if self.api_key is not None and request.headers.get("x-api-key") != self.api_key:
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return web.json_response({"type": "error", "error": error}, status=401)
        if "anthropic-version" not in request.headers:
            error = {"type": "invalid_request_error", "message": "anthropic-version missing"}
            return web.json_response({"type": "error", "error": error}, status=400)
        n = next(self._ids)
        reply = self._next()
        content = []
        for i, scripted in enumerate(reply["content"]):
            block = dict(scripted)
            if block["type"] == "tool_use":
                block["id"] = f"toolu_{n}_{i}"
            content.append(block)
        message = {
            "id": f"msg_fake_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": reply["stop"],
            "stop_sequence": None,
            "usage": {"input_tokens": reply["usage"][0], "output_tokens": reply["usage"][1]},
        }
        if not body.get("stream"):
            return web.json_response(message)
        return await self._stream(request, message)

    async def _stream(self, request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)

        async def send(kind: str, data: dict[str, Any]) -> None:
            payload = json.dumps({"type": kind, **data})
            await out.write(f"event: {kind}\ndata: {payload}\n\n".encode())

        start = dict(message, content=[], stop_reason=None)
        start["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 1}
        await send("message_start", {"message": start})
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                await send(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
                text = block["text"]
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    delta = {"type": "text_delta", "text": piece}
                    await send("content_block_delta", {"index": index, "delta": delta})
            else:
                head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                await send("content_block_start", {"index": index, "content_block": head})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                await send("content_block_delta", {"index": index, "delta": delta})
            await send("content_block_stop", {"index": index})
        await send(
            "message_delta",
            {
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
        await send("message_stop", {})
        await out.write_eof()
        return out
