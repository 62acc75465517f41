"""`controlplane serve` with ACS_WORKERS > 1: this process supervises that many workers.

One Python process runs its requests on one core: its event loop. A host with more cores serves
more with more processes, as uvicorn's and gunicorn's workers do. Each worker is a whole replica
of the control plane (`controlplane serve --worker I/N/PID`): its own event loop, Redis
connections and background loops, coordinated with the others through Redis exactly as replicas
on other hosts are (leader locks, leases, the outbox); they share the API's port and the webhook
listener's through SO_REUSEPORT, so the kernel spreads new connections over them.

The supervisor serves nothing. Before its workers it checks that the API's port is free (a port
held by anything else fails the start, rather than being shared or retried), makes what they
would race for on a first start (the embedded Redis when that is the store: commands.py; the
secret key file), and catches SIGTERM and SIGINT: each is handed to every worker, started or
starting, and each drains as a lone replica does (controlplane/shutdown.py); the supervisor
exits when they have. A worker that exits while no stop was asked is started again (1 s,
doubling to 30 s while it keeps dying young; after 60 s alive, 1 s again); one that exits 2 (a
configuration refused, or Redis unreachable at its start) on its first start stops them all and
the supervisor exits 2, as a lone `serve` would; later, it is started again like any other.
Workers die with their supervisor (PR_SET_PDEATHSIG). The supervisor also reaps what is left to
it as PID 1 in a container (a killed worker's children).

Their request metrics are shared through prometheus_client's multiprocess files in a directory
of this supervisor's under ACS_DATA_DIR, locked while it runs (several containers may share the
data directory, each supervisor PID 1 in its own), removed when it exits; one whose lock is free
(its supervisor was killed) is removed by the next start.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

import structlog

from controlplane.config import ConfigError
from controlplane.metrics import MULTIPROCESS_DIR

log = structlog.get_logger("controlplane.workers")

POLL = 0.2  # seconds between the supervisor's looks at its workers
FIRST_DELAY = 1.0
MAX_DELAY = 30.0
LIVED = 60.0  # a worker that lived this long is restarted after FIRST_DELAY again
CONFIG_ERROR = 2  # the exit status of a refused configuration (commands.run)
METRICS_PREFIX = "workers-metrics-"
SWEEP_AFTER = 60.0  # seconds: a younger directory may be one another supervisor is making
LOCK_NAME = "supervisor.lock"
_PR_SET_PDEATHSIG = 1
_STOPS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    starts: int = 0
    delay: float = FIRST_DELAY
    restart_at: float | None = None


def parse_worker(value: str) -> tuple[int, int, int]:
    """`--worker I/N/PID` (index, count, supervisor's pid), as the supervisor passes it."""
    index, count, supervisor = (int(part) for part in value.split("/"))
    if not 0 <= index < count:
        raise ValueError(value)
    return index, count, supervisor


def supervised_by(supervisor: int) -> bool:
    """True while this worker's parent is still its supervisor (a supervisor that died
    between the start and PR_SET_PDEATHSIG taking hold is caught here)."""
    return os.getppid() == supervisor


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies (Linux; else nothing); the
    stop signals the supervisor blocked around the fork unblocked again."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def check_port_free(host: str, port: int) -> None:
    """ConfigError when something already listens on the API's address: the workers would
    otherwise share a port held by a process of the same user (SO_REUSEPORT), or fail and be
    restarted forever against another user's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As aiohttp binds: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"serve --port {port}: {host}:{port} is in use") from None
            raise ConfigError(f"serve --host {host} --port {port}: {exc.strerror}") from None


class MetricsDir:
    """The workers' metrics directory under `data_dir`, locked while this supervisor runs;
    those no supervisor holds any more are removed first (not the ones made in the last
    SWEEP_AFTER: between its mkdtemp and its lock, a starting supervisor holds nothing yet)."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        settled = time.time() - SWEEP_AFTER
        for old in data_dir.glob(f"{METRICS_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                if old.stat().st_mtime < settled and not _held(old / LOCK_NAME):
                    shutil.rmtree(old, ignore_errors=True)
        self.path = Path(tempfile.mkdtemp(prefix=METRICS_PREFIX, dir=data_dir))
        self._lock: IO[bytes] = (self.path / LOCK_NAME).open("wb")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def _held(lock: Path) -> bool:
    """True while a supervisor holds `lock` (its directory is in use)."""
    try:
        with lock.open("rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except FileNotFoundError:
        return False  # left half-made
    except BlockingIOError:
        return True
    return False


class Supervisor:
    def __init__(self, count: int, host: str, port: int) -> None:
        self.count = count
        self.host = host
        self.port = port
        self.workers = [_Worker(i) for i in range(count)]
        self.stopping = False
        self.status = 0
        self._metrics_dir = Path()

    def catch_signals(self) -> None:
        """From here a stop signal stops the workers (those started later included)."""
        for sig in _STOPS:
            signal.signal(sig, self._on_signal)

    def run(self, data_dir: Path) -> int:
        check_port_free(self.host, self.port)
        metrics = MetricsDir(data_dir)
        self._metrics_dir = metrics.path
        try:
            for worker in self.workers:
                if not self.stopping:
                    self._start(worker)
            log.info(
                "workers_started",
                workers=self.count,
                pids=[w.process.pid for w in self.workers if w.process is not None],
                metrics_dir=str(metrics.path),
            )
            while any(w.process is not None or w.restart_at is not None for w in self.workers):
                self._look()
                time.sleep(POLL)
            log.info("workers_stopped", status=self.status)
            return self.status
        finally:
            self._stop_all(signal.SIGKILL)  # only what is left after an error of ours
            metrics.remove()

    def _start(self, worker: _Worker) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable,
            "-m",
            "controlplane",
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--worker",
            f"{worker.index}/{self.count}/{os.getpid()}",
        ]
        env = {**os.environ, MULTIPROCESS_DIR: str(self._metrics_dir)}
        # A stop signal during the fork is held until the worker is known, then handed to it
        # (the handler sees it in self.workers). preexec_fn: this process has no threads.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            worker.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads here (above)
            )
            worker.started = time.monotonic()
            worker.starts += 1
            worker.restart_at = None
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        return worker.process

    def _look(self) -> None:
        self._reap()
        now = time.monotonic()
        for worker in self.workers:
            if worker.restart_at is not None and now >= worker.restart_at and not self.stopping:
                process = self._start(worker)
                log.info("worker_restarted", worker=worker.index, pid=process.pid)
                continue
            if worker.process is None or worker.process.returncode is None:
                continue
            code = worker.process.returncode
            worker.process = None
            if self.stopping:
                if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                    self.status = self.status or 1
                continue
            log.warning("worker_exited", worker=worker.index, code=code)
            if code == CONFIG_ERROR and worker.starts == 1:
                self.status = CONFIG_ERROR
                self._stop()
                continue
            if now - worker.started >= LIVED:
                worker.delay = FIRST_DELAY
            worker.restart_at = now + worker.delay
            worker.delay = min(worker.delay * 2, MAX_DELAY)

    def _reap(self) -> None:
        """Every child that exited, the workers' exit codes noted on them: as PID 1 this
        process also inherits the children of a worker that was killed."""
        by_pid = {w.process.pid: w.process for w in self.workers if w.process is not None}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            process = by_pid.get(pid)
            if process is not None:
                process.returncode = os.waitstatus_to_exitcode(status)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stop(signum)

    def _stop(self, signum: int = signal.SIGTERM) -> None:
        self.stopping = True
        for worker in self.workers:
            worker.restart_at = None
        self._stop_all(signum)

    def _stop_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signum)
