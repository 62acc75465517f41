"""The runtimes sandboxes can run on, one row each: ACS_DRIVER names a row, whose settings model
controlplane/config.py reads (and docs/configuration.md lists) and whose factory the wiring calls.

Adding a runtime is a package under drivers/ (its driver, its settings, its `RUNTIME` row in its
`__init__.py`) and a row here; docs/architecture.md, "Adding a runtime", walks through it.
"""

from __future__ import annotations

from typing import Any

from drivers import docker, kubernetes
from drivers.runtime import Runtime

RUNTIMES: dict[str, Runtime[Any]] = {
    "docker": docker.RUNTIME,
    "kubernetes": kubernetes.RUNTIME,
}
DEFAULT_RUNTIME = "docker"
"""The runtime of `make run`: one host's engine, nothing else to set up."""
