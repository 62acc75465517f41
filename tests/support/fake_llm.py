"""A scripted OpenAI-compatible chat-completions server for tests (real HTTP, no mocks).

    fake = FakeLLM()                    # host=<sandbox gateway> to serve sandboxes too
    await fake.start()
    fake.script([reply_tool_call("terminal", {"command": "echo hi > f.txt"}),
                 reply_finish("done")])
    ... LLMConfig(model="fake", base_url=fake.base_url, api_key="sk-test") ...
    await fake.close()

Routes: ``POST /v1/chat/completions`` (also without ``/v1``) and ``GET /v1/models``.
``"stream": true`` gets OpenAI's server-sent events (usage last, when
``stream_options.include_usage`` asks for it).
Every answer carries ``usage`` (``prompt_tokens``/``completion_tokens`` settable globally or
per reply). ``.requests`` records every request (body, Authorization header, status answered).
When the script is exhausted the server answers ``when_exhausted``: ``"text"`` (a plain
text reply, the default), ``"repeat"`` (the last scripted reply again) or a reply of yours.
With ``.untooled`` set, requests that offer no tools (the official agent server's own title
generation, which races the agent's first call) get that reply and leave the script alone.
Sandboxes reach a fake bound to their network's gateway (``LiveServer.sandbox_gateway``) as
``fake.container_base_url`` (``http://host.docker.internal:<port>/v1``), when the control plane
opens that port to them (``ACS_SANDBOX_HOST_PORTS``, see tests/support/conversation_helpers.py).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Reply = dict[str, Any]
EXHAUSTED_TEXT = "(fake LLM: the script is exhausted)"


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> Any:
    """One tool call; ``arguments`` as a dict, or a raw string (e.g. invalid JSON)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": raw}}
    if call_id is not None:
        call["id"] = call_id
    return call


def reply_text(text: str, *, usage: tuple[int, int] | None = None) -> Reply:
    return {"message": {"role": "assistant", "content": text}, "usage": usage}


def reply_tool_calls(
    *calls: dict[str, Any], thought: str = "", usage: tuple[int, int] | None = None
) -> Reply:
    message = {"role": "assistant", "content": thought or None, "tool_calls": list(calls)}
    return {"message": message, "usage": usage}


def reply_tool_call(
    name: str,
    arguments: dict[str, Any] | str,
    *,
    thought: str = "",
    call_id: str | None = None,
    usage: tuple[int, int] | None = None,
) -> Reply:
    return reply_tool_calls(tool_call(name, arguments, call_id), thought=thought, usage=usage)


def reply_finish(message: str = "done", **kwargs: Any) -> Reply:
    return reply_tool_call("finish", {"message": message}, **kwargs)


@dataclass
class RecordedRequest:
    path: str
    body: dict[str, Any]
    authorization: str | None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    peer: str | None = None  # the caller's address (who called the model: a gateway, a sandbox)


@dataclass
class _Failure:
    status: int | None  # None: drop the connection
    body: str
    retry_after: float | None


class FakeLLM:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        prompt_tokens: int = 100,
        completion_tokens: int = 20,
        when_exhausted: Literal["text", "repeat"] | Reply = "text",
        api_key: str | None = None,
        model: str = "fake-model",
    ) -> None:
        self.host = host
        self.port = port
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.when_exhausted = when_exhausted
        self.api_key = api_key  # when set, other keys get a 401
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.untooled: Reply | None = None
        self._replies: deque[Reply] = deque()
        self._last: Reply | None = None
        self._failures: deque[_Failure] = deque()
        self._gate = asyncio.Event()
        self._gate.set()
        self._seen = asyncio.Event()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> FakeLLM:
        app = web.Application()
        for prefix in ("/v1", ""):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_get(prefix + "/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        self._gate.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeLLM:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def container_base_url(self) -> str:
        return f"http://host.docker.internal:{self.port}/v1"

    # --- what to answer -----------------------------------------------------------------

    def script(self, replies: Iterable[Reply]) -> None:
        """Replace the queued replies."""
        self._replies = deque(replies)

    def add(self, *replies: Reply) -> None:
        self._replies.extend(replies)

    @property
    def remaining(self) -> int:
        return len(self._replies)

    def fail_next(
        self, n: int = 1, status: int = 500, body: str = "", retry_after: float | None = None
    ) -> None:
        """Answer the next ``n`` requests with ``status`` (before any scripted reply)."""
        text = body or json.dumps({"error": {"message": f"fake failure {status}"}})
        self._failures.extend(_Failure(status, text, retry_after) for _ in range(n))

    def disconnect_next(self, n: int = 1) -> None:
        """Drop the connection of the next ``n`` requests without answering."""
        self._failures.extend(_Failure(None, "", None) for _ in range(n))

    def hold(self) -> None:
        """Keep every completion request waiting until :meth:`release`."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def wait_for_requests(self, n: int, timeout: float = 10.0) -> None:
        """Wait until at least ``n`` requests have arrived (TimeoutError after ``timeout``)."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < n:
                self._seen.clear()
                await self._seen.wait()

    # --- handlers ---------------------------------------------------------------------

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]}
        )

    def _next_reply(self) -> Reply:
        if self._replies:
            self._last = self._replies.popleft()
            return self._last
        if self.when_exhausted == "repeat" and self._last is not None:
            return self._last
        if isinstance(self.when_exhausted, dict):
            return self.when_exhausted
        return reply_text(EXHAUSTED_TEXT)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        record = RecordedRequest(
            path=request.path,
            body=body,
            authorization=request.headers.get("Authorization"),
            headers=dict(request.headers),
            peer=request.remote,
        )
        self.requests.append(record)
        self._seen.set()
        if self.api_key is not None and record.authorization != f"Bearer {self.api_key}":
            record.status = 401
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        if self._failures:
            failure = self._failures.popleft()
            if failure.status is None:
                assert request.transport is not None
                request.transport.close()
                record.status = 0
                return web.Response()
            record.status = failure.status
            headers = {"Retry-After": str(failure.retry_after)} if failure.retry_after else {}
            return web.Response(
                status=failure.status,
                text=failure.body,
                content_type="application/json",
                headers=headers,
            )
        await self._gate.wait()
        if self.untooled is not None and not body.get("tools"):
            reply = self.untooled
        else:
            reply = self._next_reply()
        completion = self._completion(body, reply)
        if body.get("stream") is True:
            return await self._stream(request, body, completion)
        return web.json_response(completion)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], completion: dict[str, Any]
    ) -> web.StreamResponse:
        """OpenAI's server-sent events: the role, the content in two pieces, each tool call,
        the finish reason, then (when asked) a usage chunk with no choices, then [DONE]."""
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        base = {k: completion[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"

        async def send(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
            await out.write(f"data: {json.dumps(chunk)}\n\n".encode())

        choice = completion["choices"][0]
        message = choice["message"]
        await send({"role": "assistant", "content": ""})
        text = message.get("content") or ""
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            if piece:
                await send({"content": piece})
        for i, call in enumerate(message.get("tool_calls") or []):
            await send({"tool_calls": [{"index": i, **call}]})
        await send({}, choice["finish_reason"])
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = dict(base, choices=[], usage=completion["usage"])
            await out.write(f"data: {json.dumps(usage)}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        n = next(self._ids)
        message = copy.deepcopy(reply["message"])
        for i, call in enumerate(message.get("tool_calls") or []):
            call.setdefault("id", f"call_{n}_{i}")
        prompt, completion = reply.get("usage") or (self.prompt_tokens, self.completion_tokens)
        return {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
