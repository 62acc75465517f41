"""A conversation's workspace as its sandbox's agent server reports it (git changes, a diff, a
file), read through the control plane for the routes of conversations/runtime_routes.py.

The sandbox must be RUNNING (else Conflict: a read never resumes a paused sandbox). Paths are the
agent server's (absolute, or relative to the workspace), with one translation: Agent Canvas roots
a cloud conversation's files at `/workspace/project`, OpenHands Cloud's project directory, so
that prefix is read as this conversation's project directory (the spec's working_dir, or the
clone of its repository in it).
"""

from __future__ import annotations

from urllib.parse import urlencode

from controlplane.conversations.models import AppConversationInfo
from controlplane.errors import Conflict
from controlplane.sandboxes.models import SandboxStatus
from controlplane.sandboxes.reads import SandboxReads
from controlplane.sandboxes.runtime_http import RuntimeAnswer, RuntimeHttp, SandboxUnreachable
from controlplane.specs.models import AGENT_SERVER

CANVAS_ROOT = "/workspace/project"
DEFAULT_WORKING_DIR = "/workspace"
TIMEOUT = 30.0
PATH_PARAMS = ("path", "file_path")


def project_dir(working_dir: str, repository: str | None) -> str:
    return f"{working_dir}/{repository.rsplit('/', 1)[-1]}" if repository else working_dir


def translate(path: str, project: str) -> str:
    if path == CANVAS_ROOT or path.startswith(CANVAS_ROOT + "/"):
        return project + path[len(CANVAS_ROOT) :]
    return path


async def read(
    runtime: RuntimeHttp,
    sandboxes: SandboxReads,
    info: AppConversationInfo,
    agent_path: str,
    params: dict[str, str],
) -> RuntimeAnswer:
    """GET `agent_path` with `params` from the agent server of the conversation's sandbox.
    Raises Conflict (the sandbox is not RUNNING), SandboxUnreachable (no answer, or a 5xx)."""
    record = await sandboxes.record(info.sandbox_id)
    if record is None or record.status != SandboxStatus.RUNNING or AGENT_SERVER not in record.ports:
        status = record.status.value if record else "MISSING"
        raise Conflict(f"the conversation's sandbox is {status}: resume it to read its files")
    spec = sandboxes.spec_of(record)
    project = project_dir(
        spec.working_dir if spec else DEFAULT_WORKING_DIR, info.selected_repository
    )
    query = {k: translate(v, project) if k in PATH_PARAMS else v for k, v in params.items()}
    url = f"{sandboxes.agent_url(record)}{agent_path}?{urlencode(query)}"
    answer = await runtime.send("GET", url, record.session_api_key, timeout=TIMEOUT)
    if answer.status >= 500:
        raise SandboxUnreachable(f"the sandbox's agent server failed ({answer.status})")
    return answer
