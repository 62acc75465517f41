"""The Kubernetes runtime (drivers/base.py: SandboxDriver). A sandbox is, in one namespace, a pod
with its workspace on a PersistentVolumeClaim, a NetworkPolicy and, optionally, a ClusterIP
Service (objects.py); a pause deletes the pod and keeps the claim, a resume makes a new pod on it
(`pause_releases`).

Every call goes through api.py (kubernetes_asyncio, asyncio all the way: nothing blocks the event
loop); the deployment's pods are followed by one watch (pods.py) that starts wait on and the
reconciler's events come from; nodes are read when the control plane may (nodes.py). Admission:
`has_room` is False while the scheduler finds no node for a sandbox of ours (its last verdict,
until a sandbox's pod goes), or when the nodes known have no room for the reservation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from drivers.base import (
    EventSink,
    HostListener,
    NetworkPolicy,
    SandboxFiles,
    SandboxRequest,
    SandboxState,
    Watch,
)
from drivers.errors import DriverError, RuntimeUnavailable
from drivers.kubernetes.api import KubeApi
from drivers.kubernetes.capacity import Capacity
from drivers.kubernetes.files import KubeFiles
from drivers.kubernetes.names import selector, uid_of
from drivers.kubernetes.network import Network, peers_of
from drivers.kubernetes.nodes import Nodes
from drivers.kubernetes.objects import image_reference
from drivers.kubernetes.pods import PodWatch
from drivers.kubernetes.resources import Resources
from drivers.kubernetes.settings import Credentials, KubernetesSettings
from drivers.kubernetes.state import terminating
from drivers.kubernetes.waits import PodWaits, booting_or_running


class KubernetesDriver:
    """Sandboxes in `settings.kube_namespace` for the deployment whose objects carry `prefix`.

    `listener`: the webhook listener, bound at `settings.kube_webhook_address` where sandboxes
    reach it (None: no webhooks: tests, benches and the CLI's look-ups); `host_ports`: ports of
    the control plane's host every sandbox may reach too (ACS_SANDBOX_HOST_PORTS);
    `credentials`: by default the settings'. `on_error(operation)` counts failed API calls,
    `on_watch_restart(why)` the pod watch's resumptions (the metrics' hooks).

    Each operation is a few steps, each handed to the part that knows it, given at construction
    what it works with: `network` (listener, URLs, egress plans), `resources` (the objects
    through the API server), `waits` (a pod's changes, through the watch), `capacity` (the
    scheduler's verdicts and the nodes' room), `nodes` (optional node reads), `pods` (the watch).
    """

    pause_releases = True
    stage_reads_workspace = False

    def __init__(
        self,
        settings: KubernetesSettings,
        *,
        prefix: str,
        credentials: Credentials | None = None,
        host_ports: Sequence[int] = (),
        listener: HostListener | None = None,
        on_error: Callable[[str], None] | None = None,
        on_watch_restart: Callable[[str], None] | None = None,
        helper_image: str = "acs-base:bookworm",
    ) -> None:
        self.prefix = prefix
        self.settings = settings
        credentials = credentials or settings.credentials()
        api = KubeApi(credentials, on_error)
        self._api = api
        self._nodes = Nodes(api, settings.kube_node_selector)
        self._capacity = Capacity(self._nodes)
        self._pods = PodWatch(
            api,
            settings.kube_namespace,
            selector(prefix),
            on_restart=on_watch_restart,
            on_deleted=self._capacity.freed,
        )
        peers = peers_of(settings, credentials)
        self._network = Network(settings, peers, listener, tuple(host_ports))
        self._resources = Resources(api, settings, prefix, peers)
        self._waits = PodWaits(self._pods, self._resources, self._capacity, settings)
        self._files = KubeFiles(api, settings, prefix=prefix, image=helper_image)

    @property
    def files(self) -> SandboxFiles:
        """Snapshots: the workspace and the kept state paths, read from and written to the
        claim by helper pods (files.py)."""
        return self._files

    # -- the runtime --------------------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            status, _ = await self._api.request("GET", "/version", operation="ping", timeout=5)
        except (RuntimeUnavailable, DriverError):
            return False
        return status == 200

    async def memory_capacity(self) -> int | None:
        if self._nodes.readable is None:
            await self._nodes.first_read()
        return self._nodes.capacity()

    def has_room(self, reservation: int) -> bool:
        return self._capacity.has_room(reservation, self._pods.all())

    async def image_id(self, image: str) -> str | None:
        """The reference pods pull (a registry digest when the spec names one). With pull
        policy Never (images loaded onto the nodes, no registry) an image no Ready node holds is
        missing, when the control plane may read nodes."""
        reference = image_reference(image, self.settings.kube_image_registry)
        if self.settings.kube_image_pull_policy == "Never":
            if self._nodes.readable is None:
                await self._nodes.first_read()
            if self._nodes.has_image(reference) is False:
                return None
        return reference

    # -- networks -----------------------------------------------------------------------------

    async def prepare(self, policies: Sequence[NetworkPolicy]) -> None:
        self._pods.start()
        for policy in policies:
            await self._network.prepare(policy)
        # What the first creates would otherwise wait for, read while the control plane starts
        # (a burst's first cold creates waited 0.6 s for the nodes on a busy API server).
        await self._nodes.first_read()
        await self._resources.binding_mode()

    async def prepare_network(self, policy: NetworkPolicy) -> str | None:
        self._pods.start()
        return await self._network.prepare(policy)

    async def host_address(self, policy: NetworkPolicy) -> str | None:
        """The control plane's address as sandboxes reach it (what they call
        host.docker.internal): the host of the webhook URL they are given, when it is one."""
        return await self._network.host_address()

    async def sandbox_networks(self) -> list[str]:
        """The cluster's pod and Service ranges as the operator gave them: a v1.20 cluster does
        not tell its Service range through its API, nor its pod ranges without a ClusterRole."""
        return list(self.settings.kube_cluster_cidrs)

    # -- sandboxes ----------------------------------------------------------------------------

    async def create(self, request: SandboxRequest, *, new: bool = False) -> SandboxState:
        """Its egress planned, its objects made (claim, policy, Service, pod), its pod waited
        for until it runs; what was made goes again if that fails."""
        self._pods.start()
        egress = await self._network.egress(request.network)
        fill = self._files.fill if request.restore is not None else None
        made = await self._resources.make(request, egress, new=new, fill=fill)
        try:
            return await self._resources.state(await self._waits.running(request.sandbox_id))
        except BaseException:
            await asyncio.shield(self._resources.undo(made))
            raise

    async def inspect(self, sandbox_id: str) -> SandboxState | None:
        pod = await self._waits.pod(sandbox_id)
        if pod is not None:
            return await self._resources.state(pod)
        return await self._resources.kept(sandbox_id)

    async def direct_address(self, sandbox_id: str) -> str | None:
        """None: a sandbox's endpoints are its pod's (or its Service's) address already."""
        return None

    async def pause(self, sandbox_id: str) -> None:
        """Delete the pod (SIGTERM, then SIGKILL after ACS_KUBE_PAUSE_GRACE), keep the claim.
        Returns once the deletion is recorded: inspect says EXITED from then on."""
        pod = await self._waits.pod(sandbox_id)
        if pod is None:
            if await self._resources.kept(sandbox_id) is not None:
                return  # paused already
            raise DriverError(f"sandbox {sandbox_id} has no pod to pause")
        if terminating(pod):
            return
        answer = await self._resources.delete_pod(
            sandbox_id,
            "pause",
            grace=self.settings.kube_pause_grace,
            uid=uid_of(pod),
        )
        await self._waits.stopping(sandbox_id, answer)

    async def unpause(self, sandbox_id: str) -> None:
        raise DriverError(
            f"sandbox {sandbox_id}: a Kubernetes sandbox is never paused in place (its pause "
            "deleted the pod); start it"
        )

    async def start(self, request: SandboxRequest) -> SandboxState:
        """A new pod on the kept claim, once a stopping one is gone; a pod that runs or boots
        already is waited for."""
        pod = await self._waits.pod(request.sandbox_id)
        if pod is not None:
            if booting_or_running(pod):
                return await self._resources.state(await self._waits.running(request.sandbox_id))
            await self._waits.cleared(pod)
        return await self.create(request)

    async def hibernate(self, sandbox_id: str) -> None:
        """Nothing more to give back: a pause deleted the pod already."""

    async def stage(self, request: SandboxRequest) -> None:
        """Nothing: a pod's claim is filled from the snapshot when it is made."""

    async def remove(self, sandbox_id: str, *, keep_workspace: bool = False) -> None:
        """Pod (at once), Service, NetworkPolicy, then the claim, or with `keep_workspace` the
        claim marked detached (left for an operator, no longer listed as a sandbox)."""
        if await self._resources.delete_pod(sandbox_id, "remove", grace=0) is not None:
            await self._waits.changed(sandbox_id, lambda p: p is None)
        await self._resources.remove(sandbox_id, keep_workspace=keep_workspace)

    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxState]:
        """Every sandbox with a pod or a kept claim (a detached one is not a sandbox any more).
        Pods come from the watch while it follows the API server, claims from a list; every
        minute, NetworkPolicies and Services left without pod or claim are removed."""
        cached = self._pods.all() if self._pods.synced else None
        return await self._resources.states(owner, cached)

    def watch(self, sink: EventSink) -> Watch:
        """The pod watch's events (it resumes itself from its last resourceVersion and lists
        again after 410 Gone, announcing what changed meanwhile): the stream never ends by
        itself; close() stops it."""
        return self._pods.subscribe(sink)

    async def close(self) -> None:
        await self._files.close()
        await self._pods.close()
        await self._nodes.close()
        await self._api.close()
