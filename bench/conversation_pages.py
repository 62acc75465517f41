"""Conversation pages as a user's conversations grow: the first page of each order, the V0 list
and the count at 100, 1,000 and 10,000 conversations of one user (issue 30, item 4: nothing per
request grows with everything a user has).

Run with `.venv/bin/python -m bench.conversation_pages [--sizes 100,1000,10000] [--requests N]`.

One process: a private redis-server, the real app over real HTTP on 127.0.0.1 (its Docker
engine an address nothing answers: the reads under test never call a sandbox), one user's
conversations written through the store (records and every index, as a create writes them).
For each size, each route is asked `--requests` times for its first page of 20 (after a
warm-up), alternating the routes;
the server's own time (every middleware and the handler) is compared with the raw Redis work of a
page read by hand from this client: the index's first 21 ids, then their 21 records (one ZRANGE,
one MGET), timed in the same run.

Exit status: 0 when the table was printed (missed targets marked), 1 on an error.
Target: a page of any order costs the same at 10,000 conversations as at 100 (at most 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from bench.common import BenchError, Samples, main_of, ms, serve, served_config
from controlplane import keys
from controlplane.auth.service import ApiKeyService
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.ids import uuid7_hex
from controlplane.store import keyspace

BASE = "/api/v1/app-conversations"
ROUTES: dict[str, tuple[str, dict[str, str]]] = {
    "created_desc": (f"{BASE}/search", {"limit": "20"}),
    "updated_desc": (f"{BASE}/search", {"limit": "20", "sort_order": "UPDATED_AT_DESC"}),
    "updated_asc": (f"{BASE}/search", {"limit": "20", "sort_order": "UPDATED_AT"}),
    "v0_list": ("/api/conversations", {"limit": "20"}),
    "count": (f"{BASE}/count", {}),
    "title_desc": (f"{BASE}/search", {"limit": "20", "sort_order": "TITLE_DESC"}),
    "title_asc": (f"{BASE}/search", {"limit": "20", "sort_order": "TITLE"}),
}
LINEAR: set[str] = set()  # routes that read every record of the user by design: none now
MAX_GROWTH = 2.0
NO_ENGINE = "tcp://127.0.0.1:1"  # conversations are served, no sandbox is ever reached


@dataclass
class Options:
    sizes: list[int]
    requests: int
    json_path: Path | None


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="conversations of the user")
    parser.add_argument("--requests", type=int, default=60, help="timed requests a route and size")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1 or args.requests < 1:
        parser.error("--sizes and --requests must be positive")
    return Options(sizes=sorted(sizes), requests=args.requests, json_path=args.json_path)


class PagesBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.tmp = tmp
        self.redis_url = redis_url
        self.notes: list[str] = []
        self.samples = Samples()
        self.rows: dict[str, dict[str, float]] = {}

    async def measure(self) -> tuple[list[str], list[str]]:
        config = served_config(
            self.redis_url,
            self.tmp,
            docker_url=NO_ENGINE,
        )
        async with (
            serve(config, self.samples) as served,
            aiohttp.ClientSession() as http,
        ):
            redis: aioredis.Redis = served.app[keys.REDIS]
            store = ConversationStore(redis)
            await store.reindex_statuses()  # as the app's start does: the index is built
            headers = {"X-Session-API-Key": (await ApiKeyService(redis, None).create("pat")).key}
            have = 0
            for size in self.options.sizes:
                await _seed(store, "pat", have, size)
                have = size
                await self._size(http, served.url, headers, redis, size)
        return self._table()

    async def _size(
        self,
        http: aiohttp.ClientSession,
        url: str,
        headers: dict[str, str],
        redis: aioredis.Redis,
        size: int,
    ) -> None:
        for i in range(10 + self.options.requests):
            for name, (path, params) in ROUTES.items():
                async with http.get(url + path, params=params, headers=headers) as resp:
                    if resp.status != 200:
                        raise BenchError(f"{name}: {resp.status} {await resp.text()}")
                    await resp.read()
                route = "server:GET " + path
                timed = self.samples.values[route].pop()
                if i >= 10:
                    self.samples.add(f"{size}.{name}", timed)
            raw = await _raw_page(redis, "pat")
            if i >= 10:
                self.samples.add(f"{size}.raw", raw)

    def _table(self) -> tuple[list[str], list[str]]:
        sizes = self.options.sizes
        lines = [
            f"first page of 20 (server time p50, ms) by the user's conversations; raw = ZRANGE 21 "
            f"+ MGET 21 from the client; {self.options.requests} requests each",
            f"{'route':<14}" + "".join(f"{n:>12,}" for n in sizes) + f"{'growth':>10}",
        ]
        missed: list[str] = []
        for name in [*ROUTES, "raw"]:
            p50s = [self.samples.p(f"{n}.{name}", 50) for n in sizes]
            growth = p50s[-1] / p50s[0] if p50s[0] else 0.0
            self.rows[name] = {str(n): p for n, p in zip(sizes, p50s, strict=True)}
            mark = ""
            if name not in LINEAR and name != "raw" and growth > MAX_GROWTH and len(sizes) > 1:
                mark = "  MISSED"
                missed.append(f"{name} grew {growth:.1f}x from {sizes[0]} to {sizes[-1]}")
            lines.append(
                f"{name:<14}" + "".join(f"{ms(p):>12}" for p in p50s) + f"{growth:>9.1f}x{mark}"
            )
        top = sizes[-1]
        raw = self.samples.p(f"{top}.raw", 50)
        updated = self.samples.p(f"{top}.updated_desc", 50)
        created = self.samples.p(f"{top}.created_desc", 50)
        lines.append(
            f"at {top:,}: updated_desc / raw {updated / raw:.1f}x, "
            f"created_desc / raw {created / raw:.1f}x"
        )
        return lines, missed

    def remove_everything(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def results(self) -> Any:
        return self.rows


async def _seed(store: ConversationStore, user: str, have: int, want: int) -> None:
    """Conversations `have`..`want` of `user`, updated at times unlike their creation order."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    sandbox = "s" + secrets.token_hex(8)
    pending = []
    for i in range(have, want):
        info = AppConversationInfo(
            id=uuid7_hex(),
            created_by_user_id=user,
            sandbox_id=sandbox,
            title=f"conversation {secrets.token_hex(4)}",
            updated_at=start + timedelta(seconds=(i * 7919) % 1_000_003),
        )
        pending.append(store.save(info))
        if len(pending) >= 200:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


async def _raw_page(redis: aioredis.Redis, user: str) -> float:
    started = time.perf_counter()
    ids: Any = await redis.zrange(keyspace.user_conversations(user), 0, 20, desc=True)
    await redis.mget([keyspace.conversation(i.decode()) for i in ids])
    return time.perf_counter() - started


main = main_of(parse, PagesBench, "acs-bench-pages-")

if __name__ == "__main__":
    raise SystemExit(main(None))
