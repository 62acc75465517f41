"""A sandbox spec as written in YAML, and as the API shows it (SandboxSpecInfo)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from drivers.egress import Egress, parse_egress

SPEC_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_MEMORY_RE = re.compile(r"^([0-9]+)([kmg]?)b?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
AGENT_SERVER = "AGENT_SERVER"
DEFAULT_RESERVATION = "64m"
"""Admission's default per sandbox: twice an idle sandbox's ~31 MiB, so a 24 GiB host admits
~345 with the default 0.9 fraction (docs/operations.md, "Capacity")."""
#: Writable scratch space of a read-only root: the agent user's home, /tmp and the agent server's
#: state (mount options as `docker run --tmpfs`).
DEFAULT_TMPFS = {
    "/tmp": "rw,nosuid,nodev,size=256m",  # noqa: S108 (a tmpfs inside the sandbox)
    "/home/agent": "rw,nosuid,nodev,size=256m,uid=1000,gid=1000,mode=0755",
    "/var/lib/acs-agent": "rw,nosuid,nodev,size=64m,uid=1000,gid=1000,mode=0700",
}


#: Which agent server a spec's image runs: `acs` (ours, agent/) or `openhands` (the official
#: OpenHands agent server). The launcher sets the environment each needs (agent_protocol/kinds.py).
AgentKind = Literal["acs", "openhands"]


class BuildSpec(BaseModel):
    """How scripts/build-images.sh builds the image (the control plane only validates it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context: str = Field(description="Build context, relative to the specs directory")
    debian: Literal["bookworm", "trixie"] = Field(
        default="bookworm", description="Debian release of the base image (acs-base:<release>)"
    )
    python: str = Field(
        default="3.11", pattern=r"^3\.[0-9]{1,2}$", description="The image's python3, for wheels"
    )
    requirements: str | None = Field(
        default=None,
        description="Pinned requirements, relative to specs/; unset: agent/requirements.txt",
    )


class OpenHandsOptions(BaseModel):
    """What the official agent server may switch on (both off: heavy, and not in the image)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vscode: bool = Field(default=False, description="The VSCode server (OH_ENABLE_VSCODE)")
    browser: bool = Field(default=False, description="The browser tool set (OH_ENABLE_BROWSER)")


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(default=1.0, gt=0, le=256)
    memory: str = Field(default="1g", description="Bytes, or a number with k, m or g")
    pids: int = Field(default=512, ge=16, le=1_000_000)
    memory_reservation: str = Field(
        default=DEFAULT_RESERVATION,
        description="What admission reserves per sandbox (an idle one uses ~31 MiB); `memory` "
        "stays the hard limit. Capped at `memory`.",
    )

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int) -> str:
        text = str(value).strip()
        if _bytes(text) < 6 * 1024**2:
            raise ValueError("memory must be at least 6m (Docker's minimum)")
        return text.lower()

    @field_validator("memory_reservation")
    @classmethod
    def _reservation(cls, value: str | int) -> str:
        text = str(value).strip()
        if _bytes(text) < 1024**2:
            raise ValueError("memory_reservation must be at least 1m")
        return text.lower()

    @property
    def memory_bytes(self) -> int:
        return _bytes(self.memory)

    @property
    def reservation_bytes(self) -> int:
        """The bytes admission counts for one sandbox of this spec (acs:memory_reserved)."""
        return min(_bytes(self.memory_reservation), self.memory_bytes)


def _bytes(text: str) -> int:
    match = _MEMORY_RE.match(text)
    if not match:
        raise ValueError("memory must be bytes or a number with k, m or g, e.g. 512m")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


PortNumber = Annotated[int, Field(ge=1, le=65535)]


class SandboxSpec(BaseModel):
    """One template. Unknown keys are an error, reported with file and line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=SPEC_ID_PATTERN)
    description: str = Field(default="", max_length=1000)
    default: bool = False
    enabled: bool = Field(
        default=True, description="false: not offered unless named in ACS_ENABLE_SPECS"
    )
    agent_kind: AgentKind = "acs"
    openhands: OpenHandsOptions | None = Field(
        default=None, description="Options of the official agent server (agent_kind openhands)"
    )
    image: str = Field(min_length=1, max_length=512)
    build: BuildSpec | None = None
    command: list[str] | None = None
    working_dir: str = "/workspace"
    initial_env: dict[str, str] = Field(default_factory=dict)
    exposed_ports: dict[str, PortNumber]
    resources: Resources = Field(default_factory=Resources)
    idle_timeout: int = Field(default=1800, ge=0, description="Seconds; 0 disables auto-pause")
    # Isolation (docs/sandboxes.md, docs/security.md).
    user: str = Field(
        default="1000:1000",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$",
    )
    read_only_root: bool = False
    tmpfs: dict[str, str] | None = Field(
        default=None, description="path -> mount options; unset: DEFAULT_TMPFS with read_only_root"
    )
    runtime: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    egress: Egress = "internet"
    llm_gateway: bool = Field(
        default=True,
        description="The agent calls models through the control plane's LLM gateway and never "
        "sees the user's key; false (less safe): the key goes into the sandbox",
    )
    checkpoints: bool = Field(
        default=True,
        description="A checkpoint of the sandbox at each user message of its conversations "
        "(with a snapshot store); false: none (docs/sandboxes.md#checkpoints)",
    )
    # The warm pool (docs/sandboxes.md, "Warm pool").
    warm_pool: int = Field(
        default=0, ge=0, le=1000, description="Sandboxes kept booted ahead of demand; 0: none"
    )
    warm_pool_state: Literal["running", "paused"] = Field(
        default="running", description="How pool members wait: running (fastest) or paused"
    )

    @model_validator(mode="after")
    def _kind_options(self) -> SandboxSpec:
        if self.openhands is not None and self.agent_kind != "openhands":
            raise ValueError("openhands options need agent_kind: openhands")
        return self

    @field_validator("egress")
    @classmethod
    def _egress(cls, value: Egress) -> Egress:
        parse_egress(value)
        if isinstance(value, list) and not value:
            raise ValueError("an empty allow-list: write `egress: none`")
        return value

    @field_validator("tmpfs")
    @classmethod
    def _tmpfs(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for path, options in (value or {}).items():
            if not path.startswith("/") or path == "/":
                raise ValueError(f"tmpfs path {path!r} must be an absolute path below /")
            if not re.fullmatch(r"[A-Za-z0-9_=,.-]*", options):
                raise ValueError(f"tmpfs options {options!r} for {path} are not mount options")
        return value

    @property
    def tmpfs_mounts(self) -> dict[str, str]:
        if self.tmpfs is not None:
            return dict(self.tmpfs)
        return dict(DEFAULT_TMPFS) if self.read_only_root else {}

    @field_validator("working_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("working_dir must be an absolute path")
        return value

    @field_validator("exposed_ports")
    @classmethod
    def _agent_server(cls, value: dict[str, int]) -> dict[str, int]:
        if AGENT_SERVER not in value:
            raise ValueError("exposed_ports must name AGENT_SERVER (the agent server's port)")
        for name in value:
            if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,31}", name):
                raise ValueError(f"port name {name!r} must be UPPER_SNAKE_CASE")
        return value

    @field_validator("initial_env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"environment variable name {key!r} is not valid")
        return value


class SandboxSpecInfo(BaseModel):
    """GET /api/v1/sandbox-specs: the OpenHands fields plus ours."""

    id: str
    command: list[str] | None
    created_at: datetime
    initial_env: dict[str, str]
    working_dir: str
    description: str
    image: str
    default: bool
    resources: Resources
    exposed_ports: dict[str, int]
    idle_timeout: int
    runtime: str | None = None
    egress: Egress = "internet"
    warm_pool: int = 0
    warm_pool_state: Literal["running", "paused"] = "running"
    agent_kind: AgentKind = "acs"


class SandboxSpecInfoPage(BaseModel):
    items: list[SandboxSpecInfo]
    next_page_id: str | None = None
