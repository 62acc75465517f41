"""/api/v1/app-conversations, plus the legacy rename and delete under /api/conversations."""

from __future__ import annotations

import asyncio

from aiohttp import web

from controlplane.api.parsing import json_response, parse_body, parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.conversations.handler_deps import conversation_service as _service
from controlplane.conversations.models import (
    CONVERSATION_PARAM,
    TERMINAL_TASK,
    AppConversation,
    AppConversationPage,
    AppConversationStartRequest,
    AppConversationStartTask,
    AppConversationStartTaskPage,
    AppConversationUpdateRequest,
    ConfirmationRequest,
    ConversationBatchQuery,
    ConversationFilters,
    ConversationSearchQuery,
    RenameRequest,
    SendMessageRequest,
    TaskFilters,
    TaskSearchQuery,
)
from controlplane.sandboxes.models import Success

routes = RouteTable(tag="app-conversations")
BASE = "/api/v1/app-conversations"
STREAM_RECHECK_S = 5.0  # a stream-start with no update for this long re-reads its task
CONVERSATION = CONVERSATION_PARAM


@routes.route(
    "POST",
    BASE,
    summary="Start a conversation: returns its start task at once",
    body=AppConversationStartRequest,
    response=AppConversationStartTask,
    errors=(404, 409),
)
async def start_conversation(request: web.Request) -> web.Response:
    body = await parse_body(request, AppConversationStartRequest)
    return json_response(await _service(request).start(principal_of(request), body))


@routes.route(
    "POST",
    f"{BASE}/stream-start",
    summary="Start a conversation and stream every task update as a JSON array",
    body=AppConversationStartRequest,
    response=list[AppConversationStartTask],
    errors=(404, 409),
)
async def stream_start(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, AppConversationStartRequest)
    service = _service(request)
    principal = principal_of(request)
    task, updates = await service.start_watched(principal, body)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b"[\n" + task.model_dump_json().encode())
    last = task.status
    while True:
        try:
            snapshot = await asyncio.wait_for(updates.get(), STREAM_RECHECK_S)
        except TimeoutError:
            # The queue is this process's view of the task; the stored task is the truth. A
            # stream must not outlive the task's end because an update never reached it.
            snapshot = await service.task(principal, task.id)
            if snapshot is None or snapshot.status not in TERMINAL_TASK:
                continue
            if snapshot.status != last:
                await response.write(b",\n" + snapshot.model_dump_json().encode())
            break
        if snapshot is None:
            break
        last = snapshot.status
        await response.write(b",\n" + snapshot.model_dump_json().encode())
    await response.write(b"\n]")
    await response.write_eof()
    return response


@routes.route(
    "GET",
    BASE,
    summary="Get conversations by id (null for missing)",
    query=ConversationBatchQuery,
    response=list[AppConversation | None],
)
async def batch_conversations(request: web.Request) -> web.Response:
    query = parse_query(request, ConversationBatchQuery)
    return json_response(await _service(request).batch_get(principal_of(request), query.ids))


@routes.route(
    "GET",
    f"{BASE}/search",
    summary="Search conversations",
    query=ConversationSearchQuery,
    response=AppConversationPage,
)
async def search_conversations(request: web.Request) -> web.Response:
    query = parse_query(request, ConversationSearchQuery)
    return json_response(await _service(request).search(principal_of(request), query))


@routes.route(
    "GET", f"{BASE}/count", summary="Count conversations", query=ConversationFilters, response=int
)
async def count_conversations(request: web.Request) -> web.Response:
    query = parse_query(request, ConversationFilters)
    return json_response(await _service(request).count(principal_of(request), query))


@routes.route(
    "GET",
    f"{BASE}/start-tasks",
    summary="Get start tasks by id (null for missing)",
    query=ConversationBatchQuery,
    response=list[AppConversationStartTask | None],
)
async def batch_tasks(request: web.Request) -> web.Response:
    query = parse_query(request, ConversationBatchQuery)
    return json_response(await _service(request).batch_tasks(principal_of(request), query.ids))


@routes.route(
    "GET",
    f"{BASE}/start-tasks/search",
    summary="Search start tasks",
    query=TaskSearchQuery,
    response=AppConversationStartTaskPage,
)
async def search_tasks(request: web.Request) -> web.Response:
    query = parse_query(request, TaskSearchQuery)
    return json_response(await _service(request).search_tasks(principal_of(request), query))


@routes.route(
    "GET", f"{BASE}/start-tasks/count", summary="Count start tasks", query=TaskFilters, response=int
)
async def count_tasks(request: web.Request) -> web.Response:
    query = parse_query(request, TaskFilters)
    return json_response(await _service(request).count_tasks(principal_of(request), query))


@routes.route(
    "GET",
    f"{BASE}/{CONVERSATION}",
    summary="Get one conversation",
    response=AppConversation,
    errors=(404,),
)
async def get_conversation(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    return json_response(await _service(request).get(principal_of(request), cid))


@routes.route(
    "PATCH",
    f"{BASE}/{CONVERSATION}",
    summary="Change a conversation's title, public flag or repository; answers the conversation",
    body=AppConversationUpdateRequest,
    response=AppConversation,
    errors=(404,),
)
async def update_conversation(request: web.Request) -> web.Response:
    body = await parse_body(request, AppConversationUpdateRequest)
    cid = request.match_info["conversation_id"]
    return json_response(await _service(request).update(principal_of(request), cid, body))


@routes.route(
    "PATCH",
    f"/api/conversations/{CONVERSATION}",
    summary="Rename a conversation (legacy path)",
    body=RenameRequest,
    response=Success,
    errors=(404,),
)
async def rename_conversation_legacy(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, RenameRequest)
    cid = request.match_info["conversation_id"]
    await _service(request).rename(principal_of(request), cid, body.title)
    return json_response(Success())


@routes.route(
    "DELETE",
    f"{BASE}/{CONVERSATION}",
    summary="Delete a conversation (and its sandbox when no other conversation uses it)",
    response=Success,
    errors=(404,),
)
async def delete_conversation(request: web.Request) -> web.Response:
    cid = request.match_info["conversation_id"]
    await _service(request).delete(principal_of(request), cid)
    return json_response(Success())


@routes.route(
    "DELETE",
    f"/api/conversations/{CONVERSATION}",
    summary="Delete a conversation (legacy path)",
    response=Success,
    errors=(404,),
)
async def delete_conversation_legacy(request: web.Request) -> web.StreamResponse:
    return await delete_conversation(request)


@routes.route(
    "POST",
    f"{BASE}/{CONVERSATION}/events",
    summary="Send a message (resumes a paused sandbox first)",
    body=SendMessageRequest,
    response=Success,
    errors=(404, 409),
)
async def send_message(request: web.Request) -> web.Response:
    body = await parse_body(request, SendMessageRequest)
    cid = request.match_info["conversation_id"]
    await _service(request).send_message(principal_of(request), cid, body)
    return json_response(Success())


@routes.route(
    "POST",
    f"{BASE}/{CONVERSATION}/respond_to_confirmation",
    summary="Approve or reject the pending action (confirmation mode)",
    body=ConfirmationRequest,
    response=Success,
    errors=(404, 409),
)
async def respond(request: web.Request) -> web.Response:
    body = await parse_body(request, ConfirmationRequest)
    cid = request.match_info["conversation_id"]
    await _service(request).respond(principal_of(request), cid, body.accept, body.reason)
    return json_response(Success())


@routes.route(
    "POST",
    f"{BASE}/{CONVERSATION}/pause",
    summary="Pause the agent after its current step",
    response=Success,
    errors=(404, 409),
)
async def pause(request: web.Request) -> web.Response:
    await _service(request).pause(principal_of(request), request.match_info["conversation_id"])
    return json_response(Success())


@routes.route(
    "POST",
    f"{BASE}/{CONVERSATION}/run",
    summary="Run the agent again",
    response=Success,
    errors=(404, 409),
)
async def run(request: web.Request) -> web.Response:
    await _service(request).run(principal_of(request), request.match_info["conversation_id"])
    return json_response(Success())
