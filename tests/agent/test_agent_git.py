"""GET /api/git/changes and /api/git/diff against real git repositories."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.types import Client


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


async def changes(client: Client, auth: dict[str, str], path: str) -> list[dict[str, str]]:
    resp = await client.get("/api/git/changes", params={"path": path}, headers=auth)
    assert resp.status == 200, await resp.text()
    body: list[dict[str, str]] = await resp.json()
    return body


async def test_changes_against_the_upstream_and_nested_repositories(
    agent_client: Client, auth: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    origin = make_repo(
        tmp_path / "origin", {"keep.txt": "k\n", "edit.txt": "a\n", "gone.txt": "g\n"}
    )
    repo = workspace / "project"
    git(workspace, "clone", "-q", str(origin), str(repo))
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "edit.txt").write_text("b\n")
    (repo / "gone.txt").unlink()
    (repo / "new dir").mkdir()
    (repo / "new dir" / "ünï.txt").write_text("n\n")
    (repo / "committed.txt").write_text("c\n")
    git(repo, "add", "committed.txt")
    git(repo, "commit", "-q", "-m", "local")  # a local commit still counts: base is origin/main
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "noise.log").write_text("x\n")

    expected = [
        {"status": "ADDED", "path": ".gitignore"},
        {"status": "ADDED", "path": "committed.txt"},
        {"status": "UPDATED", "path": "edit.txt"},
        {"status": "DELETED", "path": "gone.txt"},
        {"status": "ADDED", "path": "new dir/ünï.txt"},
    ]
    assert await changes(agent_client, auth, str(repo)) == expected
    # From the workspace (no repository itself): the repositories right below it, prefixed.
    assert await changes(agent_client, auth, str(workspace)) == [
        {**c, "path": f"project/{c['path']}"} for c in expected
    ]
    # Path-style and relative paths, as older clients send them.
    resp = await agent_client.get("/api/git/changes/project", headers=auth)
    assert await resp.json() == expected

    resp = await agent_client.get(
        "/api/git/diff", params={"path": str(repo / "edit.txt")}, headers=auth
    )
    assert await resp.json() == {"original": "a\n", "modified": "b\n"}
    resp = await agent_client.get("/api/git/diff/project/gone.txt", headers=auth)
    assert await resp.json() == {"original": "g\n", "modified": ""}
    resp = await agent_client.get(
        "/api/git/diff", params={"path": str(repo / "new dir" / "ünï.txt")}, headers=auth
    )
    assert await resp.json() == {"original": "", "modified": "n\n"}


async def test_repository_without_commits_or_upstream(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    fresh = workspace / "fresh"
    fresh.mkdir()
    git(fresh, "init", "-q")
    (fresh / "a.txt").write_text("a\n")
    assert await changes(agent_client, auth, str(fresh)) == [{"status": "ADDED", "path": "a.txt"}]

    local = make_repo(workspace / "local", {"a.txt": "1\n", "sub/b.txt": "2\n"})
    (local / "a.txt").write_text("one\n")
    git(local, "mv", "sub/b.txt", "c.txt")
    assert await changes(agent_client, auth, str(local)) == [
        {"status": "UPDATED", "path": "a.txt"},
        {"status": "ADDED", "path": "c.txt"},
        {"status": "DELETED", "path": "sub/b.txt"},
    ]
    # A directory inside a repository: its own changes, relative to it.
    (local / "sub" / "d.txt").write_text("d\n")
    assert await changes(agent_client, auth, str(local / "sub")) == [
        {"status": "DELETED", "path": "b.txt"},
        {"status": "ADDED", "path": "d.txt"},
    ]


async def test_outside_a_repository(
    agent_client: Client, auth: dict[str, str], workspace: Path
) -> None:
    (workspace / "plain.txt").write_text("p\n")
    assert await changes(agent_client, auth, str(workspace)) == []
    assert await changes(agent_client, auth, str(workspace / "missing")) == []
    resp = await agent_client.get("/api/git/diff", params={"path": "plain.txt"}, headers=auth)
    assert await resp.json() == {"original": None, "modified": None}
    resp = await agent_client.get("/api/git/changes", headers=auth)
    assert resp.status == 422
    resp = await agent_client.get("/api/git/changes", params={"path": "x"})
    assert resp.status == 401
