"""The audit log: what writing an entry adds to a state-changing request, what searching a
million entries costs, and what an entry takes in Redis.

Run with `.venv/bin/python -m bench.audit_log [--quick] [--entries N]`. bench/README.md says
what is measured. Targets (issue 29):

- the audit write adds at most 0.3 ms p50 to a state-changing request: the same request on two
  apps over one Redis, one with the audit middleware and one without it (so no store adds an
  entry), alternating in the same run, timed inside the server; beside them the floor, a third
  app whose writer stores the same entry's fields with one bare XADD in the action's MULTI (no
  indexes, no script: the least that keeps the entry in the action's transaction, FloorLog);
- a search over 1,000,000 entries answers in at most 100 ms p95, for a one-day window and for
  one user (client round trip over HTTP on loopback).

Exit status: 0 when the table was printed (a missed target is marked in it), 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from bench.common import BenchError, Samples, main_of, ms, serve, served_config
from controlplane import keys
from controlplane.audit.middleware import audit_middleware
from controlplane.auth.service import ApiKeyService
from controlplane.store import keyspace
from controlplane.store.audit import AuditLog, index_keys, new_id
from controlplane.store.audit_event import AuditRecord
from controlplane.store.audit_index import AuditIndexer
from controlplane.store.streams import StreamAdd, StreamEntry, lex_member

WRITE_TARGET = 0.0003
SEARCH_TARGET = 0.100
DAY_MS = 86_400_000
SPAN_DAYS = 30
ORGS = 20
USERS = 2_000
SANDBOXES = 50_000
ACTIONS = (
    ("sandbox.create", "sandbox_id"),
    ("sandbox.pause", "sandbox_id"),
    ("sandbox.resume", "sandbox_id"),
    ("sandbox.delete", "sandbox_id"),
    ("conversation.start", "task_id"),
    ("conversation.message", "conversation_id"),
    ("settings.update", None),
    ("key.create", "key_id"),
    ("auth.sign_in", None),
)
FLOOR_STREAM = "bench:audit-floor"
WRITES = ("with", "floor", "without")
AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0"


@dataclass
class Options:
    quick: bool
    entries: int
    requests: int
    searches: int
    json_path: Path | None


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 entries, fewer requests")
    parser.add_argument("--entries", type=int, default=None, help="entries to search (1,000,000)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args(argv)
    entries = args.entries or (100_000 if args.quick else 1_000_000)
    return Options(
        quick=args.quick,
        entries=entries,
        requests=500 if args.quick else 2_000,
        searches=100 if args.quick else 300,
        json_path=args.json_path,
    )


class AuditBench:
    def __init__(self, options: Options, tmp: Path, redis_url: str) -> None:
        self.options = options
        self.tmp = tmp
        self.redis_url = redis_url
        self.notes: list[str] = []
        self.samples = Samples()
        self.summary: dict[str, Any] = {}
        self.redis: aioredis.Redis | None = None

    async def measure(self) -> tuple[list[str], list[str]]:
        config = served_config(
            self.redis_url,
            self.tmp,
            audit_retention=(SPAN_DAYS + 10) * 86400,
        )
        async with (
            # Without the audit middleware no request has an audit scope, so no store adds an
            # entry: the service as it was before the audit log.
            serve(config, self.samples, with_sandboxes=False) as audited,
            serve(config, self.samples, with_sandboxes=False, without=[audit_middleware]) as plain,
            serve(config, self.samples, with_sandboxes=False, on_startup=_floor) as floor,
            aiohttp.ClientSession() as http,
        ):
            redis = audited.app[keys.REDIS]
            admin = {"X-Session-API-Key": (await _admin_key(redis))}
            urls = {"with": audited.url, "floor": floor.url, "without": plain.url}
            await self._writes(http, admin, urls)
            await self._check_floor(redis)
            await self._indexer(redis, audited.app[keys.AUDIT_LOG])
            await redis.flushdb()
            admin = {"X-Session-API-Key": (await _admin_key(redis))}
            await self._load(redis, audited.app[keys.AUDIT_LOG])
            self.redis = redis
            await self._searches(http, admin, audited.url)
        return self._table()

    async def _writes(
        self, http: aiohttp.ClientSession, admin: dict[str, str], urls: dict[str, str]
    ) -> None:
        """PUT /api/organizations/eng/members/{user}: one transaction (two HSETs) and, with the
        audit log, its entry in the same MULTI (the floor: its fields' one XADD there). The
        three apps take turns request by request, which goes first rotating."""
        org = {"id": "eng", "name": "Eng", "owner": "olivia"}
        async with http.post(urls["with"] + "/api/organizations", headers=admin, json=org) as resp:
            if resp.status != 201:
                raise BenchError(f"organization: {resp.status} {await resp.text()}")
        route = "server:PUT /api/organizations/{org_id}/members/{user_id}"
        warm = 100
        for i in range(warm + self.options.requests):
            turn = i % len(WRITES)
            for kind in WRITES[turn:] + WRITES[:turn]:
                path = f"/api/organizations/eng/members/u{i % 50}"
                role = "admin" if i % 3 == 0 else "member"
                async with http.put(urls[kind] + path, headers=admin, json={"role": role}) as resp:
                    if resp.status != 200:
                        raise BenchError(f"PUT member: {resp.status} {await resp.text()}")
                timed = self.samples.values[route].pop()
                if i >= warm:
                    self.samples.add(f"write.{kind}", timed)

    async def _check_floor(self, redis: aioredis.Redis) -> None:
        """The floor app stored one entry per PUT in its stream, and no index: else it measured
        something else."""
        stored = int(await redis.xlen(FLOOR_STREAM))
        expected = 100 + self.options.requests
        if stored != expected:
            raise BenchError(f"the floor stored {stored} entries for {expected} requests")
        last: Any = await redis.xrevrange(FLOOR_STREAM, count=1)
        if last[0][1].get(b"action") != b"member.set":
            raise BenchError(f"the floor's entry is not the request's: {last[0][1]!r}")

    async def _indexer(self, redis: aioredis.Redis, log: AuditLog) -> None:
        """What indexing costs, off the request path (store/audit_index.py): the entries the
        writes made, their indexes and the watermark deleted, indexed again, timed until the
        watermark is at the newest (whichever indexer, this one or an app's, did a batch)."""
        entries = int(await redis.xlen(keyspace.AUDIT))
        indexes = [k async for k in redis.scan_iter(match=f"{keyspace.AUDIT}:*")]
        await redis.delete(*indexes)
        started = time.perf_counter()
        await AuditIndexer(redis, retention=log.retention_ms / 1000).catch_up()
        elapsed = time.perf_counter() - started
        newest: Any = await redis.xrevrange(keyspace.AUDIT, count=1)
        if await redis.get(keyspace.AUDIT_INDEXED) != newest[0][0]:
            raise BenchError("the indexer stopped before the newest entry")
        self.summary |= {
            "indexer_entries": entries,
            "indexer_us_per_entry": elapsed / entries * 1e6,
        }

    async def _load(self, redis: aioredis.Redis, log: AuditLog) -> None:
        """`entries` entries over the last SPAN_DAYS days, as the writer and the indexer store
        them (AuditLog.adds, audit.index_keys; at stream ids spread over that time, all of them
        indexed: the watermark at the newest), sent with `redis-cli --pipe` (a Python client's
        per-command cost would make the load take most of the run); the memory they take is
        INFO's used_memory after less before."""
        n = self.options.entries
        rng = random.Random(20261128)
        before = int((await redis.info("memory"))["used_memory"])
        now_ms = int(time.time() * 1000)
        start_ms = now_ms - SPAN_DAYS * DAY_MS
        step = (now_ms - start_ms) / n
        started = time.perf_counter()
        socket_path = self.redis_url.removeprefix("unix://")
        batch = 50_000
        for first in range(0, n, batch):
            commands = bytearray()
            for i in range(first, min(first + batch, n)):
                t = start_ms + int(i * step)
                record = _record(rng, t)
                for add in log.adds(record):
                    commands += _resp(("XADD", add.key, f"{t}-0", *add.fields))
                streams, sorted_sets = index_keys(record)
                for key in streams:
                    commands += _resp(("XADD", key, f"{t}-0", "r", ""))
                for key in sorted_sets:
                    commands += _resp(("ZADD", key, "0", lex_member(f"{t}-0")))
                if i == n - 1:
                    for key in streams + sorted_sets:
                        commands += _resp(("PEXPIRE", key, str(log.retention_ms)))
                    commands += _resp(("SET", keyspace.AUDIT_INDEXED, f"{t}-0"))
            done = await asyncio.to_thread(
                subprocess.run,
                ["redis-cli", "-s", socket_path, "--pipe"],
                input=bytes(commands),
                capture_output=True,
                check=False,
            )
            if done.returncode != 0 or b"errors: 0," not in done.stdout:
                raise BenchError(f"loading: {done.stdout[-300:]!r} {done.stderr[-300:]!r}")
        self.samples.add("load.seconds", time.perf_counter() - started)
        after = int((await redis.info("memory"))["used_memory"])
        main = int(await redis.memory_usage(keyspace.AUDIT, samples=0) or 0)
        self.summary |= {
            "entries": n,
            "bytes_per_entry": (after - before) / n,
            "log_bytes_per_entry": main / n,
            "used_memory_mib": after / 2**20,
        }

    async def _searches(self, http: aiohttp.ClientSession, admin: dict[str, str], url: str) -> None:
        rng = random.Random(7)
        now = time.time()
        cases: list[tuple[str, dict[str, str]]] = []
        for _ in range(self.options.searches):
            day_start = now - rng.uniform(1, SPAN_DAYS - 1) * 86400
            window = {
                "since": datetime.fromtimestamp(day_start, UTC).isoformat(),
                "until": datetime.fromtimestamp(day_start + 86400, UTC).isoformat(),
            }
            cases.append(("day", window))
            cases.append(("day_org", window | {"org_id": f"org{rng.randrange(ORGS)}"}))
            cases.append(("user", {"user_id": f"user{rng.randrange(USERS)}"}))
            cases.append(("user_day", window | {"user_id": f"user{rng.randrange(USERS)}"}))
        for name, params in cases[:40]:  # warm-up
            await self._search(http, admin, url, name, params, record=False)
        for name, params in cases:
            await self._search(http, admin, url, name, params, record=True)

    async def _search(
        self,
        http: aiohttp.ClientSession,
        admin: dict[str, str],
        url: str,
        name: str,
        params: dict[str, str],
        *,
        record: bool,
    ) -> None:
        started = time.perf_counter()
        async with http.get(url + "/api/v1/audit-events/search", headers=admin,
                            params=params | {"limit": "100"}) as resp:  # fmt: skip
            body = await resp.json()
            if resp.status != 200:
                raise BenchError(f"search {params}: {resp.status} {body}")
        elapsed = time.perf_counter() - started
        server = self.samples.values["server:GET /api/v1/audit-events/search"].pop()
        raw = await self._raw(name, params)
        if record:
            self.samples.add(f"search.{name}", elapsed)
            self.samples.add(f"server.{name}", server)
            self.samples.add(f"raw.{name}", raw)
            self.samples.add(f"found.{name}", len(body["items"]))
            if name.startswith("day") and len(body["items"]) < 100:
                self.notes.append(f"a {name} search found {len(body['items'])} < 100 entries")

    async def _raw(self, name: str, params: dict[str, str]) -> float:
        """The Redis work of the same search, timed from this client: the index's newest 100
        ids in the window (XREVRANGE), then the entries (one pipeline of XRANGEs) unless the
        index is the log itself."""
        if "user_id" in params:
            index = keyspace.audit_user(params["user_id"])
        elif "org_id" in params:
            index = keyspace.audit_org(params["org_id"])
        else:
            index = keyspace.AUDIT
        low, high = "-", "+"
        if "since" in params:
            low = f"{int(datetime.fromisoformat(params['since']).timestamp() * 1000)}-0"
            high = f"({int(datetime.fromisoformat(params['until']).timestamp() * 1000)}-0"
        redis = self.redis
        assert redis is not None
        started = time.perf_counter()
        ids: Any = await redis.xrevrange(index, high, low, count=100)
        if index != keyspace.AUDIT and ids:
            async with redis.pipeline(transaction=False) as pipe:
                for stream_id, _ in ids:
                    pipe.xrange(keyspace.AUDIT, stream_id, stream_id, count=1)
                await pipe.execute()
        return time.perf_counter() - started

    def _table(self) -> tuple[list[str], list[str]]:
        s = self.samples
        missed: list[str] = []
        added = s.p("write.with", 50) - s.p("write.without", 50)
        lines = [
            "write: PUT /api/organizations/eng/members/{user}, "
            f"{s.count('write.with')} of each kind, taking turns, server time; floor: the same "
            "entry's fields, one XADD in the MULTI, no index, no script",
            "| measure | without audit | floor | with audit | floor adds | audit adds "
            "| audit / floor (added) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for q in (50, 95):
            without = s.p("write.without", q)
            floor_added = s.p("write.floor", q) - without
            ours_added = s.p("write.with", q) - without
            ratio = ours_added / floor_added if floor_added > 0 else float("nan")
            lines.append(
                f"| p{q} (ms) | {ms(without)} | {ms(s.p('write.floor', q))} "
                f"| {ms(s.p('write.with', q))} | {floor_added * 1000:.3f} "
                f"| {ours_added * 1000:.3f} | {ratio:.2f} |"
            )
            self.summary |= {
                f"write_floor_added_p{q}_ms": floor_added * 1000,
                f"write_added_p{q}_ms": ours_added * 1000,
            }
        lines += [
            f"indexer (off the request path): {self.summary['indexer_us_per_entry']:.0f} us per "
            f"entry, {self.summary['indexer_entries']} entries indexed from scratch",
            "",
            f"search over {self.options.entries:,} entries ({SPAN_DAYS} days, {ORGS} "
            f"organizations, {USERS:,} users), limit 100, client round trip, deployment admin",
            "| query | p50 (ms) | p95 (ms) | in the server p50 / p95 | raw Redis p50 / p95 "
            "| server / raw p50 | entries found p50 |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, label in (
            ("day", "one-day window"),
            ("day_org", "one-day window, one organization"),
            ("user", "one user"),
            ("user_day", "one user, one-day window"),
        ):
            lines.append(
                f"| {label} | {ms(s.p(f'search.{name}', 50))} | {ms(s.p(f'search.{name}', 95))} "
                f"| {ms(s.p(f'server.{name}', 50))} / {ms(s.p(f'server.{name}', 95))} "
                f"| {ms(s.p(f'raw.{name}', 50))} / {ms(s.p(f'raw.{name}', 95))} "
                f"| {s.p(f'server.{name}', 50) / s.p(f'raw.{name}', 50):.1f} "
                f"| {s.p(f'found.{name}', 50):.0f} |"
            )
            if s.p(f"search.{name}", 95) > SEARCH_TARGET:
                missed.append(f"search {label} p95 {ms(s.p(f'search.{name}', 95))} ms > 100 ms")
        lines += [
            "",
            f"Redis: {self.summary['bytes_per_entry']:.0f} bytes per entry with its indexes "
            f"({self.summary['log_bytes_per_entry']:.0f} in the log stream itself), "
            f"used_memory {self.summary['used_memory_mib']:.0f} MiB; loaded in "
            f"{s.p('load.seconds', 50):.0f} s",
        ]
        if added > WRITE_TARGET:
            missed.append(f"audit write adds {added * 1000:.3f} ms p50 > 0.3 ms")
        self.summary |= {
            "search_day_p95_ms": s.p("search.day", 95) * 1000,
            "search_user_p95_ms": s.p("search.user", 95) * 1000,
        }
        return lines, missed

    def remove_everything(self) -> int:
        return 0

    def close(self) -> None:
        return None

    def results(self) -> Any:
        return {"summary": self.summary, "samples": self.samples.values}


async def _admin_key(redis: aioredis.Redis) -> str:
    return (await ApiKeyService(redis, None).create("bench-admin", admin=True)).key


class FloorLog(AuditLog):
    """The floor of the audit write: the request's entry, made as the service makes it (the
    same scope, redaction and fields), stored by one bare XADD to one stream trimmed by age, in
    the action's own MULTI (StreamEntry.queue), with no index and no script. Anything cheaper
    would not keep the entry in the action's transaction (bench/README.md)."""

    def __init__(self, writer: AuditLog) -> None:
        """The same Redis, retention and redaction (secrets) as `writer`."""
        vars(self).update(vars(writer))

    def entry(self, record: AuditRecord) -> StreamEntry:
        add = StreamAdd(FLOOR_STREAM, record.fields(), minid=record.time_ms - self.retention_ms)
        return StreamEntry(((add,),))


def _floor(app: web.Application) -> None:
    """The app's writer replaced by its floor (same Redis, retention and secrets)."""
    app[keys.AUDIT_LOG] = FloorLog(app[keys.AUDIT_LOG])


def _resp(parts: tuple[str, ...]) -> bytes:
    """One command in the Redis protocol."""
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        raw = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _record(rng: random.Random, t: int) -> AuditRecord:
    """An entry like the service writes: a user of an organization acting on one target."""
    user = rng.randrange(USERS)
    action, target = ACTIONS[rng.randrange(len(ACTIONS))]
    targets = {target: f"{rng.randrange(SANDBOXES):032x}"} if target else {}
    return AuditRecord(
        id=new_id(t),
        time_ms=t,
        action=action,
        outcome="success" if rng.random() < 0.97 else "failure",
        user_id=f"user{user}",
        key_id=f"{user:012x}",
        via="api_key",
        admin=False,
        org_id=f"org{user % ORGS}",
        role="member",
        targets=targets,
        ip=f"10.{user % 256}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
        user_agent=AGENT,
        request_id=f"{rng.getrandbits(64):016x}",
    )


main = main_of(parse, AuditBench, "acs-bench-audit-")

if __name__ == "__main__":
    raise SystemExit(main(None))
