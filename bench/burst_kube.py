"""The burst of bench/burst.py on the Kubernetes test cluster (two nodes): N sandboxes requested
at once by U users through a control plane with ACS_DRIVER=kubernetes, beside the same burst of
raw pods measured in the same run (issue 30: "Kubernetes: <= 1.2x the same burst of raw pods").

Run with `.venv/bin/python -m bench.burst --runtime kubernetes --count 20` (as root, under
`flock /work/locks/kube` on a machine shared with other clusters). It brings the project's test
cluster up in a free slot (as bench/kube_sandboxes.py does: docs/test-cluster.md), loads the
default sandbox image onto both nodes, and takes the cluster down at the end (also after an
error or Ctrl-C). Each mode's control plane has a namespace of its own, deleted (and waited
for, untimed) after it.

The raw burst, in the cold mode's namespace with that mode's control plane idle: for each of the
N sandboxes, the workspace claim and the pod the driver would make for the same request (its own
manifests, drivers/kubernetes/objects.py, under a prefix the control plane does not adopt),
created through the API server, all N at once: the claim read until Bound (the driver waits for
it too), the pod created, read until it has an IP, its agent server's /health polled every
`--poll` s, then the same first command at the pod's address with the sandbox's session key.
Each is timed from its claim's POST to that command's output. The driver also makes a
NetworkPolicy per sandbox; the raw path does not (its pods are reached from this host only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bench.burst import EXPECTED, BurstBench, ModeResult, Options, Outcome, Server
from bench.common import BenchError
from bench.kube_sandboxes import kube_call
from controlplane.config import ServiceConfig
from controlplane.sandboxes import naming
from controlplane.sandboxes.launcher import sandbox_request
from controlplane.sandboxes.models import SandboxRecord
from controlplane.specs.models import AGENT_SERVER
from drivers.kubernetes.names import claim_name, pod_name
from drivers.kubernetes.objects import claim_manifest, pod_manifest
from drivers.kubernetes.settings import KubernetesSettings
from tests.drivers.kubernetes.conftest import (
    KubeCluster,
    api_client,
    bring_up,
    wait_service_account,
)

Json = dict[str, Any]
TARGET_COLD_RATIO = 1.2
NAMESPACE_GONE_WITHIN = 300.0


class KubeBurstBench(BurstBench):
    RUNTIME = "Kubernetes (the two-node test cluster)"
    RAW_LABEL = "raw pods"
    RAW_WHAT = "the driver's claim and pod through the API server, the command at the pod's IP"
    RAW_KEY = "raw.agent"
    TARGET_COLD = TARGET_COLD_RATIO
    TARGET_POOL = None

    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        super().__init__(options, tmp, redis_url)
        self.run_id = secrets.token_hex(3)
        self.cluster: KubeCluster | None = None
        self.kube: client.ApiClient | None = None

    def namespace(self, mode: str) -> str:
        return f"burst-{self.run_id}-{mode}"

    # -- the cluster -------------------------------------------------------------------------

    async def setup(self) -> None:
        """The cluster up in a free slot, the sandbox image on both nodes (untimed)."""
        self.deploy.preflight()  # the image is loaded from the host's engine
        started = time.monotonic()
        self.cluster = await asyncio.to_thread(bring_up, os.getpid())
        await asyncio.to_thread(self.cluster.load_images, self.deploy.spec.image)
        self.notes.append(
            f"cluster up and image loaded in {time.monotonic() - started:.0f} s "
            f"(slot {self.cluster.slot}, {len(self.cluster.nodes)} nodes, untimed)"
        )
        self.note_settings()
        self.kube = await api_client(self.cluster.kubeconfig)
        version = await client.VersionApi(self.kube).get_code()
        print(
            f"env: {os.cpu_count()} cores | Kubernetes {version.git_version} "
            f"({len(self.cluster.nodes)} nodes, each a network namespace with its own dockerd, "
            f"on this host) | Python {sys.version.split()[0]} | image {self.deploy.spec.image} "
            f"| load avg {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        print(f"prefix {self.deploy.prefix}, namespaces burst-{self.run_id}-*", file=sys.stderr)

    def runtime_env(self, mode: str) -> dict[str, str]:
        assert self.cluster is not None
        return {
            "ACS_DRIVER": "kubernetes",
            "ACS_KUBECONFIG": str(self.cluster.kubeconfig),
            "ACS_KUBE_NAMESPACE": self.namespace(mode),
            "ACS_KUBE_WEBHOOK_ADDRESS": self.cluster.host_address,
            "ACS_KUBE_IMAGE_PULL_POLICY": "Never",
            "ACS_KUBE_STORAGE_CLASS": self.cluster.storage_class,
        }

    async def run_mode(self, http: aiohttp.ClientSession, mode: str) -> None:
        assert self.kube is not None
        core = client.CoreV1Api(self.kube)
        await core.create_namespace({"metadata": {"name": self.namespace(mode)}})
        await wait_service_account(core, self.namespace(mode))
        await super().run_mode(http, mode)

    async def api_burst(
        self, http: aiohttp.ClientSession, server: Server, mode: str, keys: list[str]
    ) -> ModeResult:
        """The burst, with the API server's requests over it counted (the control plane's)."""
        before = await self.requests_answered()
        result = await super().api_burst(http, server, mode, keys)
        self.note_requests(mode, before, await self.requests_answered())
        return result

    async def requests_answered(self) -> dict[tuple[str, str], float]:
        """Requests the API server has answered in JSON, by verb and resource, from its
        metrics: over a burst, the control plane's own (the cluster's components ask in
        protobuf; this bench's client is idle meanwhile)."""
        assert self.kube is not None
        response = await self.kube.call_api(
            "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
        )
        text = (await response.read()).decode()
        counts: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            if 'contentType="application/json"' not in line:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            key = (labels.get("verb", "?"), labels.get("resource", "?"))
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return counts

    def note_requests(
        self,
        mode: str,
        before: dict[tuple[str, str], float],
        after: dict[tuple[str, str], float],
    ) -> None:
        made = {k: after[k] - before.get(k, 0.0) for k in after if after[k] > before.get(k, 0.0)}
        total = sum(made.values())
        shown = ", ".join(
            f"{verb} {resource} {count / self.opt.count:.1f}"
            for (verb, resource), count in sorted(made.items(), key=lambda kv: -kv[1])
        )
        self.notes.append(
            f"{mode}: the control plane's API server requests over the burst: {total:.0f}, "
            f"{total / self.opt.count:.1f} per sandbox ({shown or 'none'})"
        )

    async def clean_mode(self, mode: str) -> None:
        """The mode's namespace deleted and waited for, so that its pods leave the nodes before
        the next mode starts (untimed)."""
        assert self.kube is not None
        path = f"/api/v1/namespaces/{self.namespace(mode)}"
        await kube_call(self.kube, "DELETE", path, {"gracePeriodSeconds": 0}, missing_ok=True)
        deadline = time.monotonic() + NAMESPACE_GONE_WITHIN
        while await kube_call(self.kube, "GET", path, missing_ok=True):
            if time.monotonic() > deadline:
                raise BenchError(f"namespace {self.namespace(mode)} not gone in 300 s")
            await asyncio.sleep(1.0)

    def remove_everything(self) -> int:
        if self.cluster is not None:
            self.cluster.cli("down")  # the namespaces and all in them go with the cluster
            self.cluster = None
        return 0

    def close(self) -> None:
        if self.kube is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.run(self.kube.close())
        super().close()

    # -- the raw burst -----------------------------------------------------------------------

    def raw_config(self) -> tuple[ServiceConfig, KubernetesSettings]:
        """The cold mode's configuration, as its control plane has it from its environment."""
        assert self.cluster is not None
        config = self.deploy.config(
            driver="kubernetes",
            kubeconfig=self.cluster.kubeconfig,
            kube_namespace=self.namespace("cold"),
            kube_webhook_address=self.cluster.host_address,
            kube_image_pull_policy="Never",
            kube_storage_class=self.cluster.storage_class,
        )
        settings = config.runtime
        assert isinstance(settings, KubernetesSettings)
        return config, settings

    async def raw_burst(self, http: aiohttp.ClientSession) -> None:
        config, settings = self.raw_config()
        await self.timed_raw("pods", lambda: self.one_pod(http, config, settings))
        await self.remove_raw_pods()

    async def one_pod(
        self, http: aiohttp.ClientSession, config: ServiceConfig, settings: KubernetesSettings
    ) -> Outcome:
        assert self.kube is not None
        api, ns, prefix = self.kube, self.namespace("cold"), self.deploy.raw_prefix
        spec = self.deploy.spec
        record = SandboxRecord.starting(naming.new_sandbox_id(), "bench", spec.id)
        request = sandbox_request(config, record, spec, None)
        pod = pod_manifest(request, settings, prefix, aliases=[], runtime_class=None)
        claim = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
        pods = f"/api/v1/namespaces/{ns}/pods"
        port = spec.exposed_ports[AGENT_SERVER]
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.opt.timeout):
                await kube_call(api, "POST", claim, claim_manifest(request, settings, prefix))
                await self.until(f"{claim}/{claim_name(prefix, request.sandbox_id)}", bound)
                await kube_call(api, "POST", pods, pod)
                found = await self.until(f"{pods}/{pod_name(prefix, request.sandbox_id)}", has_ip)
                agent = f"http://{found['status']['podIP']}:{port}"
                await self.pod_health(http, agent)
                output = await self.first_command(http, agent, record.session_api_key)
        except TimeoutError:
            return Outcome(error=f"no output within {self.opt.timeout:g} s")
        if EXPECTED not in output:
            return Outcome(error=f"raw agent answered {output[:80]!r}")
        seconds = time.perf_counter() - t0
        self.samples.add("raw.agent", seconds)
        return Outcome(seconds=seconds, running=seconds)

    async def until(self, path: str, done: Callable[[Json], bool]) -> Json:
        """The object at `path` read every `--poll` s until `done(object)`."""
        assert self.kube is not None
        while True:
            found = await kube_call(self.kube, "GET", path)
            if done(found):
                return found
            await asyncio.sleep(self.opt.poll)

    async def pod_health(self, http: aiohttp.ClientSession, agent: str) -> None:
        """/health at the pod's address every `--poll` s until 200 (as the Docker raw path)."""
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with http.get(
                    f"{agent}/health", timeout=aiohttp.ClientTimeout(total=5)
                ) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(self.opt.poll)

    async def remove_raw_pods(self) -> None:
        """Untimed: the raw pods and claims removed (grace 0) before the cold mode's burst,
        and their containers gone from the nodes' engines: a deletion with grace 0 takes the
        pod from the API server at once, while its kubelet goes on stopping and removing its
        containers for seconds, which the cold burst would otherwise pay for."""
        started = time.monotonic()
        await self.remove_raw_objects()
        await self.raw_containers_gone()
        self.notes.append(
            f"the raw pods removed from the API server and the nodes in "
            f"{time.monotonic() - started:.0f} s (untimed)"
        )

    async def raw_containers_gone(self) -> None:
        assert self.cluster is not None
        deadline = time.monotonic() + NAMESPACE_GONE_WITHIN
        while time.monotonic() < deadline:
            left = 0
            for node in self.cluster.nodes:
                process = await asyncio.create_subprocess_exec(
                    *("docker", "-H", node.docker_host, "ps", "-aq"),
                    *("--filter", f"name={self.deploy.raw_prefix}"),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                out, _ = await process.communicate()
                if process.returncode != 0:
                    raise BenchError(f"docker -H {node.docker_host} ps failed")
                left += len(out.split())
            if not left:
                return
            await asyncio.sleep(1.0)
        raise BenchError("the raw pods' containers were not gone from the nodes in 300 s")

    async def remove_raw_objects(self) -> None:
        assert self.kube is not None
        ns = self.namespace("cold")
        for kind in ("pods", "persistentvolumeclaims"):
            listed = await kube_call(self.kube, "GET", f"/api/v1/namespaces/{ns}/{kind}")
            names = [
                item["metadata"]["name"]
                for item in listed.get("items", [])
                if item["metadata"]["name"].startswith(self.deploy.raw_prefix)
            ]
            await asyncio.gather(
                *(
                    kube_call(
                        self.kube,
                        "DELETE",
                        f"/api/v1/namespaces/{ns}/{kind}/{name}",
                        {"gracePeriodSeconds": 0},
                        missing_ok=True,
                    )
                    for name in names
                )
            )
        deadline = time.monotonic() + NAMESPACE_GONE_WITHIN
        while time.monotonic() < deadline:
            listed = await kube_call(self.kube, "GET", f"/api/v1/namespaces/{ns}/pods")
            if not any(
                i["metadata"]["name"].startswith(self.deploy.raw_prefix)
                for i in listed.get("items", [])
            ):
                return
            await asyncio.sleep(1.0)
        raise BenchError("the raw pods were not gone in 300 s")


def bound(claim: Json) -> bool:
    return (claim.get("status") or {}).get("phase") == "Bound"


def has_ip(pod: Json) -> bool:
    return bool((pod.get("status") or {}).get("podIP"))
