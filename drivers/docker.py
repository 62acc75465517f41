"""Docker runtime: the docker SDK, each blocking call sent to one of two thread pools (lanes)
this driver owns: quick calls (inspect, pause, unpause, image look-up, list) never queue behind
slow ones (create and start, remove), which hold a thread for up to seconds each."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

import docker
import structlog
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import _create_container_args  # type: ignore[attr-defined]
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from controlplane.errors import RuntimeUnavailable
from drivers import docker_networks
from drivers.base import (
    ContainerEvent,
    ContainerExists,
    ContainerRequest,
    ContainerState,
    DriverError,
    EventSink,
    ImageMissing,
    NetworkInfo,
    Watch,
)
from drivers.docker_images import ImageIdCache

log = structlog.get_logger(__name__)
T = TypeVar("T")

_WATCHED_ACTIONS = {"start", "die", "kill", "stop", "pause", "unpause", "destroy", "oom", "create"}


def _parse_time(value: str | None) -> datetime | None:
    if not value or value.startswith("0001-"):
        return None
    # Docker gives nanoseconds; Python parses up to microseconds.
    head, _, frac = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00")


def _state_of(attrs: dict[str, Any]) -> ContainerState:
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    ports: dict[int, int] = {}
    for key, bindings in ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).items():
        if bindings and key.endswith("/tcp"):
            ports[int(key.split("/")[0])] = int(bindings[0]["HostPort"])
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    networks = ((attrs.get("NetworkSettings") or {}).get("Networks") or {}).values()
    return ContainerState(
        id=attrs["Id"],
        name=attrs.get("Name", "").lstrip("/"),
        status=state.get("Status", "unknown"),
        labels=config.get("Labels") or {},
        ports=ports,
        env=env,
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        error=state.get("Error") or None,
        created_at=_parse_time(attrs.get("Created")),
        addresses=tuple(n["IPAddress"] for n in networks if n.get("IPAddress")),
    )


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


QUICK = "quick"
SLOW = "slow"


class DockerDriver:
    """Talks to one Docker engine. `threads` bounds concurrent slow engine calls (create and
    start, restart, remove, networks), `quick_threads` the quick ones, each lane its own FIFO.

    `on_error(operation)`, if given, is called on the event loop for every engine call that
    fails (engine unreachable, an error answer, or a DriverError): the error metric's hook.
    """

    def __init__(
        self,
        base_url: str | None = None,
        threads: int = 8,
        timeout: int = 60,
        quick_threads: int = 4,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._base_url = base_url
        self._on_error = on_error
        self._timeout = timeout
        self._threads = threads + quick_threads
        self._lanes = {
            SLOW: ThreadPoolExecutor(max_workers=threads, thread_name_prefix="docker-slow"),
            QUICK: ThreadPoolExecutor(max_workers=quick_threads, thread_name_prefix="docker-quick"),
        }
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()
        self._images = ImageIdCache(self._open_image_events)

    def _docker(self) -> docker.DockerClient:
        # Created lazily, in a worker thread, so start-up works while the engine is down.
        with self._client_lock:
            if self._client is None:
                # Two more connections: the container and the image event streams hold one each.
                pool = self._threads + 2
                kwargs: dict[str, Any] = {"timeout": self._timeout, "max_pool_size": pool}
                if self._base_url:
                    self._client = docker.DockerClient(base_url=self._base_url, **kwargs)
                else:
                    self._client = docker.from_env(**kwargs)
            return self._client

    def _report(self, operation: str) -> None:
        if self._on_error is not None:
            try:
                self._on_error(operation)
            except Exception:
                log.exception("docker_error_hook_failed")

    async def _call(
        self, fn: Callable[[docker.DockerClient], T], operation: str = "other", lane: str = QUICK
    ) -> T:
        """Run `fn` in `lane`'s pool; `operation` labels the error metric if it fails."""
        loop = asyncio.get_running_loop()

        def run() -> T:
            try:
                return fn(self._docker())
            except (RequestsConnectionError, ReadTimeout) as exc:
                raise RuntimeUnavailable(f"Docker engine unreachable: {exc}") from None
            except DockerException as exc:
                if isinstance(exc, APIError | NotFound):
                    raise
                raise RuntimeUnavailable(f"Docker engine unreachable: {exc}") from None

        future = loop.run_in_executor(self._lanes[lane], run)
        try:
            return await asyncio.shield(future)
        except Exception:
            self._report(operation)
            raise
        except asyncio.CancelledError:
            # The engine call cannot be interrupted. Let it finish before the cancellation goes
            # on, so that whoever cancelled (a delete cancelling a launch) acts after its effect:
            # otherwise the delete's removal can run before the container exists, leaking it.
            await asyncio.wait([future])
            raise

    async def ping(self) -> bool:
        try:
            return bool(await self._call(lambda c: c.ping(), "ping"))
        except (RuntimeUnavailable, APIError):
            return False

    async def memory_total(self) -> int | None:
        try:
            info = await self._call(lambda c: c.info(), "info")
        except (RuntimeUnavailable, APIError):
            return None
        total = info.get("MemTotal")
        return int(total) if total else None

    async def image_id(self, image: str) -> str | None:
        """The image's id, None when absent: known without asking the engine while its image
        events are followed (drivers/docker_images.py), else asked; an unreachable engine raises
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
        found = await self._call(look_up, "image_exists")
        self._images.put(image, found, generation)
        return found

    def _open_image_events(self, since: int) -> Any:
        return self._docker().api.events(decode=True, since=since, filters={"type": "image"})

    async def create_and_start(
        self, request: ContainerRequest, *, new: bool = False
    ) -> ContainerState:
        return await self._call(lambda c: self._create_and_start(c, request, new), "create", SLOW)

    def _create_and_start(
        self, client: docker.DockerClient, req: ContainerRequest, new: bool
    ) -> ContainerState:
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
            return _state_of(client.api.inspect_container(container_id))
        except ContainerExists:
            raise  # not ours: leave it alone
        except BaseException as exc:
            self._remove(client, req.name, req.volume if made_volume else None)
            if isinstance(exc, ImageNotFound):
                raise ImageMissing(
                    f"image {req.image} is not on this host; run `make images` to build it"
                ) from None
            if isinstance(exc, APIError):
                raise DriverError(
                    f"Docker refused to start the sandbox: {exc.explanation}"
                ) from None
            raise

    async def inspect(self, name: str) -> ContainerState | None:
        def run(client: docker.DockerClient) -> ContainerState | None:
            try:
                return _state_of(client.api.inspect_container(name))
            except NotFound:
                return None

        return await self._call(run, "inspect")

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

        await self._call(run, operation, lane)

    async def pause(self, name: str) -> None:
        await self._act("pause", name, lambda api: api.pause(name), benign="already paused")

    async def unpause(self, name: str) -> None:
        # Strict: "is not paused" may mean stopped, which the caller must handle (restart).
        await self._act("unpause", name, lambda api: api.unpause(name))

    async def start(self, name: str) -> ContainerState:
        await self._act("start", name, lambda api: api.start(name), lane=SLOW)
        state = await self.inspect(name)
        if state is None:
            raise DriverError(f"container {name} vanished while starting")
        return state

    async def remove(self, name: str, volume: str | None) -> None:
        await self._call(lambda c: self._remove(c, name, volume), "remove", SLOW)

    @staticmethod
    def _remove(client: docker.DockerClient, name: str, volume: str | None) -> None:
        try:
            client.api.remove_container(name, force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise DriverError(f"Docker could not remove {name}: {exc.explanation}") from None
        if volume:
            try:
                client.api.remove_volume(volume, force=True)
            except NotFound:
                pass
            except APIError as exc:
                raise DriverError(
                    f"Docker could not remove volume {volume}: {exc.explanation}"
                ) from None

    async def list_managed(self, labels: dict[str, str]) -> list[ContainerState]:
        def run(client: docker.DockerClient) -> list[ContainerState]:
            filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
            summaries = client.api.containers(all=True, filters=filters)
            states = []
            for summary in summaries:
                try:
                    states.append(_state_of(client.api.inspect_container(summary["Id"])))
                except NotFound:
                    continue
            return states

        return await self._call(run, "list")

    async def ensure_network(
        self, name: str, labels: dict[str, str], pool: str, size: int
    ) -> NetworkInfo:
        return await self._call(
            lambda c: docker_networks.ensure_network(c, name, labels, pool, size), "network", SLOW
        )

    async def list_networks(self, labels: dict[str, str]) -> list[NetworkInfo]:
        return await self._call(lambda c: docker_networks.list_networks(c, labels), "network")

    async def remove_network(self, name: str) -> bool:
        return await self._call(lambda c: docker_networks.remove_network(c, name), "network", SLOW)

    def watch(self, labels: dict[str, str], sink: EventSink) -> Watch:
        """Follow container events in a dedicated thread, feeding `sink` on the event loop.

        The thread opens the stream itself: Docker may hold the response until the first event,
        and a wait on the loop for that would not be cancellable. `sink(None)` marks the end,
        `sink(exc)` a broken stream.
        """
        loop = asyncio.get_running_loop()
        filters = {"type": "container", "label": [f"{k}={v}" for k, v in labels.items()]}
        watch = _DockerWatch()

        def pump() -> None:
            end: Exception | None = None
            try:
                stream = self._docker().api.events(decode=True, filters=filters)
                watch.attach(stream)
                for raw in stream:
                    action = str(raw.get("Action", "")).split(":")[0]
                    if action not in _WATCHED_ACTIONS:
                        continue
                    attrs = (raw.get("Actor") or {}).get("Attributes") or {}
                    event = ContainerEvent(action=action, name=attrs.get("name", ""), labels=attrs)
                    loop.call_soon_threadsafe(sink, event)
            except Exception as exc:
                end = RuntimeUnavailable(f"Docker event stream broke: {exc}")
            if not watch.closed:
                with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                    if end is not None:
                        loop.call_soon_threadsafe(self._report, "events")
                    loop.call_soon_threadsafe(sink, end)

        threading.Thread(target=pump, name="docker-events", daemon=True).start()
        return watch

    async def close(self) -> None:
        self._images.close()
        client = self._client
        if client is not None:
            await asyncio.get_running_loop().run_in_executor(self._lanes[QUICK], client.close)
        for pool in self._lanes.values():
            pool.shutdown(wait=False, cancel_futures=True)
