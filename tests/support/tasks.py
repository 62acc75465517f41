"""Closing an app under test with a time limit that shows what it waits for."""

from __future__ import annotations

import asyncio
import io

import pytest

from tests.support.types import Client

CLOSE_SECONDS = 60.0


async def close_or_show_tasks(client: Client, within: float = CLOSE_SECONDS) -> None:
    """Close `client` and its app; if that takes longer than `within` seconds, fail with the
    stack of every asyncio task still running (pytest-timeout would show only threads)."""
    closing = asyncio.ensure_future(client.close())
    done, _ = await asyncio.wait({closing}, timeout=within)
    if done:
        closing.result()
        return
    report = io.StringIO()
    for task in asyncio.all_tasks():
        print(f"--- {task.get_name()}", file=report)
        task.print_stack(file=report)
    pytest.fail(f"the app did not close within {within:.0f} s; its tasks:\n{report.getvalue()}")
