"""The Kubernetes driver reads as steps (docs/architecture.md, "Drivers"): a sandbox create,
followed from the route to the running pod, comes back to the driver class from its helper
modules a handful of times (each step handed to one part, which calls the others itself), not
at every turn.

Measured with sys.setprofile over POST /api/v1/sandboxes until the sandbox is RUNNING, on a warm
control plane whose reconciler does not sweep meanwhile: a call from the driver's code
(drivers/kubernetes/driver.py) into a helper module (any other module of drivers/) returns to
the driver once; a call from a helper into the driver's code (a callback) comes back to it too.
Before the driver was split into steps, one create came back 39 times (36 calls from 30 call
sites, 3 callbacks of the pod watch into the driver's wait); since, 11 times, none a callback.
"""

from __future__ import annotations

import collections
import dis
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.support.sandbox_helpers import REPO, start, wait_status
from tests.support.types import ClientFactory, UserHeaders

pytestmark = [pytest.mark.kube, pytest.mark.slow]

DRIVERS = REPO / "drivers"
DRIVER = str(DRIVERS / "kubernetes" / "driver.py")
BEFORE = 39
"""Returns to the driver in one create before it was split into steps (the same measurement)."""
RESUME = dis.opmap["RESUME"]


def _part(frame: FrameType) -> str | None:
    filename = frame.f_code.co_filename
    if filename == DRIVER:
        return "driver"
    return "helper" if filename.startswith(f"{DRIVERS}/") else None


def _where(frame: FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_qualname}"


async def test_a_create_comes_back_to_the_driver_at_most_half_as_often_as_before(
    make_client: ClientFactory, kube_overrides: dict[str, Any], user_headers: UserHeaders
) -> None:
    api = await make_client(with_sandboxes=True, reconcile_interval=3600, **kube_overrides)
    alice = await user_headers("alice")
    warm = (await start(api, alice))["id"]  # the pod watch, the network, the node reads
    await wait_status(api, alice, warm, "RUNNING", within=90)

    returns: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        code = frame.f_code.co_code
        if code[frame.f_lasti] != RESUME or code[frame.f_lasti + 1] != 0:
            return  # a coroutine resumed after an await (RESUME 1-3), not a call (RESUME 0)
        caller, callee = _part(frame.f_back), _part(frame)
        if {caller, callee} == {"driver", "helper"}:
            returns[f"{_where(frame.f_back)} -> {_where(frame)}"] += 1

    sys.setprofile(profile)
    try:
        sandbox_id = (await start(api, alice))["id"]
        await wait_status(api, alice, sandbox_id, "RUNNING", within=90)
    finally:
        sys.setprofile(None)

    seen = "\n".join(f"{n:3d} {where}" for where, n in sorted(returns.items()))
    assert returns, "the create went through no driver (is ACS_DRIVER kubernetes?)"
    assert sum(returns.values()) <= BEFORE // 2, seen
    callbacks = [where for where in returns if where.split(" -> ")[1].startswith("driver.py")]
    assert callbacks == [], seen  # no helper calls back into the driver
