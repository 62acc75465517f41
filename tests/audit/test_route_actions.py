"""Every route that changes state has its audit action (controlplane/audit/actions.py), or is
listed as not audited with the reason; the table names no route that does not exist."""

from __future__ import annotations

from controlplane.app import route_tables
from controlplane.audit.actions import (
    NOT_AUDITED,
    NOT_AUDITED_PREFIXES,
    ROUTE_ACTIONS,
    canonical,
)

READS = {"GET", "HEAD", "OPTIONS"}


def served(*, reads: bool = False) -> set[tuple[str, str]]:
    return {
        (ep.method, canonical(ep.path))
        for table in route_tables()
        for ep in table.endpoints
        if reads or ep.method not in READS
    }


def test_every_state_changing_route_has_an_action_or_a_reason() -> None:
    missing = {
        route
        for route in served()
        if route not in ROUTE_ACTIONS
        and route not in NOT_AUDITED
        and not route[1].startswith(NOT_AUDITED_PREFIXES)
    }
    assert not missing, f"routes without an audit action: {sorted(missing)}"


def test_the_table_names_only_served_routes() -> None:
    routes = served(reads=True)  # a read that signs in (the OpenID callback) has one too
    assert not set(ROUTE_ACTIONS) - routes, sorted(set(ROUTE_ACTIONS) - routes)
    assert not set(NOT_AUDITED) - routes, sorted(set(NOT_AUDITED) - routes)
    assert not set(ROUTE_ACTIONS) & set(NOT_AUDITED)


def test_canonical_paths_are_aiohttps() -> None:
    assert canonical("/api/v1/sandboxes/{sandbox_id:(?!search$)[^/]+}/pause") == (
        "/api/v1/sandboxes/{sandbox_id}/pause"
    )
    assert canonical("/sandboxes/{sandbox_id}/proxy/{port}/{path:.*}") == (
        "/sandboxes/{sandbox_id}/proxy/{port}/{path}"
    )
