"""File upload, download and listing."""

from __future__ import annotations

import io
import os
from pathlib import Path

from aiohttp import FormData

from tests.support.types import Client

BLOB = bytes(range(256)) * 1000  # binary, 256 kB


async def test_upload_raw_body_then_download(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    resp = await agent_client.post(
        "/api/file/upload/dir/sub/data.bin",
        data=BLOB,
        headers={**auth, "Content-Type": "application/octet-stream"},
    )
    assert resp.status == 200
    target = workspace / "dir" / "sub" / "data.bin"
    assert await resp.json() == {
        "success": True,
        "file_size": len(BLOB),
        "path": str(target),
        "size": len(BLOB),
    }
    assert target.read_bytes() == BLOB
    assert not [p for p in target.parent.iterdir() if p.name != "data.bin"]  # no temp left

    resp = await agent_client.get("/api/file/download/dir/sub/data.bin", headers=auth)
    assert resp.status == 200
    assert await resp.read() == BLOB


async def test_upload_multipart(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    form = FormData()
    form.add_field("other", "ignored")
    form.add_field("file", b"print('hi')\n", filename="x.py", content_type="text/x-python")
    resp = await agent_client.post("/api/file/upload/src/x.py", data=form, headers=auth)
    assert resp.status == 200
    body = await resp.json()
    assert body["success"] is True
    assert body["size"] == 12
    assert (workspace / "src" / "x.py").read_bytes() == b"print('hi')\n"


async def test_query_path_routes_as_the_official_server(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    """``/api/file/upload?path=`` (multipart ``file``) and ``/api/file/download?path=``."""
    target = workspace / "q dir" / "ünï.bin"
    form = FormData()
    form.add_field("file", BLOB, filename="ignored-name.bin")
    resp = await agent_client.post(
        "/api/file/upload", params={"path": str(target)}, data=form, headers=auth
    )
    assert resp.status == 200
    assert (await resp.json())["file_size"] == len(BLOB)
    assert target.read_bytes() == BLOB

    resp = await agent_client.get("/api/file/download", params={"path": str(target)}, headers=auth)
    assert resp.status == 200
    assert await resp.read() == BLOB
    resp = await agent_client.get(
        "/api/file/download", params={"path": "q dir/ünï.bin"}, headers=auth
    )
    assert await resp.read() == BLOB  # relative to the workspace

    for method in ("GET", "POST"):
        url = "/api/file/download" if method == "GET" else "/api/file/upload"
        resp = await agent_client.request(method, url, headers=auth)
        assert resp.status == 422
        assert (await resp.json())["detail"] == [
            {"loc": ["query", "path"], "msg": "Field required", "type": "missing"}
        ]


async def test_upload_multipart_without_file_field_is_422(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    form = FormData()
    form.add_field("data", b"x", filename="x")
    resp = await agent_client.post("/api/file/upload/x", data=form, headers=auth)
    assert resp.status == 422
    assert (await resp.json())["detail"][0]["loc"] == ["body", "file"]
    assert os.listdir(workspace) == []


async def test_upload_overwrites_and_keeps_mode(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    script = workspace / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    resp = await agent_client.post("/api/file/upload/run.sh", data=b"#!/bin/sh\n", headers=auth)
    assert resp.status == 200
    assert script.read_text() == "#!/bin/sh\n"
    assert script.stat().st_mode & 0o777 == 0o755


async def test_upload_empty_file(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    resp = await agent_client.post("/api/file/upload/empty", data=b"", headers=auth)
    assert resp.status == 200
    assert (await resp.json())["size"] == 0
    assert (workspace / "empty").read_bytes() == b""


async def test_upload_larger_than_client_max_size(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    big = os.urandom(20 * 1024 * 1024)  # above aiohttp's request size limit: must stream
    resp = await agent_client.post("/api/file/upload/big.bin", data=io.BytesIO(big), headers=auth)
    assert resp.status == 200
    assert (workspace / "big.bin").read_bytes() == big


async def test_upload_to_absolute_path(
    agent_client: Client, auth: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere" / "abs.txt"
    resp = await agent_client.post(f"/api/file/upload/{target}", data=b"abs", headers=auth)
    assert resp.status == 200
    assert (await resp.json())["path"] == str(target)
    assert target.read_bytes() == b"abs"


async def test_upload_onto_directory_is_400(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    (workspace / "d").mkdir()
    for path in ("d", "d/"):
        resp = await agent_client.post(f"/api/file/upload/{path}", data=b"x", headers=auth)
        assert resp.status == 400
        assert isinstance((await resp.json())["detail"], str)


async def test_upload_below_a_file_is_400(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    (workspace / "f").write_text("x")
    resp = await agent_client.post("/api/file/upload/f/child", data=b"x", headers=auth)
    assert resp.status == 400


async def test_download_absolute_path(
    agent_client: Client, auth: dict[str, str], tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("hello")
    resp = await agent_client.get(f"/api/file/download/{outside}", headers=auth)
    assert resp.status == 200
    assert await resp.read() == b"hello"


async def test_download_missing_is_404_json(agent_client: Client, auth: dict[str, str]) -> None:
    resp = await agent_client.get("/api/file/download/missing.txt", headers=auth)
    assert resp.status == 404
    body = await resp.json()
    assert isinstance(body["detail"], str)
    assert "missing.txt" in body["detail"]


async def test_download_directory_is_400(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    (workspace / "d").mkdir()
    resp = await agent_client.get("/api/file/download/d", headers=auth)
    assert resp.status == 400


async def test_list_directory(agent_client: Client, auth: dict[str, str], workspace: Path) -> None:
    (workspace / "b.txt").write_bytes(b"12345")
    (workspace / "a_dir").mkdir()
    (workspace / "link").symlink_to("b.txt")
    for path in ("/api/file/list/", "/api/file/list", f"/api/file/list/{workspace}"):
        resp = await agent_client.get(path, headers=auth)
        assert resp.status == 200, path
        body = await resp.json()
        assert body["path"] == str(workspace)
        entries = {e["name"]: e for e in body["entries"]}
        assert [e["name"] for e in body["entries"]] == ["a_dir", "b.txt", "link"]
        assert entries["a_dir"]["type"] == "directory"
        assert entries["b.txt"]["type"] == "file"
        assert entries["b.txt"]["size"] == 5
        assert entries["b.txt"]["path"] == str(workspace / "b.txt")
        assert entries["link"]["type"] == "symlink"
        assert entries["b.txt"]["modified"].endswith("+00:00")


async def test_list_subdirectory(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    (workspace / "s" / "t").mkdir(parents=True)
    resp = await agent_client.get("/api/file/list/s", headers=auth)
    assert resp.status == 200
    assert [e["name"] for e in (await resp.json())["entries"]] == ["t"]


async def test_list_missing_is_404_and_file_is_400(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    resp = await agent_client.get("/api/file/list/nope", headers=auth)
    assert resp.status == 404
    assert isinstance((await resp.json())["detail"], str)
    (workspace / "f").write_text("x")
    resp = await agent_client.get("/api/file/list/f", headers=auth)
    assert resp.status == 400
