"""Whether the cluster has room for one more sandbox, for admission's `has_room`: the scheduler's
verdicts on the deployment's pods (read from the pod watch's cache) and, where the control plane
may read nodes, their allocatable memory (nodes.py).

A start that gives up because no node can run its pod leaves its verdict here: new sandboxes
reserving as much are refused for a while (VERDICT_SECONDS), or until a pod that held a node's
memory goes (the pod watch says so through `freed`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from drivers.kubernetes.nodes import Nodes, requested_memory
from drivers.kubernetes.state import capacity_verdict

Json = dict[str, Any]
VERDICT_SECONDS = 60.0
"""How long a scheduler's refusal keeps new sandboxes out, unless a sandbox's pod goes first."""


class Capacity:
    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes
        self._refused: tuple[float, str, int] | None = None
        self._freed_at = 0.0

    def has_room(self, reservation: int, pods: Iterable[Json]) -> bool:
        """False while a sandbox reserving `reservation` bytes would be refused (`refusal`), or
        when the nodes known, with the deployment's `pods` on them, have no room for it."""
        known = list(pods)
        if self.refusal(reservation, known) is not None:
            return False
        return self._nodes.room_for(reservation, known) is not False

    def refusal(self, reservation: int, pods: Iterable[Json]) -> str | None:
        """The scheduler's verdict that keeps a sandbox reserving `reservation` out: one of
        `pods` requesting as much or less that it cannot place now, or its last such refusal,
        until a pod that held memory has gone since."""
        for pod in pods:
            message = capacity_verdict(pod)
            if message and requested_memory(pod) <= reservation:
                return message
        if self._refused is not None:
            at, message, refused = self._refused
            recent = time.monotonic() - at < VERDICT_SECONDS and self._freed_at < at
            if recent and refused <= reservation:
                return message
        return None

    def refused(self, pod: Json, verdict: str) -> None:
        """A start gave up on `pod`: no node could run it (`verdict`, the scheduler's)."""
        self._refused = (time.monotonic(), verdict, requested_memory(pod))

    def freed(self, pod: Json) -> None:
        """A pod of the deployment is gone (the pod watch's hook)."""
        if (pod.get("spec") or {}).get("nodeName"):  # it held a node's memory
            self._freed_at = time.monotonic()
