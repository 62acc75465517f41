"""A sandbox's Kubernetes objects through the API server (api.py), named by names.py and made
from the manifests of objects.py: made in order (the workspace claim, waited for until bound,
then the NetworkPolicy, the Service, the pod), read as the sandbox's state, listed for the
sweeps, removed; and what a half-done removal leaves (a policy or Service without its sandbox)
swept up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from drivers.base import SandboxRequest, SandboxState
from drivers.errors import ContainerExists, DriverError, RuntimeUnavailable
from drivers.kubernetes.api import (
    STORAGE_CLASSES,
    Expired,
    Forbidden,
    KubeApi,
    claims,
    pods,
    policies,
    services,
    storage_class,
)
from drivers.kubernetes.egress import Egress, Peers
from drivers.kubernetes.names import (
    ANNOTATION_DETACHED,
    claim_name,
    detached,
    name_of,
    owner_of,
    pod_name,
    policy_name,
    sandbox_of,
    selector,
    service_name,
)
from drivers.kubernetes.objects import (
    claim_manifest,
    pod_manifest,
    policy_manifest,
    service_manifest,
)
from drivers.kubernetes.settings import KubernetesSettings
from drivers.kubernetes.state import claim_state, parse_time, state_of, terminating

log = structlog.get_logger(__name__)

Json = dict[str, Any]
BIND_POLL = 0.01
"""A new claim is read first this soon (tens of ms to bind with `Immediate` binding), then at
twice the interval each time, up to BIND_POLL_MAX."""
BIND_POLL_MAX = 0.25
"""The longest wait between two reads of a claim not bound yet: in a burst the binder takes
seconds, and 20 starts reading every 10 ms put ~2,000 GETs a second on the API server that
shares the cluster's cores with the binder and the kubelets."""
UNKNOWN_BINDING_WAIT = 2.0
"""Seconds to wait for a new claim to bind when the storage class cannot be read (with
`Immediate` binding it takes tens of ms; a pod made before it is bound waits for the scheduler's
back-off, seconds)."""
CLAIM_WATCHES = 32
"""Claims watched at once, each on a connection of its own for as long as its binding takes;
more starts at once read theirs (the client keeps 100 connections to the API server)."""
CLAIM_GONE_WITHIN = 30.0
"""Seconds a re-create waits for a claim still being deleted to go."""
DEBRIS_EVERY = 60.0
DEBRIS_AGE = 60.0
"""A NetworkPolicy or Service whose sandbox has neither pod nor claim is removed by a sweep once
it is that old (a create makes the claim first, so only a half-done removal leaves one)."""


class Resources:
    """The objects of the deployment whose names carry `prefix`, in the sandbox namespace;
    `peers`: the control plane as the NetworkPolicies name it."""

    def __init__(
        self, api: KubeApi, settings: KubernetesSettings, prefix: str, peers: Peers
    ) -> None:
        self._api = api
        self._settings = settings
        self._prefix = prefix
        self._ns = settings.kube_namespace
        self._peers = peers
        self._service_ips: dict[str, str] = {}
        self._binding: str | None = None
        self._binding_known = False
        self._binding_lock = asyncio.Lock()
        self._claims_watched = True  # until RBAC refuses a watch of claims (an older Role)
        self._claim_watches = CLAIM_WATCHES
        self._debris_at = 0.0

    # -- making -------------------------------------------------------------------------------

    async def make(
        self,
        request: SandboxRequest,
        egress: Egress,
        *,
        new: bool,
        fill: Callable[[SandboxRequest], Awaitable[None]] | None = None,
    ) -> list[str]:
        """The sandbox's objects, its pod last; the paths of those made now (for `undo`). A
        claim made now is handed to `fill` (a restore) before anything else is made. Raises
        ContainerExists (leaving things alone) when the sandbox exists (its pod; or its claim,
        for a `new` one); on any other failure removes what it made, then raises."""
        made: list[str] = []
        try:
            if await self._ensure_claim(request, new):
                made.append(claims(self._ns, claim_name(self._prefix, request.sandbox_id)))
                if fill is not None:
                    await fill(request)
            if await self._ensure_policy(request, egress):
                made.append(policies(self._ns, policy_name(self._prefix, request.sandbox_id)))
            if self._settings.kube_endpoint == "service" and await self._ensure_service(request):
                made.append(services(self._ns, service_name(self._prefix, request.sandbox_id)))
            made.append(await self._create_pod(request, egress))
        except ContainerExists:
            raise  # not ours: leave it alone
        except BaseException:
            await asyncio.shield(self.undo(made))
            raise
        return made

    async def undo(self, made: list[str]) -> None:
        """Remove what a failed create made, pod first (its claim is protected while a pod
        uses it)."""
        for path in reversed(made):
            try:
                await self._api.delete(path, "remove", grace=0)
            except (RuntimeUnavailable, DriverError) as exc:
                log.warning("kube_cleanup_failed", path=path, error=str(exc))

    async def _create_pod(self, request: SandboxRequest, egress: Egress) -> str:
        runtime = request.runtime
        manifest = pod_manifest(
            request,
            self._settings,
            self._prefix,
            aliases=list(egress.aliases),
            runtime_class=self._settings.kube_runtime_classes.get(runtime, runtime)
            if runtime
            else None,
        )
        name = pod_name(self._prefix, request.sandbox_id)
        if await self._api.create(pods(self._ns), manifest, "create") is None:
            raise ContainerExists(f"pod {name} exists already")
        return pods(self._ns, name)

    async def _ensure_claim(self, request: SandboxRequest, new: bool) -> bool:
        """The workspace claim, made (True) or found (False; re-attached if a removal kept it).
        Raises ContainerExists for a `new` sandbox whose claim exists."""
        name = claim_name(self._prefix, request.sandbox_id)
        path = claims(self._ns, name)
        manifest = claim_manifest(request, self._settings, self._prefix)
        deadline = time.monotonic() + CLAIM_GONE_WITHIN
        while True:
            created = await self._api.create(claims(self._ns), manifest, "create")
            if created is not None:
                await self._bound(path, created)
                return True
            if new:
                raise ContainerExists(f"sandbox {request.sandbox_id} exists already ({name})")
            found = await self._api.get(path, "inspect")
            if found is not None and not terminating(found):
                if detached(found):
                    patch = {"metadata": {"annotations": {ANNOTATION_DETACHED: None}}}
                    await self._api.patch(path, patch, "create")
                return False
            # Gone meanwhile, or still being deleted (a pod of it may still be stopping).
            if time.monotonic() > deadline:
                raise DriverError(f"workspace claim {name} is still being deleted")
            await asyncio.sleep(0.2)

    async def _bound(self, path: str, created: Json) -> None:
        """Wait until a new claim (`created`: the API server's answer to its POST) is bound,
        unless its class binds at the first pod: a pod that meets an unbound claim is retried
        by the scheduler only after a back-off. Followed by a watch of that claim from its
        creation (one request, where reading it took ~16 per start in a burst of 20 on two
        cores, issue 30); read at doubling intervals if the watch cannot be had (a Role
        without `watch` on claims, a broken stream)."""
        mode = await self.binding_mode()
        if mode == "WaitForFirstConsumer":
            return
        limit = UNKNOWN_BINDING_WAIT if mode is None else self._settings.kube_pod_start_timeout
        if _bound(created):
            return
        try:
            async with asyncio.timeout(limit):
                if not await self._watch_bound(path, created, limit):
                    await self._read_bound(path)
        except TimeoutError:
            log.info("kube_claim_not_bound_yet", claim=path, waited_s=limit)

    async def _watch_bound(self, path: str, created: Json, limit: float) -> bool:
        """True once the watch of the claim at `path` saw it bound (or gone); False when the
        watch could not be had (CLAIM_WATCHES are open already, RBAC refuses it, the stream
        broke) or ended first: the caller reads the claim instead."""
        parent, name = path.rsplit("/", 1)
        version = str((created.get("metadata") or {}).get("resourceVersion") or "")
        if not version or not self._claims_watched or not self._claim_watches:
            return False
        stream = self._api.watch(
            parent, "", version, max(1, math.ceil(limit)), fields=f"metadata.name={name}"
        )
        self._claim_watches -= 1
        try:
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    kind = event.get("type")
                    if kind == "DELETED" or (kind != "BOOKMARK" and _bound(event["object"])):
                        return True
        except Forbidden as exc:
            self._claims_watched = False
            log.warning("kube_claim_watch_forbidden", claim=path, error=str(exc))
        except (Expired, RuntimeUnavailable, DriverError) as exc:
            log.info("kube_claim_watch_unavailable", claim=path, error=str(exc))
        finally:
            self._claim_watches += 1
        return False

    async def _read_bound(self, path: str) -> None:
        """The claim read at doubling intervals until it is bound or gone."""
        pause = BIND_POLL
        while True:
            claim = await self._api.get(path, "inspect")
            if claim is None or _bound(claim):
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, BIND_POLL_MAX)

    async def binding_mode(self) -> str | None:
        """The storage class's volumeBindingMode, read once; None when it cannot be read.
        Starts that come together before it is known wait for the one read: answered None
        meanwhile, they would wait for their claims at most UNKNOWN_BINDING_WAIT and make pods
        the scheduler then backs off from (the first cold starts of a burst did, issue 30)."""
        if self._binding_known:
            return self._binding
        async with self._binding_lock:
            if not self._binding_known:
                await self._read_binding_mode()
        return self._binding

    async def _read_binding_mode(self) -> None:
        try:
            if self._settings.kube_storage_class:
                found = await self._api.get(
                    storage_class(self._settings.kube_storage_class), "inspect"
                )
                classes = [found] if found else []
            else:
                listed = await self._api.list(STORAGE_CLASSES, None, "inspect")
                classes = [
                    c
                    for c in listed.get("items") or []
                    if ((c.get("metadata") or {}).get("annotations") or {}).get(
                        "storageclass.kubernetes.io/is-default-class"
                    )
                    == "true"
                ]
        except (Forbidden, RuntimeUnavailable, DriverError) as exc:
            log.info("kube_storage_class_unread", reason=str(exc))
            # An API server that does not answer is asked again at the next start.
            self._binding_known = not isinstance(exc, RuntimeUnavailable)
            return
        self._binding = str(classes[0].get("volumeBindingMode") or "Immediate") if classes else None
        self._binding_known = True

    async def _ensure_policy(self, request: SandboxRequest, egress: Egress) -> bool:
        manifest = policy_manifest(request, self._prefix, self._peers, egress, self._ns)
        if await self._api.create(policies(self._ns), manifest, "create") is not None:
            return True
        # It exists (a re-create): bring its rules up to date in one write, never without one.
        path = policies(self._ns, policy_name(self._prefix, request.sandbox_id))
        await self._api.patch(path, {"spec": manifest["spec"]}, "create")
        return False

    async def _ensure_service(self, request: SandboxRequest) -> bool:
        made = await self._api.create(
            services(self._ns), service_manifest(request, self._prefix), "create"
        )
        found = made or await self._api.get(
            services(self._ns, service_name(self._prefix, request.sandbox_id)), "inspect"
        )
        if found is not None:
            self._service_ips[request.sandbox_id] = str((found.get("spec") or {}).get("clusterIP"))
        return made is not None

    # -- reading ------------------------------------------------------------------------------

    async def read_pod(self, sandbox_id: str) -> Json | None:
        """The sandbox's pod as the API server has it now."""
        return await self._api.get(pods(self._ns, pod_name(self._prefix, sandbox_id)), "inspect")

    async def state(self, pod: Json, claim: Json | None = None) -> SandboxState:
        """The sandbox of `pod` (created when its `claim` was), its ports reached at its pod's
        address or its Service's (ACS_KUBE_ENDPOINT)."""
        sandbox_id = sandbox_of(pod)
        host: str | None
        if self._settings.kube_endpoint == "service":
            host = self._service_ips.get(sandbox_id) or await self._service_ip(sandbox_id)
        else:
            host = (pod.get("status") or {}).get("podIP")
        created = (
            parse_time((claim.get("metadata") or {}).get("creationTimestamp")) if claim else None
        )
        return state_of(pod, host, created)

    async def _service_ip(self, sandbox_id: str) -> str | None:
        found = await self._api.get(
            services(self._ns, service_name(self._prefix, sandbox_id)), "inspect"
        )
        address = (found.get("spec") or {}).get("clusterIP") if found else None
        if address:
            self._service_ips[sandbox_id] = str(address)
        return str(address) if address else None

    async def kept(self, sandbox_id: str) -> SandboxState | None:
        """A sandbox without a pod: its kept claim (paused), None when there is none (or it
        goes, or a removal left it detached)."""
        claim = await self._api.get(
            claims(self._ns, claim_name(self._prefix, sandbox_id)), "inspect"
        )
        if claim is None or terminating(claim) or detached(claim):
            return None
        return claim_state(claim)

    async def states(self, owner: str | None, cached_pods: list[Json] | None) -> list[SandboxState]:
        """Every sandbox (of `owner`) with a pod or a kept claim (a detached one is not a
        sandbox any more): pods from `cached_pods` (the watch's, while it follows the API
        server) or a list, claims from a list. Every minute, NetworkPolicies and Services left
        without pod or claim are removed."""
        chosen = selector(self._prefix, owner)
        debris = await self._debris_candidates() if owner is None else []
        listed = await self._api.list(claims(self._ns), chosen, "list")
        found_claims = {
            sandbox_of(c): c
            for c in listed.get("items") or []
            if sandbox_of(c) and not terminating(c) and not detached(c)
        }
        if cached_pods is None:
            pod_list = await self._api.list(pods(self._ns), chosen, "list")
            cached_pods = pod_list.get("items") or []
        found_pods = {sandbox_of(p): p for p in cached_pods if sandbox_of(p)}
        states: list[SandboxState] = []
        for sandbox_id, pod in found_pods.items():
            if owner is None or owner_of(pod) == owner:
                states.append(await self.state(pod, found_claims.get(sandbox_id)))
        for sandbox_id, claim in found_claims.items():
            if sandbox_id not in found_pods and (owner is None or owner_of(claim) == owner):
                states.append(claim_state(claim))
        await self._remove_debris(debris, set(found_pods) | set(found_claims), listed)
        return states

    # -- removing -----------------------------------------------------------------------------

    async def delete_pod(
        self, sandbox_id: str, operation: str, *, grace: int, uid: str | None = None
    ) -> Json | None:
        """DELETE the sandbox's pod (that very one, given its `uid`): the API server's answer
        (the pod marked for deletion while its grace period runs), None when there was none."""
        path = pods(self._ns, pod_name(self._prefix, sandbox_id))
        return await self._api.delete_object(path, operation, grace=grace, uid=uid)

    async def remove(self, sandbox_id: str, *, keep_workspace: bool) -> None:
        """Its Service, its NetworkPolicy, then its claim, or with `keep_workspace` the claim
        marked detached (left for an operator, no longer listed as a sandbox). The pod must be
        gone first (its claim is protected while a pod uses it)."""
        await self._api.delete(services(self._ns, service_name(self._prefix, sandbox_id)), "remove")
        await self._api.delete(policies(self._ns, policy_name(self._prefix, sandbox_id)), "remove")
        self._service_ips.pop(sandbox_id, None)
        claim = claims(self._ns, claim_name(self._prefix, sandbox_id))
        if keep_workspace:
            now = datetime.now(UTC).isoformat()
            await self._api.patch(
                claim, {"metadata": {"annotations": {ANNOTATION_DETACHED: now}}}, "remove"
            )
        else:
            await self._api.delete(claim, "remove")

    async def _debris_candidates(self) -> list[tuple[str, Json]]:
        """NetworkPolicies and Services (listed before claims and pods: a create makes its claim
        first, so any policy seen here whose claim exists shows in the lists that follow)."""
        if time.monotonic() - self._debris_at < DEBRIS_EVERY:
            return []
        self._debris_at = time.monotonic()
        chosen = selector(self._prefix)
        found: list[tuple[str, Json]] = []
        for path in (policies(self._ns), services(self._ns)):
            listed = await self._api.list(path, chosen, "list")
            found.extend((path, obj) for obj in listed.get("items") or [])
        return found

    async def _remove_debris(
        self, candidates: list[tuple[str, Json]], alive: set[str], claims_listed: Json
    ) -> None:
        every_claim = {sandbox_of(c) for c in claims_listed.get("items") or []}
        now = datetime.now(UTC)
        for path, obj in candidates:
            sandbox_id = sandbox_of(obj)
            created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
            if sandbox_id in alive or sandbox_id in every_claim or created is None:
                continue
            if (now - created).total_seconds() < DEBRIS_AGE:
                continue
            log.info("kube_debris_removed", object=f"{path}/{name_of(obj)}", sandbox_id=sandbox_id)
            await self._api.delete(f"{path}/{name_of(obj)}", "remove")


def _bound(claim: Json) -> bool:
    """The claim is bound to a volume."""
    return (claim.get("status") or {}).get("phase") == "Bound"
