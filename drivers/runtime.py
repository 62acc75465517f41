"""What a runtime is to the control plane: a settings model and a factory, one row of
drivers/runtimes.py each (docs/architecture.md, "Adding a runtime").

A runtime's settings are declared once, in its own package, as a `RuntimeSettings` model: field
`x` is read from the variable `ACS_X` (controlplane/config.py reads the chosen runtime's), its
description is what docs/configuration.md says of it, and the model's docstring titles its group
there. What every runtime gets besides, from settings of the control plane's own, is a
`RuntimeHost`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict

from drivers.base import HostListener, SandboxDriver

T = TypeVar("T")


def split_commas(value: Any) -> Any:
    """`a, b,,c` -> ["a", "b", "c"]; anything but a string is left to the field's type."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[T], BeforeValidator(split_commas)]
"""A list written in one variable as comma-separated items (each then validated as T)."""


def split_pairs(value: Any) -> Any:
    """`a=1, b=2` -> {"a": "1", "b": "2"}; anything but a string is left to the field's type."""
    if not isinstance(value, str):
        return value
    pairs: dict[str, str] = {}
    for item in split_commas(value):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        pairs[key.strip()] = val.strip()
    return pairs


KeyValues = Annotated[dict[str, str], BeforeValidator(split_pairs)]
"""A mapping written in one variable as comma-separated `key=value` items."""


class RuntimeSettings(BaseModel):
    """Base of a runtime's settings model. A field that wants its default said in words in
    docs/configuration.md gives it as `json_schema_extra={"shown_default": "…"}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def check(self, prefix: str) -> None:
        """Rules across these settings and the deployment's prefix (ACS_CONTAINER_PREFIX),
        checked once at start-up; each field validates itself. Raises ValueError with a
        message that names the variables."""

    def listener_address(self) -> str | None:
        """The address these settings bind the webhook listener at, when they fix one (serve
        refuses to share its port with the API there); None when the runtime finds its own
        (Docker: each sandbox network's gateway)."""
        return None


Count = Callable[[str], None]
"""Counts one occurrence, labelled (e.g. by the operation that failed)."""
Counters = Callable[[str, str, str], Count]
"""counters(name, documentation, label): a labelled counter of the control plane's metrics, made
on first use (a runtime names its own: `acs_docker_errors`, `acs_kubernetes_errors`)."""


@dataclass(frozen=True)
class RuntimeHost:
    """What the control plane hands the runtime it runs sandboxes on, from its own settings."""

    prefix: str
    """ACS_CONTAINER_PREFIX: names and labels every object of the deployment."""
    url_host: str = "127.0.0.1"
    """ACS_URL_HOST: where the control plane reaches what a runtime publishes on its host."""
    host_ports: tuple[int, ...] = ()
    """ACS_SANDBOX_HOST_PORTS: ports of the control plane's host every sandbox may reach."""
    listener: HostListener | None = None
    """The webhook listener, bound by the runtime where sandboxes reach it; None: no webhooks
    (the CLI's look-ups)."""
    counters: Counters | None = None
    """The metrics (None: nothing counted)."""
    helper_image: str = "acs-base:bookworm"
    """The image a runtime runs its own helpers from (the snapshots' file helper):
    ACS_SNAPSHOT_HELPER_IMAGE, else ACS_BASE_IMAGE."""

    def counter(self, name: str, documentation: str, label: str) -> Count | None:
        return None if self.counters is None else self.counters(name, documentation, label)


@dataclass(frozen=True)
class Removal:
    """What `controlplane networks remove` did: `done` (said on stdout), `warnings` (stderr),
    `in_use` (what is still in use and was left, stderr, exit status 1)."""

    done: str
    warnings: tuple[str, ...] = ()
    in_use: str | None = None


S = TypeVar("S", bound=RuntimeSettings)


@dataclass(frozen=True)
class Runtime(Generic[S]):
    """One row of the runtimes table: what ACS_DRIVER=<name> runs sandboxes on."""

    settings: type[S]
    """Its settings model: read from the environment when it is chosen, documented always."""
    make: Callable[[S, RuntimeHost], SandboxDriver]
    """The driver, made once at start-up (may import the runtime's client library then)."""
    boots_here: bool = False
    """Its sandboxes boot on the control plane's own host (one engine beside it): the boots a
    replica runs at once are then bounded by this host's CPUs unless set
    (ACS_MAX_CONCURRENT_STARTS). False: they are placed elsewhere (a cluster's scheduler)."""
    remove_networks: Callable[[S, RuntimeHost], Awaitable[Removal]] | None = None
    """`controlplane networks remove` (uninstalling): what the runtime keeps of the deployment
    outside its sandboxes (Docker: networks and firewall chains), removed. None: it keeps
    nothing of the kind."""
