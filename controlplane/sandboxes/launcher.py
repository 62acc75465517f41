"""Bringing a container up to a healthy agent server, or cleaning up and saying why not."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import structlog

from controlplane.config import ServiceConfig
from controlplane.errors import ControlPlaneError
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord
from controlplane.specs.models import AGENT_SERVER, SandboxSpec
from drivers.base import ContainerRequest, ContainerState, SandboxDriver

log = structlog.get_logger(__name__)


class StartFailed(ControlPlaneError):
    code = "sandbox_start_failed"
    status = 502


def container_request(
    config: ServiceConfig, record: SandboxRecord, spec: SandboxSpec
) -> ContainerRequest:
    env = dict(spec.initial_env)
    env.update(
        {
            "OH_SESSION_API_KEYS_0": record.session_api_key,
            "ACS_SANDBOX_ID": record.id,
            "ACS_WORKSPACE": spec.working_dir,
        }
    )
    if config.public_url:
        env["OH_WEBHOOKS_0_BASE_URL"] = f"{config.public_url}/api/v1/webhooks/{record.id}"
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
        extra_hosts={"host.docker.internal": "host-gateway"},
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
            delay = min(delay * 1.5, 0.25)
        raise StartFailed(f"the agent server did not answer /health within {self._timeout:g} s")
