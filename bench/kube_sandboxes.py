"""Kubernetes sandbox benchmark: the control plane with ACS_DRIVER=kubernetes against raw pod
operations on the same cluster, in the same run.

Run with `.venv/bin/python -m bench.kube_sandboxes [--runs N]` (as root: it brings up the
project's two-node test cluster in a free slot, docs/test-cluster.md, and takes it down again).

- cold create: POST /api/v1/sandboxes (no warm pool) until GET says RUNNING, against the raw
  path: the same workspace claim and pod (the driver's own manifests, drivers/kubernetes/objects.py,
  for a request the control plane would make) created through the API server, then the agent
  server's /health polled at the pod's IP until 200.
- from the warm pool: POST /api/v1/sandboxes answered RUNNING by a claim (a pool of one,
  refilled between runs).
- pause: POST .../pause answered, against a raw DELETE of the pod with the same grace period;
  a GET of the sandbox just before it gives the floor any authenticated sandbox request pays
  (HTTP, the API key's and the record's reads).
- resume: POST .../resume until RUNNING, against the raw path doing what the driver does: the
  old pod's container stopped, the pod deleted for good, a new pod on the same claim, its
  /health 200.
- control-plane CPU per cold start: this process's CPU time over the API's cold starts, per start
  (the client's polling is in the same process: the raw phase's CPU per start, which is only the
  client, is printed beside it).

Targets (issue 18): cold create <= 1.1x raw, pool <= 50 ms p50, pause and resume <= 1.2x raw.
Exit status: 0 when the table was printed (missed targets marked), 1 on an error, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from bench.common import STATUS_TIMEOUT, BenchError, Samples, main_of, ms, serve
from controlplane import keys
from controlplane.auth.service import ApiKeyService
from controlplane.config import ServiceConfig, load_config
from controlplane.sandboxes import naming
from controlplane.sandboxes.launcher import sandbox_request
from controlplane.sandboxes.models import SandboxRecord
from controlplane.specs.catalog import SpecCatalog
from drivers.base import SandboxDriver
from drivers.kubernetes.names import claim_name, pod_name
from drivers.kubernetes.objects import claim_manifest, pod_manifest
from drivers.kubernetes.settings import KubernetesSettings
from tests.drivers.kubernetes.conftest import (
    KubeCluster,
    api_client,
    bring_up,
    wait_service_account,
)
from tests.support.sandbox_helpers import DEFAULT_IMAGE, REPO

POLL = 0.010
"""The client's GET interval while waiting for a status, and the raw path's /health interval."""
TARGET_COLD = 1.1
TARGET_POOL_MS = 50.0
TARGET_PAUSE = 1.2


@dataclass
class Options:
    runs: int
    json_path: Path | None


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class KubeBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.tmp = tmp
        self.redis_url = redis_url
        self.prefix = f"acs-bench-{secrets.token_hex(3)}-"
        self.raw_prefix = f"{self.prefix}raw-"
        self.namespace = f"bench-{secrets.token_hex(3)}"
        self.image_tag = os.environ.get("ACS_IMAGE_TAG") or None
        self.spec = SpecCatalog.load(REPO / "specs", self.image_tag).default
        self.samples = Samples()
        self.notes: list[str] = []
        self.cluster: KubeCluster | None = None
        self.kube: client.ApiClient | None = None
        self.http: aiohttp.ClientSession | None = None

    # -- set-up ------------------------------------------------------------------------------

    def config(self, **overrides: Any) -> ServiceConfig:
        assert self.cluster is not None
        values: dict[str, Any] = {
            "redis_url": self.redis_url,
            "data_dir": self.tmp / "data",
            "spec_dir": REPO / "specs",
            "container_prefix": self.prefix,
            "log_format": "json",
            "log_level": "warning",
            "rate_limit_per_minute": 0,
            "image_tag": self.image_tag,
            "warm_pool": "0",
            "driver": "kubernetes",
            "kubeconfig": self.cluster.kubeconfig,
            "kube_namespace": self.namespace,
            "kube_webhook_address": self.cluster.host_address,
            "kube_image_pull_policy": "Never",
            "kube_storage_class": self.cluster.storage_class,
        }
        values.update(overrides)
        return load_config({}, **values)

    def options_of(self, config: ServiceConfig) -> KubernetesSettings:
        settings = config.runtime
        assert isinstance(settings, KubernetesSettings)
        return settings

    async def measure(self) -> tuple[list[str], list[str]]:
        started = time.monotonic()
        self.cluster = await asyncio.to_thread(bring_up, os.getpid())
        await asyncio.to_thread(self.cluster.load_images, DEFAULT_IMAGE)
        self.notes.append(
            f"cluster up and image loaded in {time.monotonic() - started:.0f} s "
            f"(slot {self.cluster.slot}, 2 nodes)"
        )
        self.kube = await api_client(self.cluster.kubeconfig)
        core = client.CoreV1Api(self.kube)
        await core.create_namespace({"metadata": {"name": self.namespace}})
        await wait_service_account(core, self.namespace)
        self.http = aiohttp.ClientSession()
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            keys = ApiKeyService(redis, None)
            headers = {"X-Session-API-Key": (await keys.create("bench")).key}
            admin = {"X-Session-API-Key": (await keys.create("bench-admin", admin=True)).key}
            await self.cold_and_lifecycle(headers)
            await self.pool(headers, admin)
        finally:
            await redis.aclose()
        return self.table()

    # -- the API -----------------------------------------------------------------------------

    async def call(self, method: str, url: str, headers: dict[str, str]) -> dict[str, Any]:
        assert self.http is not None
        async with self.http.request(method, url, headers=headers) as resp:
            body: dict[str, Any] = await resp.json()
            if resp.status != 200:
                raise BenchError(f"{method} {url}: {resp.status} {body}")
            return body

    async def until_running(self, url: str, headers: dict[str, str]) -> dict[str, Any]:
        deadline = time.monotonic() + STATUS_TIMEOUT
        while time.monotonic() < deadline:
            body = await self.call("GET", url, headers)
            if body["status"] == "RUNNING":
                return body
            if body["status"] == "ERROR":
                raise BenchError(f"sandbox in ERROR: {body.get('reason')}")
            await asyncio.sleep(POLL)
        raise BenchError(f"{url}: not RUNNING within {STATUS_TIMEOUT:g} s")

    async def cold_and_lifecycle(self, headers: dict[str, str]) -> None:
        config = self.config()
        async with serve(config, self.samples) as served:
            self.time_driver_pause(served.app[keys.DRIVER])
            base = f"{served.url}/api/v1/sandboxes"
            for run in range(self.options.runs + 1):  # the first run warms both paths up
                record = run > 0
                order = (self.api_run, self.raw_run) if run % 2 else (self.raw_run, self.api_run)
                for one in order:
                    await one(base, headers, config, record=record)

    def time_driver_pause(self, driver: SandboxDriver) -> None:
        """Record how much of an API pause is the driver's (the pod's DELETE), the rest being the
        control plane's own work (HTTP, auth, the lock, the record read, the compare-and-set
        that also stores the lifecycle event)."""
        pause = driver.pause

        async def timed(sandbox_id: str) -> None:
            t = time.perf_counter()
            try:
                await pause(sandbox_id)
            finally:
                self.samples.add("driver.pause", time.perf_counter() - t)

        driver.pause = timed  # type: ignore[method-assign]

    async def api_run(
        self, base: str, headers: dict[str, str], _config: ServiceConfig, *, record: bool
    ) -> None:
        cpu = cpu_seconds()
        t = time.perf_counter()
        sandbox_id = (await self.call("POST", base, headers))["id"]
        await self.until_running(f"{base}/{sandbox_id}", headers)
        cold = time.perf_counter() - t
        used = cpu_seconds() - cpu
        # The floor under any sandbox operation: one authenticated request reading the record.
        t = time.perf_counter()
        await self.call("GET", f"{base}/{sandbox_id}", headers)
        read = time.perf_counter() - t
        t = time.perf_counter()
        await self.call("POST", f"{base}/{sandbox_id}/pause", headers)
        pause = time.perf_counter() - t
        t = time.perf_counter()
        await self.call("POST", f"{base}/{sandbox_id}/resume", headers)
        await self.until_running(f"{base}/{sandbox_id}", headers)
        resume = time.perf_counter() - t
        await self.call("DELETE", f"{base}/{sandbox_id}", headers)
        if record:
            self.samples.add("api.cold", cold)
            self.samples.add("api.cold_cpu", used)
            self.samples.add("api.pause", pause)
            self.samples.add("api.get", read)
            self.samples.add("api.resume", resume)

    # -- the raw baseline --------------------------------------------------------------------

    async def raw_run(
        self, _base: str, _headers: dict[str, str], config: ServiceConfig, *, record: bool
    ) -> None:
        """The driver's claim and pod for a request the control plane would make, through the
        API server with no control plane, timed to the agent's first /health 200."""
        assert self.kube is not None
        assert self.cluster is not None
        api = self.kube
        options = self.options_of(config)
        sandbox = SandboxRecord.starting(naming.new_sandbox_id(), "bench", self.spec.id)
        request = sandbox_request(config, sandbox, self.spec, None)
        claims = f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims"
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        pod = pod_manifest(request, options, self.raw_prefix, aliases=[], runtime_class=None)
        name = pod_name(self.raw_prefix, request.sandbox_id)
        cpu = cpu_seconds()
        t = time.perf_counter()
        await kube_call(api, "POST", claims, claim_manifest(request, options, self.raw_prefix))
        await self.bound(f"{claims}/{claim_name(self.raw_prefix, request.sandbox_id)}")
        await kube_call(api, "POST", pods, pod)
        await self.health(f"{pods}/{name}")
        cold = time.perf_counter() - t
        used = cpu_seconds() - cpu
        t = time.perf_counter()
        grace = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 5}
        await kube_call(api, "DELETE", f"{pods}/{name}", grace)
        pause = time.perf_counter() - t
        t = time.perf_counter()
        # What the driver's start does too: the old pod's container stopped, the pod removed
        # for good (grace 0: the kubelet's own clean-up is not waited for), a new one made.
        await self.stopped(f"{pods}/{name}")
        await kube_call(api, "DELETE", f"{pods}/{name}", {"gracePeriodSeconds": 0})
        await self.gone(f"{pods}/{name}")
        await kube_call(api, "POST", pods, pod)
        await self.health(f"{pods}/{name}")
        resume = time.perf_counter() - t
        await kube_call(api, "DELETE", f"{pods}/{name}", {"gracePeriodSeconds": 0})
        await self.gone(f"{pods}/{name}")
        claim = f"{claims}/{claim_name(self.raw_prefix, request.sandbox_id)}"
        await kube_call(api, "DELETE", claim, {})
        if record:
            self.samples.add("raw.cold", cold)
            self.samples.add("raw.cold_cpu", used)
            self.samples.add("raw.pause", pause)
            self.samples.add("raw.resume", resume)

    async def bound(self, path: str) -> None:
        assert self.kube is not None
        while True:
            claim = await kube_call(self.kube, "GET", path)
            if (claim.get("status") or {}).get("phase") == "Bound":
                return
            await asyncio.sleep(POLL)

    async def stopped(self, path: str) -> None:
        """Until the pod's container no longer runs (or the pod is gone)."""
        assert self.kube is not None
        deadline = time.monotonic() + STATUS_TIMEOUT
        while time.monotonic() < deadline:
            pod = await kube_call(self.kube, "GET", path, missing_ok=True)
            states = [c.get("state") or {} for c in (pod.get("status") or {}).get(
                "containerStatuses") or []]  # fmt: skip
            if not pod or (states and not any(st.get("running") for st in states)):
                return
            await asyncio.sleep(POLL)
        raise BenchError(f"{path}: its container did not stop within {STATUS_TIMEOUT:g} s")

    async def gone(self, path: str) -> None:
        assert self.kube is not None
        deadline = time.monotonic() + STATUS_TIMEOUT
        while await kube_call(self.kube, "GET", path, missing_ok=True):
            if time.monotonic() > deadline:
                raise BenchError(f"{path} not gone within {STATUS_TIMEOUT:g} s")
            await asyncio.sleep(POLL)

    async def health(self, path: str) -> None:
        """Poll the pod for its IP, then its agent's /health, every POLL until 200."""
        assert self.kube is not None
        assert self.http is not None
        port = self.spec.exposed_ports["AGENT_SERVER"]
        deadline = time.monotonic() + STATUS_TIMEOUT
        address = None
        while time.monotonic() < deadline:
            if address is None:
                pod = await kube_call(self.kube, "GET", path)
                address = (pod.get("status") or {}).get("podIP")
            if address is not None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with self.http.get(
                        f"http://{address}:{port}/health", timeout=aiohttp.ClientTimeout(total=2)
                    ) as resp:
                        if resp.status == 200:
                            return
            await asyncio.sleep(POLL)
        raise BenchError(f"raw pod {path}: no 200 on /health")

    # -- the warm pool -----------------------------------------------------------------------

    async def pool(self, headers: dict[str, str], admin: dict[str, str]) -> None:
        config = self.config(warm_pool="1", pool_interval=0.2, container_prefix=f"{self.prefix}p-")
        async with serve(config, self.samples) as served:
            base = f"{served.url}/api/v1/sandboxes"
            for run in range(self.options.runs + 1):
                await self.pool_ready(served.url, admin)
                t = time.perf_counter()
                body = await self.call("POST", base, headers)
                took = time.perf_counter() - t
                if body["status"] != "RUNNING":
                    self.notes.append(f"pool run {run}: a cold start ({body['status']})")
                elif run > 0:
                    self.samples.add("api.pool", took)
                await self.call("DELETE", f"{base}/{body['id']}", headers)

    async def pool_ready(self, url: str, admin: dict[str, str]) -> None:
        deadline = time.monotonic() + STATUS_TIMEOUT
        while time.monotonic() < deadline:
            view = await self.call("GET", f"{url}/api/v1/sandbox-pool", admin)
            spec = next(s for s in view["specs"] if s["spec_id"] == self.spec.id)
            if any(m["ready"] and not m["stale"] for m in spec["members"]):
                return
            await asyncio.sleep(0.1)
        raise BenchError("the warm pool never had a ready member")

    # -- results -----------------------------------------------------------------------------

    def table(self) -> tuple[list[str], list[str]]:
        s = self.samples
        missed: list[str] = []
        lines = [
            "operation                       |  API p50 |  API p95 |  raw p50 |  raw p95 | ratio"
            " | target",
            "-" * 96,
        ]

        def row(label: str, name: str, target: float | None) -> None:
            api, raw = s.p(f"api.{name}", 50), s.p(f"raw.{name}", 50)
            ratio = api / raw if raw > 0 else float("nan")
            verdict = "(info)"
            if target is not None:
                ok = ratio <= target
                verdict = f"<= {target}x {'yes' if ok else 'NO'}"
                if not ok:
                    missed.append(f"{label}: {ratio:.2f}x raw > {target}x")
            lines.append(
                f"{label:<31} | {ms(api):>8} | {ms(s.p(f'api.{name}', 95)):>8} | {ms(raw):>8} | "
                f"{ms(s.p(f'raw.{name}', 95)):>8} | {ratio:5.2f} | {verdict}"
            )

        row("cold create -> RUNNING", "cold", TARGET_COLD)
        row("pause", "pause", TARGET_PAUSE)
        row("resume -> RUNNING", "resume", TARGET_PAUSE)
        pool = s.p("api.pool", 50)
        ok = pool * 1000 <= TARGET_POOL_MS
        if not ok:
            missed.append(f"pool claim p50 {pool * 1000:.1f} ms > {TARGET_POOL_MS:g} ms")
        lines.append(
            f"{'create from the warm pool':<31} | {ms(pool):>8} | {ms(s.p('api.pool', 95)):>8} | "
            f"{'-':>8} | {'-':>8} |   -   | p50 <= {TARGET_POOL_MS:g} ms {'yes' if ok else 'NO'}"
        )
        server = s.p("server:POST /api/v1/sandboxes/{sandbox_id}/pause", 50)
        lines.append(
            f"API pause, p50: {ms(s.p('api.pause', 50))} ms at the client, {ms(server)} in the "
            f"server, {ms(s.p('driver.pause', 50))} of it in the driver (the DELETE)"
        )
        get = s.p("api.get", 50)
        lines.append(
            f"GET of the sandbox just before (HTTP, auth, the record read), p50: {ms(get)} ms; "
            f"pause - driver - GET: {ms(s.p('api.pause', 50) - s.p('driver.pause', 50) - get)} ms"
        )
        lines.append(
            f"CPU per cold start (this process): API path {ms(s.p('api.cold_cpu', 50))} ms "
            f"p50, raw path {ms(s.p('raw.cold_cpu', 50))} ms (the client alone)"
        )
        lines.append(
            f"times in ms; {s.count('api.cold')} runs per path, {s.count('api.pool')} claims; "
            f"raw = the driver's own manifests through the API server, no control plane"
        )
        return lines, missed

    def results(self) -> Any:
        return self.samples.values

    def remove_everything(self) -> int:
        if self.cluster is not None:
            self.cluster.cli("down")  # the namespace and everything in it goes with the cluster
        return 0

    def close(self) -> None:
        async def shut() -> None:
            if self.http is not None:
                await self.http.close()
            if self.kube is not None:
                await self.kube.close()

        with contextlib.suppress(RuntimeError):
            asyncio.run(shut())


async def kube_call(
    api: client.ApiClient,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """One API server call, its JSON answer ({} for a 404 when `missing_ok`)."""
    response = await api.call_api(
        path,
        method,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    raw = await response.read()
    if response.status == 404 and missing_ok:
        return {}
    if response.status >= 300:
        raise BenchError(f"{method} {path}: {response.status} {raw[:300]!r}")
    data: dict[str, Any] = json.loads(raw)
    return data


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per operation and path (10)")
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    return Options(args.runs, args.json)


main = main_of(parse_args, KubeBench, "acs-kube-bench-")

if __name__ == "__main__":
    sys.exit(main(None))
