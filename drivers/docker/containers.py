"""The container of a sandbox on Docker: the one translation of a sandbox request into the engine's
create arguments (the benches' raw baselines use it too, so that they make the driver's engine
calls), and an inspected container read back as the sandbox's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound
from docker.models.containers import _create_container_args  # type: ignore[attr-defined]  # the SDK's own translation, not in its stubs

from drivers.base import Endpoint, RunState, SandboxRequest, SandboxState
from drivers.docker import names
from drivers.docker.egress import Attachment
from drivers.egress import HOST_GATEWAY
from drivers.errors import ContainerExists


def _parse_time(value: str | None) -> datetime | None:
    if not value or value.startswith("0001-"):
        return None
    # Docker gives nanoseconds; Python parses up to microseconds.
    head, _, frac = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00")


@dataclass(frozen=True)
class ContainerRequest:
    """Everything Docker needs to create one sandbox container (container_request)."""

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


def container_request(
    request: SandboxRequest, prefix: str, publish_host: str, attachment: Attachment | None
) -> ContainerRequest:
    """The container of a sandbox: named and labelled with the deployment's `prefix`, its ports
    published on `publish_host`, on its spec's network (`attachment`; None: the engine's default
    bridge, where host.docker.internal is the engine's host-gateway)."""
    sandbox_id = request.sandbox_id
    return ContainerRequest(
        name=names.container_name(prefix, sandbox_id),
        image=request.image,
        command=request.command,
        env=request.env,
        labels=names.labels(prefix, sandbox_id, request.owner, request.spec_id),
        working_dir=request.working_dir,
        volume=names.volume_name(prefix, sandbox_id),
        ports=request.ports,
        cpus=request.cpus,
        memory_bytes=request.memory_bytes,
        pids=request.pids,
        publish_host=publish_host,
        extra_hosts=attachment.extra_hosts if attachment else {HOST_GATEWAY: "host-gateway"},
        network=attachment.network if attachment else None,
        user=request.user,
        read_only=request.read_only,
        tmpfs=request.tmpfs,
        runtime=request.runtime,
    )


def _status(value: str) -> RunState:
    try:
        return RunState(value)
    except ValueError:  # an engine's state we do not know: nothing the reconciler acts on
        return RunState.RESTARTING


SUMMARISED = frozenset({RunState.RUNNING, RunState.PAUSED})
"""The states in which a container's list summary says all that its inspect would (with its
fixed facts): a running or paused container's exit code is 0 and it has no error. Any other
state (exited, created, dead, restarting) carries its last stop's exit code, OOM kill or error,
which only an inspect gives."""


@dataclass(frozen=True)
class FixedFacts:
    """What a container's inspect gives that its list summary lacks and that never changes in
    the container's life: its environment (as created) and its creation time (to the
    microsecond; the summary's is to the second)."""

    owner: str
    env: dict[str, str]
    created_at: datetime | None


def state_of(attrs: dict[str, Any], address: str) -> SandboxState:
    """A container's inspect output as a sandbox's state, its published ports reached at
    `address`."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    endpoints: dict[int, Endpoint] = {}
    for key, bindings in ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).items():
        if bindings and key.endswith("/tcp"):
            endpoints[int(key.split("/")[0])] = Endpoint(address, int(bindings[0]["HostPort"]))
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    networks = ((attrs.get("NetworkSettings") or {}).get("Networks") or {}).values()
    status = _status(state.get("Status", "unknown"))
    return SandboxState(
        sandbox_id=labels.get(names.LABEL_ID, ""),
        owner=labels.get(names.LABEL_OWNER, ""),
        spec_id=labels.get(names.LABEL_SPEC, ""),
        name=attrs.get("Name", "").lstrip("/"),
        status=status,
        endpoints=endpoints,
        env=env,
        exit_code=state.get("ExitCode"),
        # The engine keeps a past run's OOM kill on a container started again; it describes
        # a stop, so it is reported for a stopped container only (as the list does).
        oom_killed=bool(state.get("OOMKilled")) and status not in SUMMARISED,
        error=state.get("Error") or None,
        created_at=_parse_time(attrs.get("Created")),
        addresses=tuple(n["IPAddress"] for n in networks if n.get("IPAddress")),
    )


def fixed_facts(state: SandboxState) -> FixedFacts:
    return FixedFacts(owner=state.owner, env=state.env, created_at=state.created_at)


def summary_state(summary: dict[str, Any], facts: FixedFacts, address: str) -> SandboxState:
    """A running or paused container's list summary (GET /containers/json), with the facts its
    first inspect gave, as the sandbox's state: equal to what state_of makes of its inspect."""
    labels = summary.get("Labels") or {}
    endpoints: dict[int, Endpoint] = {}
    for port in summary.get("Ports") or []:
        # One entry per binding (an IPv4 and an IPv6 one on 0.0.0.0): the first, as state_of.
        if port.get("Type") == "tcp" and port.get("PublicPort"):
            endpoints.setdefault(
                int(port["PrivatePort"]), Endpoint(address, int(port["PublicPort"]))
            )
    networks = ((summary.get("NetworkSettings") or {}).get("Networks") or {}).values()
    # Names: "/name", and "/other/alias" for each legacy link to it.
    name = next((n[1:] for n in summary.get("Names") or [] if "/" not in n[1:]), "")
    return SandboxState(
        sandbox_id=labels.get(names.LABEL_ID, ""),
        owner=labels.get(names.LABEL_OWNER, ""),
        spec_id=labels.get(names.LABEL_SPEC, ""),
        name=name,
        status=_status(summary.get("State", "unknown")),
        endpoints=endpoints,
        env=facts.env,
        exit_code=0,
        created_at=facts.created_at,
        addresses=tuple(n["IPAddress"] for n in networks if n.get("IPAddress")),
    )


def create_container(client: docker.DockerClient, req: ContainerRequest) -> str:
    """Create the container of `req` (not started); its id. The SDK's own `containers.create`
    inspects the container it made; its argument translation is used without that extra engine
    call. The benches' raw baselines call this too, so that they make the driver's engine calls."""
    try:
        args = _create_container_args(
            dict(
                image=req.image,
                version=client.api.api_version,
                command=req.command,
                name=req.name,
                environment=req.env,
                labels=req.labels,
                working_dir=req.working_dir,
                volumes={req.volume: {"bind": req.working_dir, "mode": "rw"}},
                # No host port: Docker picks a free one and we read it back (no race).
                ports={f"{p}/tcp": (req.publish_host, None) for p in req.ports},
                nano_cpus=int(req.cpus * 1e9),
                mem_limit=req.memory_bytes,
                memswap_limit=req.memory_bytes,
                pids_limit=req.pids,
                security_opt=["no-new-privileges:true"],
                cap_drop=["ALL"],
                user=req.user,
                read_only=req.read_only,
                tmpfs=req.tmpfs or None,
                runtime=req.runtime,
                network=req.network,
                extra_hosts=req.extra_hosts,
                detach=True,
            )
        )
        return str(client.api.create_container(**args)["Id"])
    except APIError as exc:
        if exc.status_code == 409 and not isinstance(exc, ImageNotFound):
            raise ContainerExists(f"container {req.name} exists already") from None
        raise
