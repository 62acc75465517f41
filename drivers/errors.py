"""Errors a sandbox runtime reports. drivers/ imports nothing of controlplane/, so the root of
every error reported on purpose lives here: controlplane/errors.py builds its own on it
(`ControlPlaneError` is `ServiceError`), one middleware renders both, and a caller's
`except ControlPlaneError` also catches a driver's."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """Root of every error reported on purpose: a stable `code`, the HTTP `status` it is
    rendered with, a readable message and context fields."""

    code = "error"
    status = 500

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        return self.message


class RuntimeUnavailable(ServiceError):
    """A dependency (the sandbox runtime, or Redis for the control plane) does not answer."""

    code = "runtime_unavailable"
    status = 503


class DriverError(ServiceError):
    """The runtime refused an operation (bad image, bad config, engine-side failure)."""

    code = "runtime_error"
    status = 502


class ImageMissing(DriverError):
    code = "image_missing"


class SandboxBusy(DriverError):
    """The runtime could not hold a sandbox still for now (Docker's freezer, stopped by processes
    waiting on I/O, after its retries): transient, retry later."""

    code = "sandbox_busy"
    status = 503


class ContainerExists(DriverError):
    """A container of that name exists already (made by a concurrent or earlier attempt)."""

    code = "container_exists"
    status = 409


class NetworkUnavailable(ServiceError):
    """A sandbox's network, or the rules that fence it, could not be put in place."""

    code = "sandbox_network_unavailable"
    status = 502


class FirewallRequired(ServiceError):
    """ACS_HOST_FIREWALL=on, and the host firewall (iptables, nftables) cannot be used here."""

    code = "host_firewall_unavailable"
    status = 500


class FilesTooLarge(DriverError):
    """A sandbox's changed files are over what one export may copy (nothing was copied)."""

    code = "snapshot_too_large"
    status = 413


class FilesTooDeep(DriverError):
    """A sandbox's directories nest deeper than an export walks (drivers/files_helper.py:
    MAX_DEPTH; nothing was copied)."""

    code = "snapshot_too_deep"
    status = 413
