"""The security tests' live control planes: the default configuration, no host port open to
sandboxes (the conversation tests' `live` opens the fake LLM's), spec files of the module's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from controlplane.config import ServiceConfig
from tests.support.live_server import LiveServer, LiveServerFactory, start_live_server
from tests.support.sandbox_helpers import spec_dir


@pytest.fixture
async def make_plain_live(
    test_prefix: str,
    make_config: Callable[..., ServiceConfig],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LiveServerFactory]:
    """`await make_plain_live(specs=None, **settings)`: the control plane over HTTP, its
    sandboxes under this test's prefix; `specs` (name -> YAML) stand beside the default spec,
    `settings` go to the configuration. Closed after the test."""
    servers: list[LiveServer] = []

    async def make(*, specs: dict[str, str] | None = None, **settings: Any) -> LiveServer:
        if specs is not None:
            settings["spec_dir"] = spec_dir(tmp_path_factory.mktemp("specs"), specs)
        server = await start_live_server(make_config(container_prefix=test_prefix, **settings))
        servers.append(server)
        return server

    yield make
    for server in reversed(servers):
        await server.close()
