"""The translator: a LiteLLM process next to the control plane (`python -m
controlplane.gateway.translator --socket PATH`), started by the gateway on first need.

It takes an OpenAI chat-completions request on a Unix socket that only the control plane's
user can open, with the upstream named in headers (`X-Acs-Model`: LiteLLM's model name,
`X-Acs-Api-Key`, `X-Acs-Api-Base`, `X-Acs-Timeout`) and the outbound rules the call is held to
(`X-Acs-Outbound`, controlplane/outbound/policy.py's Rules as JSON), calls the provider through
`litellm.acompletion` and answers in OpenAI's shape: JSON, or server-sent events ending in
`data: [DONE]` (with a final usage chunk). Provider errors keep their HTTP status, in OpenAI's
error shape. It never retries (the gateway does, for both paths) and stores nothing: the key
arrives with each request and is dropped with it.

Where LiteLLM connects: the process runs on `GuardedEventLoop` (controlplane/outbound/
event_loop.py), which checks every connection LiteLLM opens, at the address it connects to,
against the request's rules; a call that was refused a connection answers 400
`destination_refused` (and says why in `X-Acs-Refused`). Its environment is the minimal one
translator_process.py gives it: no key or credential of the control plane's for LiteLLM to
fall back on when a call brings none.

Why a process of its own: importing LiteLLM takes ~4.6 s and ~160 MB, and each call costs
~10 ms of CPU in LiteLLM's Python (measured, docs/llm-gateway.md); in the control plane's
process that would hold its event loop (and every other API call) for that long per model call.
It exits when its parent does.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import logging
import os
import resource
import signal
import sys
from typing import Any

from aiohttp import web

from controlplane.outbound.event_loop import GuardedEventLoop, current, refusals
from controlplane.outbound.policy import OutboundPolicy, Rules

log = logging.getLogger("acs.translator")

MAX_HEADER = 1 << 20
"""The rules travel in a header: the control plane's own socket may send them whole."""
_policies: dict[str, OutboundPolicy] = {}

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


def _policy_of(rules: str | None) -> OutboundPolicy | None:
    """The policy of a request's `X-Acs-Outbound` (parsed once per version of the rules);
    None without (then every connection is refused)."""
    if not rules:
        return None
    policy = _policies.get(rules)
    if policy is None:
        try:
            parsed = Rules.from_json(rules)
        except (ValueError, KeyError, TypeError):
            return None
        if len(_policies) >= 4:
            _policies.clear()
        policy = _policies[rules] = OutboundPolicy(parsed)
    return policy


def _refused(noted: list[str]) -> web.Response:
    reason = "; ".join(dict.fromkeys(noted))
    error = {"message": reason, "type": "invalid_request_error", "code": "destination_refused"}
    safe = reason.encode("ascii", "replace").decode()
    return web.json_response({"error": error}, status=400, headers={"X-Acs-Refused": safe})


def _status_of(exc: Exception) -> int:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status <= 599:
        return status
    return 502


async def _chat(request: web.Request) -> web.StreamResponse:
    import litellm  # noqa: PLC0415 (imported at start-up by main; here for the type checker)

    noted: list[str] = []
    current.set(_policy_of(request.headers.get("X-Acs-Outbound")))
    refusals.set(noted)
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
        if noted:
            return _refused(noted)
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
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2, max_field_size=MAX_HEADER)
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
    parser.add_argument("--memory-limit", type=int, default=0, help="RLIMIT_AS in bytes; 0: none")
    args = parser.parse_args()
    if args.memory_limit > 0:
        # Before LiteLLM is imported and before any provider answers: a hard limit that this
        # process cannot raise again. An allocation past it fails (MemoryError, the call
        # answers 502) or the process dies (the gateway starts another); the host's memory is
        # never at stake (a provider's gzip bomb, an endless body).
        resource.setrlimit(resource.RLIMIT_AS, (args.memory_limit, args.memory_limit))
    logging.basicConfig(level=logging.WARNING)
    # No network at import: LiteLLM would otherwise fetch its price list (and retry offline).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # translator_env sets it too
    import litellm  # noqa: PLC0415 (the heavy import, here and only here)

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    with asyncio.Runner(loop_factory=GuardedEventLoop) as runner:
        runner.run(serve(args.socket))
    # Served and shut down: the exit handlers (logging's, LiteLLM's callback flush) run, and the
    # interpreter's teardown of LiteLLM's 3,000 modules, 1 CPU-s and 1.5 to 5 s of every stop
    # (past the gateway's 5 s wait on a loaded host, which then killed it), is skipped.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
