"""Carrying a recorded start (STARTING) to a healthy agent server, or to ERROR with the reason.

A start is an intent recorded before anything is done (the STARTING record). Whoever holds it
carries it to completion: the launcher that was asked, riding out Redis and engine blips with
retries and backoff, or, when that launcher's process died, the reconciler of any replica, which
takes the start over once its lease lapses (leases.py). Taking over is safe at any point because
each attempt looks at the container first and continues from what it finds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time

import structlog

from controlplane.agent_protocol.kinds import STATE_DIR, agent_env
from controlplane.background import stop_task, stop_tasks
from controlplane.config import ServiceConfig
from controlplane.errors import RuntimeUnavailable, StoreUnavailable
from controlplane.lifecycle.models import LifecycleType
from controlplane.sandboxes.leases import IntentLeases
from controlplane.sandboxes.lifecycle import SandboxLifecycle, entry_of
from controlplane.sandboxes.models import SandboxRecord, SandboxStatus
from controlplane.sandboxes.readiness import ReadinessProbe, StartFailed
from controlplane.sandboxes.restores import Restores
from controlplane.sandboxes.start_gate import StartGate, Ticket
from controlplane.sandboxes.store import SandboxStore
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import AGENT_SERVER, SandboxSpec
from controlplane.store.redis import REDIS_DOWN
from drivers.base import NetworkPolicy, RunState, SandboxDriver, SandboxRequest, SandboxState
from drivers.egress import parse_egress
from drivers.errors import ContainerExists

log = structlog.get_logger(__name__)
S = SandboxStatus

ENGINE_BLIPS = (RuntimeUnavailable, ContainerExists, StoreUnavailable)
TRANSIENT = (*ENGINE_BLIPS, *REDIS_DOWN)
"""Faults of ours, of the engine's connection (or the snapshot store's) or a concurrent attempt,
not of the sandbox: the attempt is retried, looking at the container first."""
RETRY_FIRST, RETRY_MAX = 0.2, 5.0


class Mode(enum.Enum):
    FRESH = "fresh"  # a new sandbox: nothing exists yet
    CONVERGE = "converge"  # anything may exist: continue from what the container is
    REPLACE = "replace"  # a rewind: whatever exists is removed, workspace too, then re-made


def network_policy(spec: SandboxSpec) -> NetworkPolicy:
    """Where the spec's sandboxes may connect, in the driver's terms."""
    destinations = parse_egress(spec.egress)
    return NetworkPolicy(spec.id, None if destinations is None else tuple(destinations))


def sandbox_request(
    config: ServiceConfig,
    record: SandboxRecord,
    spec: SandboxSpec,
    webhook_base: str | None = None,
) -> SandboxRequest:
    """The sandbox the driver creates for a record: its spec's image, resources and isolation,
    the agent kind's environment, posting its webhooks to ACS_PUBLIC_URL or else to
    `webhook_base` (where the driver says its sandboxes reach the webhook listener)."""
    base = sandbox_base_url(config, webhook_base)
    env = agent_env(spec, max_body_bytes=config.max_body_bytes, webhooks=base is not None)
    env.update(spec.initial_env)
    env.update(
        {
            "OH_SESSION_API_KEYS_0": record.session_api_key,
            "ACS_SANDBOX_ID": record.id,
            "ACS_WORKSPACE": spec.working_dir,
        }
    )
    if base:
        env["OH_WEBHOOKS_0_BASE_URL"] = f"{base}/api/v1/webhooks/{record.id}"
    # The pages allowed to call the API may call the sandbox's agent server too (the web
    # frontend reads events and sends messages there directly).
    for n, origin in enumerate(config.cors_origins):
        env[f"OH_ALLOW_CORS_ORIGINS_{n}"] = origin
    return SandboxRequest(
        sandbox_id=record.id,
        owner=record.owner,
        spec_id=spec.id,
        image=spec.image,
        command=spec.command,
        env=env,
        working_dir=spec.working_dir,
        ports=sorted(set(spec.exposed_ports.values())),
        cpus=spec.resources.cpus,
        memory_bytes=spec.resources.memory_bytes,
        memory_reservation=spec.resources.reservation_bytes,
        pids=spec.resources.pids,
        network=network_policy(spec),
        user=spec.user,
        read_only=spec.read_only_root,
        tmpfs=spec.tmpfs_mounts,
        runtime=spec.runtime,
        kept_paths=(STATE_DIR,),
    )


def sandbox_base_url(config: ServiceConfig, webhook_base: str | None) -> str | None:
    """The control plane as sandboxes reach it (webhooks, the LLM gateway): ACS_PUBLIC_URL,
    else `webhook_base`, the webhook listener where the driver says its sandboxes reach it."""
    if config.public_url is not None:
        return config.public_url.rstrip("/")
    return webhook_base


def reached(spec: SandboxSpec, state: SandboxState) -> tuple[dict[str, int], str | None]:
    """The spec's named ports as the control plane reaches them (port by name) and the host
    they are on (one per sandbox; None when no port is reached yet)."""
    ports: dict[str, int] = {}
    host: str | None = None
    for name, port in spec.exposed_ports.items():
        endpoint = state.endpoints.get(port)
        if endpoint is not None:
            ports[name] = endpoint.port
            host = host or endpoint.host
    return ports, host


class Launcher:
    """The background work that brings a STARTING sandbox to RUNNING, or to ERROR."""

    def __init__(
        self,
        config: ServiceConfig,
        store: SandboxStore,
        *,
        driver: SandboxDriver,
        catalog: SpecCatalog,
        probe: ReadinessProbe,
        notes: SandboxLifecycle,
        leases: IntentLeases | None = None,
        webhooks: bool = False,
        restores: Restores | None = None,
        gate: StartGate | None = None,
    ) -> None:
        """`webhooks`: the driver gives sandboxes a webhook listener to reach (so our agent
        announces itself there), as ACS_PUBLIC_URL does. `gate`: how many boot at once here
        (none: no bound)."""
        self._config = config
        self._store = store
        self._driver = driver
        self._catalog = catalog
        self._probe = probe
        self._notes = notes
        self._leases = leases
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._webhooks = webhooks or config.public_url is not None
        self._restores = restores
        self.gate = gate or StartGate(None, None)

    def is_launching(self, sandbox_id: str) -> bool:
        return sandbox_id in self._tasks

    def launch(self, record: SandboxRecord, ticket: Ticket) -> None:
        """Create a new sandbox's workspace and container, in the background, at its turn
        (`ticket`: from the gate's `admit`, or `place` for a pool member)."""
        self._spawn(record, Mode.FRESH, automatic=False, ticket=ticket)

    def resume(self, record: SandboxRecord, ticket: Ticket) -> None:
        """Bring a sandbox whose record is now STARTING back up, on its kept workspace:
        unpause, start a stopped container, or re-create a vanished or dead one."""
        self._spawn(record, Mode.CONVERGE, automatic=False, ticket=ticket)

    def replace(self, record: SandboxRecord, ticket: Ticket) -> None:
        """Bring a sandbox whose record is now STARTING back up from its `origin` snapshot,
        its agent's state included (a conversation's rewind): its instance and workspace are
        removed first, at every attempt (a removal is idempotent), so that no attempt can
        continue on the files being replaced."""
        self._spawn(record, Mode.REPLACE, automatic=False, ticket=ticket)

    def take_over(self, record: SandboxRecord) -> None:
        """Finish a start whose launcher is gone (the caller holds its lease); never refused,
        it waits its turn among the user starts."""
        self._spawn(record, Mode.CONVERGE, automatic=True, ticket=self.gate.place(user=True))

    async def cancel(self, sandbox_id: str) -> None:
        """Stop the launch of this sandbox and wait until it has ended, with the effect of its
        engine call in progress (the caller, a delete, then removes what it made). Cancelled
        again only if it has not ended within a start's time-out."""
        task = self._tasks.get(sandbox_id)
        timeout = self._config.start_timeout
        await stop_task(task, grace=timeout, within=timeout + 10)

    async def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the launches in progress here to end."""
        tasks = list(self._tasks.values())
        if tasks and timeout > 0:
            await asyncio.wait(tasks, timeout=timeout)

    async def close(self) -> None:
        await stop_tasks(list(self._tasks.values()))

    def _spawn(self, record: SandboxRecord, mode: Mode, *, automatic: bool, ticket: Ticket) -> None:
        if self._leases is not None:
            self._leases.hold(record.id)  # held while it waits its turn too: not abandoned
        task = asyncio.create_task(
            self._carry(record, mode, automatic, ticket), name=f"launch-{record.id}"
        )
        self._tasks[record.id] = task
        task.add_done_callback(lambda t: self._done(record.id, t, ticket))

    def _done(self, sandbox_id: str, task: asyncio.Task[None], ticket: Ticket) -> None:
        ticket.release()  # a task cancelled before it ran never reached its own release
        if self._tasks.get(sandbox_id) is task:
            del self._tasks[sandbox_id]
        if not task.cancelled() and task.exception() is not None:  # retrieved: never unlogged
            log.error("launch_task_failed", sandbox_id=sandbox_id, error=str(task.exception()))

    async def _carry(
        self, record: SandboxRecord, mode: Mode, automatic: bool, ticket: Ticket
    ) -> None:
        """At its turn, attempt until RUNNING or a real failure; a blip only costs a retry."""
        try:
            async with self.gate.turn(ticket):
                await self._attempts(record, mode, automatic)
        finally:
            ticket.release()
            if self._leases is not None:
                await self._leases.release(record.id)

    async def _attempts(self, record: SandboxRecord, mode: Mode, automatic: bool) -> None:
        # The time-out counts from here: a start waiting for its turn is not failing.
        started = time.monotonic()
        new = mode == Mode.FRESH
        delay = RETRY_FIRST
        while True:
            try:
                await self._attempt(record, mode, automatic)
                return
            except asyncio.CancelledError:
                raise
            except TRANSIENT as exc:
                redis_down = not isinstance(exc, ENGINE_BLIPS)
                # The engine may stay away: give up after the start timeout. Without
                # Redis nothing could record the failure anyway, so wait for it.
                if not redis_down and time.monotonic() - started > self._config.start_timeout:
                    await self._fail(record, new, f"start failed: {exc}", automatic)
                    return
                log.warning("sandbox_start_retry", sandbox_id=record.id, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                # What the failed attempt left is unknown: look before acting (a
                # replacement removes it again).
                mode = Mode.REPLACE if mode == Mode.REPLACE else Mode.CONVERGE
            except Exception as exc:
                await self._fail(record, new, f"start failed: {exc}", automatic)
                return

    async def _attempt(self, record: SandboxRecord, mode: Mode, automatic: bool) -> None:
        spec = self._catalog.find(record.spec_id)
        if spec is None:
            raise StartFailed(f"sandbox spec {record.spec_id!r} no longer exists")
        began = time.monotonic()
        state = await self._bring_up(record, spec, mode)
        up = time.monotonic()
        ports, host = reached(spec, state)
        result = await self._store.transition(
            record, [S.STARTING], S.STARTING, ports=ports, host=host
        )
        if result.outcome != "ok":
            await self._abandon(record, result.outcome)
            return
        agent = state.endpoints.get(spec.exposed_ports[AGENT_SERVER])
        await self._probe.wait(record.id, agent, announced=self._announces(spec))
        log.info(
            "sandbox_launch_phases",
            sandbox_id=record.id,
            bring_up_s=round(up - began, 3),
            ready_s=round(time.monotonic() - up, 3),
        )
        reason = "start finished by the reconciler after an interruption" if automatic else None
        event = self._notes.pending(
            LifecycleType.SANDBOX_RUNNING, record, reason, automatic=automatic
        )
        result = await self._store.transition(
            record,
            [S.STARTING],
            S.RUNNING,
            ports=ports,
            host=host,
            touch=True,
            entry=entry_of(event),
        )
        if result.outcome == "ok":
            self._notes.done(event)
        else:
            await self._abandon(record, result.outcome)

    async def _abandon(self, record: SandboxRecord, outcome: str) -> None:
        """The record moved on without us (deleted, or another replica finished the start)."""
        if outcome == "missing":
            # Deleted while starting: the delete may have run before our sandbox existed.
            await self._driver.remove(record.id)

    async def _bring_up(self, record: SandboxRecord, spec: SandboxSpec, mode: Mode) -> SandboxState:
        if mode == Mode.FRESH:
            return await self._driver.create(await self._request(record, spec), new=True)
        if mode == Mode.REPLACE and self._driver.stage_reads_workspace:
            # The stage removes the old instance itself and reads its workspace (taking the
            # snapshot's files it still holds unchanged); the workspace goes whatever
            # happened, before anything is created in its place.
            request = await self._request(record, spec)
            try:
                await self._driver.stage(request)
            finally:
                await self._driver.remove(record.id)
            return await self._driver.create(request)
        if mode == Mode.REPLACE:
            # The old instance and workspace go while what the new workspace is made from
            # (the snapshot's files) is fetched and laid out; nothing is created in their
            # place before they are gone.
            request = await self._request(record, spec)
            removal = asyncio.ensure_future(self._driver.remove(record.id))
            try:
                await self._driver.stage(request)
            finally:
                await asyncio.gather(removal, return_exceptions=True)  # no orphan on a failure
            await removal  # its failure, if any, is the attempt's
            return await self._driver.create(request)
        state = await self._driver.inspect(record.id)
        if state is not None and state.status == RunState.PAUSED:
            await self._driver.unpause(record.id)
            state = await self._driver.inspect(record.id)
        if state is not None and state.status in (RunState.EXITED, RunState.CREATED):
            return await self._driver.start(await self._request(record, spec))
        if state is not None and state.status in (RunState.DEAD, RunState.REMOVING):
            await self._driver.remove(record.id, keep_workspace=True)
            state = None
        if state is None:
            return await self._driver.create(await self._request(record, spec))
        return state  # running or restarting: the readiness probe decides

    async def control_plane_url(self, spec: SandboxSpec) -> str | None:
        """What the sandboxes of `spec` call the control plane (sandbox_base_url); their network
        exists already when one of them runs, so the driver answers from what it knows."""
        if self._config.public_url is not None:
            return sandbox_base_url(self._config, None)
        return await self._driver.prepare_network(network_policy(spec))

    def _announces(self, spec: SandboxSpec) -> bool:
        """Our agent server posts `<webhook base>/ready` once it listens (agent/announce.py),
        when it has a webhook base: ACS_PUBLIC_URL or the listener the driver gives it."""
        return spec.agent_kind == "acs" and self._webhooks

    async def _request(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRequest:
        """The sandbox's request, its network made ready first (it tells where the sandbox
        reaches the webhook listener)."""
        base = await self._driver.prepare_network(network_policy(spec))
        self._webhooks = self._webhooks or base is not None
        request = sandbox_request(self._config, record, spec, base)
        if record.origin is not None:
            if self._restores is None:
                raise StartFailed("snapshots are not enabled (ACS_SNAPSHOT_STORE_URL is unset)")
            source = await self._restores.source(
                record.owner, record.origin, record.id, carried=record.carried
            )
            request = dataclasses.replace(request, restore=source)
        return request

    async def _fail(self, record: SandboxRecord, new: bool, reason: str, automatic: bool) -> None:
        """ERROR with the reason. A new sandbox leaves nothing behind; one that existed before
        keeps its workspace (and a container that exists), so resume can bring it back."""
        log.warning("sandbox_start_failed", sandbox_id=record.id, reason=reason)
        if new:
            try:
                await self._driver.remove(record.id)
            except Exception as exc:
                log.warning("sandbox_cleanup_failed", sandbox_id=record.id, error=str(exc))
        delay = RETRY_FIRST
        event = self._notes.pending(
            LifecycleType.SANDBOX_ERROR, record, reason, automatic=automatic
        )
        while True:
            try:
                result = await self._store.transition(
                    record,
                    [S.STARTING],
                    S.ERROR,
                    reason=reason,
                    entry=entry_of(event),
                )
                break
            except REDIS_DOWN as exc:  # the failure must be recorded: wait for Redis
                log.warning("sandbox_error_not_recorded", sandbox_id=record.id, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        if result.outcome == "ok":
            self._notes.done(event)
