"""Schemathesis over /api/openapi.json, every check on, against a live server with Docker on.

The live server (tests/support/live_server.py) is the app as `controlplane serve` runs it, sandboxes
included, so every route is reached for real: creating sandboxes and conversations (capped by a
quota of 2 and 1 running), the WebSocket handshake, the webhooks (which answer 401 without a
sandbox's key). A fixed seed makes the run repeatable; tests/api/fuzz/schemathesis.toml holds
the one per-operation allowance, the 413 of oversized bodies, and why.

The events WebSocket is left out: the fuzzer's HTTP client cannot speak WebSocket; after a 101 it
puts the upgraded connection back in its pool and its next request dies on it. Its 400, 401,
404, 422 and 101 are in tests/api/test_bad_input.py and tests/conversations/test_api.py.

The run fails on any 5xx, any status code or content type the document does not declare, any
schema-valid input refused, any schema-invalid input accepted.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import ServiceConfig
from tests.support.live_server import start_live_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sandbox_images")]

ST = Path(sys.executable).with_name("st")
CONFIG = Path(__file__).parent / "fuzz" / "schemathesis.toml"
SEED = 20261124
# Examples an operation: `make test` runs 10 (about 5,000 cases over the ~150 operations and the
# stateful phase; with snapshots on, positive cases take real snapshots and forks), `make
# test-deep` 50. At 20 (about 9,900 cases) this one test took 280 CPU-s of the suite's ~2,800
# with what it starts and was its longest, 12 min of one worker: docs/development.md, "The
# fuzzer". The least number of cases generated, an operation's worth.
QUICK_EXAMPLES, DEEP_EXAMPLES = 10, 50
MIN_CASES_PER_EXAMPLE = 100


# Its own server, snapshots on (the session's registry): the snapshot, fork and checkpoint
# routes are fuzzed as served, not as a 503 "not enabled".
@pytest.mark.usefixtures("base_images")
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    "examples",
    [
        pytest.param(QUICK_EXAMPLES, id="quick"),
        pytest.param(DEEP_EXAMPLES, id="deep", marks=pytest.mark.deep),
    ],
)
async def test_schemathesis_finds_no_5xx_and_nothing_undocumented(
    examples: int,
    *,
    make_config: Callable[..., ServiceConfig],
    test_prefix: str,
    user_headers: Callable[..., Awaitable[dict[str, str]]],
    snapshot_settings: dict[str, Any],
    tmp_path: Path,
) -> None:
    live = await start_live_server(
        make_config(
            container_prefix=test_prefix,
            max_sandboxes_per_user=2,
            max_running_per_user=1,
            unauthenticated_rate=0,
            **snapshot_settings,
        )
    )
    key = (await user_headers("fuzzer"))["X-Session-API-Key"]
    try:
        proc = await asyncio.create_subprocess_exec(
            str(ST),
            "--config-file",
            str(CONFIG),
            "run",
            f"{live.url}/api/openapi.json",
            "--header",
            f"X-Session-API-Key: {key}",
            "--checks",
            "all",
            "--seed",
            str(SEED),
            "--max-examples",
            str(examples),
            # One worker: hypothesis' lambda-source cache is not thread-safe on Python 3.11
            # ("AST constructor recursion depth mismatch" runtime errors with two).
            "--workers",
            "1",
            "--generation-database",
            "none",
            # stream-start answers when its start task ends: a sandbox boot on a busy host.
            "--request-timeout",
            "180",
            "--no-color",
            "--exclude-path",
            "/api/v1/events/socket",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=3540)
    finally:
        await live.close()
    report = out.decode(errors="replace")
    (tmp_path / "schemathesis.txt").write_text(report)
    if "FAILURES" in report:  # the failures and the summary, not the progress lines
        report = report[report.index("FAILURES") :]
    generated = re.search(r"(\d+) generated", report)
    assert generated is not None, report[-4000:]
    assert int(generated.group(1)) >= MIN_CASES_PER_EXAMPLE * examples, report[-4000:]
    assert proc.returncode == 0, report[-12000:]
    assert "Server error" not in report
    assert "Undocumented status code" not in report
