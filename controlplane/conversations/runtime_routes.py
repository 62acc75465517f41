"""A conversation's workspace as its sandbox's agent server reports it, read through the control
plane: `GET /api/v1/app-conversations/{id}/git/changes`, `/git/diff` and `/file` (OpenHands'
app server has the same three; Agent Canvas reads them in its cloud mode).

The caller must own the conversation (else 404) and its sandbox must be RUNNING (else 409: a
read never resumes a paused sandbox); paths are the agent server's, with Agent Canvas's
`/workspace/project` read as the conversation's project directory (conversations/workspace.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.parsing import parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.conversations.handler_deps import conversation_service
from controlplane.conversations.models import CONVERSATION_PARAM

routes = RouteTable(tag="app-conversations")
BASE = f"/api/v1/app-conversations/{CONVERSATION_PARAM}"


class GitQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4096, description="A directory (changes) or file")
    ref: str | None = Field(default=None, max_length=256, description="Compare with this ref")


class FileQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file_path: str = Field(min_length=1, max_length=4096)


class GitChange(BaseModel):
    status: str
    path: str


class GitDiff(BaseModel):
    modified: str
    original: str


async def _agent_call(
    request: web.Request, agent_path: str, params: dict[str, str]
) -> web.Response:
    cid = request.match_info["conversation_id"]
    service = conversation_service(request)
    answer = await service.read_workspace(principal_of(request), cid, agent_path, params)
    return answer.response()


def _git_params(query: GitQuery) -> dict[str, Any]:
    return {"path": query.path} | ({"ref": query.ref} if query.ref else {})


@routes.route(
    "GET",
    f"{BASE}/git/changes",
    summary="Changed files below `path` in the conversation's sandbox (git status)",
    query=GitQuery,
    response=list[GitChange],
    errors=(400, 404, 409, 502),
)
async def git_changes(request: web.Request) -> web.Response:
    return await _agent_call(
        request, "/api/git/changes", _git_params(parse_query(request, GitQuery))
    )


@routes.route(
    "GET",
    f"{BASE}/git/diff",
    summary="A file's content now and at the compared ref, in the conversation's sandbox",
    query=GitQuery,
    response=GitDiff,
    errors=(400, 404, 409, 502),
)
async def git_diff(request: web.Request) -> web.Response:
    query = parse_query(request, GitQuery)
    return await _agent_call(request, "/api/git/diff", _git_params(query))


@routes.route(
    "GET",
    f"{BASE}/file",
    summary="A file of the conversation's sandbox, as stored (its bytes)",
    query=FileQuery,
    errors=(400, 404, 409, 502),
)
async def read_file(request: web.Request) -> web.Response:
    query = parse_query(request, FileQuery)
    return await _agent_call(request, "/api/file/download", {"path": query.file_path})
