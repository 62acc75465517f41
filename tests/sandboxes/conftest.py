"""The sandbox tests' apps: a reconciler every second (the default sweeps every 10 s, and these
tests watch it act), and the spec files a module adds to the default spec.

A module that needs specs of its own says which with
`pytestmark = pytest.mark.sbx_specs({name: yaml, ...}, **settings)` and takes `sbx_with_specs`;
`sbx_factory` makes more apps where a test needs several or other settings.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sandbox_helpers import spec_dir
from tests.support.types import Client, ClientFactory

SBX_SPECS = "sbx_specs"


@pytest.fixture
def sbx_factory(
    make_sandbox_client: ClientFactory, tmp_path_factory: pytest.TempPathFactory
) -> ClientFactory:
    """`await sbx_factory(specs=None, **settings)`: a client of an app with sandboxes and a
    reconciler every second; `specs` (name -> YAML) stand beside the default spec, `settings` go
    to the configuration."""

    async def make(*, specs: dict[str, str] | None = None, **settings: Any) -> Client:
        if specs is not None:
            settings["spec_dir"] = spec_dir(tmp_path_factory.mktemp("specs"), specs)
        return await make_sandbox_client(**({"reconcile_interval": 1.0} | settings))

    return make


@pytest.fixture
async def sbx_with_specs(request: pytest.FixtureRequest, sbx_factory: ClientFactory) -> Client:
    """A client of the app the module's `sbx_specs` marker describes (see above)."""
    marker = request.node.get_closest_marker(SBX_SPECS)
    assert marker is not None, f"sbx_with_specs needs the module's {SBX_SPECS} marker"
    (specs,) = marker.args
    return await sbx_factory(specs=specs, **marker.kwargs)
