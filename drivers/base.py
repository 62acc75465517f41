"""The interface every sandbox runtime implements (drivers/docker/, drivers/kubernetes/).

The control plane speaks to a driver in sandbox terms only: a sandbox id with its owner and
spec, a request to create it, its state and the endpoints its ports are reached at, the network
policy of its spec. What a runtime needs besides stays behind the driver: for Docker the
containers, volumes, networks, host firewall rules, image ids and the engine's thread lanes; for
Kubernetes the pods, claims, network policies and watches. docs/architecture.md ("Drivers") says
what a driver must provide; tests/drivers/contract.py holds the tests every driver passes.

Errors (drivers/errors.py): RuntimeUnavailable when the runtime does not answer (the caller
retries), DriverError (and its kinds) when it refuses; "already so" is never an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from drivers.egress import Destination


class RunState(StrEnum):
    """What the runtime says a sandbox's instance is doing. A runtime maps its own states onto
    these (Docker's container states are these words; a Kubernetes pod's phase and container
    statuses, or no pod beside a kept claim, map onto them)."""

    CREATED = "created"  # made, not started yet (still booting for the readiness probe)
    RUNNING = "running"
    RESTARTING = "restarting"
    PAUSED = "paused"  # frozen in place, memory kept: `unpause` thaws it
    EXITED = "exited"  # not running, workspace kept (stopped, or released by a pause that
    # frees the instance): `start` brings it up again
    DEAD = "dead"  # broken beyond a start: remove it (keeping the workspace), create it again
    REMOVING = "removing"


@dataclass(frozen=True)
class Endpoint:
    """Where the control plane reaches one port of a sandbox (Docker: the published port on
    the engine's host address; Kubernetes: the pod's IP and the container port)."""

    host: str
    port: int


@dataclass(frozen=True)
class NetworkPolicy:
    """Where the sandboxes of one spec may connect (its `egress`): `egress` None is the
    internet, () nothing, else an allow-list. Every policy also fences the control plane's
    host: of it, a sandbox reaches only the control plane's webhooks (and the ports an operator
    opens), never link-local addresses."""

    spec_id: str
    egress: tuple[Destination, ...] | None = None


@dataclass(frozen=True)
class SandboxRequest:
    """Everything needed to create one sandbox; the driver names and labels what it makes."""

    sandbox_id: str
    owner: str
    spec_id: str
    image: str
    command: list[str] | None
    env: dict[str, str]
    working_dir: str  # the workspace: kept across pause, resume and re-creates; delete drops it
    ports: list[int]  # container ports the control plane must reach (endpoints)
    cpus: float
    memory_bytes: int  # the hard limit
    memory_reservation: int  # what admission counts for it (Kubernetes: the memory request)
    pids: int
    network: NetworkPolicy
    # Isolation: every capability is dropped and privileges can never be gained.
    user: str | None = None  # None: the image's USER
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)  # path -> mount options
    runtime: str | None = None  # e.g. runsc (gVisor); None: the runtime's default
    kept_paths: tuple[str, ...] = ()
    """Directories besides the workspace whose content must outlive the instance (the agent
    server's state): a runtime whose pause releases the instance keeps them with the workspace;
    Docker keeps them in the container, which a pause freezes."""
    restore: FileSource | None = None
    """A new sandbox's files come from here (a snapshot) instead of an empty workspace: its
    workspace and system trees (drivers/base.py, "Files"), applied before it starts."""


@dataclass(frozen=True)
class SandboxState:
    """What the runtime says about one sandbox right now."""

    sandbox_id: str
    owner: str
    spec_id: str
    name: str  # the runtime's own name for it (logs, operators)
    status: RunState
    endpoints: dict[int, Endpoint]  # container port -> where the control plane reaches it
    env: dict[str, str]  # as created (the reconciler adopts a sandbox by its session key)
    exit_code: int | None = None
    oom_killed: bool = False
    error: str | None = None
    created_at: datetime | None = None
    addresses: tuple[str, ...] = ()
    """The instance's own addresses on the runtime's networks (Docker: the container's), where
    they differ from the endpoints' host."""


@dataclass(frozen=True)
class SandboxEvent:
    """Something happened to a sandbox (Docker: a container event such as die, pause, destroy);
    the reconciler inspects it and aligns its record."""

    sandbox_id: str
    action: str


EventSink = Callable[[SandboxEvent | Exception | None], None]


class Watch(Protocol):
    def close(self) -> None: ...


class HostListener(Protocol):
    """A server of the control plane that sandboxes reach on the host (the webhook listener):
    a driver whose sandboxes reach the host at addresses of its own (Docker: each network's
    gateway) binds it there."""

    @property
    def port(self) -> int: ...

    async def bind(self, address: str) -> int:
        """Listen on `address` too (idempotent); the port. Raises OSError."""
        ...


# -- files: what a snapshot holds, exported from a sandbox and imported into a new one ---------

WORKSPACE = "workspace"
"""The workspace (`working_dir`): paths relative to it."""
SYSTEM = "system"
"""What changed outside the workspace and the kept paths, relative to the image (packages the
agent installed, files it wrote or deleted elsewhere): paths relative to `/`."""
STATE = "state"
"""What changed under the kept paths (the agent server's state): paths relative to `/`."""


class FileKind(StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    DELETED = "deleted"  # in the system tree: a path of the image that was removed


@dataclass(frozen=True)
class FileEntry:
    """One entry of a sandbox's files. Sockets, fifos and devices are not kept; hard links
    are kept as separate files."""

    tree: str  # WORKSPACE, SYSTEM or STATE
    path: str  # relative to the tree's root, "/"-separated; "" is the workspace's root itself
    kind: FileKind
    mode: int = 0o644  # permission bits, set-id and sticky bits included
    uid: int = 0
    gid: int = 0
    size: int = 0  # a FILE's length: exactly that many bytes follow it in a stream
    mtime_ns: int = 0
    target: str = ""  # a SYMLINK's target
    opaque: bool = False  # a DIR that hides what the image had beneath it
    stamp: tuple[int, ...] = ()
    """The runtime's change marks (Docker: ctime and inode): with the fields above, an entry
    whose `signature` is the same as before has not changed since."""
    changed: bool = True  # in an export: False when its signature is one the caller knew
    name: str = ""  # the runtime's own name for an exported file's bytes (Docker: its copy)

    def signature(self) -> tuple[object, ...]:
        return (
            self.kind.value,
            self.mode,
            self.uid,
            self.gid,
            self.size,
            self.mtime_ns,
            *self.stamp,
            self.target,
            self.opaque,
        )


FileItem = FileEntry | bytes
"""A stream of files: each entry, and after a FILE entry its bytes (size of them, in pieces)."""


class FileSource(Protocol):
    """Files to make a new sandbox from (a snapshot)."""

    @property
    def key(self) -> str:
        """The identity of the content (a snapshot id): a runtime may keep one copy of it and
        share it, copy-on-write, between the sandboxes made from it."""

    def items(self, held: Collection[str] = ()) -> AsyncIterator[FileItem]:
        """The workspace and system trees, parents before children, and the state tree when
        the source restores the agent's state too (a rewind into the sandbox it was taken
        of: its key then differs from a plain restore's). Raises the store's errors (a
        damaged or missing blob) as it goes. The workspace files whose paths are in `held`
        come without their bytes (the runtime holds them already: a rewind's unchanged
        files), and nothing is fetched for them."""

    async def workspace(self) -> list[FileEntry]:
        """The workspace tree's entries, their signatures as taken (a rewind compares them
        with the files the sandbox holds), without fetching any file."""


class Hold(Protocol):
    """Told around the moment a running sandbox is held still for an export, so that the
    control plane can tell a sandbox frozen by a snapshot from one paused by someone. `end`
    comes after every `begin`, one that was cancelled half-way included."""

    async def begin(self) -> None: ...

    async def end(self) -> None: ...


@dataclass(frozen=True)
class LocalCopy:
    """A fork's export (SandboxFiles.export's `local`): its snapshot, `key`, is to be built
    into the runtime's shared copy for sandboxes of `image` (`build_local`) from the export's
    stream, which a runtime may prepare that copy from while it exports (Docker: the helper
    stages its copies in the new base volume and lays the workspace down there)."""

    key: str
    image: str
    sandbox_ids: Sequence[str] = ()
    """The sandboxes to be made from it (their own parts of the copy are made with it)."""


@dataclass
class FileExport:
    """A consistent export: the sandbox was held still `held_still` seconds while its state
    was recorded (0 when it was not running); `items` streams every entry, a changed FILE's
    bytes after it."""

    held_still: float
    items: AsyncIterator[FileItem]


class SandboxFiles(Protocol):
    """A runtime's way to read and write a sandbox's files: the snapshot capability."""

    keeps_system: bool
    """True when exports hold the system tree and restores apply it (Docker); False where the
    container's own changes are out of reach (Kubernetes: only the claim's workspace and
    state)."""

    def export(
        self,
        sandbox_id: str,
        known: Mapping[tuple[str, str], FileEntry],
        *,
        working_dir: str,
        state_paths: Sequence[str],
        hold: Hold,
        max_bytes: int | None = None,
        local: LocalCopy | None = None,
    ) -> AbstractAsyncContextManager[FileExport]:
        """The sandbox's workspace, system and state trees as they were at one moment. A
        running sandbox is held still (told to `hold`) only while the files that changed
        since a copy made before are copied again; bytes are sent only for files whose
        signature is not that of their entry in `known` ((tree, path) -> the entry the caller
        holds, e.g. the parent snapshot's). An entry whose signature is the known one is
        yielded as that very object (changed=False): nothing is built again for it. The
        runtime is left as it was found, also on failure. Raises DriverError when the
        sandbox has no instance to read (or its files cannot be read), RuntimeUnavailable.
        With `max_bytes`, an export whose changed files add up to more is refused with
        FilesTooLarge before anything is copied (a sparse file counts at its full size).
        `local`: the caller builds the runtime's shared copy of this export (`build_local`,
        with the same key and image) from its stream; a runtime without one ignores it.
        """

    builds_locally: bool
    """True when the runtime keeps one shared copy of a snapshot's files for the sandboxes
    made from it on this host and can build it from an export as it streams (`build_local`:
    Docker's base); False where each sandbox gets its own copy out of the store
    (Kubernetes)."""

    async def build_local(
        self,
        key: str,
        image: str,
        items: AsyncIterator[FileItem],
        sandbox_ids: Sequence[str] = (),
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Build the shared copy of the content `key` (a snapshot id: FileSource.key of a
        plain restore) for sandboxes of `image` from `items` (the workspace and system trees,
        every file with its bytes, as FileSource.items streams them), unless it exists; the
        sandboxes made from `key` here then start from it without reading the store (those of
        `sandbox_ids`, the forks to come, with what each needs of it made already); `ready` is
        called once they can be (Docker: at the export's end, before `items` ends, when the
        export laid the copy down itself). Raises what the runtime raises (nothing of a failed
        build is left); DriverError where `builds_locally` is False."""

    async def forget(self, key: str) -> None:
        """Drop what the runtime keeps of a FileSource's content (when no sandbox uses it);
        nothing kept succeeds."""

    async def sweep(self, older_than: float) -> int:
        """Remove what exports and imports interrupted more than `older_than` seconds ago left
        (a control plane killed in the middle); how many objects were removed."""


class SandboxDriver(Protocol):
    pause_releases: bool
    """True when a pause releases the instance and keeps only the workspace (Kubernetes deletes
    the pod, keeping its claim): a paused sandbox then holds no memory, and a resume starts a
    new instance instead of unpausing. False when a pause freezes it in place (Docker)."""
    stage_reads_workspace: bool
    """True when `stage` (a rewind's) takes from the sandbox's old workspace what it still
    holds of the snapshot (Docker): it removes the old instance itself, and its workspace must
    still be there when it starts (the caller removes it after). False when the caller may
    remove the old instance and workspace while `stage` runs."""

    @property
    def files(self) -> SandboxFiles | None:
        """How to export and import a sandbox's files (snapshots); None where the runtime
        does not offer it yet: snapshots are then refused with a clear error."""

    # -- the runtime --------------------------------------------------------------------------

    async def ping(self) -> bool:
        """True when the runtime answers; never raises."""

    async def memory_capacity(self) -> int | None:
        """Bytes of memory the runtime has for sandboxes (Docker: the engine host's total;
        Kubernetes: the nodes' allocatable memory); None when it does not answer."""

    def has_room(self, reservation: int) -> bool:
        """False while the runtime is too short of memory right now for one more sandbox
        reserving `reservation` bytes (Docker: the host's available memory under the floor);
        cheap, never raises."""

    async def image_id(self, image: str) -> str | None:
        """The image's identity, which changes whenever the image does: a content id or a
        registry digest; where the runtime cannot tell, the reference itself. None when the
        image is known to be absent. Raises RuntimeUnavailable."""

    # -- networks: where sandboxes may connect, and how they reach the control plane -----------

    async def prepare(self, policies: Sequence[NetworkPolicy]) -> None:
        """At start: put in place what sandboxes of these policies need, and fence whatever the
        runtime still holds for policies no longer given. Raises RuntimeUnavailable or
        NetworkUnavailable (the caller retries)."""

    async def prepare_network(self, policy: NetworkPolicy) -> str | None:
        """Put in place what sandboxes of `policy` need before one is created (idempotent, cheap
        once done). Returns the base URL at which they reach the control plane's webhook
        listener (Docker: http://host.docker.internal:<port> on their network's gateway), None
        when the runtime gives them none (ACS_PUBLIC_URL must then be set). Raises
        NetworkUnavailable (the policy cannot be enforced here) or RuntimeUnavailable."""

    async def host_address(self, policy: NetworkPolicy) -> str | None:
        """The address of the control plane's host as the sandboxes of `policy` reach it (what
        they call host.docker.internal; Docker: their network's gateway), so that the control
        plane can call what a sandbox would call there (the LLM gateway, a model server on the
        host). None when sandboxes reach no address of this host. Raises as prepare_network."""

    async def sandbox_networks(self) -> list[str]:
        """The address ranges (CIDRs) where sandboxes, and whatever else the runtime runs beside
        them, have their addresses (Docker: the subnet pool and every network of the engine;
        Kubernetes: the cluster's pod and Service ranges): the control plane never connects
        there for a user (controlplane/outbound). Never raises: what it cannot ask the runtime
        now, it answers from its configuration."""

    # -- sandboxes ----------------------------------------------------------------------------

    async def create(self, request: SandboxRequest, *, new: bool = False) -> SandboxState:
        """Create the sandbox with its workspace and start it. `new`: a new sandbox, whose
        workspace cannot exist yet (not looked for); otherwise an existing workspace is kept,
        also on failure. A request with `restore` gets its workspace and system trees from
        that source when its workspace is made (a kept workspace is not restored again).
        On any failure after it made something, removes what it made and re-raises. Raises
        ContainerExists (touching nothing) when the sandbox exists already, ImageMissing,
        NetworkUnavailable, DriverError, RuntimeUnavailable, or what the source raises."""

    async def stage(self, request: SandboxRequest) -> None:
        """Make ready, ahead of `create`, what a restoring request's workspace is made from
        and does not depend on the sandbox's present instance or workspace (Docker: the
        snapshot's base), so that a replacement does it while the old instance is removed.
        Nothing for a request without `restore`, or on a runtime that has nothing to stage.
        Raises as `create`."""

    async def inspect(self, sandbox_id: str) -> SandboxState | None:
        """None when the runtime has no instance of it (its workspace may still exist)."""

    async def direct_address(self, sandbox_id: str) -> str | None:
        """An address at which this process reaches the sandbox's container ports themselves,
        closer than its endpoints (Docker with a local engine: the container's own address on
        its network, not the engine's published port); the sandbox proxy forwards there. None
        when there is none (a remote engine), or the endpoints are that already (Kubernetes:
        the pod's or its Service's address), or the sandbox has no instance. Raises
        RuntimeUnavailable."""

    async def pause(self, sandbox_id: str) -> None:
        """Stop its processes, keeping the workspace: inspect says PAUSED after (Docker freezes
        it, memory kept) or EXITED (a runtime whose pause releases the instance). Pausing a
        paused sandbox succeeds. Raises DriverError when there is nothing to pause."""

    async def unpause(self, sandbox_id: str) -> None:
        """Thaw a PAUSED sandbox in place, endpoints unchanged. Raises DriverError when it is
        not PAUSED (the caller then inspects it and starts or re-creates it)."""

    async def start(self, request: SandboxRequest) -> SandboxState:
        """Bring an EXITED or CREATED sandbox up again on its workspace (Docker: starts the
        container; a runtime that keeps only the workspace makes a new instance of `request`);
        starting a running one succeeds."""

    async def remove(self, sandbox_id: str, *, keep_workspace: bool = False) -> None:
        """Remove the sandbox (forced) and, unless `keep_workspace`, its workspace; "already
        gone" counts as success."""

    async def hibernate(self, sandbox_id: str) -> None:
        """Give back the memory of a PAUSED sandbox, keeping its files (Docker: the container
        is stopped; its processes start again with `start`). A runtime whose pause releases
        the instance has nothing more to do. Raises DriverError when there is no instance."""

    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxState]:
        """Every sandbox of this deployment, running or not (of `owner` only, when given)."""

    def watch(self, sink: EventSink) -> Watch:
        """Feed `sink` (on the event loop) an event for each change of this deployment's
        sandboxes. `sink(None)` or `sink(exception)` marks the end of the stream: the caller
        watches again and relies on its periodic sweep (list_sandboxes) for what it missed; a
        driver may resume a stream itself where the runtime allows (Kubernetes: from the last
        resourceVersion). close() the watch to stop it."""

    async def close(self) -> None: ...
