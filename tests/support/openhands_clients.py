"""The real OpenHands client packages (CLI, SDK, workspace) in a Python 3.12 venv of their own.

Compatibility is proven with the clients people use, not with our reading of their code. The venv
is built from tests/clients/requirements.lock (pinned versions) once per machine, in the cache
that outlives a clone ($ACS_CACHE_DIR, default ~/.cache/acs; `build_dir()`): wheels are
downloaded (or built, for the few sdists) into clients/client-wheels/<hash> and installed with
--no-index, so later runs, fresh clones included, need no network and take a few seconds.
"""

from __future__ import annotations

import asyncio
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "clients"
LOCK = CLIENTS / "requirements.lock"
SDK158_LOCK = REPO / "tests" / "clients" / "requirements-sdk158.lock"
"""The newest SDK and workspace (1.58.2), beside the CLI's pins (which hold SDK 1.21)."""
PYTHON_VERSION = "3.12"


@dataclass(frozen=True)
class OpenHandsVenv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name


def cache_dir() -> Path:
    """What outlives a clone (the scripts' ACS_CACHE_DIR): the Kubernetes binaries, the images'
    wheels (scripts/build-images.sh), the client venvs and Agent Canvas below."""
    raw = os.environ.get("ACS_CACHE_DIR")
    return Path(raw) if raw else Path.home() / ".cache" / "acs"


def build_dir() -> Path:
    """Where the client venvs, their wheels and the web apps the tests run are made."""
    return cache_dir() / "clients"


def find_python(version: str = PYTHON_VERSION) -> Path | None:
    """An interpreter of `version`: pyenv's (looked up, not assumed), then one on PATH."""
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        found = subprocess.run(
            [pyenv, "prefix", version], capture_output=True, text=True, check=False
        )
        for prefix in found.stdout.split(":"):
            candidate = Path(prefix.strip()) / "bin" / "python"
            if prefix.strip() and candidate.exists():
                return candidate
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    for root in filter(None, roots):
        for installed in sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"), reverse=True):
            return Path(installed)
    on_path = shutil.which(f"python{version}")
    return Path(on_path) if on_path else None


def _run(args: list[str | Path], log: Path, timeout: float) -> None:
    with log.open("a") as out:
        result = subprocess.run(
            [str(a) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    if result.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{' '.join(map(str, args[:4]))} … failed (log {log}):\n{tail}")


def build_venv(python: Path, build: Path, lock: Path = LOCK) -> Path:
    """The venv for `lock` under `build`, made if missing; safe against concurrent callers."""
    key = hashlib.sha256(lock.read_bytes() + str(python).encode()).hexdigest()[:16]
    venv = build / f"client-venv-{key}"
    wheels = build / "client-wheels" / key
    build.mkdir(parents=True, exist_ok=True)
    with (build / "client-venv.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        log = build / "logs" / f"client-venv-{key}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        if not (wheels / ".complete").exists():
            shutil.rmtree(wheels, ignore_errors=True)
            wheels.mkdir(parents=True)
            # The builder venv only runs pip wheel; the lock needs Python 3.12 wheels.
            builder = build / "client-wheel-builder"
            if not (builder / "bin" / "pip").exists():
                _run([python, "-m", "venv", builder], log, 120)
            _run([builder / "bin/pip", "wheel", "-q", "-r", lock, "-w", wheels], log, 1800)
            (wheels / ".complete").touch()
        shutil.rmtree(venv, ignore_errors=True)
        _run([python, "-m", "venv", venv], log, 120)
        pip = venv / "bin" / "pip"
        _run([pip, "install", "-q", "--no-index", "--find-links", wheels, "-r", lock], log, 1200)
        (venv / ".complete").touch()
        return venv


def _client_venv(lock: Path) -> OpenHandsVenv:
    python = find_python()
    if python is None:
        pytest.fail(
            f"no Python {PYTHON_VERSION} found (pyenv or python{PYTHON_VERSION} on PATH);"
            " the real OpenHands clients need it: scripts/bootstrap-host.sh --clients",
            pytrace=False,
        )
    try:
        root = build_venv(python, build_dir(), lock)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.fail(
            f"building the OpenHands client venv ({lock.name}) failed: {exc}", pytrace=False
        )
    return OpenHandsVenv(root)


@pytest.fixture(scope="session")
def openhands_venv() -> OpenHandsVenv:
    """The pinned OpenHands clients; fails (never skips) when Python 3.12 cannot be found."""
    return _client_venv(LOCK)


@pytest.fixture(scope="session")
def sdk158_venv() -> OpenHandsVenv:
    """openhands-sdk/-workspace/-tools 1.58.2 (SDK158_LOCK), the newest, in their own venv."""
    return _client_venv(SDK158_LOCK)


OFFICIAL_LOCK = REPO / "specs" / "images" / "openhands" / "requirements.lock"
OFFICIAL_PYTHON = "3.13"


def build_official_sdk_venv(python: Path, build: Path) -> Path:
    """openhands-sdk/-tools 1.58.2, the official agent server's own version (the 1.21 clients
    cannot read its events), from the wheels scripts/build-images.sh fetched for its image."""
    key = hashlib.sha256(OFFICIAL_LOCK.read_bytes() + str(python).encode()).hexdigest()[:16]
    venv = build / f"official-sdk-venv-{key}"
    with (build / "client-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        wheels = [
            Path(found).parent
            for found in glob.glob(str(cache_dir() / "wheels" / "*" / "openhands_sdk-1.58.2-*.whl"))
            if (Path(found).parent / ".complete").exists()
        ]
        if not wheels:
            raise RuntimeError("no wheelhouse of the openhands image: build it first")
        log = build / "logs" / f"official-sdk-venv-{key}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        shutil.rmtree(venv, ignore_errors=True)
        _run([python, "-m", "venv", venv], log, 120)
        pip = venv / "bin" / "pip"
        args: list[str | Path] = ["install", "-q", "--no-index", "--find-links", wheels[0]]
        args += ["-r", OFFICIAL_LOCK]
        _run([pip, *args], log, 1200)
        (venv / ".complete").touch()
        return venv


@pytest.fixture(scope="session")
def official_sdk_venv(openhands_image: str) -> OpenHandsVenv:
    """The SDK at the official agent server's version, in a Python 3.13 venv of its own."""
    python = find_python(OFFICIAL_PYTHON)
    if python is None:
        pytest.fail(
            f"no Python {OFFICIAL_PYTHON} found (pyenv or python{OFFICIAL_PYTHON} on PATH): "
            "scripts/bootstrap-host.sh --clients",
            pytrace=False,
        )
    try:
        return OpenHandsVenv(build_official_sdk_venv(python, build_dir()))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"building the official SDK venv failed: {exc}", pytrace=False)


def client_env(venv: OpenHandsVenv, home: Path) -> dict[str, str]:
    """A clean user: own HOME and persistence dir, no browser to open, wide plain output."""
    return {
        "PATH": f"{venv.root / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "OPENHANDS_PERSISTENCE_DIR": str(home / ".openhands"),
        "BROWSER": "true",  # webbrowser.open runs `true <url>`
        "COLUMNS": "250",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
        # No network here: LiteLLM would retry fetching its price list for ~7 s per start.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OPENHANDS_SUPPRESS_BANNER": "1",
    }


async def run(
    args: list[str | Path], env: dict[str, str], cwd: Path, timeout: float
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *map(str, args),
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        raise AssertionError(f"{args[0]} timed out:\n{out.decode(errors='replace')}") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def run_client_script(
    venv: OpenHandsVenv, script: str, *args: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """tests/clients/`script` run by the venv's Python with `args`, in `env` (else this
    process's environment): the JSON report it prints last, once it has exited 0."""
    result = await asyncio.to_thread(
        subprocess.run,
        [str(venv.python), str(CLIENTS / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing; stderr:\n{result.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    assert result.returncode == 0, f"{report}\nstderr:\n{result.stderr[-4000:]}"
    return report


if __name__ == "__main__":
    # `python -m tests.support.openhands_clients` (make test-prep) prepares both venvs ahead of
    # time; the official SDK's needs the openhands image's wheelhouse (scripts/build-images.sh
    # openhands).
    found = find_python()
    if found is None:
        sys.exit(f"no Python {PYTHON_VERSION} found: scripts/bootstrap-host.sh --clients says how")
    print(build_venv(found, build_dir()))
    print(build_venv(found, build_dir(), SDK158_LOCK))
    official = find_python(OFFICIAL_PYTHON)
    if official is None:
        sys.exit(f"no Python {OFFICIAL_PYTHON} found: scripts/bootstrap-host.sh --clients says how")
    print(build_official_sdk_venv(official, build_dir()))


async def approve_in_the_page(base: str, key: str, link: str) -> None:
    """What a person does with the printed link: sign in, look at the code, press Approve."""
    own = {"Origin": base}
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for an IP address host
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        async with browser.get(link, allow_redirects=False) as page:
            assert page.status == 303  # not signed in yet
            sign_in = base + page.headers["Location"]
        async with browser.get(sign_in) as page:
            assert 'name="api_key"' in await page.text()
        next_path = link.removeprefix(base)
        async with browser.post(
            base + "/auth/sign-in",
            data={"api_key": key, "next": next_path},
            headers=own,
            allow_redirects=False,
        ) as signed:
            assert signed.status == 303
            assert signed.headers["Location"] == next_path
        await approve_code(browser, base, link)


async def approve_code(browser: aiohttp.ClientSession, base: str, link: str) -> None:
    """A signed-in browser on the printed link: the code is the one shown, Approve."""
    async with browser.get(link) as page:
        text = await page.text()
        assert page.status == 200, text
    user_code = link.rsplit("=", 1)[1]
    assert f'value="{user_code}"' in text
    async with browser.post(
        base + "/oauth/device/verify",
        data={"user_code": user_code, "action": "approve"},
        headers={"Origin": base},
    ) as done:
        assert done.status == 200
        assert "is connected" in await done.text()


async def openhands_login(
    venv: OpenHandsVenv,
    base: str,
    key: str,
    home: Path,
    within: float,
    *,
    approve: Callable[[str], Awaitable[None]] | None = None,
) -> str:
    """`openhands login --server-url base`, its printed link approved in the page as a person
    would (as `key`'s user, or by `approve(link)`: e.g. signing in through an OpenID provider);
    the CLI's whole output, once it has exited 0."""
    proc = await asyncio.create_subprocess_exec(
        str(venv.bin("openhands")),
        "login",
        "--server-url",
        base,
        env=client_env(venv, home),
        cwd=home,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(within):
            link = None
            while link is None:
                line = (await proc.stdout.readline()).decode(errors="replace")
                assert line, "".join(seen)
                seen.append(line)
                found = re.search(r"(http://\S+/oauth/device/verify\?user_code=[A-Z-]+)", line)
                link = found.group(1) if found else None
            if approve is None:
                await approve_in_the_page(base, key, link)
            else:
                await approve(link)
            seen.append((await proc.stdout.read()).decode(errors="replace"))
            assert await proc.wait() == 0, "".join(seen)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return "".join(seen)
