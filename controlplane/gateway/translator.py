"""The translator: a LiteLLM process next to the control plane (`python -m
controlplane.gateway.translator --socket PATH`), started by the gateway on first need.

It takes an OpenAI chat-completions request on a Unix socket that only the control plane's
user can open, with the upstream named in headers (`X-Acs-Model`: LiteLLM's model name,
`X-Acs-Api-Key`, `X-Acs-Api-Base`, `X-Acs-Timeout`), calls the provider through
`litellm.acompletion` and answers in OpenAI's shape: JSON, or server-sent events ending in
`data: [DONE]` (with a final usage chunk). Provider errors keep their HTTP status, in OpenAI's
error shape. It never retries (the gateway does, for both paths) and stores nothing: the key
arrives with each request and is dropped with it.

Why a process of its own: importing LiteLLM takes ~4.6 s and ~160 MB, and each call costs
~10 ms of CPU in LiteLLM's Python (measured, docs/llm-gateway.md); in the control plane's
process that would hold its event loop (and every other API call) for that long per model call.
It exits when its parent does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
from typing import Any

from aiohttp import web

log = logging.getLogger("acs.translator")

#: The OpenAI chat-completions parameters forwarded to LiteLLM (drop_params removes those a
#: provider does not take); anything else in a request is ignored.
PARAMS = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "response_format",
        "logprobs",
        "top_logprobs",
        "user",
        "reasoning_effort",
        "thinking",
    }
)


def _error(status: int, message: str, kind: str = "upstream_error") -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": kind}}
    return web.json_response(body, status=status)


def _status_of(exc: Exception) -> int:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status <= 599:
        return status
    return 502


async def _chat(request: web.Request) -> web.StreamResponse:
    import litellm  # noqa: PLC0415 (imported at start-up by main; here for the type checker)

    body = await request.json()
    stream = bool(body.get("stream"))
    kwargs: dict[str, Any] = {k: v for k, v in body.items() if k in PARAMS}
    kwargs.update(
        model=request.headers["X-Acs-Model"],
        api_key=request.headers.get("X-Acs-Api-Key") or None,
        api_base=request.headers.get("X-Acs-Api-Base") or None,
        timeout=float(request.headers.get("X-Acs-Timeout", "600")),
        num_retries=0,
        drop_params=True,
    )
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    try:
        response = await litellm.acompletion(**kwargs)
    except Exception as exc:
        return _error(_status_of(exc), f"{type(exc).__name__}: {exc}")
    if not stream:
        data = response.model_dump(exclude_none=True)
        headers = {}
        cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
        if isinstance(cost, int | float):
            headers["X-Acs-Cost"] = repr(float(cost))
        return web.json_response(data, headers=headers)
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    try:
        async for chunk in response:
            data = chunk.model_dump(exclude_none=True)
            await out.write(f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
    except Exception as exc:
        error = {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "upstream_error"}}
        await out.write(f"data: {json.dumps(error)}\n\n".encode())
    await out.write_eof()
    return out


async def _health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """An orphan (its control plane died without stopping it) exits within a second."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1)


async def serve(socket_path: str) -> None:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/chat/completions", _chat)
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2)
    await runner.setup()
    old = os.umask(0o177)  # the socket: this user only
    try:
        site = web.UnixSite(runner, socket_path)
        await site.start()
    finally:
        os.umask(old)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_watch_parent(os.getppid(), stop))
    await stop.wait()
    watcher.cancel()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # No network at import: LiteLLM would otherwise fetch its price list (and retry offline).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # noqa: PLC0415 (the heavy import, here and only here)

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    asyncio.run(serve(args.socket))


if __name__ == "__main__":
    main()
