"""The Docker runtime (drivers/base.py: SandboxDriver). A sandbox is a container and a workspace
volume (named and labelled by names.py, made by containers.py) on its spec's
network (egress.py: networks, host firewall rules, the webhook listener on their
gateways), its ports published on the engine's host; pause freezes it in place.

Every engine call goes to one of the engine's two thread lanes (engine.py); image ids are
known without an engine call while the engine's image events are followed (images.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import docker
import structlog
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from drivers.base import (
    EventSink,
    HostListener,
    NetworkPolicy,
    SandboxEvent,
    SandboxRequest,
    SandboxState,
    Watch,
)
from drivers.docker import names, networks
from drivers.docker.bases import OldWorkspace
from drivers.docker.containers import (
    SUMMARISED,
    ContainerRequest,
    FixedFacts,
    container_request,
    create_container,
    fixed_facts,
    state_of,
    summary_state,
)
from drivers.docker.egress import (
    Attachment,
    Engine,
    FirewallMode,
    SandboxNetworks,
    network_labels,
    network_name,
)
from drivers.docker.engine import QUICK, SLOW, DockerEngine
from drivers.docker.firewall import HostFirewall
from drivers.docker.freezer import freeze
from drivers.docker.helper import LABEL_OWNER, LABEL_ROLE, ROLE
from drivers.docker.host_memory import HostMemory
from drivers.docker.images import ImageIdCache
from drivers.docker.snapshots import DockerFiles
from drivers.egress import HOST_GATEWAY
from drivers.errors import ContainerExists, DriverError, ImageMissing, RuntimeUnavailable

log = structlog.get_logger(__name__)


class _NetworkGone(DriverError):
    """The engine has no network of the name a container was to join."""


_WATCHED_ACTIONS = {"start", "die", "kill", "stop", "pause", "unpause", "destroy", "oom", "create"}


class _DockerWatch:
    """Handle on one event stream; close() ends it from any thread."""

    def __init__(self) -> None:
        self.closed = False
        self._stream: Any = None
        self._lock = threading.Lock()

    def attach(self, stream: Any) -> None:
        with self._lock:
            self._stream = stream
            if self.closed:
                stream.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            if self._stream is not None:
                self._stream.close()


class _FactsById:
    """The fixed facts of the containers listed lately, by container id (list_sandboxes); the
    lists run in the engine's threads, so the map is guarded."""

    def __init__(self) -> None:
        self._facts: dict[str, FixedFacts] = {}
        self._lock = threading.Lock()

    def get(self, container_id: str) -> FixedFacts | None:
        with self._lock:
            return self._facts.get(container_id)

    def put(self, container_id: str, facts: FixedFacts) -> None:
        with self._lock:
            self._facts[container_id] = facts

    def keep(self, listed: set[str], owner: str | None) -> None:
        """Forget the containers a list of `owner`'s (None: of everyone's) no longer had."""
        with self._lock:
            gone = [
                container_id
                for container_id, facts in self._facts.items()
                if container_id not in listed and owner in (None, facts.owner)
            ]
            for container_id in gone:
                del self._facts[container_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._facts)


class DockerDriver:
    """Sandboxes on one Docker engine, for the deployment whose objects carry `prefix`.

    `address`: where the control plane reaches published ports (ACS_URL_HOST); `publish_host`:
    the host address they are published on. `listener`: the webhook listener, bound on each
    sandbox network's gateway; without one, sandboxes run on the engine's default bridge with no
    network or firewall of ours (tests, benches and the CLI's look-ups). `memory_floor`: the
    host memory guard's floor (has_room), on a local engine only.
    """

    pause_releases = False  # `docker pause` freezes the container, memory kept
    stage_reads_workspace = True  # a rewind's base takes the old workspace's unchanged files

    def __init__(
        self,
        base_url: str | None = None,
        *,
        prefix: str = "acs-sandbox-",
        threads: int = 8,
        quick_threads: int = 4,
        timeout: int = 60,
        address: str = "127.0.0.1",
        publish_host: str = "127.0.0.1",
        memory_floor: int = 0,
        listener: HostListener | None = None,
        firewall_mode: FirewallMode = "auto",
        host_ports: Sequence[int] = (),
        subnet_pool: str = "10.213.0.0/16",
        subnet_size: int = 22,
        firewall: HostFirewall | None = None,
        on_error: Callable[[str], None] | None = None,
        files_image: str = "acs-base:bookworm",
        reuse_timeout: float = 60.0,
    ) -> None:
        self.prefix = prefix
        self._subnet_pool = subnet_pool
        self._engine_subnets: list[str] = []
        self._address = address
        self._publish_host = publish_host
        self.engine = DockerEngine(
            base_url,
            threads=threads,
            quick_threads=quick_threads,
            timeout=timeout,
            on_error=on_error,
        )
        self._memory = HostMemory(memory_floor, base_url)
        self._images = ImageIdCache(self._open_image_events)
        self.networks: SandboxNetworks | None = None
        if listener is not None:
            self.networks = SandboxNetworks(
                Engine(ensure=self.ensure_network, list=self.list_networks),
                prefix=prefix,
                listener=listener,
                firewall_mode=firewall_mode,
                host_ports=host_ports,
                subnet_pool=subnet_pool,
                subnet_size=subnet_size,
                firewall=firewall,
            )
        self._attachments: dict[str, Attachment] = {}
        self.facts = _FactsById()
        """The fixed facts of the containers listed lately (list_sandboxes)."""
        self.files = DockerFiles(
            self.engine, prefix=prefix, image=files_image, reuse_timeout=reuse_timeout
        )

    # -- the runtime --------------------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            return bool(await self.engine.call(lambda c: c.ping(), "ping"))
        except (RuntimeUnavailable, APIError):
            return False

    async def memory_capacity(self) -> int | None:
        try:
            info = await self.engine.call(lambda c: c.info(), "info")
        except (RuntimeUnavailable, APIError):
            return None
        total = info.get("MemTotal")
        return int(total) if total else None

    def has_room(self, reservation: int) -> bool:
        return self._memory.room_for(reservation)

    async def image_id(self, image: str) -> str | None:
        """The image's id, None when absent: known without asking the engine while its image
        events are followed (drivers/docker/images.py), else asked; an unreachable engine raises
        RuntimeUnavailable."""
        self._images.start()
        known = self._images.get(image)
        if known is not None:
            return known
        generation = self._images.generation()

        def look_up(client: docker.DockerClient) -> str | None:
            try:
                return str(client.images.get(image).id)
            except ImageNotFound:
                return None

        # The error metric's label for image look-ups (documented in docs/operations.md).
        found = await self.engine.call(look_up, "image_exists")
        self._images.put(image, found, generation)
        return found

    def _open_image_events(self, since: int) -> Any:
        return self.engine.client().api.events(decode=True, since=since, filters={"type": "image"})

    # -- networks -----------------------------------------------------------------------------

    async def prepare(self, policies: Sequence[NetworkPolicy]) -> None:
        if self.networks is not None:
            await self.networks.prepare_all(policies)

    async def prepare_network(self, policy: NetworkPolicy) -> str | None:
        if self.networks is None:
            return None
        attachment = await self.networks.prepare(policy)
        self._attachments[attachment.network] = attachment
        return f"http://{HOST_GATEWAY}:{self.networks.listener.port}"

    async def host_address(self, policy: NetworkPolicy) -> str | None:
        if self.networks is None:
            return None  # the engine's default bridge: not a network of ours
        return (await self.networks.prepare(policy)).gateway

    async def sandbox_networks(self) -> list[str]:
        """The subnet pool of our networks (also where the next one comes from) and every
        network of the engine: its containers, ours or not, are this host's."""
        try:
            self._engine_subnets = await self.engine.call(networks.engine_subnets, "network")
        except (RuntimeUnavailable, DockerException) as exc:
            log.warning("sandbox_networks_unknown", error=str(exc), kept=self._engine_subnets)
        return [self._subnet_pool, *self._engine_subnets]

    async def _attachment(self, policy: NetworkPolicy) -> Attachment | None:
        """The network a new container of `policy` joins: as prepare_network last made it ready
        (for this start, just before), else prepared now."""
        if self.networks is None:
            return None
        found = self._attachments.get(network_name(self.prefix, policy))
        if found is None:
            found = await self.networks.prepare(policy)
            self._attachments[found.network] = found
        return found

    def _forget(self, policy: NetworkPolicy) -> None:
        """After a failed create or start: the network may be gone; check it at the next."""
        self._attachments.pop(network_name(self.prefix, policy), None)
        if self.networks is not None:
            self.networks.forget(policy)

    async def ensure_network(
        self, name: str, labels: dict[str, str], pool: str, size: int
    ) -> networks.NetworkInfo:
        """The network `name`, created when absent on the first free /`size` of `pool`.

        Raises DriverError when a network of that name exists without `labels`, or the pool is
        full; RuntimeUnavailable when the engine does not answer.
        """
        return await self.engine.call(
            lambda c: networks.ensure_network(c, name, labels, pool, size), "network", SLOW
        )

    async def list_networks(self, labels: dict[str, str]) -> list[networks.NetworkInfo]:
        """Every network carrying all of `labels`."""
        return await self.engine.call(lambda c: networks.list_networks(c, labels), "network")

    async def remove_networks(self, firewall: HostFirewall | None) -> int:
        """Remove the deployment's networks that have no containers, and their firewall chains
        (`controlplane networks remove`). Returns how many still have containers (kept)."""
        kept = 0
        for info in await self.list_networks(network_labels(self.prefix)):
            if await self._remove_network(info.name):
                if firewall is not None:
                    await asyncio.to_thread(firewall.remove, info.bridge)
            else:
                kept += 1
        return kept

    async def _remove_network(self, name: str) -> bool:
        """Remove the network if it has no containers; False when it still has some."""
        return await self.engine.call(lambda c: networks.remove_network(c, name), "network", SLOW)

    # -- sandboxes ----------------------------------------------------------------------------

    def _name(self, sandbox_id: str) -> str:
        return names.container_name(self.prefix, sandbox_id)

    async def create(self, request: SandboxRequest, *, new: bool = False) -> SandboxState:
        try:
            attachment = await self._attachment(request.network)
            req = container_request(request, self.prefix, self._publish_host, attachment)
            if request.restore is not None:  # its workspace and image from the snapshot
                image = await self.files.restored_workspace(request, req.volume, req.labels)
                req = dataclasses.replace(req, image=image)
                new = False
            try:
                return await self._create_and_start_on(req, new)
            except _NetworkGone:
                # Another process removed the network this spec's sandboxes joined (`controlplane
                # networks remove`); what was remembered of it is stale. Make it (and its fence)
                # again, once: the failed attempt left no container behind.
                self._forget(request.network)
                attachment = await self._attachment(request.network)
                again = container_request(request, self.prefix, self._publish_host, attachment)
                log.info("sandbox_network_made_again", network=again.network)
                return await self._create_and_start_on(
                    dataclasses.replace(again, image=req.image), new
                )
        except DriverError:
            self._forget(request.network)
            raise

    async def stage(self, request: SandboxRequest) -> None:
        """The snapshot's base (volume and image), built unless it exists, from what the
        sandbox's old workspace (a rewind's) holds of it as it was, and from the store for the
        rest. The old container is removed here (`stage_reads_workspace`), the old workspace
        too once the base has what it needs of it."""
        if request.restore is None:
            return
        sandbox_id = request.sandbox_id
        # The old container goes while the base is prepared; its workspace once the base has
        # taken what it holds of the snapshot (the launcher removes it again, whatever
        # happened: "already gone" succeeds).
        gone = asyncio.ensure_future(self.remove(sandbox_id, keep_workspace=True))
        old = OldWorkspace(
            names.volume_name(self.prefix, sandbox_id), gone, lambda: self.remove(sandbox_id)
        )
        try:
            await self.files.bases.stage(request, old)
        finally:
            await asyncio.gather(gone, return_exceptions=True)
        await gone  # its failure, if any, is the stage's

    async def _create_and_start_on(self, req: ContainerRequest, new: bool) -> SandboxState:
        return await self.engine.call(lambda c: self._create_and_start(c, req, new), "create", SLOW)

    def _create_and_start(
        self, client: docker.DockerClient, req: ContainerRequest, new: bool
    ) -> SandboxState:
        # Four engine calls for a new sandbox (volume, create, start, inspect): every call is
        # engine work and Python work under the GIL that short requests wait behind during a
        # burst of starts. No separate image look-up: the service has just asked for the image's
        # id, and create answers ImageNotFound itself (mapped to ImageMissing below).
        made_volume = True
        if not new:
            try:
                client.api.inspect_volume(req.volume)
                made_volume = False  # a re-create: the workspace survives a failure below
            except NotFound:
                pass
        if made_volume:
            client.api.create_volume(name=req.volume, labels=req.labels)
        try:
            container_id = create_container(client, req)
            client.api.start(container_id)
            return state_of(client.api.inspect_container(container_id), self._address)
        except ContainerExists:
            raise  # not ours: leave it alone
        except BaseException as exc:
            self._remove(client, req.name, req.volume if made_volume else None, self.prefix)
            if isinstance(exc, ImageNotFound):
                raise ImageMissing(
                    f"image {req.image} is not on this host; run `make images` to build it"
                ) from None
            if (
                isinstance(exc, NotFound)
                and req.network
                and f"network {req.network} " in (str(exc.explanation) + " ")
            ):
                raise _NetworkGone(f"network {req.network} not found") from None
            if isinstance(exc, APIError):
                raise DriverError(
                    f"Docker refused to start the sandbox: {exc.explanation}"
                ) from None
            raise

    async def inspect(self, sandbox_id: str) -> SandboxState | None:
        name = self._name(sandbox_id)

        def run(client: docker.DockerClient) -> SandboxState | None:
            try:
                return state_of(client.api.inspect_container(name), self._address)
            except NotFound:
                return None

        return await self.engine.call(run, "inspect")

    async def direct_address(self, sandbox_id: str) -> str | None:
        """The container's address on its network, when the engine is local (a remote
        engine's container networks are not routed to this host)."""
        if not self.engine.local:
            return None
        found = await self.inspect(sandbox_id)
        return found.addresses[0] if found is not None and found.addresses else None

    async def _act(
        self,
        operation: str,
        name: str,
        action: Callable[[Any], None],
        benign: str = "",
        lane: str = QUICK,
    ) -> None:
        """Run one container action; a 409 whose message contains `benign` meets the intent."""

        def run(client: docker.DockerClient) -> None:
            try:
                action(client.api)
            except NotFound:
                raise DriverError(f"container {name} does not exist") from None
            except APIError as exc:
                message = str(exc.explanation or exc)
                if exc.status_code == 409 and benign and benign in message:
                    return
                raise DriverError(f"Docker error on {name}: {message}") from None

        await self.engine.call(run, operation, lane)

    async def pause(self, sandbox_id: str) -> None:
        # Paused already: the intent is met. A busy host's freezer is retried (freezer.py).
        await freeze(self.engine, self._name(sandbox_id))

    async def unpause(self, sandbox_id: str) -> None:
        # Strict: "is not paused" may mean stopped, which the caller must handle (restart).
        name = self._name(sandbox_id)
        await self._act("unpause", name, lambda api: api.unpause(name))

    async def start(self, request: SandboxRequest) -> SandboxState:
        """Start the existing container again (it keeps its own configuration: `request` only
        names it)."""
        name = self._name(request.sandbox_id)
        try:
            await self._act("start", name, lambda api: api.start(name), lane=SLOW)
        except DriverError:
            self._forget(request.network)
            raise
        state = await self.inspect(request.sandbox_id)
        if state is None:
            raise DriverError(f"container {name} vanished while starting")
        return state

    async def remove(self, sandbox_id: str, *, keep_workspace: bool = False) -> None:
        name = self._name(sandbox_id)
        volume = None if keep_workspace else names.volume_name(self.prefix, sandbox_id)
        base = await self.files.bases.base_of(volume) if volume else None
        await self.engine.call(lambda c: self._remove(c, name, volume, self.prefix), "remove", SLOW)
        if base is not None:  # a sandbox made from a snapshot: its base may be unused now
            await self.files.bases.release(base)

    async def hibernate(self, sandbox_id: str) -> None:
        """Stop the container (thawed first, so that its processes get SIGTERM and a few
        seconds to save their state): its memory is given back, its files stay."""
        name = self._name(sandbox_id)
        await self._act("unpause", name, lambda api: api.unpause(name), benign="is not paused")
        await self._act("stop", name, lambda api: api.stop(name, timeout=5), lane=SLOW)

    @staticmethod
    def _remove(client: docker.DockerClient, name: str, volume: str | None, prefix: str) -> None:
        try:
            client.api.remove_container(name, force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise DriverError(f"Docker could not remove {name}: {exc.explanation}") from None
        if volume:
            _remove_volume(client, volume, prefix)

    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxState]:
        """One engine list (its container summaries); an inspect only for a container not
        seen before (its environment and creation time, which never change: kept by id) and
        for one neither running nor paused (its last stop's exit code, OOM kill or error).
        The warm pool's pass and the reconciler's sweep call this every few seconds: at an
        inspect per container, its cost grew with every sandbox on the host (issue 30)."""
        labels = {names.LABEL_PREFIX: self.prefix}
        if owner is not None:
            labels[names.LABEL_OWNER] = owner

        def run(client: docker.DockerClient) -> list[SandboxState]:
            filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
            summaries = client.api.containers(all=True, filters=filters)
            states = []
            for summary in summaries:
                facts = self.facts.get(summary["Id"])
                state = None
                if facts is not None:
                    state = summary_state(summary, facts, self._address)
                if state is None or state.status not in SUMMARISED:
                    try:
                        inspected = client.api.inspect_container(summary["Id"])
                    except NotFound:
                        continue
                    state = state_of(inspected, self._address)
                    self.facts.put(summary["Id"], fixed_facts(state))
                states.append(state)
            self.facts.keep({s["Id"] for s in summaries}, owner)
            return states

        return await self.engine.call(run, "list")

    def watch(self, sink: EventSink) -> Watch:
        """Follow container events in a dedicated thread, feeding `sink` on the event loop.

        The thread opens the stream itself: Docker may hold the response until the first event,
        and a wait on the loop for that would not be cancellable. `sink(None)` marks the end,
        `sink(exc)` a broken stream.
        """
        loop = asyncio.get_running_loop()
        filters = {"type": "container", "label": [f"{names.LABEL_PREFIX}={self.prefix}"]}
        watch = _DockerWatch()

        def pump() -> None:
            end: Exception | None = None
            try:
                stream = self.engine.client().api.events(decode=True, filters=filters)
                watch.attach(stream)
                for raw in stream:
                    action = str(raw.get("Action", "")).split(":")[0]
                    if action not in _WATCHED_ACTIONS:
                        continue
                    attrs = (raw.get("Actor") or {}).get("Attributes") or {}
                    event = SandboxEvent(sandbox_id=attrs.get(names.LABEL_ID, ""), action=action)
                    loop.call_soon_threadsafe(sink, event)
            except Exception as exc:
                end = RuntimeUnavailable(f"Docker event stream broke: {exc}")
            if not watch.closed:
                with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                    if end is not None:
                        loop.call_soon_threadsafe(self.engine.report, "events")
                    loop.call_soon_threadsafe(sink, end)

        threading.Thread(target=pump, name="docker-events", daemon=True).start()
        return watch

    async def close(self) -> None:
        if self.networks is not None:
            await self.networks.close()
        self._images.close()
        self.files.close()
        await self.engine.close()


def _remove_volume(client: docker.DockerClient, volume: str, prefix: str) -> None:
    """Removes a workspace volume (gone already: nothing to do). Held by a snapshot helper ("in
    use", 409), whose removal is left to the background once its export is read (files.py) so
    that the snapshot's caller is not held up: that helper goes first, then the volume."""
    for attempt in (1, 2):
        try:
            client.api.remove_volume(volume, force=True)
            return
        except NotFound:
            return
        except APIError as exc:
            if (
                attempt == 1
                and exc.status_code == 409
                and _remove_helpers_of(client, volume, prefix)
            ):
                continue
            raise DriverError(
                f"Docker could not remove volume {volume}: {exc.explanation}"
            ) from None


def _remove_helpers_of(client: docker.DockerClient, volume: str, prefix: str) -> int:
    """Removes this deployment's snapshot helper and loader containers that mount `volume`;
    how many there were."""
    filters = {"volume": volume, "label": [f"{LABEL_OWNER}={prefix}", f"{LABEL_ROLE}={ROLE}"]}
    found = client.api.containers(all=True, filters=filters)
    for container in found:
        with contextlib.suppress(NotFound):
            client.api.remove_container(container["Id"], force=True)
    return len(found)
