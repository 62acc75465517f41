"""`controlplane serve` with ACS_WORKERS > 1: this process supervises that many workers.

One Python process runs its requests on one core: its event loop. A host with more cores serves
more with more processes, as uvicorn's and gunicorn's workers do. Each worker is a whole replica
of the control plane (`controlplane serve --worker I/N`): its own event loop, Redis connections
and background loops, coordinated with the others through Redis exactly as replicas on other
hosts are (leader locks, leases, the outbox); they share the API's port and the webhook
listener's through SO_REUSEPORT, so the kernel spreads new connections over them.

The supervisor serves nothing. It starts the embedded Redis first when that is the store (so
that the workers find it running rather than each start one), then the workers; it hands SIGTERM
and SIGINT to every one (each drains as a lone replica does: controlplane/shutdown.py) and exits
when they have; a worker that exits while no stop was asked is started again (1 s, doubling to
30 s while it keeps dying young; a worker that lived 60 s starts again after 1 s), except one
that exits 2 (its configuration refused): then every worker is stopped and the supervisor exits
2. Workers die with their supervisor (PR_SET_PDEATHSIG), so a killed supervisor leaves no
server behind. Their request metrics are shared through prometheus_client's multiprocess files
in a directory of this supervisor's under ACS_DATA_DIR (controlplane/metrics.py), removed when it
exits; one left by a supervisor that was killed is removed by the next one's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import structlog

from controlplane.metrics import MULTIPROCESS_DIR

log = structlog.get_logger("controlplane.workers")

POLL = 0.2  # seconds between the supervisor's looks at its workers
FIRST_DELAY = 1.0
MAX_DELAY = 30.0
LIVED = 60.0  # a worker that lived this long is restarted after FIRST_DELAY again
CONFIG_ERROR = 2  # the exit status of a refused configuration (commands.run)
_PR_SET_PDEATHSIG = 1


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
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
    """In the child before exec: SIGTERM when the supervisor dies (Linux; else nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


METRICS_PREFIX = "workers-metrics-"


def metrics_dir(data_dir: Path) -> Path:
    """A new directory for this supervisor's workers' metrics, under `data_dir`; those of
    supervisors no longer alive (killed: nothing removed them) are removed first."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for old in data_dir.glob(f"{METRICS_PREFIX}*"):
        pid = old.name.removeprefix(METRICS_PREFIX)
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    made = data_dir / f"{METRICS_PREFIX}{os.getpid()}"
    shutil.rmtree(made, ignore_errors=True)  # a pid reused since
    made.mkdir(mode=0o700)
    return made


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class Supervisor:
    def __init__(self, count: int, host: str, port: int, data_dir: Path) -> None:
        self.count = count
        self.host = host
        self.port = port
        self.workers = [_Worker(i) for i in range(count)]
        self.stopping = False
        self.status = 0
        self.metrics_dir = metrics_dir(data_dir)

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for worker in self.workers:
                self._start(worker)
            log.info(
                "workers_started",
                workers=self.count,
                pids=[w.process.pid for w in self.workers if w.process is not None],
            )
            while any(w.process is not None or w.restart_at is not None for w in self.workers):
                self._look()
                time.sleep(POLL)
            log.info("workers_stopped", status=self.status)
            return self.status
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop_all(signal.SIGKILL)  # only what is left after an error of ours
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

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
        env = {**os.environ, MULTIPROCESS_DIR: str(self.metrics_dir)}
        # preexec_fn: this process has no threads, so the fork it runs in is safe.
        worker.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads here (above)
        )
        worker.started = time.monotonic()
        worker.restart_at = None
        return worker.process

    def _look(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.restart_at is not None and now >= worker.restart_at and not self.stopping:
                process = self._start(worker)
                log.info("worker_restarted", worker=worker.index, pid=process.pid)
                continue
            if worker.process is None:
                continue
            code = worker.process.poll()
            if code is None:
                continue
            worker.process = None
            if self.stopping:
                if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                    self.status = self.status or 1
                continue
            log.warning("worker_exited", worker=worker.index, code=code)
            if code == CONFIG_ERROR:
                self.status = CONFIG_ERROR
                self._stop()
                continue
            if now - worker.started >= LIVED:
                worker.delay = FIRST_DELAY
            worker.restart_at = now + worker.delay
            worker.delay = min(worker.delay * 2, MAX_DELAY)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stop(signum)

    def _stop(self, signum: int = signal.SIGTERM) -> None:
        self.stopping = True
        for worker in self.workers:
            worker.restart_at = None
        self._stop_all(signum)

    def _stop_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signum)
