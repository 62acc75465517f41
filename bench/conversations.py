"""Conversation benchmark: time to READY, and event fan-out from webhook to a live WebSocket.

Run with `.venv/bin/python -m bench.conversations [--runs N | --quick]`.
bench/README.md says what is measured and how the control plane's share is computed.

One process holds the control plane: a private redis-server, the real app served over real HTTP
on 127.0.0.1 (sandboxes post their webhooks to its listener on their network's gateway), a
scripted fake LLM on that gateway (a host port the sandboxes may reach) that answers every call
with a `finish` tool call, and the benchmark's own clients. The fan-out load (webhook poster and
WebSocket reader) runs in a child process, so that its CPU work does not share the server's event
loop. Every container, volume and network carries the run's prefix and is removed at the end,
also after an error, Ctrl-C or SIGTERM.

Exit status: 0 when the table was printed (missed targets are marked in it), 1 on an error,
130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import Any

from bench.common import Samples, main_of, ms
from bench.conversation_harness import (
    EXISTING_SEGMENTS,
    NEW_SEGMENTS,
    START_ROUTE,
    TARGET_FANOUT_P95_S,
    TARGET_READY_NEW_S,
    TASKS_ROUTE,
    Bench,
    Options,
    fanout_client_main,
)


class ConversationBench(Bench):
    async def measure(self) -> tuple[list[str], list[str]]:
        try:
            print(self.raw.environment(), flush=True)
            print(f"prefix {self.prefix}", file=sys.stderr)
            await self.run()
            lines, missed = table(self)
            return [*lines, "", *share_lines(self.samples), "", *detail_lines(self)], missed
        finally:
            await self.redis.aclose()


# -- report --------------------------------------------------------------------------------------


def rate(result: dict[str, Any]) -> tuple[float, float]:
    """(events/s posted, events/s delivered): from the first send to the last answer / event."""
    n = len(result["events"])
    posted = (result["last_response"] - result["first_send"]) / 1e9
    delivered = (result["last_receive"] - result["first_send"]) / 1e9
    return n / posted if posted > 0 else math.nan, n / delivered if delivered > 0 else math.nan


def table(bench: Bench) -> tuple[list[str], list[str]]:
    s = bench.samples
    missed: list[str] = []
    header = ("measure", "p50", "p95", "p99", "n", "target", "ok?")
    rows: list[tuple[str, ...]] = []

    def row(label: str, name: str, target: tuple[str, int, float] | None = None) -> None:
        """target: (shown as, percentile, limit in seconds); the value must be below it."""
        values = s.values.get(name, [])
        shown, ok = "(info)", "-"
        if target is not None:
            shown, q, limit = target
            value = s.p(name, q)
            ok = "yes" if value < limit else "NO"
            if ok == "NO":
                missed.append(f"{label.strip()}: p{q} {ms(value)} ms, target {shown}")
        p99 = ms(s.p(name, 99)) if len(values) >= 100 else "-"
        rows.append((label, ms(s.p(name, 50)), ms(s.p(name, 95)), p99, str(len(values)), shown, ok))

    row(
        "READY, new sandbox (POST -> client sees READY)",
        "new.ready",
        ("p50 < 2000 ms", 50, TARGET_READY_NEW_S),
    )
    row("  raw: create+start+/health+agent POST", "raw_new.ready")
    row("  control plane's own time", "new.cp_own")
    row("READY, existing RUNNING sandbox", "existing.ready")
    row("  raw: agent POST /api/conversations", "raw_existing.agent")
    row("  control plane's own time", "existing.cp_own")
    row(
        "fan-out, 1 event/request (send -> socket)",
        "single.latency",
        ("p95 < 50 ms", 95, TARGET_FANOUT_P95_S),
    )
    row(f"fan-out, {bench.opt.batch_size} events/request", "burst.latency")
    row("webhook request, 1 event", "single.webhook")
    row(f"webhook request, {bench.opt.batch_size} events", "burst.webhook")
    for name in ("single", "burst"):
        result = bench.fanout.get(name)
        if result is None:
            continue
        posted, delivered = rate(result)
        per = "1 event" if name == "single" else f"{bench.opt.batch_size} events"
        n = str(len(result["events"]))
        rows.append(
            (
                f"throughput, {per}/request (events/s)",
                f"{delivered:,.0f}",
                "-",
                "-",
                n,
                "(info)",
                "-",
            )
        )
        rows.append(("  of which posted (events/s)", f"{posted:,.0f}", "-", "-", n, "(info)", "-"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: tuple[str, ...]) -> str:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:5], widths[1:5], strict=True)
        ]
        cells += [r[5].ljust(widths[5]), r[6].ljust(widths[6])]
        return " | ".join(cells).rstrip()

    lines = [fmt(header), "-+-".join("-" * w for w in widths), *(fmt(r) for r in rows)]
    lines.append("times in ms; throughput = events / (first send -> last event on the socket)")
    return lines, missed


def share_lines(s: Samples) -> list[str]:
    """The control plane's share of READY, stated plainly (p50 based)."""

    def p50(name: str) -> float:
        return s.p(name, 50)

    new_total = p50("new.ready")
    overshoot = max(0.0, p50("new.probe") - p50("raw_new.boot"))
    extra_docker = max(0.0, p50("new.docker") - p50("raw_new.docker"))
    own = p50("new.cp_own")
    ours = own + overshoot + extra_docker
    existing_total = p50("existing.ready")
    existing_own = p50("existing.cp_own")

    def both(name: str) -> str:
        return f"{ms(s.p(name, 50))} / {ms(s.p(name, 95))}"

    return [
        "sandbox start (p50 / p95, ms):",
        f"  task WAITING_FOR_SANDBOX -> sandbox RUNNING set   {both('new.sandbox_start')}",
        f"  raw: volume+create+start+inspect+first /health 200  {both('raw_new.start')}",
        "the control plane's share of READY (p50, ms):",
        f"  new sandbox: READY {ms(new_total)} = Docker calls {ms(p50('new.docker'))}"
        f" + agent boot as the HealthProbe sees it {ms(p50('new.probe'))}"
        f" + agent POST {ms(p50('new.agent'))} + client poll {ms(p50('new.notice'))}"
        f" + control plane's own {ms(own)}",
        f"    raw path: Docker calls {ms(p50('raw_new.docker'))}, boot to first /health 200 "
        f"(5 ms poll) {ms(p50('raw_new.boot'))}, agent POST {ms(p50('raw_new.agent'))}",
        f"    ours = own {ms(own)} + HealthProbe back-off beyond the raw boot {ms(overshoot)}"
        f" + extra Docker calls {ms(extra_docker)} = {ms(ours)} ms"
        f" = {ours / new_total:.0%} of READY",
        f"    cross-check: READY p50 - raw equivalent p50 = "
        f"{ms(new_total - p50('raw_new.ready'))} ms",
        f"  existing sandbox: READY {ms(existing_total)} = agent POST {ms(p50('existing.agent'))}"
        f" + client poll {ms(p50('existing.notice'))} + control plane's own {ms(existing_own)}"
        f" = {existing_own / existing_total:.0%} of READY"
        f" (raw agent POST {ms(p50('raw_existing.agent'))})",
    ]


def detail_lines(bench: Bench) -> list[str]:
    s = bench.samples
    out: list[str] = []
    for kind, segments in (("new", NEW_SEGMENTS), ("existing", EXISTING_SEGMENTS)):
        out.append(f"READY, {kind} sandbox, decomposed (ms, p50 / p95; server-side instants):")
        for label, _a, _b in segments:
            name = f"{kind}.seg.{label}"
            out.append(f"  {label:<50} {ms(s.p(name, 50)):>8} / {ms(s.p(name, 95)):>8}")
    out.append("fan-out, decomposed (ms, p50 / p95 per event):")
    for name in ("single", "burst"):
        parts = [
            ("send -> append answered in the webhook handler", "to_appended"),
            ("send -> the socket's XREAD returned it", "to_read"),
            ("XREAD returned -> client has the frame", "to_client"),
        ]
        out.append(f"  {name}:")
        for label, part in parts:
            key = f"{name}.{part}"
            out.append(f"    {label:<52} {ms(s.p(key, 50)):>8} / {ms(s.p(key, 95)):>8}")
    out.append("requests, client-observed / inside the server (p50, ms):")
    pairs = (
        ("POST /api/v1/app-conversations", "new.client_post", f"server:{START_ROUTE}"),
        ("GET .../start-tasks?ids=", "client.get_task", f"server:{TASKS_ROUTE}"),
        ("POST webhook, 1 event", "single.webhook", "single.server_webhook"),
        (f"POST webhook, {bench.opt.batch_size} events", "burst.webhook", "burst.server_webhook"),
    )
    for label, client, server in pairs:
        out.append(f"  {label:<50} {ms(s.p(client, 50)):>8} / {ms(s.p(server, 50)):>8}")
    return out


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="READY runs per case and path (20)")
    parser.add_argument("--quick", action="store_true", help="5 runs, 500 + 2,500 events")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded runs first (1)")
    parser.add_argument("--settle", type=float, default=0.2, help="pause between runs, s (0.2)")
    parser.add_argument("--events", type=int, default=2000, help="events, one per request (2000)")
    parser.add_argument("--batches", type=int, default=200, help="burst requests (200)")
    parser.add_argument("--batch-size", type=int, default=50, help="events per burst request (50)")
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    args = parser.parse_args(argv)
    runs = 5 if args.quick else args.runs
    events = 500 if args.quick else args.events
    batches = 50 if args.quick else args.batches
    if min(runs, events, batches, args.batch_size) < 1 or args.warmup < 0 or args.settle < 0:
        parser.error("--runs, --events, --batches, --batch-size must be >= 1")
    return Options(runs, args.warmup, args.settle, events, batches, args.batch_size, args.json)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:] == ["--fanout-client"]:
        return asyncio.run(fanout_client_main())
    return main_of(parse_args, ConversationBench, "acs-bench-conv-")(argv)


if __name__ == "__main__":
    sys.exit(main())
