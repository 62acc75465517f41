"""The trigram index of titles: its memory and a 3-character query's candidates (issue 30, review
finding: a key per trigram let hostile titles cost ~50 KB a conversation).

Run with `.venv/bin/python -m bench.title_index [--conversations 1000] [--query-conversations
10000] [--repeat 200]`.

On a private redis-server (no Docker, no control plane process), two parts:

- **memory**: per kind of title (200 random CJK characters, whose trigrams no other title holds;
  words as often as docs/*.md uses them, 200, 50 and 10 characters), `--conversations`
  conversations of a user of their own, written by the store's create script: the bytes
  (MEMORY USAGE of every key of the index: the buckets, the titles hash, the cut set) and keys
  of the index a conversation, against the same titles in `conversation-indexes-v1`'s layout (a
  set per trigram and its titles hash, written by hand beside it in the same run: the before).
- **queries**: `--query-conversations` conversations of words (50 and 200 characters) of one
  user each, and 3-character queries: trigrams of the titles from the most common to one
  title's, and trigrams of no title. For each: the titles that hold it, the ids in its bucket
  (what the bucket adds: other trigrams' conversations), the candidates kept (their indexed
  title checked), and the time of one call of the candidates' read (`title_candidates`, no
  limit: the count's; SINTER, SMEMBERS, HMGET of the titles) against v1's read on the same Redis
  (SINTER of the trigram's set and SMEMBERS of the cut set, one pipeline): p50 / p99 over
  `--repeat` calls each, and Redis's
  own time a call (INFO commandstats: what the call keeps other clients waiting).

Exit status: 0 when the tables were printed, 1 on an error. No target: the numbers go to
docs/conversations.md and bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import string
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.common import REPO, Samples, main_of, ms
from controlplane.conversations.indexes import (
    ConversationIndexes,
    bucket,
    indexed_title,
    trigrams,
)
from controlplane.conversations.models import AppConversationInfo
from controlplane.conversations.store import ConversationStore
from controlplane.store import keyspace, text

START = datetime(2026, 11, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Options:
    conversations: int
    query_conversations: int
    repeat: int
    json_path: Path | None


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=1000, help="a kind, memory part")
    parser.add_argument("--query-conversations", type=int, default=10000, help="queries part")
    parser.add_argument("--repeat", type=int, default=200, help="timed calls a query")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    if min(args.conversations, args.query_conversations, args.repeat - 1) < 1:
        parser.error("--conversations, --query-conversations positive, --repeat at least 2")
    return Options(args.conversations, args.query_conversations, args.repeat, args.json_path)


class Titles:
    """Titles of each kind, from one seeded generator. Words are English as this repository's
    docs write it (docs/*.md), drawn as often as the docs use them: trigrams shared as a
    language shares them (random letters would share few)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        used = Counter(
            w.lower()
            for path in sorted((REPO / "docs").glob("*.md"))
            for w in re.findall(r"[A-Za-z]{2,}", path.read_text())
        )
        self.words = sorted(used)
        self.weights = [float(used[w]) for w in self.words]

    def cjk(self) -> str:
        return "".join(chr(self.rng.randint(0x4E00, 0x9FFF)) for _ in range(200))

    def of_words(self, length: int) -> str:
        out = ""
        while len(out) < length:
            word = self.rng.choices(self.words, self.weights)[0]
            out = f"{out} {word}" if out else word.capitalize()
        return out[:length].rstrip() or "x"


@dataclass
class TitleIndexBench:
    options: Options
    redis_url: str
    notes: list[str] = field(default_factory=list)
    samples: Samples = field(default_factory=Samples)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    queries: list[dict[str, Any]] = field(default_factory=list)

    async def measure(self) -> tuple[list[str], list[str]]:
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            load = os.getloadavg()[0]
            info = await redis.info("server")
            titles = Titles(30)
            kinds = {
                "200 random CJK characters": titles.cjk,
                "words, 200 characters": lambda: titles.of_words(200),
                "words, 50 characters": lambda: titles.of_words(50),
                "words, 10 characters": lambda: titles.of_words(10),
            }
            for n, (kind, make) in enumerate(kinds.items()):
                infos = await self.write(redis, f"mem{n}", make, self.options.conversations)
                self.memory[kind] = await self.bytes_of(redis, f"mem{n}", infos)
            for length in (50, 200):
                user = f"q{length}"
                infos = await self.write(
                    redis,
                    user,
                    lambda length=length: titles.of_words(length),
                    self.options.query_conversations,
                )
                await self.write_v1(redis, user, infos)
                await self.time_queries(redis, user, infos, titles.rng)
            return self.table(load, os.getloadavg()[0], str(info.get("redis_version"))), []
        finally:
            await redis.aclose()

    async def write(
        self, redis: aioredis.Redis, user: str, make: Any, n: int
    ) -> list[AppConversationInfo]:
        """`n` conversations of `user` titled by `make()`, through the store's create script."""
        store = ConversationStore(redis)
        infos = []
        for i in range(n):
            info = AppConversationInfo(
                id=uuid.uuid4().hex,
                created_by_user_id=user,
                sandbox_id=f"s-{user}",
                title=make(),
                created_at=START + timedelta(seconds=i),
            )
            await store.create(info)
            infos.append(info)
        return infos

    async def write_v1(
        self, redis: aioredis.Redis, user: str, infos: list[AppConversationInfo]
    ) -> None:
        """The same titles as `conversation-indexes-v1` indexed them: a set per trigram (its
        UTF-8 bytes in the key) and its titles hash."""
        prefix = keyspace.user_title_trigrams_v1(user)
        for start in range(0, len(infos), 100):
            async with redis.pipeline(transaction=False) as pipe:
                for info in infos[start : start + 100]:
                    title, _ = indexed_title(info)
                    pipe.hset(keyspace.user_conversation_titles_v1(user), info.id, title)
                    for gram in trigrams(title):
                        pipe.sadd(prefix + gram, info.id)
                await pipe.execute()

    async def bytes_of(
        self, redis: aioredis.Redis, user: str, infos: list[AppConversationInfo]
    ) -> dict[str, float]:
        """Bytes and keys of the user's index a conversation, this version's and v1's."""
        await self.write_v1(redis, user, infos)
        n = len(infos)
        v2 = [keyspace.user_conversation_titles(user), keyspace.user_cut_titles(user)]
        v1 = [keyspace.user_conversation_titles_v1(user), keyspace.user_cut_titles(user)]
        v2 += [text(k) async for k in redis.scan_iter(keyspace.user_title_buckets(user) + "*")]
        v1 += [text(k) async for k in redis.scan_iter(keyspace.user_title_trigrams_v1(user) + "*")]
        memberships = sum(len({bucket(g) for g in trigrams(indexed_title(i)[0])}) for i in infos)
        record = await _usage(redis, [keyspace.conversation(i.id) for i in infos])
        return {
            "bytes": await _usage(redis, v2) / n,
            "keys": len(v2) - 2,
            "v1_bytes": await _usage(redis, v1) / n,
            "v1_keys": len(v1) - 2,
            "memberships": memberships / n,
            "record": record / n,
        }

    async def time_queries(
        self,
        redis: aioredis.Redis,
        user: str,
        infos: list[AppConversationInfo],
        rng: random.Random,
    ) -> None:
        """Each query: the titles holding it, its bucket's size, the candidates kept, and the
        time of this version's read and v1's."""
        lowered = [indexed_title(i)[0] for i in infos]
        held = Counter(g for title in lowered for g in trigrams(title))
        ranked = [g for g, _ in held.most_common()]
        picks = [ranked[r] for r in (0, 9, 99, 999) if r < len(ranked)]
        picks += rng.sample([g for g, c in held.items() if c == 1], 3)
        while len(picks) < len(ranked) and len(picks) < 10:
            gram = "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
            if gram not in held:
                picks.append(gram)
        indexes = ConversationIndexes(redis)
        cut = keyspace.user_cut_titles(user)
        await _rewrite_done(redis)
        for gram in picks:
            kept = await indexes.title_candidates(user, gram) or []
            size = int(await redis.scard(keyspace.user_title_buckets(user) + bucket(gram)))
            # Interleaved halves, so that what Redis does in the background (the AOF's rewrite
            # after the writes) falls on both reads alike.
            v2_server = v1_server = 0.0
            for _ in range(2):
                await redis.config_resetstat()
                for _ in range(self.options.repeat // 2):
                    started = time.perf_counter()
                    await indexes.title_candidates(user, gram)
                    self.samples.add(f"{user}.{gram}.v2", time.perf_counter() - started)
                v2_server += await _server_usec(redis, ("sinter", "smembers", "hmget"))
                await redis.config_resetstat()
                for _ in range(self.options.repeat // 2):
                    started = time.perf_counter()
                    async with redis.pipeline(transaction=False) as pipe:
                        pipe.sinter([keyspace.user_title_trigrams_v1(user) + gram])
                        pipe.smembers(cut)
                        await pipe.execute()
                    self.samples.add(f"{user}.{gram}.v1", time.perf_counter() - started)
                v1_server += await _server_usec(redis, ("sinter", "smembers"))
            self.queries.append(
                {
                    "user": user,
                    "query": gram,
                    "holding": held.get(gram, 0),
                    "bucket": size,
                    "kept": len(kept),
                    "v2_p50": self.samples.p(f"{user}.{gram}.v2", 50),
                    "v2_p99": self.samples.p(f"{user}.{gram}.v2", 99),
                    "v2_server": v2_server / (self.options.repeat // 2 * 2),
                    "v1_p50": self.samples.p(f"{user}.{gram}.v1", 50),
                    "v1_p99": self.samples.p(f"{user}.{gram}.v1", 99),
                    "v1_server": v1_server / (self.options.repeat // 2 * 2),
                }
            )

    def table(self, load: float, end: float, version: str) -> list[str]:
        lines = [
            f"Redis {version}; load avg {load:.2f} at the start, {end:.2f} at the end",
            f"memory, {self.options.conversations} conversations of one user a kind "
            "(bytes a conversation; keys of the user's index)",
            f"{'titles':<28}{'buckets (now)':>16}{'keys':>7}{'a key per trigram (v1)':>24}"
            f"{'keys':>8}{'memberships':>13}{'record':>8}",
        ]
        for kind, m in self.memory.items():
            lines.append(
                f"{kind:<28}{m['bytes']:>16,.0f}{m['keys']:>7,.0f}{m['v1_bytes']:>24,.0f}"
                f"{m['v1_keys']:>8,.0f}{m['memberships']:>13,.1f}{m['record']:>8,.0f}"
            )
        lines += [
            "",
            f"3-character queries, {self.options.query_conversations} conversations of one user "
            f"(titles of words); candidates' read p50 / p99 ms, {self.options.repeat} calls",
            "(then Redis's own time a call, ms: INFO commandstats)",
            f"{'titles':<8}{'query':<8}{'holding':>9}{'bucket':>8}{'kept':>6}"
            f"{'buckets (now)':>22}{'v1 (SINTER+SMEMBERS)':>24}",
        ]
        for q in self.queries:
            now = f"{ms(q['v2_p50'])} / {ms(q['v2_p99'])}, {q['v2_server'] / 1000:.2f}"
            before = f"{ms(q['v1_p50'])} / {ms(q['v1_p99'])}, {q['v1_server'] / 1000:.2f}"
            lines.append(
                f"{q['user']:<8}{q['query']!r:<8}{q['holding']:>9}{q['bucket']:>8}{q['kept']:>6}"
                f"{now:>22}{before:>24}"
            )
        return lines

    def remove_everything(self) -> int:
        return 0  # nothing outside the private redis-server

    def close(self) -> None:
        pass

    def results(self) -> Any:
        return {"memory": self.memory, "queries": self.queries}


async def _rewrite_done(redis: aioredis.Redis) -> None:
    """Wait for the AOF rewrite the writes set off (a fork, whose copy-on-write slows Redis)."""
    for _ in range(600):
        if not int((await redis.info("persistence"))["aof_rewrite_in_progress"]):
            return
        await asyncio.sleep(0.5)


async def _server_usec(redis: aioredis.Redis, commands: tuple[str, ...]) -> float:
    """Microseconds Redis spent in these commands since the last CONFIG RESETSTAT."""
    stats = await redis.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in commands))


async def _usage(redis: aioredis.Redis, keys: list[str]) -> int:
    total = 0
    for start in range(0, len(keys), 500):
        async with redis.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 500]:
                pipe.memory_usage(key, samples=0)
            total += sum(int(u or 0) for u in await pipe.execute())
    return total


main = main_of(parse, lambda options, tmp, url: TitleIndexBench(options, url), "acs-bench-tri-")

if __name__ == "__main__":
    raise SystemExit(main(None))
