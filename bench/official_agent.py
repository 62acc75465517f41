"""Official agent server benchmark: how long a user waits for a conversation on spec `openhands`
(the official OpenHands agent server) to be READY, cold and from the warm pool, next to our own
agent (spec `default`) and to raw Docker doing the same in the same run.

Run with `make bench` (after `make images SPECS=openhands`), or
`.venv/bin/python -m bench.official_agent [--runs N]`. bench/README.md says what it measured.

One process holds the control plane (a private redis-server, the real app over real HTTP on
127.0.0.1, ACS_ENABLE_SPECS=openhands, a warm pool of one per spec) and the docker SDK. READY is
`POST /api/v1/app-conversations` (no first message: the model is not part of it) until the start
task is READY. A cold run takes the pool out of the create path (`SandboxService.pool = None`),
as bench/warm_pool.py does; before every run the pool is full again. Raw Docker: `docker run`
of the same image with the same environment, `/health`, then the same
`POST /api/conversations` the control plane sends (raw_cold); that first POST alone, timed from
`/health` (raw_first: a booted server's first conversation, what a warm-pool claim cannot skip);
and a second POST on the same server (raw_warm: tools already set up, the floor of any start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import docker
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from bench.common import REPO, percentile
from controlplane import keys
from controlplane.agent_protocol.kinds import agent_env
from controlplane.agent_protocol.start_request import start_conversation_request
from controlplane.auth.service import ApiKeyService
from controlplane.config import load_config
from controlplane.ids import uuid7_hex
from controlplane.logging import configure_logging
from tests.support.docker_fixtures import remove_matching
from tests.support.live_server import LiveServer, attachment, start_live_server
from tests.support.redis_server import RedisServer

SPECS = {"openhands": "openai/fake-model", "default": "fake-model"}
POLL = 0.01


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


class Bench:
    def __init__(self, runs: int, live: LiveServer, key: str) -> None:
        self.runs = runs
        self.live = live
        self.headers = {"X-Session-API-Key": key}
        self.samples: dict[str, list[float]] = {}
        self.docker = docker.from_env()
        self.http: aiohttp.ClientSession | None = None
        self.prefix = live.app[keys.CONFIG].container_prefix + "raw-"

    def add(self, name: str, value: float) -> None:
        self.samples.setdefault(name, []).append(value)

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        async with self.http.request(
            method, self.live.url + path, json=body, headers=self.headers
        ) as resp:
            payload = await resp.json(content_type=None) if resp.content_length != 0 else None
            if resp.status >= 300:
                raise RuntimeError(f"{method} {path}: {resp.status} {payload}")
            return payload

    async def pool_full(self, spec_id: str) -> None:
        pool = self.live.app[keys.POOL]
        spec = self.live.app[keys.SPECS].get(spec_id)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            members = {r.id for r, _ in await pool.store.members() if r.spec_id == spec_id}
            # Only members count: the ready set was seen holding a claimed, deleted id.
            ready = await pool.store.ready_ids(spec_id) & members
            if len(ready) >= pool.size(spec) and members == ready:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the {spec_id} pool did not refill in 10 minutes")

    async def ready(self, spec_id: str, warm: bool) -> None:
        await self.pool_full(spec_id)
        service = self.live.app[keys.SANDBOXES]
        pool = service.pool
        if not warm:
            service.pool = None
        try:
            t0 = time.perf_counter()
            task = await self.api(
                "POST",
                "/api/v1/app-conversations",
                {"sandbox_spec_id": spec_id, "llm_model": SPECS[spec_id]},
            )
            while task["status"] not in ("READY", "ERROR"):
                await asyncio.sleep(POLL)
                (task,) = await self.api(
                    "GET", f"/api/v1/app-conversations/start-tasks?ids={task['id']}"
                )
            elapsed = time.perf_counter() - t0
        finally:
            service.pool = pool
        if task["status"] != "READY":
            raise RuntimeError(f"{spec_id} start failed: {task['detail']}")
        self.add(f"{spec_id}.{'warm' if warm else 'cold'}", elapsed)
        await self.api("DELETE", f"/api/v1/app-conversations/{task['app_conversation_id']}")

    # -- raw Docker ---------------------------------------------------------------------------

    def raw_run(self, spec_id: str, key: str, network: str) -> tuple[Any, int]:
        """On the control plane's sandbox network (the engine's default bridge may be gone)."""
        spec = self.live.app[keys.SPECS].get(spec_id)
        env = {**agent_env(spec, max_body_bytes=1 << 20, webhooks=False), **spec.initial_env}
        env["OH_SESSION_API_KEYS_0"] = key
        # No host port: the engine picks one (the stubs know only fixed ones).
        publish: dict[str, Any] = {"8000/tcp": ("127.0.0.1", None)}
        container = self.docker.containers.run(
            spec.image,
            command=spec.command,
            name=f"{self.prefix}{secrets.token_hex(4)}",
            environment=env,
            user=spec.user,
            working_dir=spec.working_dir,
            ports=publish,
            network=network,
            detach=True,
        )
        container.reload()
        port = int(container.attrs["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"])
        return container, port

    async def healthy(self, port: int) -> None:
        assert self.http is not None
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(POLL)

    async def raw_start(self, port: int, key: str, spec_id: str) -> None:
        assert self.http is not None
        body = start_conversation_request(
            conversation_id=uuid7_hex(),
            llm={"model": SPECS[spec_id], "base_url": "http://127.0.0.1:9/v1", "api_key": "k"},
            working_dir="/workspace",
            initial_message=None,
            max_iterations=10,
            max_budget_per_task=None,
            confirmation_mode=False,
            secrets={},
            mcp_config=None,
            system_message_suffix=None,
        )
        async with self.http.post(
            f"http://127.0.0.1:{port}/api/conversations",
            json=body,
            headers={"X-Session-API-Key": key},
        ) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"raw start: {resp.status} {await resp.text()}")

    async def raw(self, spec_id: str) -> None:
        key = secrets.token_urlsafe(32)
        spec = self.live.app[keys.SPECS].get(spec_id)
        network = (await attachment(self.live.app, spec)).network
        t0 = time.perf_counter()
        container, port = await asyncio.to_thread(self.raw_run, spec_id, key, network)
        try:
            await self.healthy(port)
            t1 = time.perf_counter()
            await self.raw_start(port, key, spec_id)
            self.add(f"{spec_id}.raw_cold", time.perf_counter() - t0)
            self.add(f"{spec_id}.raw_first", time.perf_counter() - t1)
            t2 = time.perf_counter()
            await self.raw_start(port, key, spec_id)
            self.add(f"{spec_id}.raw_warm", time.perf_counter() - t2)
        finally:
            await asyncio.to_thread(container.remove, force=True, v=True)

    async def run(self) -> None:
        async with aiohttp.ClientSession() as self.http:
            for spec_id in SPECS:  # one unrecorded conversation each: imports, first network
                await self.ready(spec_id, warm=True)
            for n in range(self.runs):
                for spec_id in SPECS:
                    await self.raw(spec_id)
                    await self.ready(spec_id, warm=True)
                    await self.ready(spec_id, warm=False)
                print(f"run {n + 1}/{self.runs} done", file=sys.stderr)

    def report(self) -> None:
        def p50(name: str) -> float:
            return percentile(self.samples[name], 50)

        print(f"\nConversation READY ({self.runs} runs each, p50; min-max)")
        for spec_id in SPECS:
            for kind, raw in (("cold", "raw_cold"), ("warm", "raw_first"), ("warm", "raw_warm")):
                got = self.samples[f"{spec_id}.{kind}"]
                print(
                    f"  {spec_id:<10} {kind:<5} {ms(p50(f'{spec_id}.{kind}')):>10} "
                    f"({ms(min(got))}-{ms(max(got))})   raw Docker {raw:<9} "
                    f"{ms(p50(f'{spec_id}.{raw}')):>10}   ratio "
                    f"{p50(f'{spec_id}.{kind}') / p50(f'{spec_id}.{raw}'):.2f}"
                )
        print(
            f"  official warm / ours warm: "
            f"{p50('openhands.warm') / p50('default.warm'):.2f}; "
            f"official cold / official warm: {p50('openhands.cold') / p50('openhands.warm'):.1f}"
        )


async def main(runs: int) -> None:
    configure_logging("json", "warning")
    prefix = f"acs-bench-official-{secrets.token_hex(3)}-"
    engine = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="acs-bench-official-") as tmp:
        redis = RedisServer(Path(tmp) / "redis")
        redis.start()
        try:
            config = load_config(
                {},
                redis_url=redis.url,
                data_dir=Path(tmp) / "data",
                bootstrap_api_key="bench-bootstrap-" + secrets.token_hex(12),
                secret_key=Fernet.generate_key().decode(),
                spec_dir=REPO / "specs",
                container_prefix=prefix,
                log_format="json",
                log_level="warning",
                enable_specs=["openhands"],
                warm_pool="openhands=1,default=1,*=0",
                pool_interval=0.2,
                start_timeout=600,
                rate_limit_per_minute=0,
                image_tag=os.environ.get("ACS_IMAGE_TAG") or None,
            )
            live = await start_live_server(config)
            try:
                client = aioredis.Redis.from_url(redis.url)
                key = (await ApiKeyService(client, None).create("bench")).key
                await client.aclose()
                bench = Bench(runs, live, key)
                async with aiohttp.ClientSession() as bench.http:
                    await bench.api("POST", "/api/settings", {"llm_model": "fake-model"})
                await bench.run()
                bench.report()
            finally:
                await live.close()
                # Sandboxes outlive the control plane: this run's containers, volumes, networks.
                remove_matching(engine, prefix)
        finally:
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per case (5)")
    asyncio.run(main(parser.parse_args().runs))
