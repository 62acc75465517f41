"""``GET /api/git/changes`` and ``GET /api/git/diff`` (as the official agent server).

``changes?path=<repo dir>`` lists what differs from the repository's base: the current branch's
upstream (``origin/<branch>``), else the merge base with ``origin/HEAD``, else ``HEAD``, else
the empty tree (a repository without commits). Untracked files count as ADDED. Repositories one
level below ``path`` (``/workspace/<repo>``, where the control plane clones) are included with
their directory as prefix. A path that is no repository has no changes (``[]``).

``diff?path=<file>`` answers ``{"original": <file at the base>, "modified": <file now>}``
(``""`` for a side where the file does not exist; both null outside a repository).
Both also take the path in the URL (``/api/git/changes/<path>``) for older clients.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from .config import CONFIG_KEY
from .errors import ApiError, missing_query
from .files import resolve_path
from .shell import command_env

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
GIT_TIMEOUT = 30.0
MAX_DIFF_FILE = 1024 * 1024
STATUS = {"M": "UPDATED", "T": "UPDATED", "U": "UPDATED", "A": "ADDED", "D": "DELETED"}


class GitFailed(Exception):
    pass


async def git(repo: Path, *args: str, check: bool = True) -> str:
    """``git -C repo args``; GitFailed when it exits non-zero (with ``check``) or hangs."""
    env = {**command_env(), "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    process = await asyncio.create_subprocess_exec(
        "git",
        "-c",
        "safe.directory=*",
        "-c",
        "core.quotepath=off",
        "-C",
        str(repo),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), GIT_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise GitFailed(f"git {args[0]} timed out") from None
    if check and process.returncode != 0:
        raise GitFailed(err.decode(errors="replace").strip() or f"git {args[0]} failed")
    return out.decode(errors="replace")


def _existing_dir(path: Path) -> Path | None:
    directory = path if path.is_dir() else path.parent
    return directory if directory.is_dir() else None


def _nested_repos(path: Path) -> tuple[bool, list[Path]]:
    """Whether ``path`` is a repository's top, and the repositories right below it."""
    if not path.is_dir():
        return False, []
    nested = sorted(p for p in path.iterdir() if p.is_dir() and (p / ".git").exists())
    return (path / ".git").exists(), nested


def _read_text(path: Path) -> tuple[str, int]:
    """(content, size in bytes) of a file; ("", 0) when it is missing or unreadable."""
    try:
        data = path.read_bytes() if path.is_file() else b""
    except OSError:
        return "", 0
    return data.decode("utf-8", errors="replace"), len(data)


def _relative(path: Path | str, start: Path | str) -> str:
    return os.path.relpath(path, start)


async def repo_root(path: Path) -> Path | None:
    directory = _existing_dir(path)
    if directory is None:
        return None
    try:
        return Path((await git(directory, "rev-parse", "--show-toplevel")).strip())
    except GitFailed:
        return None


async def _ok(repo: Path, *args: str) -> str | None:
    try:
        return (await git(repo, *args)).strip() or None
    except GitFailed:
        return None


async def base_ref(repo: Path) -> str:
    """What the changes are counted from (see the module docstring)."""
    if await _ok(repo, "rev-parse", "--verify", "--quiet", "HEAD") is None:
        return EMPTY_TREE
    upstream = await _ok(repo, "rev-parse", "--verify", "--quiet", "@{upstream}")
    if upstream:
        return upstream
    branch = await _ok(repo, "rev-parse", "--abbrev-ref", "HEAD")
    if branch and branch != "HEAD":
        tracking = f"refs/remotes/origin/{branch}"
        remote = await _ok(repo, "rev-parse", "--verify", "--quiet", tracking)
        if remote:
            return remote
    merge_base = await _ok(repo, "merge-base", "HEAD", "refs/remotes/origin/HEAD")
    return merge_base or "HEAD"


async def repo_changes(repo: Path) -> list[dict[str, str]]:
    ref = await base_ref(repo)
    changes: list[dict[str, str]] = []
    fields = (await git(repo, "diff", "--name-status", "-z", ref)).split("\0")
    i = 0
    while i < len(fields) - 1:
        status = fields[i]
        if status[:1] in ("R", "C"):
            old, new = fields[i + 1], fields[i + 2]
            if status[0] == "R":
                changes.append({"status": "DELETED", "path": old})
            changes.append({"status": "ADDED", "path": new})
            i += 3
            continue
        if status[:1] in STATUS:
            changes.append({"status": STATUS[status[0]], "path": fields[i + 1]})
        i += 2
    untracked = await git(repo, "ls-files", "--others", "--exclude-standard", "-z")
    changes.extend({"status": "ADDED", "path": p} for p in untracked.split("\0") if p)
    return changes


async def changes_below(path: Path) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    is_top, nested = _nested_repos(path)
    if is_top:
        hidden = {p.name for p in nested}
        out.extend(c for c in await repo_changes(path) if c["path"].split("/", 1)[0] not in hidden)
    elif (root := await repo_root(path)) is not None:
        prefix = _relative(path, root)
        out.extend(
            {**c, "path": _relative(c["path"], prefix)}
            for c in await repo_changes(root)
            if prefix == "." or c["path"].startswith(prefix + "/")
        )
    for sub in nested:
        out.extend({**c, "path": f"{sub.name}/{c['path']}"} for c in await repo_changes(sub))
    out.sort(key=lambda c: c["path"])
    return out


async def file_diff(path: Path) -> dict[str, Any]:
    root = await repo_root(path)
    if root is None:
        return {"modified": None, "original": None}
    modified, size = _read_text(path)
    if size > MAX_DIFF_FILE:
        raise ApiError(400, f"File too large for a diff: {path} (at most {MAX_DIFF_FILE} bytes)")
    relative = _relative(path, root)
    ref = await base_ref(root)
    original = None
    if ref != EMPTY_TREE:
        try:
            original = await git(root, "show", f"{ref}:{relative}")
        except GitFailed:
            original = None  # not in the base: the file is new
    return {"modified": modified, "original": original or ""}


def _path(request: web.Request) -> Path:
    raw = request.match_info.get("path") or request.query.get("path")
    if not raw:
        raise missing_query("path")
    return resolve_path(request.app[CONFIG_KEY], raw)


async def changes(request: web.Request) -> web.Response:
    try:
        return web.json_response(await changes_below(_path(request)))
    except GitFailed as exc:
        raise ApiError(400, str(exc)) from exc


async def diff(request: web.Request) -> web.Response:
    try:
        return web.json_response(await file_diff(_path(request)))
    except GitFailed as exc:
        raise ApiError(400, str(exc)) from exc


def add_routes(app: web.Application) -> None:
    for suffix in ("", "/{path:.+}"):
        app.router.add_get("/api/git/changes" + suffix, changes)
        app.router.add_get("/api/git/diff" + suffix, diff)
