"""Moves a start task WORKING → WAITING_FOR_SANDBOX → PREPARING_REPOSITORY →
STARTING_CONVERSATION → READY, or ERROR with a detail. Every step is saved before it runs."""

from __future__ import annotations

import asyncio
import secrets
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from controlplane.agent_protocol.client import AgentClient
from controlplane.agent_protocol.models import MetricsSnapshot
from controlplane.agent_protocol.start_request import start_conversation_request
from controlplane.auth.models import Principal
from controlplane.background import stop_tasks
from controlplane.config import ServiceConfig
from controlplane.conversations.models import (
    AppConversationInfo,
    AppConversationStartRequest,
    AppConversationStartTask,
    SendMessageRequest,
    StartTaskStatus,
    TextContent,
)
from controlplane.conversations.pending import PendingMessages, task_owner
from controlplane.conversations.store import ConversationIdTaken, ConversationStore
from controlplane.conversations.titles import placeholder
from controlplane.errors import ControlPlaneError, InvalidInput
from controlplane.gateway.agent_llm import agent_llm
from controlplane.gateway.credentials import SandboxTokens
from controlplane.lifecycle.models import LifecycleEvent, LifecycleType
from controlplane.lifecycle.publisher import LifecyclePublisher
from controlplane.organizations.service import OrganizationService
from controlplane.sandboxes.models import SandboxRecord
from controlplane.sandboxes.service import SandboxService
from controlplane.settings.models import ProviderType, UserRecord
from controlplane.settings.service import SettingsService
from controlplane.specs.catalog import SpecCatalog
from controlplane.specs.models import SandboxSpec
from controlplane.store.redis import REDIS_DOWN

log = structlog.get_logger(__name__)
T = StartTaskStatus

DEFAULT_HOSTS = {
    ProviderType.GITHUB: "github.com",
    ProviderType.GITLAB: "gitlab.com",
    ProviderType.BITBUCKET: "bitbucket.org",
    ProviderType.AZURE_DEVOPS: "dev.azure.com",
}
_TOKEN_USER = {
    ProviderType.GITHUB: "x-access-token",
    ProviderType.GITLAB: "oauth2",
    ProviderType.BITBUCKET: "x-token-auth",
}
DEFAULT_MAX_ITERATIONS = 100
LEASE_TTL = 20.0
"""A running task's lease is renewed every LEASE_TTL / 4 s (a Redis failover can hold a renewal
for its retry window, 10 s); a replica that dies loses it, and another carries the task on."""
RESUMED_KEY_ID = "start-task-resumed"
"""The key id of the principal a resumed task acts as (its owner, without an API key)."""


def suggested_message(request: AppConversationStartRequest) -> SendMessageRequest | None:
    """OpenHands' frontend sends a suggested task instead of a first message and lets the
    server write the prompt."""
    task = request.suggested_task
    if task is None:
        return None
    kind = task.task_type.replace("_", " ").lower()
    text = (
        f"Please work on this {kind} in the repository {task.repo}: "
        f"#{task.issue_number} {task.title}. Read it, make the changes it needs, and say "
        "what you did."
    )
    return SendMessageRequest(content=[TextContent(text=text)])


class StartFailed(ControlPlaneError):
    code = "start_failed"
    status = 502


class StartTaskRunner:
    def __init__(
        self,
        config: ServiceConfig,
        store: ConversationStore,
        sandboxes: SandboxService,
        settings: SettingsService,
        agent: AgentClient,
        *,
        catalog: SpecCatalog,
        publisher: LifecyclePublisher | None = None,
        pending: PendingMessages | None = None,
        gateway_tokens: SandboxTokens | None = None,
        gateway_url: Callable[[SandboxSpec], Awaitable[str | None]] | None = None,
        organizations: OrganizationService | None = None,
    ) -> None:
        """`gateway_tokens` and `gateway_url` (where the sandboxes of a spec reach the control
        plane: Launcher.control_plane_url): agents call models through the LLM gateway; without
        them they get the user's key (docs/llm-gateway.md). `organizations`: where a task
        resumed after a restart acts (its owner's current organization and role there)."""
        self._organizations = organizations
        self._gateway_tokens = gateway_tokens
        self._gateway_url = gateway_url
        self._publisher = publisher
        self._pending = pending
        self._config = config
        self._store = store
        self._sandboxes = sandboxes
        self._catalog = catalog
        self._settings = settings
        self._agent = agent
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._updates: dict[str, asyncio.Queue[AppConversationStartTask | None]] = {}
        self._handing_over = False
        self._taken_over: set[str] = set()
        self._owners: dict[str, str] = {}  # task id -> the lease token taken before spawn()

    async def submit(
        self, task: AppConversationStartTask, principal: Principal
    ) -> asyncio.Queue[AppConversationStartTask | None]:
        """Save a new task with its lease, in one write (no replica may take it for an orphan),
        and run it here; the queue gets every saved snapshot, then None."""
        owner = secrets.token_hex(8)
        await self._store.save_task(task, lease=(owner, LEASE_TTL))
        self._owners[task.id] = owner
        return self.spawn(task, principal)

    def spawn(
        self, task: AppConversationStartTask, principal: Principal
    ) -> asyncio.Queue[AppConversationStartTask | None]:
        """Run the task in the background, under the lease taken for it (submit, recover) or
        a new one; the queue gets every saved snapshot, then None."""
        updates: asyncio.Queue[AppConversationStartTask | None] = asyncio.Queue()
        self._updates[task.id] = updates
        owner = self._owners.pop(task.id, None) or secrets.token_hex(8)
        job = asyncio.create_task(
            self._leased(task, principal, owner), name=f"start-task-{task.id}"
        )
        self._tasks[task.id] = job

        def done(_job: asyncio.Task[None]) -> None:
            self._tasks.pop(task.id, None)
            self._updates.pop(task.id, None)
            updates.put_nowait(None)

        job.add_done_callback(done)
        return updates

    async def _leased(
        self, task: AppConversationStartTask, principal: Principal, owner: str
    ) -> None:
        """Run the task while holding its lease, so other replicas know it is alive. A lease
        found taken (this replica's lapsed and another resumed the task) stops the run here."""
        job = asyncio.current_task()
        assert job is not None

        async def renew() -> None:
            while True:
                try:
                    held = await self._store.hold_lease(task.id, owner, LEASE_TTL)
                except REDIS_DOWN as exc:
                    log.warning("start_task_lease_not_renewed", task_id=task.id, error=str(exc))
                else:
                    if not held:
                        log.warning("start_task_taken_over", task_id=task.id)
                        self._taken_over.add(task.id)
                        job.cancel()
                        return
                await asyncio.sleep(LEASE_TTL / 4)

        renewer = asyncio.create_task(renew(), name=f"lease-{task.id}")
        try:
            await self.run(task, principal)
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            self._taken_over.discard(task.id)
            await asyncio.shield(self._store.drop_lease(task.id, owner))

    async def _set(self, task: AppConversationStartTask, status: StartTaskStatus) -> None:
        task.status = status
        await self._store.save_task(task)
        queue = self._updates.get(task.id)
        if queue is not None:
            queue.put_nowait(task.model_copy(deep=True))

    async def run(self, task: AppConversationStartTask, principal: Principal) -> None:
        """Never raises: a failure ends the task in ERROR with the reason as its detail."""
        # The task's own id when the client chose none: a replica resuming the task finds the
        # conversation its first run may have created.
        conversation_id = task.request.conversation_id or task.id
        try:
            record = await self._settings.record(principal.user_id)
            model = task.request.llm_model or record.settings.llm_model
            if not model:
                raise InvalidInput(
                    "no LLM model: set llm_model in /api/settings or in the request",
                    loc=["body", "llm_model"],
                )
            await self._set(task, T.WAITING_FOR_SANDBOX)
            sandbox = await self._sandbox(task, principal, record)
            base = self._sandboxes.agent_url(sandbox)
            await self._set(task, T.PREPARING_REPOSITORY)
            working_dir = await self._prepare_repository(task, sandbox, base, record)
            task.agent_server_url = self._sandboxes.client_agent_url(sandbox)
            await self._set(task, T.STARTING_CONVERSATION)
            await self._start_conversation(
                task,
                principal=principal,
                sandbox=sandbox,
                conversation_id=conversation_id,
                model=model,
                working_dir=working_dir,
                record=record,
            )
            task.app_conversation_id = conversation_id
            task.detail = None
            await self._set(task, T.READY)
            await self._publish(LifecycleType.CONVERSATION_CREATED, task, conversation_id)
            await self._hand_over_pending(task, conversation_id, sandbox.id)
        except asyncio.CancelledError:
            if self._handing_over or task.id in self._taken_over:
                raise  # another replica carries it on from its last saved step
            task.detail = "interrupted: the control plane shut down"
            task.status = T.ERROR
            await asyncio.shield(self._store.save_task(task))
            raise
        except Exception as exc:
            detail = str(exc) if isinstance(exc, ControlPlaneError) else f"internal error: {exc!r}"
            if not isinstance(exc, ControlPlaneError):
                log.exception("start_task_crashed", task_id=task.id)
            task.detail = detail
            await self._set(task, T.ERROR)
            await self._publish(LifecycleType.CONVERSATION_ERROR, task, None, detail)
            if self._pending is not None:
                await self._pending.drop(task_owner(task.id))

    async def _hand_over_pending(
        self, task: AppConversationStartTask, conversation_id: str, sandbox_id: str
    ) -> None:
        """Messages queued while the task ran go to the agent now. The conversation has
        started whatever happens here: a failure leaves them queued for the next delivery."""
        if self._pending is None:
            return
        try:
            await self._pending.adopt(task.id, conversation_id)
            await self._pending.deliver(conversation_id, sandbox_id)
        except Exception:
            log.exception("pending_hand_over_failed", task_id=task.id)

    async def _publish(
        self,
        kind: LifecycleType,
        task: AppConversationStartTask,
        conversation_id: str | None,
        reason: str | None = None,
    ) -> None:
        if self._publisher is not None and task.created_by_user_id is not None:
            await self._publisher.publish(
                LifecycleEvent(
                    type=kind,
                    user_id=task.created_by_user_id,
                    sandbox_id=task.sandbox_id,
                    conversation_id=conversation_id,
                    reason=reason,
                )
            )

    async def _sandbox(
        self, task: AppConversationStartTask, principal: Principal, record: UserRecord
    ) -> SandboxRecord:
        # A resumed task keeps the sandbox its first run recorded.
        sandbox_id = task.sandbox_id or task.request.sandbox_id
        if sandbox_id is None:
            spec_id = task.request.sandbox_spec_id or record.settings.sandbox_spec_id
            sandbox_id = (await self._sandboxes.start(principal, spec_id)).id
        task.sandbox_id = sandbox_id
        await self._set(task, task.status)
        return await self._sandboxes.ensure_running(principal, sandbox_id)

    async def _prepare_repository(
        self, task: AppConversationStartTask, sandbox: SandboxRecord, base: str, record: UserRecord
    ) -> str:
        spec = self._catalog.find(sandbox.spec_id)
        root = spec.working_dir if spec else "/workspace"
        repo = task.request.selected_repository
        if not repo:
            return root
        provider = task.request.git_provider or ProviderType.GITHUB
        stored = record.provider_tokens.get(provider)
        host = (stored.host if stored else None) or DEFAULT_HOSTS.get(provider)
        if host is None:
            raise StartFailed(f"no host known for {provider.value}: store one with the token")
        auth = ""
        if stored is not None:
            user = _TOKEN_USER.get(provider, "git")
            auth = f"{user}:{stored.token}@"
        target = f"{root}/{repo.rsplit('/', 1)[-1]}"
        url = f"https://{auth}{host}/{repo}.git"
        branch = task.request.selected_branch
        checkout = (
            f" && git -C {shlex.quote(target)} checkout {shlex.quote(branch)}" if branch else ""
        )
        # Cloned once: a resumed task finds the clone of its first run.
        command = (
            f"if [ ! -d {shlex.quote(target)}/.git ]; then GIT_TERMINAL_PROMPT=0 git clone"
            f" --quiet {shlex.quote(url)} {shlex.quote(target)}; fi{checkout}"
        )
        result = await self._agent.bash(base, sandbox.session_api_key, command, root, 600)
        if result.get("exit_code") != 0:
            output = (result.get("stderr") or result.get("stdout") or "").strip()
            if stored is not None:
                output = output.replace(stored.token, "***")
            raise StartFailed(f"could not clone {repo} from {host}: {output[-500:] or 'timed out'}")
        return target

    async def _start_conversation(
        self,
        task: AppConversationStartTask,
        *,
        principal: Principal,
        sandbox: SandboxRecord,
        conversation_id: str,
        model: str,
        working_dir: str,
        record: UserRecord,
    ) -> None:
        request = task.request
        info = AppConversationInfo(
            id=conversation_id,
            created_by_user_id=principal.user_id,
            sandbox_id=sandbox.id,
            selected_repository=request.selected_repository,
            selected_branch=request.selected_branch,
            git_provider=request.git_provider,
            title=request.title or placeholder(conversation_id),
            trigger=request.trigger,
            pr_number=request.pr_number,
            llm_model=model,
            parent_conversation_id=request.parent_conversation_id,
            public=request.public,
        )
        budget = record.settings.max_budget_per_task
        if budget is not None:
            # Kept with the cost the agent reports: agents without budgets report none.
            info.metrics = MetricsSnapshot(max_budget_per_task=budget)
        # Created before the agent starts, so its first events find their conversation; the
        # create is atomic, so a concurrent start with the same id cannot take it over.
        try:
            await self._store.create(info)
        except ConversationIdTaken:
            if not await self._created_by_earlier_run(info):
                raise
        try:
            await self._agent.start_conversation(
                self._sandboxes.agent_url(sandbox),
                sandbox.session_api_key,
                await self._agent_body(
                    task,
                    conversation_id=conversation_id,
                    model=model,
                    working_dir=working_dir,
                    record=record,
                    sandbox=sandbox,
                ),
            )
        except BaseException:
            await self._store.delete(info)
            raise

    async def _created_by_earlier_run(self, info: AppConversationInfo) -> bool:
        """A resumed task's conversation, created before its replica stopped: the same user's,
        in the same sandbox (a client-chosen id is refused at the request if it is already
        one of the user's conversations). The agent server's start is idempotent."""
        existing = await self._store.get(info.id)
        return (
            existing is not None
            and existing.created_by_user_id == info.created_by_user_id
            and existing.sandbox_id == info.sandbox_id
        )

    async def _agent_body(
        self,
        task: AppConversationStartTask,
        *,
        conversation_id: str,
        model: str,
        working_dir: str,
        record: UserRecord,
        sandbox: SandboxRecord,
    ) -> dict[str, Any]:
        settings = record.settings
        spec = self._catalog.find(sandbox.spec_id)
        secrets = {name: s.value for name, s in record.custom_secrets.items()}
        for provider, token in record.provider_tokens.items():
            secrets[f"{provider.value.upper()}_TOKEN"] = token.token
        prices = self._config.llm_prices.get(model, (None, None))
        message = task.request.initial_message or suggested_message(task.request)
        # Where this sandbox reaches the gateway (a spec no longer in the catalog: the
        # default's answer, the same listener; never the provider key for want of a URL).
        gateway_url = None
        if self._gateway_url is not None:
            gateway_url = await self._gateway_url(spec or self._catalog.default)
        return start_conversation_request(
            conversation_id=conversation_id,
            llm=agent_llm(
                spec=spec,
                model=model,
                base_url=settings.llm_base_url,
                api_key=record.llm_api_key,
                prices=prices,
                tokens=self._gateway_tokens,
                control_plane_url=gateway_url,
                sandbox_id=sandbox.id,
                conversation_id=conversation_id,
                user_id=sandbox.owner,
            ),
            working_dir=working_dir,
            initial_message=message.model_dump() if message else None,
            max_iterations=settings.max_iterations or DEFAULT_MAX_ITERATIONS,
            max_budget_per_task=settings.max_budget_per_task,
            confirmation_mode=bool(settings.confirmation_mode),
            secrets=secrets,
            mcp_config=settings.mcp_config,
            system_message_suffix=task.request.system_message_suffix,
            agent_kind=spec.agent_kind if spec else "acs",
        )

    async def recover(self) -> int:
        """Unfinished tasks no replica holds a lease on (their replica died, or handed them over
        as it stopped) are carried on here from their last saved step; returns how many."""
        resumed = 0
        ids = [i for i in await self._store.active_task_ids() if i not in self._tasks]
        leased = dict(zip(ids, await self._store.leased(ids), strict=True))
        for task in await self._store.get_tasks(ids):
            if task is None or leased[task.id] or self._handing_over:
                continue
            owner = secrets.token_hex(8)
            if not await self._store.hold_lease(task.id, owner, LEASE_TTL):
                continue  # another replica took it first
            if task.created_by_user_id is None:  # nobody to act for
                task.status = T.ERROR
                task.detail = "interrupted by a control plane restart; start the conversation again"
                await self._store.save_task(task)
                await self._store.drop_lease(task.id, owner)
                if self._pending is not None:
                    await self._pending.drop(task_owner(task.id))
                continue
            log.info("start_task_resumed", task_id=task.id, status=task.status.value)
            principal = Principal(user_id=task.created_by_user_id, key_id=RESUMED_KEY_ID)
            if self._organizations is not None:
                # The task record names no organization: its owner's current one, with their
                # role there (a sandbox it still has to start is made there).
                principal = await self._organizations.scope(principal, None)
            self._owners[task.id] = owner
            self.spawn(task, principal)
            resumed += 1
        return resumed

    async def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the tasks running here to end."""
        jobs = list(self._tasks.values())
        if jobs and timeout > 0:
            await asyncio.wait(jobs, timeout=timeout)

    async def hand_over(self) -> None:
        """Stop the tasks still running here without failing them: their leases are dropped
        and another replica's recover() resumes each from its last saved step."""
        self._handing_over = True
        await self.close()

    async def close(self) -> None:
        await stop_tasks(list(self._tasks.values()))
