"""A sandbox's pod, or its claim alone, read as the sandbox's state (drivers/base.py), with a clear
reason for whatever keeps it from running.

| the pod | RunState |
| --- | --- |
| none, the claim kept (paused) | EXITED |
| being deleted (a pause in progress) | EXITED |
| Pending: scheduling, pulling, creating | CREATED |
| Pending or Running, its image cannot be pulled or its container cannot be made | DEAD |
| Running | RUNNING |
| Running, but its node stopped reporting (Ready turned False by the node controller) | DEAD |
| Succeeded, or Failed with an exit code | EXITED (the exit code) |
| Failed: OOMKilled, evicted; Unknown | DEAD |
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drivers.base import Endpoint, RunState, SandboxState
from drivers.kubernetes.names import identity

Json = dict[str, Any]

IMAGE_FAILURES = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
CONTAINER_FAILURES = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"}
)


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def container(pod: Json) -> Json:
    """The sandbox container's status (the pod has one container)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def condition(pod: Json, kind: str) -> Json | None:
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def terminating(obj: Json) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def unschedulable(pod: Json) -> str | None:
    """The scheduler's message while it finds no node for the pod."""
    scheduled = condition(pod, "PodScheduled")
    if (
        scheduled
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    ):
        return str(scheduled.get("message") or "no node fits")
    return None


def capacity_verdict(pod: Json) -> str | None:
    """An unschedulable pod's message when the cluster lacks room (or nodes) for it; None when
    it only waits for its volume (a claim still binding is not a capacity problem)."""
    message = unschedulable(pod)
    if message is None or "PersistentVolumeClaim" in message or "volume" in message.lower():
        return None
    return message


def image_failure(pod: Json) -> str | None:
    """Why the pod's image cannot be had, or None."""
    waiting = (container(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in IMAGE_FAILURES:
        image = (pod.get("spec") or {}).get("containers", [{}])[0].get("image", "?")
        detail = waiting.get("message") or waiting.get("reason")
        return f"image {image} cannot be pulled ({waiting.get('reason')}): {detail}"
    return None


def _memory_limit(pod: Json) -> str:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return str(((containers[0].get("resources") or {}).get("limits") or {}).get("memory", "?"))


def failure(pod: Json) -> tuple[str, bool] | None:
    """Why the pod is dead (its reason, and whether memory ran out), None while it is not."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    state = container(pod).get("state") or {}
    if pulled := image_failure(pod):
        return pulled, False
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in CONTAINER_FAILURES:
        return f"the container cannot start ({waiting['reason']}): {waiting.get('message')}", False
    terminated = state.get("terminated") or {}
    if terminated.get("reason") == "OOMKilled":
        return (
            f"out of memory: the sandbox used more than its {_memory_limit(pod)} limit and was "
            "killed (OOMKilled)",
            True,
        )
    node = (pod.get("spec") or {}).get("nodeName") or "?"
    if phase == "Failed" and status.get("reason"):
        return f"{status['reason']} on node {node}: {status.get('message') or ''}".strip(), False
    if phase == "Unknown":
        return f"node {node} is lost: the pod's state is unknown", False
    if phase == "Running" and state.get("running") and not terminating(pod):
        ready = condition(pod, "Ready")
        # No readiness probe: the kubelet reports a running container's pod Ready at once, so a
        # running pod not Ready was marked so by the node controller: its node stopped reporting.
        if ready and ready.get("status") == "False":
            return (
                f"node {node} stopped responding (its kubelet no longer reports): the sandbox is "
                "unreachable; resume it to start it again on another node",
                False,
            )
    return None


def _status(pod: Json) -> tuple[RunState, str | None, bool]:
    if terminating(pod):
        return RunState.EXITED, None, False
    dead = failure(pod)
    if dead is not None:
        return RunState.DEAD, dead[0], dead[1]
    phase = (pod.get("status") or {}).get("phase")
    state = container(pod).get("state") or {}
    if phase in ("Succeeded", "Failed") or state.get("terminated"):
        return RunState.EXITED, None, False
    if phase == "Running" and state.get("running"):
        return RunState.RUNNING, None, False
    return RunState.CREATED, unschedulable(pod), False


def state_of(pod: Json, host: str | None, created_at: datetime | None = None) -> SandboxState:
    """The sandbox of `pod`; its ports reached at `host` (the pod's IP, or its Service's)."""
    metadata = pod.get("metadata") or {}
    sandbox_id, owner, spec_id, _prefix = identity(metadata) or ("", "", "", "")
    status, error, oom = _status(pod)
    spec_container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
    ports = [int(p["containerPort"]) for p in spec_container.get("ports") or []]
    endpoints: dict[int, Endpoint] = {}
    if host and status in (RunState.RUNNING, RunState.CREATED):
        endpoints = {port: Endpoint(host, port) for port in ports}
    env = {e["name"]: e.get("value", "") for e in spec_container.get("env") or []}
    terminated = (container(pod).get("state") or {}).get("terminated") or {}
    exit_code = terminated.get("exitCode")
    return SandboxState(
        sandbox_id=sandbox_id,
        owner=owner,
        spec_id=spec_id,
        name=str(metadata.get("name", "")),
        status=status,
        endpoints=endpoints,
        env=env,
        exit_code=int(exit_code) if exit_code is not None else None,
        oom_killed=oom,
        error=error,
        created_at=created_at or parse_time(metadata.get("creationTimestamp")),
    )


def claim_state(claim: Json) -> SandboxState:
    """A sandbox of which only the workspace claim is left: paused (EXITED), to be started."""
    metadata = claim.get("metadata") or {}
    sandbox_id, owner, spec_id, _prefix = identity(metadata) or ("", "", "", "")
    return SandboxState(
        sandbox_id=sandbox_id,
        owner=owner,
        spec_id=spec_id,
        name=str(metadata.get("name", "")),
        status=RunState.EXITED,
        endpoints={},
        env={},
        created_at=parse_time(metadata.get("creationTimestamp")),
    )
