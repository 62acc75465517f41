"""File transfer routes: download, upload and list.

The path is the ``path`` query parameter (``/api/file/download?path=/workspace/a.txt``, as
the official agent server takes it) or the rest of the URL (``/api/file/download/a.txt``, as
older clients send it). Paths are relative to the workspace, or absolute. The sandbox is the
security boundary, so absolute paths are allowed on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from aiohttp import BodyPartReader, web

from .config import CONFIG_KEY, AgentConfig
from .errors import ApiError, missing_query

UPLOAD_FIELD = "file"
CHUNK = 256 * 1024


def _config(request: web.Request) -> AgentConfig:
    return request.app[CONFIG_KEY]


def resolve_path(config: AgentConfig, raw: str) -> Path:
    """Absolute, normalised path for ``raw`` (relative ones: to the workspace)."""
    if "\x00" in raw:
        raise ApiError(400, "Path must not contain NUL bytes")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = config.workspace / path
    return Path(os.path.normpath(path))


def _entry(path: Path) -> dict[str, Any]:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {
        "name": path.name,
        "path": str(path),
        "type": kind,
        "size": st.st_size,
        "modified": datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat(),
    }


def _raw_path(request: web.Request) -> str:
    """The path in the URL, else the ``path`` query parameter (a 422 when neither is given)."""
    raw = request.match_info.get("path") or request.query.get("path")
    if raw is None:
        raise missing_query("path")
    return raw


async def download(request: web.Request) -> web.StreamResponse:
    path = resolve_path(_config(request), _raw_path(request))
    if not path.exists():
        raise ApiError(404, f"File not found: {path}")
    if path.is_dir():
        raise ApiError(400, f"Is a directory: {path}")
    if not os.access(path, os.R_OK):
        raise ApiError(403, f"Permission denied: {path}")
    return web.FileResponse(
        path,
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{path.name}"',
        },
    )


async def list_dir(request: web.Request) -> web.Response:
    raw = request.match_info.get("path") or request.query.get("path", "")
    path = resolve_path(_config(request), raw)
    if not path.exists():
        raise ApiError(404, f"Directory not found: {path}")
    if not path.is_dir():
        raise ApiError(400, f"Not a directory: {path}")

    def scan() -> list[dict[str, Any]]:
        entries = []
        for child in sorted(path.iterdir(), key=lambda p: p.name):
            try:
                entries.append(_entry(child))
            except OSError:  # vanished or unreadable while listing
                continue
        return entries

    try:
        entries = await asyncio.to_thread(scan)
    except PermissionError as exc:
        raise ApiError(403, f"Permission denied: {path}") from exc
    return web.json_response({"path": str(path), "entries": entries})


async def _copy_part(part: BodyPartReader, out: BinaryIO) -> int:
    size = 0
    while chunk := await part.read_chunk(CHUNK):
        out.write(chunk)
        size += len(chunk)
    return size


async def _copy_body(request: web.Request, out: BinaryIO) -> int:
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        out.write(chunk)
        size += len(chunk)
    return size


async def upload(request: web.Request) -> web.Response:
    """Store the request as a file: multipart field ``file``, or the raw body.

    The data is streamed to a temporary file next to the target and renamed
    into place, so readers never see a half-written file.
    """
    raw = _raw_path(request)
    if not raw or raw.endswith("/"):
        raise ApiError(400, "Upload path must name a file")
    path = resolve_path(_config(request), raw)
    if path.is_dir():
        raise ApiError(400, f"Is a directory: {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise ApiError(400, f"Parent is not a directory: {path.parent}") from exc
    except PermissionError as exc:
        raise ApiError(403, f"Permission denied: {path.parent}") from exc

    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".upload")
    try:
        with os.fdopen(fd, "wb") as out:
            if request.content_type.startswith("multipart/"):
                size = await _copy_multipart(request, out)
            else:
                size = await _copy_body(request, out)
        if path.exists():
            os.chmod(tmp_name, stat.S_IMODE(path.stat().st_mode))
        else:
            os.chmod(tmp_name, 0o666 & ~_UMASK)
        os.replace(tmp_name, path)
    except BaseException:
        _unlink_quietly(tmp_name)
        raise
    return web.json_response({"success": True, "file_size": size, "path": str(path), "size": size})


async def _copy_multipart(request: web.Request, out: BinaryIO) -> int:
    reader = await request.multipart()
    async for part in reader:
        if isinstance(part, BodyPartReader) and part.name == UPLOAD_FIELD:
            return await _copy_part(part, out)
    raise ApiError(
        422,
        [{"loc": ["body", UPLOAD_FIELD], "msg": "Field required", "type": "missing"}],
    )


def _read_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


#: Read once at import (os.umask can only be read by setting it).
_UMASK = _read_umask()


def _unlink_quietly(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/file/download", download)
    app.router.add_post("/api/file/upload", upload)
    app.router.add_get("/api/file/download/{path:.*}", download)
    app.router.add_post("/api/file/upload/{path:.*}", upload)
    app.router.add_get("/api/file/list/{path:.*}", list_dir)
    app.router.add_get("/api/file/list", list_dir)
