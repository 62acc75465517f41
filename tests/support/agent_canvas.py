"""Agent Canvas, OpenHands' current web app, as npm publishes it (`@openhands/agent-canvas`: a
prebuilt static app in `package/build/`), fetched once per data dir and version into
$ACS_DATA_DIR/build/agent-canvas/<version>/ (lock-protected like the client venvs), so later runs
need no network. `npm pack` fetches the tarball the registry lists and checks its integrity;
only the built app is kept (no dependency is installed: nothing of it runs outside the browser).

    python -m tests.agent_canvas    (make test-prep)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests.support.npm_cache import cached
from tests.support.openhands_clients import build_dir

PACKAGE = "@openhands/agent-canvas"
VERSION = "1.6.1"
"""The version issue 20 names; docs/api.md says what the newest (1.20.0) needs."""


def install(version: str = VERSION, build: Path | None = None) -> Path:
    """The app's built directory (holding index.html) for `version`, fetched if missing."""
    build = build or build_dir()
    root = build / "agent-canvas" / version
    cached(build / "agent-canvas.lock", root, lambda r, npm: _fetch(r, npm, version))
    return root / "build"


def _fetch(root: Path, npm: str, version: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        packed = subprocess.run(
            [npm, "pack", f"{PACKAGE}@{version}", "--pack-destination", scratch, "--silent"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=scratch,
        )
        if packed.returncode != 0:
            raise RuntimeError(f"npm pack {PACKAGE}@{version} failed:\n{packed.stderr[-3000:]}")
        (tarball,) = Path(scratch).glob("*.tgz")
        with tarfile.open(tarball) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith("package/build/")]
            archive.extractall(root, members=members, filter="data")
    (root / "package" / "build").rename(root / "build")
    shutil.rmtree(root / "package")
    if not (root / "build" / "index.html").is_file():
        raise RuntimeError(f"{PACKAGE}@{version} has no build/index.html")


@pytest.fixture(scope="session")
def agent_canvas() -> Path:
    """The built Agent Canvas (VERSION); fails (never skips) when npm cannot fetch it."""
    try:
        return install()
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"fetching {PACKAGE}@{VERSION} failed: {exc}", pytrace=False)


if __name__ == "__main__":
    print(install(sys.argv[1] if len(sys.argv) > 1 else VERSION))
