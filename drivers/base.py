"""The interface every sandbox runtime implements (Docker now, Kubernetes later)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from controlplane.errors import ControlPlaneError


class DriverError(ControlPlaneError):
    """The runtime refused an operation (bad image, bad config, engine-side failure)."""

    code = "runtime_error"
    status = 502


class ImageMissing(DriverError):
    code = "image_missing"


class ContainerExists(DriverError):
    """A container of that name exists already (made by a concurrent or earlier attempt)."""

    code = "container_exists"
    status = 409


@dataclass(frozen=True)
class ContainerRequest:
    """Everything needed to create one sandbox container."""

    name: str
    image: str
    command: list[str] | None
    env: dict[str, str]
    labels: dict[str, str]
    working_dir: str
    volume: str
    ports: list[int]
    cpus: float
    memory_bytes: int
    pids: int
    publish_host: str
    extra_hosts: dict[str, str] = field(default_factory=dict)
    # Isolation: every capability is dropped and no-new-privileges is always set.
    network: str | None = None  # None: the engine's default bridge
    user: str | None = None  # None: the image's USER
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)
    runtime: str | None = None  # None: the engine's default (runc)


@dataclass(frozen=True)
class ContainerState:
    """What the runtime says about one container right now."""

    id: str
    name: str
    status: str  # created, running, paused, restarting, removing, exited, dead
    labels: dict[str, str]
    ports: dict[int, int]  # container port -> host port
    env: dict[str, str]
    exit_code: int | None = None
    oom_killed: bool = False
    error: str | None = None
    created_at: datetime | None = None
    addresses: tuple[str, ...] = ()
    """The container's own addresses (on its networks): where this host reaches its ports
    without the published ones (the sandbox proxy, when the engine is local)."""


@dataclass(frozen=True)
class NetworkInfo:
    """One sandbox network: a bridge with inter-container traffic disabled."""

    name: str
    bridge: str  # the host's interface for it
    subnet: str
    gateway: str  # the host's address on it
    containers: int  # attached containers, when listed
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerEvent:
    action: str  # die, kill, stop, pause, unpause, start, destroy, oom, ...
    name: str
    labels: dict[str, str]


EventSink = Callable[[ContainerEvent | Exception | None], None]


class Watch(Protocol):
    def close(self) -> None: ...


class SandboxDriver(Protocol):
    async def ping(self) -> bool:
        """True when the runtime answers; never raises."""

    async def memory_total(self) -> int | None:
        """The engine host's memory in bytes; None when the engine does not answer."""

    async def image_id(self, image: str) -> str | None:
        """The image's content id (changes with every rebuild); None when it is not on the host.
        Raises RuntimeUnavailable when the runtime does not answer."""

    async def create_and_start(
        self, request: ContainerRequest, *, new: bool = False
    ) -> ContainerState:
        """Create the workspace volume and the container, start it, return its state. `new`: a
        new sandbox, whose workspace cannot exist yet (not looked for); otherwise an existing
        workspace is kept, also on failure.

        On any failure after create, removes what it made and re-raises, so nothing is left.
        Raises ContainerExists (and touches nothing) when the name is taken, ImageMissing,
        DriverError or RuntimeUnavailable.
        """

    async def inspect(self, name: str) -> ContainerState | None:
        """None when no such container exists."""

    async def pause(self, name: str) -> None:
        """Freeze processes; memory is kept. Pausing a paused container succeeds."""

    async def unpause(self, name: str) -> None:
        """Raises DriverError when the container is not paused (running or stopped)."""

    async def start(self, name: str) -> ContainerState:
        """Start a stopped container again; starting a running one succeeds."""

    async def remove(self, name: str, volume: str | None) -> None:
        """Remove the container (forced) and the volume; "already gone" counts as success."""

    async def list_managed(self, labels: dict[str, str]) -> list[ContainerState]:
        """Every container, running or not, carrying all of `labels`."""

    async def ensure_network(
        self, name: str, labels: dict[str, str], pool: str, size: int
    ) -> NetworkInfo:
        """The network `name`, created when absent on the first free /`size` of `pool`.

        Raises DriverError when a network of that name exists without `labels`, or the pool is
        full; RuntimeUnavailable when the engine does not answer.
        """

    async def list_networks(self, labels: dict[str, str]) -> list[NetworkInfo]:
        """Every network carrying all of `labels`."""

    async def remove_network(self, name: str) -> bool:
        """Remove the network if it has no containers; False when it still has some."""

    def watch(self, labels: dict[str, str], sink: EventSink) -> Watch:
        """Feed `sink` (on the event loop) each event of containers carrying `labels`.

        `sink(None)` or `sink(exception)` marks the end of the stream; close() the watch to stop.
        """

    async def close(self) -> None: ...
