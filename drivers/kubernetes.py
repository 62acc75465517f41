"""The Kubernetes runtime (drivers/base.py: SandboxDriver). A sandbox is, in one namespace, a pod
with its workspace on a PersistentVolumeClaim, a NetworkPolicy and, optionally, a ClusterIP
Service (drivers/kube_objects.py); a pause deletes the pod and keeps the claim, a resume makes a
new pod on it (`pause_releases`).

Every call goes through drivers/kube_api.py (kubernetes_asyncio, asyncio all the way: nothing
blocks the event loop); the deployment's pods are followed by one watch (drivers/kube_pods.py)
that starts wait on and the reconciler's events come from; nodes are read when the control plane
may (drivers/kube_nodes.py). Admission: `has_room` is False while the scheduler finds no node for
a sandbox of ours (its last verdict, until a sandbox's pod goes), or when the nodes known have no
room for the reservation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import structlog

from drivers.base import (
    EventSink,
    HostListener,
    NetworkPolicy,
    RunState,
    SandboxFiles,
    SandboxRequest,
    SandboxState,
    Watch,
)
from drivers.egress import lookup
from drivers.errors import (
    ContainerExists,
    DriverError,
    ImageMissing,
    NetworkUnavailable,
    RuntimeUnavailable,
)
from drivers.kube_api import (
    STORAGE_CLASSES,
    Forbidden,
    KubeApi,
    claims,
    pods,
    policies,
    services,
    storage_class,
)
from drivers.kube_egress import Egress, Peers, ipv4, plan
from drivers.kube_names import (
    ANNOTATION_DETACHED,
    ANNOTATION_OWNER,
    LABEL_ID,
    claim_name,
    pod_name,
    policy_name,
    selector,
    service_name,
)
from drivers.kube_nodes import Nodes, requested_memory
from drivers.kube_objects import (
    claim_manifest,
    image_reference,
    pod_manifest,
    policy_manifest,
    service_manifest,
)
from drivers.kube_options import Credentials, KubeOptions
from drivers.kube_pods import PodWatch
from drivers.kube_state import (
    capacity_verdict,
    claim_state,
    image_failure,
    parse_time,
    state_of,
    terminating,
)

log = structlog.get_logger(__name__)

Json = dict[str, Any]
VERDICT_SECONDS = 60.0
"""How long a scheduler's refusal keeps new sandboxes out, unless a sandbox's pod goes first."""
BIND_POLL = 0.01
"""A new claim is read this often until bound (tens of ms with `Immediate` binding)."""
UNKNOWN_BINDING_WAIT = 2.0
"""Seconds to wait for a new claim to bind when the storage class cannot be read (with
`Immediate` binding it takes tens of ms; a pod made before it is bound waits for the scheduler's
back-off, seconds)."""
DEBRIS_EVERY = 60.0
DEBRIS_AGE = 60.0
"""A NetworkPolicy or Service whose sandbox has neither pod nor claim is removed by a sweep once
it is that old (a create makes the claim first, so only a half-done removal leaves one)."""
GONE_WITHIN = 30.0
STOP_SLACK = 2.0


def _name(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _uid(obj: Json) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def _sandbox(obj: Json) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_ID, ""))


def _detached(claim: Json) -> bool:
    return ANNOTATION_DETACHED in ((claim.get("metadata") or {}).get("annotations") or {})


def _stopped(pod: Json) -> bool:
    """The pod's container no longer runs (or never will)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
    return bool(states) and all(not s.get("running") for s in states)


class KubernetesDriver:
    """Sandboxes in `options.namespace` for the deployment whose objects carry `prefix`.

    `listener`: the webhook listener, bound at `options.webhook_address` where sandboxes reach it
    (None: no webhooks: tests, benches and the CLI's look-ups). `on_error(operation)` counts
    failed API calls, `on_watch_restart(why)` the pod watch's resumptions (the metrics' hooks).
    """

    pause_releases = True
    files: SandboxFiles | None = None  # snapshots on Kubernetes: not yet (issue 28, phase 2)

    def __init__(
        self,
        options: KubeOptions,
        *,
        prefix: str,
        credentials: Credentials,
        listener: HostListener | None = None,
        on_error: Callable[[str], None] | None = None,
        on_watch_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.prefix = prefix
        self.options = options
        self._ns = options.namespace
        self._api = KubeApi(credentials, on_error)
        self._pods = PodWatch(
            self._api,
            self._ns,
            selector(prefix),
            on_restart=on_watch_restart,
            on_deleted=self._freed,
        )
        self._nodes = Nodes(self._api, options.node_selector)
        self._listener = listener
        namespace = options.control_plane_namespace or credentials.in_cluster_namespace()
        cidrs = options.control_plane_cidrs
        if not cidrs and (address := ipv4(options.webhook_address)):
            cidrs = (f"{address}/32",)
        self.peers = Peers(dict(options.control_plane_labels), namespace, tuple(cidrs))
        if listener is not None and self.peers.empty:
            raise DriverError(
                "the sandboxes' NetworkPolicies cannot name the control plane: set "
                "ACS_KUBE_CONTROL_PLANE_CIDRS (a control plane outside the cluster) or run it in "
                "the cluster with ACS_KUBE_CONTROL_PLANE_LABELS"
            )
        self._egress: dict[str, Egress] = {}
        self._host_address: str | None = None
        self._service_ips: dict[str, str] = {}
        self._binding: str | None = None
        self._binding_known = False
        self._refused: tuple[float, str, int] | None = None
        self._freed_at = 0.0
        self._debris_at = 0.0

    # -- the runtime --------------------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            status, _ = await self._api.request("GET", "/version", operation="ping", timeout=5)
        except (RuntimeUnavailable, DriverError):
            return False
        return status == 200

    async def memory_capacity(self) -> int | None:
        if self._nodes.readable is None:
            await self._nodes.refresh()
        return self._nodes.capacity()

    def has_room(self, reservation: int) -> bool:
        if self.refusal(reservation) is not None:
            return False
        return self._nodes.room_for(reservation, self._pods.all()) is not False

    def refusal(self, reservation: int) -> str | None:
        """The scheduler's verdict that keeps a sandbox reserving `reservation` out: one of
        ours requesting as much or less that it cannot place now, or its last such refusal,
        until a pod that held memory has gone since."""
        for pod in self._pods.all():
            message = capacity_verdict(pod)
            if message and requested_memory(pod) <= reservation:
                return message
        if self._refused is not None:
            at, message, refused = self._refused
            recent = time.monotonic() - at < VERDICT_SECONDS and self._freed_at < at
            if recent and refused <= reservation:
                return message
        return None

    def _freed(self, pod: Json) -> None:
        if (pod.get("spec") or {}).get("nodeName"):  # it held a node's memory
            self._freed_at = time.monotonic()

    async def image_id(self, image: str) -> str | None:
        """The reference pods pull (a registry digest when the spec names one). With pull
        policy Never (images loaded onto the nodes, no registry) an image no Ready node holds is
        missing, when the control plane may read nodes."""
        reference = image_reference(image, self.options.image_registry)
        if self.options.image_pull_policy == "Never":
            if self._nodes.readable is None:
                await self._nodes.refresh()
            if self._nodes.has_image(reference) is False:
                return None
        return reference

    # -- networks -----------------------------------------------------------------------------

    async def prepare(self, policies: Sequence[NetworkPolicy]) -> None:
        self._pods.start()
        for policy in policies:
            await self.prepare_network(policy)

    async def prepare_network(self, policy: NetworkPolicy) -> str | None:
        self._pods.start()
        if self._listener is None:
            return self.options.control_plane_url
        try:
            port = await self._listener.bind(self.options.webhook_address)
        except OSError as exc:
            raise NetworkUnavailable(
                f"cannot listen for webhooks on {self.options.webhook_address}:"
                f"{self._listener.port}: {exc}"
            ) from None
        url = self.options.control_plane_url or f"http://{self.options.webhook_address}:{port}"
        if policy.spec_id not in self._egress or policy.egress:
            # Allow-listed names are looked up again at each start, as on Docker.
            self._host_address = self._host_address or await self._control_plane_address(url)
            self._egress[policy.spec_id] = await plan(
                policy, self.options, self.peers, port, self._host_address
            )
        return url

    async def host_address(self, policy: NetworkPolicy) -> str | None:
        """The control plane's address as sandboxes reach it (what they call
        host.docker.internal): the host of the webhook URL they are given, when it is one."""
        if self._host_address is None:
            url = self.options.control_plane_url or f"http://{self.options.webhook_address}"
            self._host_address = await self._control_plane_address(url)
        return self._host_address

    async def _control_plane_address(self, url: str) -> str | None:
        """The control plane's address as sandboxes reach it (host.docker.internal)."""
        host = urlsplit(url).hostname or ""
        if found := ipv4(host):
            return found
        addresses = await lookup(host, 80) if host else []
        return addresses[0] if addresses else None

    async def _plan(self, policy: NetworkPolicy) -> Egress:
        if policy.spec_id not in self._egress or policy.egress:
            await self.prepare_network(policy)
        egress = self._egress.get(policy.spec_id)
        if egress is None:  # no listener: the control plane named by its peers alone
            egress = await plan(policy, self.options, self.peers, 0, None)
        return egress

    # -- sandboxes ----------------------------------------------------------------------------

    async def create(self, request: SandboxRequest, *, new: bool = False) -> SandboxState:
        self._pods.start()
        egress = await self._plan(request.network)
        made: list[str] = []
        try:
            if await self._ensure_claim(request, new):
                made.append(claims(self._ns, claim_name(self.prefix, request.sandbox_id)))
            if await self._ensure_policy(request, egress):
                made.append(policies(self._ns, policy_name(self.prefix, request.sandbox_id)))
            if self.options.endpoint == "service" and await self._ensure_service(request):
                made.append(services(self._ns, service_name(self.prefix, request.sandbox_id)))
            name = pod_name(self.prefix, request.sandbox_id)
            manifest = pod_manifest(
                request,
                self.options,
                self.prefix,
                aliases=list(egress.aliases),
                runtime_class=self._runtime_class(request.runtime),
            )
            if await self._api.create(pods(self._ns), manifest, "create") is None:
                raise ContainerExists(f"pod {name} exists already")
            made.append(pods(self._ns, name))
            return await self._running(request.sandbox_id)
        except ContainerExists:
            raise  # not ours: leave it alone
        except BaseException:
            await asyncio.shield(self._undo(made))
            raise

    def _runtime_class(self, runtime: str | None) -> str | None:
        if runtime is None:
            return None
        return self.options.runtime_classes.get(runtime, runtime)

    async def _undo(self, made: list[str]) -> None:
        """Remove what a failed create made, pod first (its claim is protected while a pod
        uses it)."""
        for path in reversed(made):
            try:
                await self._api.delete(path, "remove", grace=0)
            except (RuntimeUnavailable, DriverError) as exc:
                log.warning("kube_cleanup_failed", path=path, error=str(exc))

    async def _ensure_claim(self, request: SandboxRequest, new: bool) -> bool:
        """The workspace claim, made (True) or found (False; re-attached if a removal kept it).
        Raises ContainerExists for a `new` sandbox whose claim exists."""
        name = claim_name(self.prefix, request.sandbox_id)
        path = claims(self._ns, name)
        deadline = time.monotonic() + GONE_WITHIN
        while True:
            created = await self._api.create(
                claims(self._ns), claim_manifest(request, self.options, self.prefix), "create"
            )
            if created is not None:
                await self._bound(path)
                return True
            if new:
                raise ContainerExists(f"sandbox {request.sandbox_id} exists already ({name})")
            found = await self._api.get(path, "inspect")
            if found is not None and not terminating(found):
                if _detached(found):
                    patch = {"metadata": {"annotations": {ANNOTATION_DETACHED: None}}}
                    await self._api.patch(path, patch, "create")
                return False
            # Gone meanwhile, or still being deleted (a pod of it may still be stopping).
            if time.monotonic() > deadline:
                raise DriverError(f"workspace claim {name} is still being deleted")
            await asyncio.sleep(0.2)

    async def _bound(self, path: str) -> None:
        """Wait until a new claim is bound, unless its class binds at the first pod: a pod that
        meets an unbound claim is retried by the scheduler only after a back-off."""
        mode = await self._binding_mode()
        if mode == "WaitForFirstConsumer":
            return
        limit = UNKNOWN_BINDING_WAIT if mode is None else self.options.start_timeout
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            claim = await self._api.get(path, "inspect")
            if claim is None or (claim.get("status") or {}).get("phase") == "Bound":
                return
            await asyncio.sleep(BIND_POLL)
        log.info("kube_claim_not_bound_yet", claim=path, waited_s=limit)

    async def _binding_mode(self) -> str | None:
        """The storage class's volumeBindingMode, read once; None when it cannot be read."""
        if self._binding_known:
            return self._binding
        self._binding_known = True
        try:
            if self.options.storage_class:
                found = await self._api.get(storage_class(self.options.storage_class), "inspect")
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
            self._binding_known = not isinstance(exc, RuntimeUnavailable)
            return None
        self._binding = str(classes[0].get("volumeBindingMode") or "Immediate") if classes else None
        return self._binding

    async def _ensure_policy(self, request: SandboxRequest, egress: Egress) -> bool:
        manifest = policy_manifest(request, self.prefix, self.peers, egress, self._ns)
        if await self._api.create(policies(self._ns), manifest, "create") is not None:
            return True
        # It exists (a re-create): bring its rules up to date in one write, never without one.
        path = policies(self._ns, policy_name(self.prefix, request.sandbox_id))
        await self._api.patch(path, {"spec": manifest["spec"]}, "create")
        return False

    async def _ensure_service(self, request: SandboxRequest) -> bool:
        made = await self._api.create(
            services(self._ns), service_manifest(request, self.prefix), "create"
        )
        found = made or await self._api.get(
            services(self._ns, service_name(self.prefix, request.sandbox_id)), "inspect"
        )
        if found is not None:
            self._service_ips[request.sandbox_id] = str((found.get("spec") or {}).get("clusterIP"))
        return made is not None

    async def _read_pod(self, sandbox_id: str) -> Json | None:
        return await self._api.get(pods(self._ns, pod_name(self.prefix, sandbox_id)), "inspect")

    def _fetch(self, sandbox_id: str) -> Callable[[], Awaitable[Json | None]]:
        return lambda: self._read_pod(sandbox_id)

    async def _pod(self, sandbox_id: str) -> Json | None:
        if self._pods.synced:
            return self._pods.get(sandbox_id)
        return await self._read_pod(sandbox_id)

    async def _running(self, sandbox_id: str) -> SandboxState:
        """Wait until the sandbox's new pod runs; raise with the reason when it cannot."""
        started = time.monotonic()
        seen = False

        def check(pod: Json | None) -> Json | None:
            nonlocal seen
            if pod is None:
                if seen:
                    raise DriverError(f"the pod of sandbox {sandbox_id} vanished while starting")
                return None
            seen = True
            if terminating(pod):
                raise DriverError(f"the pod of sandbox {sandbox_id} is being deleted")
            if pulled := image_failure(pod):
                raise ImageMissing(pulled)
            state = state_of(pod, None)
            if state.status == RunState.DEAD:
                raise DriverError(state.error or "the pod failed")
            if state.status == RunState.EXITED:
                raise DriverError(f"the agent server exited at once (exit code {state.exit_code})")
            verdict = capacity_verdict(pod)
            if verdict and time.monotonic() - started > self.options.schedule_timeout:
                self._refused = (time.monotonic(), verdict, requested_memory(pod))
                raise DriverError(f"no node can run the sandbox: {verdict}")
            running = state.status == RunState.RUNNING
            if running and (
                self.options.endpoint == "service" or (pod.get("status") or {}).get("podIP")
            ):
                return pod
            return None

        try:
            pod = await self._pods.until(
                sandbox_id, check, self.options.start_timeout, self._fetch(sandbox_id)
            )
        except TimeoutError:
            found = await self._pod(sandbox_id)
            why = (state_of(found, None).error if found else None) or "still not running"
            raise DriverError(
                f"the pod of sandbox {sandbox_id} did not start within "
                f"{self.options.start_timeout:g} s: {why}"
            ) from None
        return await self._state(pod)

    async def _state(self, pod: Json, claim: Json | None = None) -> SandboxState:
        sandbox_id = _sandbox(pod)
        host: str | None
        if self.options.endpoint == "service":
            host = self._service_ips.get(sandbox_id) or await self._service_ip(sandbox_id)
        else:
            host = (pod.get("status") or {}).get("podIP")
        created = (
            parse_time((claim.get("metadata") or {}).get("creationTimestamp")) if claim else None
        )
        return state_of(pod, host, created)

    async def _service_ip(self, sandbox_id: str) -> str | None:
        found = await self._api.get(
            services(self._ns, service_name(self.prefix, sandbox_id)), "inspect"
        )
        address = (found.get("spec") or {}).get("clusterIP") if found else None
        if address:
            self._service_ips[sandbox_id] = str(address)
        return str(address) if address else None

    async def inspect(self, sandbox_id: str) -> SandboxState | None:
        pod = await self._pod(sandbox_id)
        if pod is not None:
            return await self._state(pod)
        claim = await self._api.get(
            claims(self._ns, claim_name(self.prefix, sandbox_id)), "inspect"
        )
        if claim is None or terminating(claim) or _detached(claim):
            return None
        return claim_state(claim)

    async def pause(self, sandbox_id: str) -> None:
        """Delete the pod (SIGTERM, then SIGKILL after ACS_KUBE_PAUSE_GRACE), keep the claim.
        Returns once the deletion is recorded: inspect says EXITED from then on."""
        pod = await self._pod(sandbox_id)
        if pod is None:
            if await self.inspect(sandbox_id) is not None:
                return  # paused already
            raise DriverError(f"sandbox {sandbox_id} has no pod to pause")
        if terminating(pod):
            return
        name = pod_name(self.prefix, sandbox_id)
        answer = await self._api.delete_object(
            pods(self._ns, name), "pause", grace=self.options.pause_grace, uid=_uid(pod)
        )
        if answer is not None and terminating(answer) and self._pods.synced:
            # The answer is the pod marked for deletion: the cache takes it now rather than
            # when the watch brings it (one wake-up less on the way to the caller's answer).
            self._pods.saw_deletion(answer)
            if (cached := self._pods.get(sandbox_id)) is None or terminating(cached):
                return
        await self._wait_pod(sandbox_id, lambda p: p is None or terminating(p))

    async def _wait_pod(self, sandbox_id: str, done: Callable[[Json | None], bool]) -> None:
        try:
            await self._pods.until(
                sandbox_id,
                lambda p: True if done(p) else None,
                GONE_WITHIN,
                self._fetch(sandbox_id),
            )
        except TimeoutError:
            raise DriverError(f"the pod of sandbox {sandbox_id} did not change in time") from None

    async def unpause(self, sandbox_id: str) -> None:
        raise DriverError(
            f"sandbox {sandbox_id}: a Kubernetes sandbox is never paused in place (its pause "
            "deleted the pod); start it"
        )

    async def start(self, request: SandboxRequest) -> SandboxState:
        """A new pod on the kept claim, once a stopping one is gone; a pod that runs or boots
        already is waited for."""
        pod = await self._pod(request.sandbox_id)
        if pod is not None:
            status = state_of(pod, None).status
            if not terminating(pod) and status in (RunState.RUNNING, RunState.CREATED):
                return await self._running(request.sandbox_id)
            await self._clear(pod)
        return await self.create(request)

    async def _clear(self, pod: Json) -> None:
        """Let a stopping pod end (its grace period at most), then remove it for good, so that
        its name is free and no two pods of a sandbox share its workspace."""
        sandbox_id = _sandbox(pod)
        deadline = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
        left = STOP_SLACK + (
            (deadline - datetime.now(UTC)).total_seconds() if deadline is not None else 0.0
        )
        if not _stopped(pod) and left > 0:
            try:
                await self._pods.until(
                    sandbox_id,
                    lambda p: True if p is None or _stopped(p) else None,
                    left,
                    self._fetch(sandbox_id),
                )
            except TimeoutError:
                log.warning("kube_pod_stop_overdue", sandbox_id=sandbox_id, node=_node(pod))
        await self._api.delete(pods(self._ns, _name(pod)), "start", grace=0, uid=_uid(pod))
        await self._wait_pod(sandbox_id, lambda p: p is None or _uid(p) != _uid(pod))

    async def hibernate(self, sandbox_id: str) -> None:
        """Nothing more to give back: a pause deleted the pod already."""

    async def remove(self, sandbox_id: str, *, keep_workspace: bool = False) -> None:
        """Pod (at once), Service, NetworkPolicy, then the claim, or with `keep_workspace` the
        claim marked detached (left for an operator, no longer listed as a sandbox)."""
        name = pod_name(self.prefix, sandbox_id)
        if await self._api.delete(pods(self._ns, name), "remove", grace=0):
            await self._wait_pod(sandbox_id, lambda p: p is None)
        await self._api.delete(services(self._ns, service_name(self.prefix, sandbox_id)), "remove")
        await self._api.delete(policies(self._ns, policy_name(self.prefix, sandbox_id)), "remove")
        self._service_ips.pop(sandbox_id, None)
        claim = claims(self._ns, claim_name(self.prefix, sandbox_id))
        if keep_workspace:
            now = datetime.now(UTC).isoformat()
            await self._api.patch(
                claim, {"metadata": {"annotations": {ANNOTATION_DETACHED: now}}}, "remove"
            )
        else:
            await self._api.delete(claim, "remove")

    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxState]:
        """Every sandbox with a pod or a kept claim (a detached one is not a sandbox any more).
        Pods come from the watch while it follows the API server, claims from a list; every
        minute, NetworkPolicies and Services left without pod or claim are removed."""
        chosen = selector(self.prefix, owner)
        debris = await self._debris_candidates() if owner is None else []
        listed = await self._api.list(claims(self._ns), chosen, "list")
        found_claims = {
            _sandbox(c): c
            for c in listed.get("items") or []
            if _sandbox(c) and not terminating(c) and not _detached(c)
        }
        if self._pods.synced:
            found_pods = {_sandbox(p): p for p in self._pods.all()}
        else:
            pod_list = await self._api.list(pods(self._ns), chosen, "list")
            found_pods = {_sandbox(p): p for p in pod_list.get("items") or [] if _sandbox(p)}
        states: list[SandboxState] = []
        for sandbox_id, pod in found_pods.items():
            if owner is None or _owner(pod) == owner:
                states.append(await self._state(pod, found_claims.get(sandbox_id)))
        for sandbox_id, claim in found_claims.items():
            if sandbox_id not in found_pods and (owner is None or _owner(claim) == owner):
                states.append(claim_state(claim))
        await self._remove_debris(debris, set(found_pods) | set(found_claims), listed)
        return states

    async def _debris_candidates(self) -> list[tuple[str, Json]]:
        """NetworkPolicies and Services (listed before claims and pods: a create makes its claim
        first, so any policy seen here whose claim exists shows in the lists that follow)."""
        if time.monotonic() - self._debris_at < DEBRIS_EVERY:
            return []
        self._debris_at = time.monotonic()
        chosen = selector(self.prefix)
        found: list[tuple[str, Json]] = []
        for path in (policies(self._ns), services(self._ns)):
            listed = await self._api.list(path, chosen, "list")
            found.extend((path, obj) for obj in listed.get("items") or [])
        return found

    async def _remove_debris(
        self, candidates: list[tuple[str, Json]], alive: set[str], claims_listed: Json
    ) -> None:
        every_claim = {_sandbox(c) for c in claims_listed.get("items") or []}
        now = datetime.now(UTC)
        for path, obj in candidates:
            sandbox_id = _sandbox(obj)
            created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
            if sandbox_id in alive or sandbox_id in every_claim or created is None:
                continue
            if (now - created).total_seconds() < DEBRIS_AGE:
                continue
            log.info("kube_debris_removed", object=f"{path}/{_name(obj)}", sandbox_id=sandbox_id)
            await self._api.delete(f"{path}/{_name(obj)}", "remove")

    def watch(self, sink: EventSink) -> Watch:
        """The pod watch's events (it resumes itself from its last resourceVersion and lists
        again after 410 Gone, announcing what changed meanwhile): the stream never ends by
        itself; close() stops it."""
        return self._pods.subscribe(sink)

    async def close(self) -> None:
        await self._pods.close()
        await self._nodes.close()
        await self._api.close()


def _owner(obj: Json) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_OWNER, ""))


def _node(pod: Json) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")
