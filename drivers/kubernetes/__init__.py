"""The Kubernetes runtime: a sandbox is a pod with its workspace on a PersistentVolumeClaim and a
NetworkPolicy, in one namespace (driver.py: KubernetesDriver).

Its public face is this module: its settings (settings.py) and `RUNTIME`, its row of
drivers/runtimes.py; everything else is its own (an import-linter contract in pyproject.toml
keeps the control plane out). kubernetes_asyncio, which takes a second or two to import, is
imported with the driver, only where this runtime is chosen.
"""

from __future__ import annotations

from drivers.base import SandboxDriver
from drivers.kubernetes.settings import KubernetesSettings
from drivers.runtime import Runtime, RuntimeHost

__all__ = ["RUNTIME", "KubernetesSettings"]


def make_driver(settings: KubernetesSettings, host: RuntimeHost) -> SandboxDriver:
    from drivers.kubernetes.driver import KubernetesDriver  # noqa: PLC0415 (see above)

    return KubernetesDriver(
        settings,
        prefix=host.prefix,
        host_ports=host.host_ports,
        listener=host.listener,
        on_error=host.counter(
            "acs_kubernetes_errors",
            "Kubernetes API calls that failed (no answer, or a refusal)",
            "operation",
        ),
        on_watch_restart=host.counter(
            "acs_kubernetes_watch_restarts",
            "Times the sandbox pod watch was resumed after a break (`broken`) or listed again "
            "because its resourceVersion had expired (`expired`, 410 Gone)",
            "reason",
        ),
        helper_image=host.helper_image,
    )


RUNTIME = Runtime(settings=KubernetesSettings, make=make_driver)
