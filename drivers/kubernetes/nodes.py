"""The nodes sandboxes may run on, when the control plane may read them.

Reading nodes needs a ClusterRole (nodes are not namespaced), which a platform team may withhold:
everything here is optional (docs/deployment.md, "RBAC"). With it, the driver knows the nodes'
allocatable memory (admission's capacity), which nodes are Ready (a sandbox whose node stopped
reporting is dead at once, not only once the node controller gives up on it) and which images
they hold (with ACS_KUBE_IMAGE_PULL_POLICY=Never, an image no node has is missing). Without it,
admission relies on the scheduler's verdicts (drivers/kubernetes/driver.py) and images on the pulls.

Nodes are listed at most every REFRESH seconds, in the background: callers read what is known.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from drivers.errors import DriverError, RuntimeUnavailable
from drivers.kubernetes.api import NODES, Forbidden, KubeApi

log = structlog.get_logger(__name__)

Json = dict[str, Any]
REFRESH = 10.0

_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m|u|n|e[0-9]+)?$")
_FACTORS = {
    "": 1.0,
    "Ki": 1024.0,
    "Mi": 1024.0**2,
    "Gi": 1024.0**3,
    "Ti": 1024.0**4,
    "Pi": 1024.0**5,
    "Ei": 1024.0**6,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}


def quantity(value: object) -> float:
    """A Kubernetes quantity (`24581256Ki`, `1Gi`, `512M`, `100m`) as a number; 0 if unreadable."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return 0.0
    number, suffix = float(match.group(1)), match.group(2) or ""
    if suffix.startswith("e"):
        return float(number * 10 ** int(suffix[1:]))
    return number * _FACTORS.get(suffix, 0.0)


@dataclass(frozen=True)
class Node:
    name: str
    ready: bool
    schedulable: bool
    allocatable: int  # bytes of memory
    images: frozenset[str]


def _node(raw: Json) -> Node:
    status = raw.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    names = {name for image in status.get("images") or [] for name in image.get("names") or []}
    return Node(
        name=str((raw.get("metadata") or {}).get("name", "")),
        ready=ready,
        schedulable=not (raw.get("spec") or {}).get("unschedulable", False),
        allocatable=int(quantity((status.get("allocatable") or {}).get("memory", 0))),
        images=frozenset(names),
    )


def requested_memory(pod: Json) -> int:
    total = 0.0
    for container in (pod.get("spec") or {}).get("containers") or []:
        total += quantity(
            ((container.get("resources") or {}).get("requests") or {}).get("memory", 0)
        )
    return int(total)


class Nodes:
    def __init__(self, api: KubeApi, node_selector: dict[str, str]) -> None:
        self._api = api
        self._selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or None
        self._nodes: dict[str, Node] = {}
        self._read_at = 0.0
        self.readable: bool | None = None  # None: not asked yet
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Task[None] | None = None
        self._closed = False

    async def refresh(self) -> None:
        """List the nodes now (a refusal makes the view unreadable for good; an API server
        that does not answer keeps what was known)."""
        if self.readable is False:
            return
        try:
            listed = await self._api.list(NODES, self._selector, "nodes")
        except Forbidden as exc:
            self.readable = False
            log.info(
                "kube_nodes_unreadable",
                reason=str(exc),
                effect="admission by the scheduler's verdicts only",
            )
            return
        except (RuntimeUnavailable, DriverError) as exc:
            log.warning("kube_nodes_not_listed", error=str(exc))
            return
        finally:
            self._read_at = time.monotonic()
        self._nodes = {n.name: n for n in (_node(raw) for raw in listed.get("items") or [])}
        self.readable = True

    async def first_read(self) -> None:
        """The nodes read unless they have been (or were found unreadable). Callers that come
        before that read has answered share it: a burst's first creates after a start each
        listed every node, images and all, at once (issue 30: the first cold creates of a
        burst of 20 were answered after 0.5-1.3 s instead of about 0.15 s). An API server that
        does not answer leaves them unknown, and the next caller asks again."""
        if self.readable is not None or self._closed:
            return
        if self._first is None or self._first.done():
            self._first = asyncio.create_task(self.refresh(), name="kube-nodes-first")
        # Shielded: a caller that gives up (its request cancelled) leaves the read to the others.
        await asyncio.shield(self._first)

    def touch(self) -> None:
        """Refresh in the background when what is known is older than REFRESH seconds."""
        if self.readable is False or time.monotonic() - self._read_at < REFRESH:
            return
        if self._closed:
            return
        if self._task is None or self._task.done():
            self._read_at = time.monotonic()
            self._task = asyncio.create_task(self.refresh(), name="kube-nodes")

    def ready(self, name: str) -> bool | None:
        """Whether the node is Ready; None when unknown."""
        self.touch()
        node = self._nodes.get(name)
        return None if node is None else node.ready

    def usable(self) -> list[Node]:
        return [n for n in self._nodes.values() if n.ready and n.schedulable]

    def capacity(self) -> int | None:
        """Allocatable memory of the Ready, schedulable nodes sandboxes may use; None when
        unknown."""
        self.touch()
        if not self.readable:
            return None
        return sum(n.allocatable for n in self.usable())

    def has_image(self, reference: str) -> bool | None:
        """Whether a Ready node holds the image; None when unknown."""
        self.touch()
        if not self.readable:
            return None
        return any(reference in n.images for n in self._nodes.values() if n.ready)

    def room_for(self, reservation: int, pods: Iterable[Json]) -> bool | None:
        """Whether some usable node has `reservation` bytes left once the sandboxes known on it
        are counted (other workloads are not known here: the scheduler's verdict covers them);
        None when nodes are unknown."""
        self.touch()
        if not self.readable:
            return None
        used: dict[str, int] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
                used[node] = used.get(node, 0) + requested_memory(pod)
        return any(n.allocatable - used.get(n.name, 0) >= reservation for n in self.usable())

    async def close(self) -> None:
        self._closed = True
        for task in (self._task, self._first):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
