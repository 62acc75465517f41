"""The Docker runtime: a sandbox is a container and a workspace volume on one engine, on its
spec's bridge network fenced by host firewall rules (driver.py: DockerDriver).

Its public face is this module: its settings (settings.py) and `RUNTIME`, its row of
drivers/runtimes.py; everything else is its own (an import-linter contract in pyproject.toml
keeps the control plane out). The docker SDK is imported with the driver, when a driver is made.
"""

from __future__ import annotations

from drivers.base import SandboxDriver
from drivers.docker.settings import DockerSettings
from drivers.runtime import Removal, Runtime, RuntimeHost

__all__ = ["RUNTIME", "DockerSettings"]


def make_driver(settings: DockerSettings, host: RuntimeHost) -> SandboxDriver:
    from drivers.docker.driver import DockerDriver  # noqa: PLC0415 (the SDK: see above)

    return DockerDriver(
        settings.docker_url,
        prefix=host.prefix,
        threads=settings.docker_threads,
        quick_threads=settings.docker_quick_threads,
        address=host.url_host,
        publish_host=settings.publish_host,
        memory_floor=settings.host_memory_floor,
        listener=host.listener,
        firewall_mode=settings.host_firewall,
        host_ports=host.host_ports,
        subnet_pool=settings.sandbox_subnet_pool,
        subnet_size=settings.sandbox_subnet_size,
        on_error=host.counter(
            "acs_docker_errors",
            "Docker engine calls that failed (engine unreachable or an error answer)",
            "operation",
        ),
        files_image=host.helper_image,
        reuse_timeout=settings.docker_reuse_timeout,
    )


async def remove_networks(settings: DockerSettings, host: RuntimeHost) -> Removal:
    """The deployment's sandbox networks and their firewall chains, removed where no container
    is left on them (`controlplane networks remove`)."""
    from drivers.docker.driver import DockerDriver  # noqa: PLC0415 (the SDK: see above)
    from drivers.docker.firewall import HostFirewall  # noqa: PLC0415 (with the driver)

    driver = DockerDriver(settings.docker_url, prefix=host.prefix)
    firewall = HostFirewall()
    reason = firewall.unavailable()
    try:
        kept = await driver.remove_networks(firewall if not reason else None)
    finally:
        await driver.close()
    return Removal(
        done=f"removed the sandbox networks of {host.prefix!r}",
        warnings=(f"firewall rules left in place: {reason}",) if reason else (),
        in_use=f"{kept} network(s) still have containers; delete their sandboxes first"
        if kept
        else None,
    )


RUNTIME = Runtime(
    settings=DockerSettings, make=make_driver, boots_here=True, remove_networks=remove_networks
)
