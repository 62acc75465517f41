"""What the Kubernetes driver made, read from the API server the way an operator would (as JSON,
by the deployment's label), and the accounting of orphans: every pod, claim, NetworkPolicy and
Service of a deployment has its sandbox record, and every record its objects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from kubernetes_asyncio import client

from controlplane.store import keyspace, text
from drivers.kubernetes.names import ANNOTATION_DETACHED, LABEL_ID, selector

Json = dict[str, Any]
KINDS = {
    "pods": "/api/v1/namespaces/{ns}/pods",
    "claims": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "policies": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "services": "/api/v1/namespaces/{ns}/services",
}


async def api_get(api: client.ApiClient, path: str, **query: str) -> Json:
    response = await api.call_api(
        path,
        "GET",
        query_params=list(query.items()),
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    body = await response.read()
    assert response.status in (200, 404), (path, response.status, body[:300])
    return dict(json.loads(body)) if response.status == 200 else {}


@dataclass
class Objects:
    """A deployment's objects by kind, then by sandbox id."""

    by_kind: dict[str, dict[str, Json]] = field(default_factory=dict)

    def of(self, kind: str) -> dict[str, Json]:
        return self.by_kind.get(kind, {})

    def sandbox_ids(self) -> set[str]:
        return {sandbox for objects in self.by_kind.values() for sandbox in objects}

    def pod(self, sandbox_id: str) -> Json:
        return self.of("pods")[sandbox_id]


async def objects(api: client.ApiClient, namespace: str, prefix: str) -> Objects:
    """Every object of the deployment `prefix` (claims being deleted left out)."""
    found = Objects()
    for kind, path in KINDS.items():
        listed = await api_get(api, path.format(ns=namespace), labelSelector=selector(prefix))
        items = [i for i in listed.get("items") or [] if not i["metadata"].get("deletionTimestamp")]
        found.by_kind[kind] = {i["metadata"]["labels"][LABEL_ID]: i for i in items}
    return found


async def records(redis: aioredis.Redis) -> dict[str, str]:
    """Every sandbox record (pool members included): id -> status."""
    out: dict[str, str] = {}
    async for key in redis.scan_iter(match=keyspace.sandbox("*")):
        name = text(key)
        if name.count(":") != 2:  # acs:sandbox:<id> only
            continue
        status = await redis.hget(name, "status")
        if status is not None:
            out[name.rsplit(":", 1)[1]] = text(status)
    return out


async def orphans(
    api: client.ApiClient, namespace: str, prefix: str, redis: aioredis.Redis, endpoint: str
) -> list[str]:
    """What is left over: objects without a record, records without their objects (a RUNNING
    sandbox needs pod, claim and policy; a PAUSED one claim and policy; with per-sandbox
    Services, each needs its Service). Detached claims (kept on purpose) are reported too."""
    found = await objects(api, namespace, prefix)
    known = await records(redis)
    problems: list[str] = []
    for kind, by_id in found.by_kind.items():
        for sandbox_id, obj in by_id.items():
            if sandbox_id not in known:
                problems.append(f"{kind} {obj['metadata']['name']} has no record")
            elif ANNOTATION_DETACHED in (obj["metadata"].get("annotations") or {}):
                problems.append(f"{kind} {obj['metadata']['name']} is detached")
    for sandbox_id, status in known.items():
        needed = {"RUNNING": ["pods", "claims", "policies"], "PAUSED": ["claims", "policies"]}
        kinds = needed.get(status, [])
        if endpoint == "service" and kinds:
            kinds = [*kinds, "services"]
        problems.extend(
            f"record {sandbox_id} ({status}) has no {kind}"
            for kind in kinds
            if sandbox_id not in found.of(kind)
        )
    return problems


async def eventually(
    check: Callable[[], Awaitable[Any]], within: float, what: str, every: float = 0.2
) -> Any:
    """The first truthy result of `check()`, polled; fails with `what` and the last result."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"{what} not within {within}s: {last!r}")
