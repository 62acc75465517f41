"""How the deployment's sandboxes reach the control plane, and where each spec's may connect: the
webhook listener bound where pods reach it, the URL and address they are given for it
(host.docker.internal), and each spec's egress planned once (egress.py), its allow-listed names
looked up again at each start, as on Docker.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from drivers.base import HostListener, NetworkPolicy
from drivers.egress import lookup
from drivers.errors import DriverError, NetworkUnavailable
from drivers.kubernetes.egress import Egress, Peers, ipv4, plan
from drivers.kubernetes.settings import Credentials, KubernetesSettings


def peers_of(settings: KubernetesSettings, credentials: Credentials) -> Peers:
    """The control plane as the NetworkPolicies name it: its pods (labels, in its namespace:
    the one configured, else its own in a pod) and the addresses it has outside the cluster
    (configured, else the webhook listener's)."""
    namespace = settings.kube_control_plane_namespace or credentials.in_cluster_namespace()
    cidrs = tuple(settings.kube_control_plane_cidrs)
    if not cidrs and (address := ipv4(settings.kube_webhook_address)):
        cidrs = (f"{address}/32",)
    return Peers(dict(settings.kube_control_plane_labels), namespace, cidrs)


class Network:
    """`listener`: the webhook listener (None: no webhooks: tests, benches and the CLI's
    look-ups); `host_ports`: ports of the control plane's host every sandbox may reach too.
    Raises DriverError when sandboxes with webhooks could not be let reach the control plane."""

    def __init__(
        self,
        settings: KubernetesSettings,
        peers: Peers,
        listener: HostListener | None,
        host_ports: tuple[int, ...],
    ) -> None:
        if listener is not None and peers.empty:
            raise DriverError(
                "the sandboxes' NetworkPolicies cannot name the control plane: set "
                "ACS_KUBE_CONTROL_PLANE_CIDRS (a control plane outside the cluster) or run it in "
                "the cluster with ACS_KUBE_CONTROL_PLANE_LABELS"
            )
        self._settings = settings
        self.peers = peers
        self._listener = listener
        self._host_ports = host_ports
        self._plans: dict[str, Egress] = {}
        self._host_address: str | None = None

    async def prepare(self, policy: NetworkPolicy) -> str | None:
        """The listener bound, the policy's egress planned; the URL sandboxes reach the control
        plane at (None without a listener: ACS_KUBE_CONTROL_PLANE_URL, if set)."""
        settings = self._settings
        if self._listener is None:
            return settings.kube_control_plane_url
        try:
            port = await self._listener.bind(settings.kube_webhook_address)
        except OSError as exc:
            raise NetworkUnavailable(
                f"cannot listen for webhooks on {settings.kube_webhook_address}:"
                f"{self._listener.port}: {exc}"
            ) from None
        url = settings.kube_control_plane_url or f"http://{settings.kube_webhook_address}:{port}"
        if policy.spec_id not in self._plans or policy.egress:
            # Allow-listed names are looked up again at each start, as on Docker.
            self._host_address = self._host_address or await _address_of(url)
            ports = (port, *self._host_ports)
            self._plans[policy.spec_id] = await plan(
                policy, settings, self.peers, ports, self._host_address
            )
        return url

    async def host_address(self) -> str | None:
        """The control plane's address as sandboxes reach it (what they call
        host.docker.internal): the host of the webhook URL they are given, when it is one."""
        if self._host_address is None:
            settings = self._settings
            url = settings.kube_control_plane_url or f"http://{settings.kube_webhook_address}"
            self._host_address = await _address_of(url)
        return self._host_address

    async def egress(self, policy: NetworkPolicy) -> Egress:
        """The egress a new sandbox of `policy` gets (planned now when it has an allow-list)."""
        if policy.spec_id not in self._plans or policy.egress:
            await self.prepare(policy)
        egress = self._plans.get(policy.spec_id)
        if egress is None:  # no listener: the control plane named by its peers alone
            ports = (0, *self._host_ports)
            egress = await plan(policy, self._settings, self.peers, ports, None)
        return egress


async def _address_of(url: str) -> str | None:
    """The IPv4 address of the URL's host (looked up when it is a name)."""
    host = urlsplit(url).hostname or ""
    if found := ipv4(host):
        return found
    addresses = await lookup(host, 80) if host else []
    return addresses[0] if addresses else None
