"""LiteLLM's proxy as a team runs it, for bench/gateway_peer.py --litellm-db: its database on a
private PostgreSQL cluster (Debian's `postgresql`), Prisma's query engine, its migrations.

LiteLLM's proxy reaches PostgreSQL through prisma-client-py 0.15, which starts Prisma's native
query engine (5.17.0, commit 393aa359) and has the Prisma CLI fetch the engines from Prisma's
own binary host, which this machine cannot reach. What stands in for them, from the registries
it does reach (bench/README.md, "LiteLLM with its database"):

- the query engine: the same commit's WebAssembly build from npm (`@prisma/query-engine-wasm`)
  with Prisma's PostgreSQL driver adapter, behind the native engine's command line and HTTP
  routes (bench/prisma_wasm_engine.mjs, run by Debian's `nodejs`);
- the schema engine (`prisma migrate deploy` at the proxy's start): LiteLLM's migrations, the
  SQL files `migrate deploy` would apply (litellm-proxy-extras), applied in order with `psql`,
  and the proxy started with DISABLE_SCHEMA_UPDATE=true.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import BenchError, process_cpu
from tests.support.live_server import free_port

HERE = Path(__file__).resolve().parent
ENGINE_SHIM = HERE / "prisma_wasm_engine.mjs"
PRISMA_PY = "prisma==0.15.0"  # the prisma-client-py LiteLLM's `extra_proxy` takes; CLI 5.17.0
ENGINE_COMMIT = "393aa359c9ad4a4bb28630fb5613f9c281cde053"
NPM_PACKAGES = (
    f"@prisma/query-engine-wasm@5.17.0-31.{ENGINE_COMMIT}",
    "@prisma/adapter-pg@5.17.0",
    "@prisma/driver-adapter-utils@5.17.0",
    "pg@8.23.1",
)
DATABASE = "litellm"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(
    argv: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, cwd=cwd)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-800:]
        raise BenchError(f"{what} failed ({done.returncode}): {tail}")
    return done


def postgres_bin() -> Path:
    """Debian's PostgreSQL server binaries (`apt-get install postgresql`), newest version."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise BenchError("--litellm-db needs PostgreSQL: apt-get install postgresql")
    return found[-1].parent


class Postgres:
    """A PostgreSQL cluster of the run's own: its data directory under the run's temporary
    directory, on a loopback port, trust authentication; never the system's service."""

    def __init__(self, tmp: Path) -> None:
        self.bin = postgres_bin()
        self.dir = tmp / "postgres"
        self.port = free_port()
        self.started = False
        # initdb and postgres refuse to run as root: as root, the cluster is the postgres
        # user's (the Debian package's), its directory handed to it.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def version(self) -> str:
        out = run([str(self.bin / "postgres"), "--version"], "postgres --version").stdout
        found = re.search(r"\(PostgreSQL\) (\S+)", out)  # postgres (PostgreSQL) 15.14 (Debian …)
        return found.group(1) if found else out.strip()

    def start(self) -> None:
        self.dir.mkdir()
        if self.as_user:
            # the postgres user passes through the run's directory to its own (no read)
            os.chmod(self.dir.parent, 0o711)  # noqa: S103
            shutil.chown(self.dir, "postgres")
        data = self.dir / "data"
        run([*self.as_user, str(self.bin / "initdb"), "-D", str(data), "-A", "trust",
             "-U", "postgres", "--no-sync"], "initdb")  # fmt: skip
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(data), "-o", options,
             "-l", str(self.dir / "log"), "-w", "start"], "pg_ctl start")  # fmt: skip
        self.started = True
        run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-q",
             "-c", f"CREATE DATABASE {DATABASE}"], "CREATE DATABASE")  # fmt: skip

    def psql(self, *args: str, what: str) -> str:
        argv = ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", DATABASE]
        return run([*argv, "-v", "ON_ERROR_STOP=1", "-q", *args], what).stdout

    def cpu(self) -> float:
        """CPU seconds of the postmaster and every backend it has now (a backend that already
        exited is not counted: the proxy's pool keeps its connections)."""
        pid_file = self.dir / "data" / "postmaster.pid"
        if not pid_file.exists():
            return 0.0
        root = int(pid_file.read_text().split()[0])
        total = 0.0
        for pid in [root, *children(root)]:
            with contextlib.suppress(OSError):  # a backend that exits meanwhile
                total += process_cpu(pid)
        return total

    def stop(self) -> None:
        if self.started:
            self.started = False
            subprocess.run(
                [*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"),
                 "-m", "immediate", "-w", "stop"],
                capture_output=True, check=False,
            )  # fmt: skip


def children(pid: int) -> list[int]:
    """The direct children of `pid` (/proc/<pid>/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def ensure_toolchain(venv: Path, cache: Path) -> Path:
    """prisma-client-py in LiteLLM's venv and the engine's npm packages under `cache`; the
    node_modules directory."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise BenchError("--litellm-db needs Node.js: apt-get install nodejs npm")
    python = venv / "bin" / "python"
    has_prisma = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('prisma'))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if has_prisma.stdout.strip() != PRISMA_PY.split("==")[1]:
        log(f"installing {PRISMA_PY} into {venv} (once)")
        run([str(venv / "bin" / "pip"), "install", "-q", PRISMA_PY], f"pip install {PRISMA_PY}")
    modules = cache / "prisma-wasm"
    stamp = modules / "installed.json"
    if not stamp.exists() or json.loads(stamp.read_text()) != list(NPM_PACKAGES):
        log(f"installing {', '.join(NPM_PACKAGES)} into {modules} (once)")
        modules.mkdir(parents=True, exist_ok=True)
        (modules / "package.json").write_text('{"name": "acs-bench-prisma-wasm", "private": true}')
        run(["npm", "install", "--no-audit", "--no-fund", "--save-exact", *NPM_PACKAGES],
            "npm install", cwd=modules)  # fmt: skip
        stamp.write_text(json.dumps(list(NPM_PACKAGES)))
    return modules / "node_modules"


def engine_env(venv: Path, modules: Path) -> dict[str, str]:
    """What prisma-client-py and the Prisma CLI need to find the engine here: the venv's `prisma`
    first on PATH (LiteLLM looks for it), both engines' paths set so that nothing is fetched."""
    return {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRISMA_QUERY_ENGINE_BINARY": str(ENGINE_SHIM),
        # Only `prisma migrate diff` (a log-only check at start) would run it; the shim
        # refuses, so the check reports "no diff" instead of fetching the schema engine.
        "PRISMA_SCHEMA_ENGINE_BINARY": str(ENGINE_SHIM),
        "PRISMA_WASM_MODULES": str(modules),
        "PRISMA_HIDE_UPDATE_MESSAGE": "1",
    }


def generate_client(venv: Path, env: dict[str, str], tmp: Path) -> None:
    """`prisma generate` on LiteLLM's schema (what LiteLLM's images do at build time): writes
    the Python client into the venv's `prisma` package; skipped when already made for it."""
    site = next((venv / "lib").glob("python*/site-packages"))
    schema = site / "litellm" / "proxy" / "schema.prisma"
    digest = hashlib.sha256(schema.read_bytes()).hexdigest()
    stamp = site / "prisma" / ".acs-bench-schema"
    if stamp.exists() and stamp.read_text() == digest:
        return
    log("prisma generate on LiteLLM's schema (once; npm fetches the Prisma CLI 5.17.0)")
    copy = tmp / "schema.prisma"
    copy.write_bytes(schema.read_bytes())
    run([str(venv / "bin" / "prisma"), "generate", "--schema", str(copy)],
        "prisma generate", env={**os.environ, **env}, cwd=tmp)  # fmt: skip
    stamp.write_text(digest)


def apply_migrations(venv: Path, pg: Postgres) -> int:
    """LiteLLM's migrations in order (the SQL `prisma migrate deploy` applies); their count."""
    site = next((venv / "lib").glob("python*/site-packages"))
    found = sorted((site / "litellm_proxy_extras" / "migrations").glob("*/migration.sql"))
    if not found:
        raise BenchError(f"no LiteLLM migrations under {site / 'litellm_proxy_extras'}")
    args: list[str] = []
    for path in found:
        args += ["-f", str(path)]
    pg.psql(*args, what="LiteLLM's migrations")
    return len(found)


def engine_process(litellm_pid: int) -> int | None:
    """The query engine LiteLLM's proxy started (a child running the shim), if any."""
    for pid in children(litellm_pid):
        with contextlib.suppress(OSError):
            if str(ENGINE_SHIM) in Path(f"/proc/{pid}/cmdline").read_text():
                return pid
    return None


def engine_stats(pid: int) -> dict[str, int]:
    """The engine's counts of queries, batches and transactions since it started."""
    argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    port = argv[argv.index("-p") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as resp:
        stats: dict[str, int] = json.loads(resp.read())
    return stats


def stop_engine(pid: int | None) -> None:
    """The engine, if it outlived the proxy that started it (the proxy stops it itself)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not running(pid):
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
