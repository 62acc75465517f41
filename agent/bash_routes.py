"""Routes of :mod:`agent.bash` under ``/api/bash`` (as the official agent server)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .bash import BashService, Command
from .bash_requests import EXECUTE, START, BashRequest, read_bash_request
from .config import CONFIG_KEY, AgentConfig
from .conversations.queries import choice_query, event_time, page, query_error, time_query
from .errors import ApiError
from .files import resolve_path

BASH_KEY = web.AppKey("bash", BashService)
MAX_IDS = 100


def _start(request: web.Request, body: BashRequest) -> Command:
    config: AgentConfig = request.app[CONFIG_KEY]
    cwd = resolve_path(config, body.cwd) if body.cwd else config.workspace
    if not cwd.is_dir():
        raise ApiError(400, f"Working directory does not exist: {cwd}")
    try:
        return request.app[BASH_KEY].start(body.command, cwd, body.timeout)
    except OSError as exc:
        raise ApiError(500, f"Could not start command: {exc.strerror or exc}") from exc


async def start_bash_command(request: web.Request) -> web.Response:
    body = await read_bash_request(request, START)
    return web.json_response(_start(request, body).event)


async def execute_bash_command(request: web.Request) -> web.Response:
    """Waits for the command: one ``BashOutput`` with all of it, plus ``timed_out`` and
    ``truncated`` (ours); ``stdout``/``stderr`` are strings, empty when there was none."""
    body = await read_bash_request(request, EXECUTE)
    record = _start(request, body)
    await record.done.wait()
    outputs = record.outputs
    final = outputs[-1] if outputs else {"id": uuid.uuid4().hex, "order": 0, "exit_code": -1}
    return web.json_response(
        {
            **final,
            "kind": "BashOutput",
            "command_id": record.id,
            "timestamp": final.get("timestamp", record.event["timestamp"]),
            "stdout": "".join(o["stdout"] or "" for o in outputs),
            "stderr": "".join(o["stderr"] or "" for o in outputs),
            "timed_out": record.timed_out,
            "truncated": record.truncated,
        }
    )


def _id_query(request: web.Request, name: str) -> str | None:
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        return uuid.UUID(raw).hex
    except ValueError:
        raise query_error(name, "Input should be a valid UUID", "uuid_parsing") from None


def _int_or_none(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise query_error(name, "Input should be a valid integer", "int_parsing") from None


async def search_bash_events(request: web.Request) -> web.Response:
    kind = request.query.get("kind__eq")
    if kind:
        choice_query(request, "kind__eq", "", ["BashCommand", "BashOutput"])
    command_id = _id_query(request, "command_id__eq")
    order_gt = _int_or_none(request, "order__gt")
    gte, lt = time_query(request, "timestamp__gte"), time_query(request, "timestamp__lt")
    order = choice_query(request, "sort_order", "TIMESTAMP", ["TIMESTAMP", "TIMESTAMP_DESC"])

    def matches(event: dict[str, Any]) -> bool:
        if kind and event["kind"] != kind:
            return False
        if command_id and command_id not in (event.get("command_id"), event["id"]):
            return False
        if order_gt is not None and (event["kind"] != "BashOutput" or event["order"] <= order_gt):
            return False
        if gte or lt:
            when = event_time(event)
            if when is None or (gte and when < gte) or (lt and when >= lt):
                return False
        return True

    events = [e for e in request.app[BASH_KEY].events() if matches(e)]
    if order == "TIMESTAMP_DESC":
        events.reverse()
    chunk, following = page(events, request, lambda e: str(e["id"]))
    return web.json_response({"items": chunk, "next_page_id": following})


async def get_bash_event(request: web.Request) -> web.Response:
    found = request.app[BASH_KEY].find(request.match_info["event_id"])
    if found is None:
        raise ApiError(404, "Not Found")
    return web.json_response(found)


async def batch_get_bash_events(request: web.Request) -> web.Response:
    ids = request.query.getall("event_ids", [])
    if len(ids) > MAX_IDS:
        raise query_error("event_ids", f"give at most {MAX_IDS} event ids")
    return web.json_response([request.app[BASH_KEY].find(i) for i in ids])


async def clear_bash_events(request: web.Request) -> web.Response:
    return web.json_response({"cleared_count": request.app[BASH_KEY].clear()})


async def stop_bash_command(request: web.Request) -> web.Response:
    if request.app[BASH_KEY].stop(request.match_info["command_id"]) is None:
        raise ApiError(404, "Not Found")
    return web.json_response({"success": True})


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[BASH_KEY].close()


def add_routes(app: web.Application) -> None:
    config = app[CONFIG_KEY]
    app[BASH_KEY] = BashService(config.max_output_bytes, config.post_exit_grace)
    app.cleanup_ctx.append(_lifecycle)
    router = app.router
    router.add_post("/api/bash/start_bash_command", start_bash_command)
    router.add_post("/api/bash/execute_bash_command", execute_bash_command)
    router.add_get("/api/bash/bash_events/search", search_bash_events)
    router.add_get("/api/bash/bash_events/", batch_get_bash_events)
    router.add_get("/api/bash/bash_events/{event_id}", get_bash_event)
    router.add_delete("/api/bash/bash_events", clear_bash_events)
    router.add_post("/api/bash/bash_commands/{command_id}/stop", stop_bash_command)
