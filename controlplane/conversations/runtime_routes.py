"""A conversation's workspace as its sandbox's agent server reports it, read through the control
plane: `GET /api/v1/app-conversations/{id}/git/changes`, `/git/diff` and `/file` (OpenHands'
app server has the same three; Agent Canvas reads them in its cloud mode).

The caller must own the conversation (else 404) and its sandbox must be RUNNING (else 409: a
read never resumes a paused sandbox). Paths are the agent server's (absolute, or relative to
the workspace), with one translation: Agent Canvas roots a cloud conversation's files at
`/workspace/project`, OpenHands Cloud's project directory, so that prefix is read as this
conversation's project directory (the spec's working_dir, or the clone of its repository in it).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from controlplane import keys
from controlplane.api.parsing import parse_query
from controlplane.api.routing import RouteTable
from controlplane.auth.identity import principal_of
from controlplane.conversations.handler_deps import conversation_service
from controlplane.conversations.models import CONVERSATION_PARAM
from controlplane.errors import Conflict
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.runtime_http import SandboxUnreachable
from controlplane.specs.models import AGENT_SERVER

routes = RouteTable(tag="app-conversations")
BASE = f"/api/v1/app-conversations/{CONVERSATION_PARAM}"
CANVAS_ROOT = "/workspace/project"
TIMEOUT = 30.0


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


def project_dir(working_dir: str, repository: str | None) -> str:
    return f"{working_dir}/{repository.rsplit('/', 1)[-1]}" if repository else working_dir


def translate(path: str, project: str) -> str:
    if path == CANVAS_ROOT or path.startswith(CANVAS_ROOT + "/"):
        return project + path[len(CANVAS_ROOT) :]
    return path


async def _agent_call(
    request: web.Request, agent_path: str, params: dict[str, str]
) -> web.Response:
    service = conversation_service(request)
    info = await service.owned(principal_of(request), request.match_info["conversation_id"])
    record = await service.sandboxes.store.get(info.sandbox_id)
    if record is None or record.status != SandboxStatus.RUNNING or AGENT_SERVER not in record.ports:
        status = record.status.value if record else "MISSING"
        raise Conflict(f"the conversation's sandbox is {status}: resume it to read its files")
    spec = service.sandboxes.catalog.find(record.spec_id)
    project = project_dir(spec.working_dir if spec else "/workspace", info.selected_repository)
    query = {
        k: translate(v, project) if k in ("path", "file_path") else v for k, v in params.items()
    }
    url = f"{service.sandboxes.agent_url(record)}{agent_path}?{urlencode(query)}"
    answer = await request.app[keys.RUNTIME_HTTP].send(
        "GET", url, record.session_api_key, timeout=TIMEOUT
    )
    if answer.status >= 500:
        raise SandboxUnreachable(f"the sandbox's agent server failed ({answer.status})")
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
