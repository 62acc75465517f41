"""Bringing a container up to a healthy agent server, or cleaning up and saying why not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
import structlog

from controlplane.config import ServiceConfig
from controlplane.errors import Conflict, ControlPlaneError
from controlplane.lifecycle.models import LifecycleType
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.networking import Attachment, SandboxNetworks
from controlplane.sandboxes.store import SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.egress import HOST_GATEWAY
from controlplane.specs.models import AGENT_SERVER, SandboxSpec
from drivers.base import ContainerRequest, ContainerState, SandboxDriver

log = structlog.get_logger(__name__)
S = SandboxStatus


class StartFailed(ControlPlaneError):
    code = "sandbox_start_failed"
    status = 502


def container_request(
    config: ServiceConfig,
    record: SandboxRecord,
    spec: SandboxSpec,
    attachment: Attachment | None = None,
    webhook_port: int | None = None,
) -> ContainerRequest:
    """The container of one sandbox: on its spec's network (`attachment`; None: the engine's
    default bridge), posting its webhooks to ACS_PUBLIC_URL or to the listener on `webhook_port`."""
    env = dict(spec.initial_env)
    env.update(
        {
            "OH_SESSION_API_KEYS_0": record.session_api_key,
            "ACS_SANDBOX_ID": record.id,
            "ACS_WORKSPACE": spec.working_dir,
        }
    )
    base = config.public_url
    if base is None and webhook_port:
        base = f"http://{HOST_GATEWAY}:{webhook_port}"
    if base:
        env["OH_WEBHOOKS_0_BASE_URL"] = f"{base}/api/v1/webhooks/{record.id}"
    # The pages allowed to call the API may call the sandbox's agent server too (the web
    # frontend reads events and sends messages there directly).
    for n, origin in enumerate(config.cors_origins):
        env[f"OH_ALLOW_CORS_ORIGINS_{n}"] = origin
    prefix = config.container_prefix
    return ContainerRequest(
        name=naming.container_name(prefix, record.id),
        image=spec.image,
        command=spec.command,
        env=env,
        labels=naming.labels(prefix, record.id, record.owner, spec.id),
        working_dir=spec.working_dir,
        volume=naming.volume_name(prefix, record.id),
        ports=sorted(set(spec.exposed_ports.values())),
        cpus=spec.resources.cpus,
        memory_bytes=spec.resources.memory_bytes,
        pids=spec.resources.pids,
        publish_host=config.publish_host,
        extra_hosts=attachment.extra_hosts if attachment else {HOST_GATEWAY: "host-gateway"},
        network=attachment.network if attachment else None,
        user=spec.user,
        read_only=spec.read_only_root,
        tmpfs=spec.tmpfs_mounts,
        runtime=spec.runtime,
    )


def host_ports(spec: SandboxSpec, state: ContainerState) -> dict[str, int]:
    return {
        name: state.ports[port] for name, port in spec.exposed_ports.items() if port in state.ports
    }


class HealthProbe:
    """Polls /health until it answers 200, the container dies, or time runs out."""

    def __init__(
        self, http: aiohttp.ClientSession, driver: SandboxDriver, host: str, timeout: float
    ) -> None:
        self._http = http
        self._driver = driver
        self._host = host
        self._timeout = timeout

    async def once(self, port: int) -> bool:
        try:
            async with self._http.get(
                f"http://{self._host}:{port}/health", timeout=aiohttp.ClientTimeout(total=2)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def wait(self, container: str, ports: dict[str, int]) -> None:
        """Raises StartFailed with the reason when the agent server does not become healthy."""
        port = ports.get(AGENT_SERVER)
        if port is None:
            raise StartFailed("the AGENT_SERVER port was not published")
        deadline = time.monotonic() + self._timeout
        delay, next_inspect = 0.02, time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if await self.once(port):
                return
            if time.monotonic() >= next_inspect:
                next_inspect = time.monotonic() + 1.0
                state = await self._driver.inspect(container)
                if state is None:
                    raise StartFailed("the container disappeared while starting")
                if state.status not in ("running", "created", "restarting"):
                    raise StartFailed(
                        f"the agent server exited (status {state.status}, exit code "
                        f"{state.exit_code}) before answering /health"
                    )
            await asyncio.sleep(delay)
            # Capped low: a loopback /health call costs ~1 ms, a late one costs the whole start.
            delay = min(delay * 1.5, 0.05)
        raise StartFailed(f"the agent server did not answer /health within {self._timeout:g} s")


Publish = Callable[[LifecycleType, SandboxRecord, str | None], Awaitable[None]]


class Launcher:
    """The background steps that bring a sandbox to RUNNING: a first start, a re-create on the
    kept workspace, or a restart of a stopped container. Each ends RUNNING or ERROR."""

    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        *,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        probe: HealthProbe,
        publish: Publish,
        networks: SandboxNetworks | None = None,
    ) -> None:
        self._config = config
        self._networks = networks
        self._store = store
        self._driver = driver
        self._catalog = catalog
        self._probe = probe
        self._publish = publish
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def is_launching(self, sandbox_id: str) -> bool:
        return sandbox_id in self._tasks

    def launch(self, record: SandboxRecord, *, fresh: bool = True) -> None:
        """Create (fresh) or re-create the container in the background."""
        self._spawn(record.id, self._launch(record, fresh=fresh))

    def restart(self, record: SandboxRecord, name: str) -> None:
        """Start a stopped container again in the background."""
        self._spawn(record.id, self._restart(record, name))

    async def cancel(self, sandbox_id: str) -> None:
        task = self._tasks.get(sandbox_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, sandbox_id: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"launch-{sandbox_id}")
        self._tasks[sandbox_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(sandbox_id, None))

    async def _launch(self, record: SandboxRecord, *, fresh: bool) -> None:
        """A failed fresh start removes everything it made; a failed re-create keeps the
        workspace."""
        spec = self._catalog.find(record.spec_id)
        try:
            if spec is None:
                raise Conflict(f"sandbox spec {record.spec_id!r} no longer exists")
            request = await self._request(record, spec)
            state = await self._driver.create_and_start(request)
            ports = host_ports(spec, state)
            await self._store.transition(record, [S.STARTING], S.STARTING, ports=ports)
            await self._probe.wait(request.name, ports)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if spec is not None and self._networks is not None:
                self._networks.forget(spec)  # re-checked at the next start (it may be gone)
            await self._fail(record, f"start failed: {exc}", remove_volume=fresh)
            return
        result = await self._store.transition(
            record, [S.STARTING], S.RUNNING, ports=ports, touch=True
        )
        if result.outcome == "missing":
            # Deleted while starting: the delete may have run before our container existed.
            await self._driver.remove(request.name, request.volume)
        elif result.outcome == "ok":
            await self._publish(LifecycleType.SANDBOX_RUNNING, record, None)

    async def _request(self, record: SandboxRecord, spec: SandboxSpec) -> ContainerRequest:
        if self._networks is None:
            return container_request(self._config, record, spec)
        attachment = await self._networks.prepare(spec)
        port = self._networks.listener.port
        return container_request(self._config, record, spec, attachment, port)

    async def _restart(self, record: SandboxRecord, name: str) -> None:
        spec = self._catalog.find(record.spec_id)
        try:
            if spec is None:
                raise Conflict(f"sandbox spec {record.spec_id!r} no longer exists")
            state = await self._driver.start(name)
            ports = host_ports(spec, state)
            await self._store.transition(record, [S.STARTING], S.STARTING, ports=ports)
            await self._probe.wait(name, ports)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Keep the container and workspace: a failed restart is not a failed first start.
            await self._fail(record, f"restart failed: {exc}", remove_container=False)
            return
        result = await self._store.transition(
            record, [S.STARTING], S.RUNNING, ports=ports, touch=True
        )
        if result.outcome == "ok":
            await self._publish(LifecycleType.SANDBOX_RUNNING, record, None)

    async def _fail(
        self,
        record: SandboxRecord,
        reason: str,
        *,
        remove_volume: bool = False,
        remove_container: bool = True,
    ) -> None:
        log.warning("sandbox_start_failed", sandbox_id=record.id, reason=reason)
        prefix = self._config.container_prefix
        if remove_container:
            volume = naming.volume_name(prefix, record.id) if remove_volume else None
            try:
                await self._driver.remove(naming.container_name(prefix, record.id), volume)
            except Exception as exc:
                log.warning("sandbox_cleanup_failed", sandbox_id=record.id, error=str(exc))
        result = await self._store.transition(record, [S.STARTING], S.ERROR, reason=reason)
        if result.outcome == "ok":
            await self._publish(LifecycleType.SANDBOX_ERROR, record, reason)
