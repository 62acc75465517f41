"""The sandbox API's curve: create, search and pause at 1x, 10x and 100x (issue 30, item 4).

Run with `.venv/bin/python -m bench.scale_curves [--levels 10:1,100:10,1000:100] [--json PATH]`.

Each level is `records:clients`: that many sandbox records exist in Redis (written as the
service writes them, spread over the clients' users, without containers: a search reads them,
nothing else does) and that many clients call the API at once, each as a user of its own. The
control plane runs as its own process (`controlplane serve` on a private redis-server, the
reconciler's sweep and the idle reaper every hour: the records have no containers; the caps
off, so that a create is refused by nothing), so the latencies are the server's own; this
process is the clients and the raw baselines. Per level, in order:

- **create**: each client POSTs `/api/v1/sandboxes` (cold: no warm pool) `max(1, 20 // C)`
  times one after another: the API's answer (STARTING, the record written and the launch
  queued); the containers then boot behind the start gate (untimed; waited for until RUNNING).
  Raw beside it: a Redis PING from C clients at once (one round trip of the floor a create's
  three to four Redis round trips stand on).
- **search**: each client asks its own first page (`limit=20`) and, as the admin, the
  deployment's first page (`all_users=true`) and a filtered one that few records match
  (`all_users=true&status=ERROR`: 1 record in 100 is ERROR), `ceil(200 / C)` times each.
  Raw beside it: the first page read by hand from C clients at once (ZRANGE of 21 ids, 21
  HGETALL in one pipeline).
- **pause**: each client pauses the sandboxes it made, one after another (a docker pause and a
  compare-and-set); then resumes them (untimed). Raw beside it: `docker pause` of the same
  containers from C threads at once, then unpause (untimed).
- the sandboxes are deleted (each DELETE timed) and their containers awaited gone.

`--search-only`: the records and the searches alone, no container (a before/after of a
search's cost, to larger record counts).

`--one-user`: the reads that once grew with what one user has (issue 30): each level's records
are that many conversations and as many start tasks (one per conversation, finished), all of
one user, and its clients are that user's, C at once, `ceil(200 / C)` requests each: the start
tasks' first page newest-updated first (`limit=20`), their count for one conversation and from
a creation time (half of them after it), the conversations' first page and count with
`title__contains` that 1 in 100 titles hold, the conversations' count and first page (oldest
first) from a creation time (half of them after it), and the first page and count of a title
word that RARE titles hold; then `max(1, 20 // C)` conversation deletes a client (each with its
one start task; extra records, so the level's count stays). Raw beside it: the start tasks'
first page read by hand (ZRANGE 21 + one MGET), the count from the time (one ZCOUNT of the index
by creation) and the rare word (SINTER of its trigrams' buckets + one MGET); then the bytes a
conversation of the trigram index and of the index by creation (MEMORY USAGE). `--server PATH`
runs another build's `controlplane` (a before, on the same records).

The server's CPU time (user + system, from /proc) per phase is printed per request. Exit
status: 0 when the table was printed, 1 on an error. No target: the curve is the result (what
grows faster than the load says where the work is linear in something it should not be).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import docker
import redis.asyncio as aioredis
from cryptography.fernet import Fernet
from docker.errors import APIError, NotFound

from bench.common import REPO, BenchError, Samples, main_of, ms, process_cpu, serve_env
from controlplane.auth.service import ApiKeyService
from controlplane.conversations.indexes import buckets
from controlplane.conversations.models import (
    AppConversationInfo,
    AppConversationStartRequest,
    AppConversationStartTask,
    StartTaskStatus,
)
from controlplane.conversations.store import ConversationStore
from controlplane.crypto import SecretBox
from controlplane.ids import uuid7_hex
from controlplane.sandboxes import naming
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.store import Limits, SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER
from controlplane.store import keyspace, text
from controlplane.store.paging import micros
from drivers.docker.names import LABEL_ID
from tests.support.docker_fixtures import remove_matching
from tests.support.live_server import free_port

SEARCH_REQUESTS = 200
"""Search requests per variant and level, spread over the clients."""
CREATES = 20
"""Creates per level at one client; at C clients each makes max(1, CREATES // C)."""
ERROR_EVERY = 100
"""One record in ERROR_EVERY is ERROR: the filtered admin search matches few."""
WITHIN = 300.0


NEEDLE_EVERY = 100
"""One conversation title in NEEDLE_EVERY holds the needle (`--one-user`)."""
RARE = 5
"""Conversations whose title holds a word no other title does (`--one-user`): the first RARE."""
ONE_USER = "heavy"
"""The user whose records `--one-user` writes."""


@dataclass
class Options:
    levels: list[tuple[int, int]]
    search_only: bool
    json_path: Path | None
    one_user: bool = False
    server: Path | None = None
    requests: int = SEARCH_REQUESTS


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--levels", default="10:1,100:10,1000:100", help="records:clients, comma separated"
    )
    parser.add_argument(
        "--search-only", action="store_true", help="the searches alone (no container is made)"
    )
    parser.add_argument(
        "--one-user",
        action="store_true",
        help="one user's conversations and start tasks, read as that user (no container)",
    )
    parser.add_argument(
        "--server", type=Path, default=None, help="the controlplane executable (default: ours)"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=SEARCH_REQUESTS,
        help=f"requests per read and level, spread over the clients (default {SEARCH_REQUESTS})",
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        levels = [(int(r), int(c)) for r, c in (p.split(":") for p in args.levels.split(",") if p)]
    except ValueError:
        parser.error("--levels: records:clients pairs, e.g. 10:1,100:10")
    if not levels or any(r < 1 or c < 1 for r, c in levels):
        parser.error("--levels: positive records and clients")
    if any(b[0] < a[0] for a, b in itertools.pairwise(levels)):
        parser.error("--levels: records must not shrink from one level to the next")
    return Options(
        levels=levels,
        search_only=args.search_only,
        json_path=args.json_path,
        one_user=args.one_user,
        server=args.server,
        requests=max(1, args.requests),
    )


class CurvesBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.tmp = tmp
        self.redis_url = redis_url
        self.notes: list[str] = []
        self.samples = Samples()
        self.cpu: dict[str, float] = {}
        self.prefix = f"acs-bench-curves-{secrets.token_hex(3)}-"
        self.admin_key = "bench-" + secrets.token_hex(12)
        self.secret_key = Fernet.generate_key().decode()
        self.tag = os.environ.get("ACS_IMAGE_TAG") or None
        self.spec = SpecCatalog.load(REPO / "specs", self.tag).default
        self.docker = docker.from_env(timeout=120)
        self.redis = aioredis.Redis.from_url(redis_url, max_connections=300)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None
        self.user_keys: list[str] = []
        self.written = 0
        self.heavy_key = ""
        self.conversations: list[str] = []
        self.middle = datetime.now(UTC)
        self.index_bytes: dict[str, tuple[int, int, int]] = {}
        self.doomed: list[str] = []
        self.threads = ThreadPoolExecutor(max_workers=100, thread_name_prefix="raw")

    # -- the server ----------------------------------------------------------------------

    async def start_server(self) -> None:
        env = serve_env(
            redis_url=self.redis_url,
            bootstrap_key=self.admin_key,
            prefix=self.prefix,
            data_dir=self.tmp / "data",
            ACS_SECRET_KEY=self.secret_key,
            ACS_RATE_LIMIT_PER_MINUTE="0",
            ACS_MAX_RUNNING_PER_USER="0",
            ACS_MAX_SANDBOXES_PER_USER="0",
            ACS_WARM_POOL="0",
            ACS_START_TIMEOUT="240",
            # The records have no containers: no sweep may mark them MISSING mid-run.
            ACS_RECONCILE_INTERVAL="3600",
            ACS_REAPER_INTERVAL="3600",
        )
        if self.tag:
            env["ACS_IMAGE_TAG"] = self.tag
        binary = self.options.server or Path(sys.executable).parent / "controlplane"
        self.process = await asyncio.create_subprocess_exec(
            str(binary),
            *("serve", "--host", "127.0.0.1", "--port", str(self.port)),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.get(f"{self.url}/ready") as resp:
                    if resp.status == 200:
                        return
            if self.process.returncode is not None:
                raise BenchError("the control plane exited at start")
            if time.monotonic() > deadline:
                raise BenchError("the control plane did not start in 60 s")
            await asyncio.sleep(0.2)

    async def stop_server(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()
        await self.redis.aclose()

    # -- calls ---------------------------------------------------------------------------

    async def call(self, method: str, path: str, key: str, name: str | None = None) -> Any:
        assert self.http is not None
        started = time.perf_counter()
        async with self.http.request(
            method, self.url + path, headers={"X-Session-API-Key": key}
        ) as resp:
            body = await resp.json(content_type=None)
            took = time.perf_counter() - started
            if resp.status != 200:
                raise BenchError(f"{method} {path}: {resp.status} {body}")
        if name is not None:
            self.samples.add(name, took)
        return body

    async def statuses(self, ids: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for n in range(0, len(ids), 100):
            query = "&".join(f"id={i}" for i in ids[n : n + 100])
            body = await self.call("GET", f"/api/v1/sandboxes?{query}", self.admin_key)
            chunk = ids[n : n + 100]
            found.update(
                {i: (b or {}).get("status", "GONE") for i, b in zip(chunk, body, strict=True)}
            )
        return found

    async def wait_for(self, ids: list[str], want: str) -> None:
        deadline = time.monotonic() + WITHIN
        while True:
            states = await self.statuses(ids)
            bad = [s for s in states.values() if s in ("ERROR", "MISSING")]
            if bad:
                raise BenchError(f"{len(bad)} sandboxes {bad[0]}")
            if all(s == want for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise BenchError(f"not all {want} in {WITHIN:g} s")
            await asyncio.sleep(0.5)

    async def phase(self, name: str, work: Awaitable[Any]) -> Any:
        """`work`, with the server's CPU time over it kept as `name`."""
        assert self.process is not None
        before = process_cpu(self.process.pid)
        try:
            return await work
        finally:
            self.cpu[name] = process_cpu(self.process.pid) - before

    # -- records -------------------------------------------------------------------------

    async def users(self, count: int) -> None:
        keys = ApiKeyService(self.redis, None)
        while len(self.user_keys) < count:
            self.user_keys.append((await keys.create(f"u{len(self.user_keys):03d}")).key)

    async def write_records(self, want: int, users: int) -> None:
        """Records up to `want`, each owned by one of the first `users` users in turn, newest
        last, without containers: PAUSED mostly, one in ERROR_EVERY ERROR."""
        store = SandboxStore(self.redis, SecretBox(self.secret_key.encode()))
        start = datetime.now(UTC) - timedelta(days=1)
        pending: list[Awaitable[str]] = []
        for i in range(self.written, want):
            error = i % ERROR_EVERY == ERROR_EVERY - 1
            created = start + timedelta(seconds=i)
            record = SandboxRecord(
                id=naming.new_sandbox_id(),
                owner=f"u{i % users:03d}",
                spec_id=self.spec.id,
                status=SandboxStatus.ERROR if error else SandboxStatus.PAUSED,
                reason="benchmark record" if error else None,
                session_api_key=secrets.token_urlsafe(32),
                ports={AGENT_SERVER: 40000 + i % 20000},
                created_at=created,
                updated_at=created,
                last_activity_at=created,
            )
            pending.append(store.create(record, 0, Limits()))
            if len(pending) >= 200:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        self.written = max(self.written, want)

    # -- a level -------------------------------------------------------------------------

    async def level(self, records: int, clients: int) -> None:
        tag = f"{records}:{clients}"
        await self.users(clients)
        await self.write_records(records, clients)
        keys = self.user_keys[:clients]
        each = max(1, CREATES // clients)
        made: list[list[str]] = [[] for _ in keys]

        async def creates(n: int) -> None:
            for _ in range(each):
                body = await self.call("POST", "/api/v1/sandboxes", keys[n], f"{tag}.create")
                made[n].append(body["id"])

        ids: list[str] = []
        if not self.options.search_only:
            print(f"{tag}: create", file=sys.stderr)
            creating = asyncio.gather(*(creates(n) for n in range(clients)))
            await self.phase(f"{tag}.create", creating)
            await self.floor(f"{tag}.raw_ping", clients, self.ping)
            ids = [i for own in made for i in own]
            await self.wait_for(ids, "RUNNING")
            await asyncio.sleep(1.0)

        print(f"{tag}: search", file=sys.stderr)
        rounds = math.ceil(self.options.requests / clients)
        variants = {
            "search_own": ("/api/v1/sandboxes/search?limit=20", None),
            "search_all": ("/api/v1/sandboxes/search?limit=20&all_users=true", self.admin_key),
            "search_rare": (
                "/api/v1/sandboxes/search?limit=20&all_users=true&status=ERROR",
                self.admin_key,
            ),
        }
        for variant, (path, admin) in variants.items():

            async def searches(
                n: int, path: str = path, admin: str | None = admin, name: str = variant
            ) -> None:
                for _ in range(rounds):
                    await self.call("GET", path, admin or keys[n], f"{tag}.{name}")

            await self.phase(
                f"{tag}.{variant}", asyncio.gather(*(searches(n) for n in range(clients)))
            )
        await self.floor(f"{tag}.raw_page", clients, self.raw_page, rounds)
        if self.options.search_only:
            return

        print(f"{tag}: pause", file=sys.stderr)

        async def pauses(n: int, verb: str, name: str | None) -> None:
            for sandbox_id in made[n]:
                await self.call("POST", f"/api/v1/sandboxes/{sandbox_id}/{verb}", keys[n], name)

        await self.phase(
            f"{tag}.pause",
            asyncio.gather(*(pauses(n, "pause", f"{tag}.pause") for n in range(clients))),
        )
        await asyncio.gather(*(pauses(n, "resume", None) for n in range(clients)))
        await self.wait_for(ids, "RUNNING")
        await asyncio.sleep(1.0)
        await self.raw_pauses(tag, made)
        await asyncio.sleep(1.0)

        print(f"{tag}: delete", file=sys.stderr)

        async def deletes(n: int) -> None:
            for sandbox_id in made[n]:
                await self.call(
                    "DELETE", f"/api/v1/sandboxes/{sandbox_id}", keys[n], f"{tag}.delete"
                )

        await self.phase(f"{tag}.delete", asyncio.gather(*(deletes(n) for n in range(clients))))
        await self.gone()

    async def one_user_records(self, want: int, extra: int) -> None:
        """Conversations and start tasks of ONE_USER up to `want` each (one task per
        conversation, finished, created a second apart), and `extra` more to delete."""
        store = ConversationStore(self.redis)
        start = datetime.now(UTC) - timedelta(days=1)

        async def one(i: int, doomed: bool = False) -> str:
            needle = i % NEEDLE_EVERY == NEEDLE_EVERY // 2
            info = AppConversationInfo(
                id=uuid7_hex(),
                created_by_user_id=ONE_USER,
                sandbox_id=f"s-bench-{i}",  # one sandbox each (none exists)
                title=f"doomed {i}"
                if doomed
                else f"needle {i}"
                if needle
                else f"unusual {i}"
                if 0 <= i < RARE
                else f"chat {i}",
                created_at=start + timedelta(seconds=i),
                updated_at=start + timedelta(seconds=i),
            )
            await store.save(info)
            await store.save_task(
                AppConversationStartTask(
                    id=uuid7_hex(),
                    created_by_user_id=ONE_USER,
                    request=AppConversationStartRequest(),
                    status=StartTaskStatus.READY,
                    app_conversation_id=info.id,
                    created_at=start + timedelta(seconds=i),
                )
            )
            return info.id

        made: list[Awaitable[str]] = []
        for i in range(len(self.conversations), want):
            made.append(one(i))
        for n in range(0, len(made), 200):
            self.conversations += await asyncio.gather(*made[n : n + 200])
        # Created before the others (never counted from the middle), titled to never match.
        self.doomed = list(await asyncio.gather(*(one(-1 - i, doomed=True) for i in range(extra))))

    async def one_user_level(self, records: int, clients: int) -> None:
        tag = f"{records}:{clients}"
        if not self.heavy_key:
            self.heavy_key = (await ApiKeyService(self.redis, None).create(ONE_USER)).key
        each = max(1, CREATES // clients)
        await self.one_user_records(records, each * clients)
        middle = datetime.now(UTC) - timedelta(days=1) + timedelta(seconds=records // 2)
        since = middle.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.middle = middle
        one = self.conversations[len(self.conversations) // 3]
        base = "/api/v1/app-conversations"
        variants = {
            "tasks_updated": f"{base}/start-tasks/search?sort_order=UPDATED_AT_DESC&limit=20",
            "tasks_count_conv": f"{base}/start-tasks/count?conversation_id__eq={one}",
            "tasks_count_since": f"{base}/start-tasks/count?created_at__gte="
            + middle.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "title_search": f"{base}/search?title__contains=needle&limit=20",
            "title_count": f"{base}/count?title__contains=needle",
            "conv_count_since": f"{base}/count?created_at__gte={since}",
            "conv_created_page": f"{base}/search?created_at__gte={since}&sort_order=CREATED_AT"
            "&limit=20",
            "title_rare_search": f"{base}/search?title__contains=unusual&limit=20",
            "title_rare_count": f"{base}/count?title__contains=unusual",
        }
        rounds = math.ceil(self.options.requests / clients)
        print(f"{tag}: one user's reads", file=sys.stderr)
        for variant, path in variants.items():

            async def reads(n: int, path: str = path, name: str = variant) -> None:
                for _ in range(rounds):
                    await self.call("GET", path, self.heavy_key, f"{tag}.{name}")

            await self.phase(
                f"{tag}.{variant}", asyncio.gather(*(reads(n) for n in range(clients)))
            )
        await self.floor(f"{tag}.raw_tasks", clients, self.raw_tasks, rounds)
        await self.floor(f"{tag}.raw_zcount", clients, self.raw_zcount, rounds)
        await self.floor(f"{tag}.raw_title", clients, self.raw_title, rounds)
        self.index_bytes[tag] = await self.index_memory()
        doomed = [self.doomed[n * each : (n + 1) * each] for n in range(clients)]

        async def deletes(n: int) -> None:
            for conversation_id in doomed[n]:
                await self.call(
                    "DELETE", f"{base}/{conversation_id}", self.heavy_key, f"{tag}.conv_delete"
                )

        await self.phase(
            f"{tag}.conv_delete", asyncio.gather(*(deletes(n) for n in range(clients)))
        )

    async def raw_tasks(self, n: int) -> None:
        """The one user's newest start tasks, read by hand (their index, then one MGET)."""
        ids: Any = await self.redis.zrange(
            keyspace.user_start_tasks(ONE_USER), "+", "-", desc=True, bylex=True, offset=0, num=21
        )
        await self.redis.mget([keyspace.start_task(text(i)) for i in ids])

    async def raw_zcount(self, n: int) -> None:
        """The one user's count from the middle creation time, by hand (one ZCOUNT)."""
        key = keyspace.user_conversations_by_creation(ONE_USER)
        await self.redis.zcount(key, micros(self.middle), "+inf")

    async def raw_title(self, n: int) -> None:
        """The one user's rare title, by hand: the SINTER of its trigrams' buckets, one MGET
        of what it holds."""
        prefix = keyspace.user_title_buckets(ONE_USER)
        ids = await self.redis.sinter([prefix + b for b in sorted(buckets("unusual"))])
        if ids:
            await self.redis.mget([keyspace.conversation(text(i)) for i in ids])

    async def index_memory(self) -> tuple[int, int, int]:
        """Bytes (MEMORY USAGE) of the one user's trigram index (every bucket's set, the
        titles hash, the cut set) and index by creation, and their number of conversations."""
        total = 0
        keys = [
            keyspace.user_conversation_titles(ONE_USER),
            keyspace.user_cut_titles(ONE_USER),
        ]
        async for key in self.redis.scan_iter(
            match=keyspace.user_title_buckets(ONE_USER) + "*", count=1000
        ):
            keys.append(text(key))
        for key in keys:
            total += int(await self.redis.memory_usage(key, samples=0) or 0)
        created = keyspace.user_conversations_by_creation(ONE_USER)
        by_creation = int(await self.redis.memory_usage(created, samples=0) or 0)
        return total, by_creation, int(await self.redis.zcard(created))

    async def ping(self, n: int) -> None:
        await self.redis.ping()

    async def raw_page(self, n: int) -> None:
        """Client n's own first page, read by hand (its user's index, then the records)."""
        ids: Any = await self.redis.zrange(
            keyspace.user_sandboxes(f"u{n:03d}"), "+", "-", desc=True, bylex=True, offset=0, num=21
        )
        async with self.redis.pipeline(transaction=False) as pipe:
            for sandbox_id in ids:
                pipe.hgetall(keyspace.sandbox(text(sandbox_id)))
            await pipe.execute()

    async def floor(
        self, name: str, clients: int, op: Callable[[int], Awaitable[None]], rounds: int = 0
    ) -> None:
        """`op(n)` from clients n = 0.. at once, `rounds` times each (ceil(--requests /
        clients) by default)."""
        rounds = rounds or math.ceil(self.options.requests / clients)

        async def one(n: int) -> None:
            for _ in range(rounds):
                started = time.perf_counter()
                await op(n)
                self.samples.add(name, time.perf_counter() - started)

        await asyncio.gather(*(one(n) for n in range(clients)))

    async def raw_pauses(self, tag: str, made: list[list[str]]) -> None:
        """docker pause of the same containers, one thread per client, each pausing its own
        one after another; then unpause (untimed)."""
        names = {
            c.labels.get(LABEL_ID, ""): c.id
            for c in await asyncio.to_thread(
                self.docker.containers.list, filters={"name": self.prefix}
            )
        }

        def pause_all(own: list[str], verb: str) -> None:
            for sandbox_id in own:
                container = names.get(sandbox_id)
                if container is None:
                    raise BenchError(f"no container for {sandbox_id}")
                started = time.perf_counter()
                getattr(self.docker.api, verb)(container)
                if verb == "pause":
                    self.samples.add(f"{tag}.raw_pause", time.perf_counter() - started)

        loop = asyncio.get_running_loop()
        for verb in ("pause", "unpause"):
            await asyncio.gather(
                *(loop.run_in_executor(self.threads, pause_all, own, verb) for own in made)
            )

    async def gone(self) -> None:
        deadline = time.monotonic() + WITHIN
        while await asyncio.to_thread(
            self.docker.containers.list, all=True, filters={"name": self.prefix}
        ):
            if time.monotonic() > deadline:
                raise BenchError("containers still there after their deletes")
            await asyncio.sleep(0.5)

    # -- the run -------------------------------------------------------------------------

    async def measure(self) -> tuple[list[str], list[str]]:
        load = os.getloadavg()[0]
        await self.start_server()
        try:
            for records, clients in self.options.levels:
                if self.options.one_user:
                    await self.one_user_level(records, clients)
                else:
                    await self.level(records, clients)
        finally:
            await self.stop_server()
        if self.options.one_user:
            return self.one_user_table(load), []
        return self.table(load), []

    def one_user_table(self, load: float) -> list[str]:
        levels = [f"{r}:{c}" for r, c in self.options.levels]
        lines = [
            f"one user's records:clients, client-observed p50 / p99 ms (raw beside); load avg "
            f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
            f"{'operation':<34}" + "".join(f"{lv:>22}" for lv in levels),
        ]
        rows = [
            ("start tasks: UPDATED_AT_DESC page", "tasks_updated"),
            ("start tasks: count, conversation", "tasks_count_conv"),
            ("start tasks: count, created since", "tasks_count_since"),
            ("conversations: title page", "title_search"),
            ("conversations: title count", "title_count"),
            ("conversations: count, created since", "conv_count_since"),
            ("conversations: page, created since", "conv_created_page"),
            (f"conversations: title page, {RARE} match", "title_rare_search"),
            (f"conversations: title count, {RARE} match", "title_rare_count"),
            ("DELETE a conversation", "conv_delete"),
            ("  raw: ZRANGE 21 + MGET 21 tasks", "raw_tasks"),
            ("  raw: ZCOUNT by creation", "raw_zcount"),
            ("  raw: SINTER 5 buckets + MGET", "raw_title"),
        ]
        lines += self.rows(levels, rows, [name for _, name in rows[:-3]])
        lines.append(
            "index bytes a conversation (trigrams + titles hash / by creation): "
            + ", ".join(
                f"{lv}: {t / n:.0f} / {c / n:.0f}" if n else f"{lv}: -"
                for lv in levels
                for t, c, n in [self.index_bytes.get(lv, (0, 0, 0))]
            )
        )
        lines.append(
            ", ".join(
                f"{lv}: {self.samples.count(f'{lv}.tasks_updated')} reads a variant, "
                f"{self.samples.count(f'{lv}.conv_delete')} deletes"
                for lv in levels
            )
        )
        return lines

    def table(self, load: float) -> list[str]:
        levels = [f"{r}:{c}" for r, c in self.options.levels]
        lines = [
            f"sandbox API by records:clients, client-observed p50 / p99 ms (raw beside); "
            f"load avg {load:.2f} at the start",
            f"{'operation':<34}" + "".join(f"{lv:>22}" for lv in levels),
        ]
        rows = [
            ("POST /sandboxes (cold, answer)", "create"),
            ("  raw: Redis PING", "raw_ping"),
            ("search: own first page", "search_own"),
            ("search: all users, first page", "search_all"),
            ("search: all users, status=ERROR", "search_rare"),
            ("  raw: ZRANGE 21 + 21 HGETALL", "raw_page"),
            ("POST /sandboxes/{id}/pause", "pause"),
            ("  raw: docker pause", "raw_pause"),
            ("DELETE /sandboxes/{id}", "delete"),
        ]
        lines += self.rows(
            levels, rows, ["create", "search_own", "search_all", "search_rare", "pause", "delete"]
        )
        counts = ", ".join(
            f"{lv}: {self.samples.count(f'{lv}.create')} creates, "
            f"{self.samples.count(f'{lv}.search_own')} searches a variant"
            for lv in levels
        )
        lines.append(counts)
        return lines

    def rows(self, levels: list[str], rows: list[tuple[str, str]], cpu_of: list[str]) -> list[str]:
        """Each row's client-observed p50 / p99 at every level, then the server's CPU per
        request of the operations `cpu_of` (the raw rows have none)."""
        lines = []
        for label, name in rows:
            cells = []
            for lv in levels:
                key = f"{lv}.{name}"
                cells.append(f"{ms(self.samples.p(key, 50))} / {ms(self.samples.p(key, 99))}")
            lines.append(f"{label:<34}" + "".join(f"{c:>22}" for c in cells))
        lines.append("server CPU ms per request (user + system over the phase):")
        for name in cpu_of:
            cells = []
            for lv in levels:
                n = self.samples.count(f"{lv}.{name}")
                cpu = self.cpu.get(f"{lv}.{name}")
                cells.append(f"{cpu * 1000 / n:.2f}" if n and cpu is not None else "-")
            lines.append(f"  {name:<32}" + "".join(f"{c:>22}" for c in cells))
        return lines

    def remove_everything(self) -> int:
        with contextlib.suppress(NotFound, APIError):
            return remove_matching(self.docker, self.prefix)
        return 0

    def close(self) -> None:
        self.threads.shutdown(wait=False)
        self.docker.close()

    def results(self) -> Any:
        return {"samples": self.samples.values, "cpu": self.cpu}


main = main_of(parse, CurvesBench, "acs-bench-curves-")

if __name__ == "__main__":
    raise SystemExit(main(None))
