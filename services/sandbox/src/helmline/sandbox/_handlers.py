"""Events in, events out: sandbox requests become recorded calls; cancels kill commands.

Exactly once: `tool.call.started` is in the log before a call runs. A first delivery of an
event stored since the consumer connected has never run. A redelivery, or an event stored
before (a power loss may have cost the server its count of deliveries), reads the session's
log first: a call with a result is done; a call
started without a result was cut short by a crash and is failed rather than run again, since
its effects may already have happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from cachetools import LRUCache
from nats.errors import Error as NatsError

from helmline.contracts import (
    SANDBOX_CONSUMER,
    CompensationScheduled,
    Event,
    LimitHit,
    ResourceUsage,
    SandboxExecutionRequested,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionStarted,
    ToolError,
    WorkspaceSnapshotsPruned,
)
from helmline.runtime import (
    Delivery,
    EventStore,
    FoldedStates,
    InjectionClassifier,
    LogStates,
    RetryableError,
    Router,
    SecretsError,
    SecretStore,
    classified,
    resolved_arguments,
    through_elections,
)
from helmline.sandbox._calls import (
    CANCELLED_BEFORE_START,
    INTERRUPTED,
    MUTATING_TOOLS,
    approached,
    failed,
    process_marker,
    results,
    safe_output,
    snapshot_id,
    snapshotted,
    started,
)
from helmline.sandbox._commands import CommandControl, Reaper, kill_marked
from helmline.sandbox._manifests import Manifest, file_changes
from helmline.sandbox._paths import workspace_of
from helmline.sandbox._reclaim import WorkspaceReclaimer
from helmline.sandbox._restores import WorkspaceRestorer
from helmline.sandbox._snapshots import Snapshot, SnapshotMissing, WorkspaceSnapshots
from helmline.sandbox._tools import Completed, Tools

logger = logging.getLogger(__name__)

SessionKey = tuple[str, str]
CallKey = tuple[str, str, str]


class SandboxHandler:
    """Handles the sandbox consumer's events; `cancel_session` also serves the fast path."""

    router = Router(SANDBOX_CONSUMER)

    def __init__(
        self,
        store: EventStore,
        workspaces_dir: Path,
        tools: Tools,
        *,
        snapshots: WorkspaceSnapshots | None = None,
        reclaim: bool = False,
        memory: int = 10_000,
        secrets: SecretStore | None = None,
        classifier: InjectionClassifier | None = None,
        states: FoldedStates | None = None,
    ) -> None:
        """`reclaim`: remove ended sessions' workspaces (needs `snapshots`); `secrets`: where
        the secrets that calls refer to are resolved (without, a call that refers to one
        fails); `classifier`: asked about each result after output safety's patterns, if
        configured; `states`: the sessions' stored states, a redelivered event's session is
        folded on from (without, from its whole log)."""
        self._store = store
        # What a redelivered call or restore needs to know of the session: its folded state.
        self._log_states = LogStates(store, states)
        self._classifier = classifier
        self._secrets = secrets
        self._workspaces_dir = workspaces_dir
        self._tools = tools
        self._snapshots = snapshots
        self._restorer = (
            WorkspaceRestorer(store, workspaces_dir, snapshots, self._log_states)
            if snapshots is not None
            else None
        )
        self._reclaimer = (
            WorkspaceReclaimer(store, snapshots, self.runs_a_call)
            if snapshots is not None and reclaim
            else None
        )
        # Sessions whose latest state this process snapshotted: that snapshot is the
        # "before" of their next call, so only the first call of a session takes one.
        self._snapshotted: LRUCache[SessionKey, None] = LRUCache(memory)
        self._running: dict[CallKey, asyncio.Event] = {}
        self._reaper = Reaper()
        # What this process learnt from the log, kept to answer without reading it again.
        self._cancelled: LRUCache[SessionKey, None] = LRUCache(memory)
        self._finished: LRUCache[CallKey, None] = LRUCache(memory)
        # Results that ran but could not be appended; appended on the redelivery.
        self._unrecorded: LRUCache[CallKey, list[Event]] = LRUCache(memory)

    @property
    def running(self) -> int:
        """How many calls are running now."""
        return len(self._running)

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)

    @router.on(SandboxExecutionRequested)
    async def _on_request(self, delivery: Delivery) -> None:
        assert isinstance(delivery.event.data, SandboxExecutionRequested)
        await self._execute(delivery, delivery.event.data)

    @router.on(SessionCancelRequested)
    async def _on_cancel(self, delivery: Delivery) -> None:
        self.cancel_session(delivery.event.tenant, delivery.event.session_id)

    @router.on(CompensationScheduled, SessionStarted)
    async def _on_restore(self, delivery: Delivery) -> None:
        if self._restorer is None:  # Without snapshots there is nothing to restore.
            return
        # A rollback may reopen a session whose end is being handled: one at a time.
        held = (
            self._reclaimer.holding(self._workspace_of(delivery.event))
            if self._reclaimer is not None
            else contextlib.nullcontext()
        )
        async with held:
            await self._restorer(delivery)

    @router.on(WorkspaceSnapshotsPruned)
    async def _on_pruned(self, delivery: Delivery) -> None:
        event, pruned = delivery.event, delivery.event.data
        assert isinstance(pruned, WorkspaceSnapshotsPruned)
        if self._snapshots is None:
            return  # Without snapshots there is nothing stored to prune.
        dropped = await self._snapshots.drop(event.tenant, event.session_id, pruned.snapshot_ids)
        logger.info("pruned %d snapshot(s) of %s/%s", dropped, event.tenant, event.session_id)

    @router.on(SessionCompleted, SessionFailed, SessionCancelled)
    async def _on_end(self, delivery: Delivery) -> None:
        if self._reclaimer is not None:
            workspace = self._workspace_of(delivery.event)
            await self._reclaimer.reclaim(delivery.event, workspace, delivery.deliveries)

    def _workspace_of(self, event: Event) -> Path:
        return workspace_of(self._workspaces_dir, event.tenant, event.session_id)

    def runs_a_call(self, tenant: str, session_id: str) -> bool:
        """Whether a call of the session runs in this process now."""
        return any((t, s) == (tenant, session_id) for t, s, _ in self._running)

    def cancel_session(self, tenant: str, session_id: str) -> int:
        """Kill the session's running commands, and start none of its calls from now on.

        Returns how many running calls were stopped. Calling it again changes nothing.
        """
        self._cancelled[tenant, session_id] = None
        stopped = 0
        for (call_tenant, call_session, _), cancel in self._running.items():
            if (call_tenant, call_session) == (tenant, session_id) and not cancel.is_set():
                cancel.set()
                stopped += 1
        if stopped:
            logger.info("cancelled %d running call(s) of %s/%s", stopped, tenant, session_id)
        return stopped

    async def _execute(self, delivery: Delivery, request: SandboxExecutionRequested) -> None:
        cause = delivery.event
        key = (cause.tenant, cause.session_id, request.call_id)
        if key in self._running or key in self._finished:
            return  # Running here now, or done: the run records (or recorded) the result.
        unrecorded = self._unrecorded.pop(key, None)
        if unrecorded is not None:
            await self._record(key, unrecorded)
            return
        if delivery.maybe_handled:
            match (await self._log_states.now(delivery)).call_progress(request.call_id):
                case "finished":
                    self._finished[key] = None
                    return
                case "started":
                    logger.warning("call %s was interrupted; failing it", request.call_id)
                    # A crash leaves the call's processes orphaned, not dead.
                    await asyncio.to_thread(kill_marked, process_marker(cause))
                    await self._record(key, [failed(cause, request, INTERRUPTED)])
                    return
                case "not started":
                    pass
        if (cause.tenant, cause.session_id) in self._cancelled:
            await self._record(key, [failed(cause, request, CANCELLED_BEFORE_START)])
            return
        try:
            # Only here, where the call runs; kept out of every event and log line.
            arguments = await resolved_arguments(self._secrets, cause.tenant, request.arguments)
        except SecretsError as error:
            await self._record(key, [failed(cause, request, error.tool_error())])
            return
        cancel = asyncio.Event()
        self._running[key] = cancel
        session = (cause.tenant, cause.session_id)
        workspace = workspace_of(self._workspaces_dir, *session)
        mutating = self._snapshots is not None and request.tool in MUTATING_TOOLS
        before: list[Event] = []
        baseline: Manifest | None = None
        try:
            if self._reclaimer is not None:
                try:
                    await self._reclaimer.put_back(workspace, *session)
                except SnapshotMissing as error:
                    await self._record(key, [failed(cause, request, _cannot_put_back(error))])
                    return
            if mutating and session not in self._snapshotted:
                taken = await self._snapshot(workspace, session, snapshot_id(cause, "before"))
                before.append(snapshotted(cause, taken, None))
                baseline = _scanned(taken)
            elif mutating:
                baseline = await self._scan(workspace)
            await self._store.append(started(cause, request))
            warnings: list[asyncio.Task[object]] = []

            def warn(hit: LimitHit, used: float, usage: ResourceUsage) -> None:
                # Appended while the call runs: people and alerts see it before the end.
                event = approached(cause, request, hit, used, usage)
                warnings.append(asyncio.create_task(self._store.append(event)))

            began = time.perf_counter()
            control = CommandControl(process_marker(cause), cancel, self._reaper, warn)
            outcome = await self._tools.execute(request, workspace, session, control, arguments)
            duration_ms = (time.perf_counter() - began) * 1000
            for warning in await asyncio.gather(*warnings, return_exceptions=True):
                if isinstance(warning, Exception):
                    logger.warning("a limit warning of call %s was lost: %s", key[2], warning)
        finally:
            del self._running[key]
        after: list[Event] = []
        if mutating:
            taken = await self._snapshot(workspace, session, snapshot_id(cause, "after"))
            scanned = _scanned(taken)
            changes = None
            if baseline is not None and scanned is not None:
                changes = file_changes(baseline, scanned)
            after.append(snapshotted(cause, taken, request.call_id, changes))
            self._snapshotted[session] = None
        safe = None
        if isinstance(outcome, Completed):
            safe = await classified(safe_output(outcome), self._classifier)
        closing = results(cause, request, outcome, duration_ms, safe)
        await self._record(key, [*before, *after, *closing])

    async def _snapshot(self, workspace: Path, session: SessionKey, snapshot: str) -> Snapshot:
        snapshots = self._snapshots
        assert snapshots is not None
        try:
            # Taking a snapshot again is harmless (blobs are named by their content, the
            # manifest is the same), and a cluster electing a leader for the bucket's stream
            # answers nothing for seconds: a snapshot lost to that would lose the checkpoint.
            return await through_elections(lambda: snapshots.take(workspace, *session, snapshot))
        except (TimeoutError, OSError, NatsError) as error:
            # The call ran (or is about to): its result matters more than its snapshot.
            logger.warning("snapshot %s of %s/%s failed: %s", snapshot, *session, error)
            return Snapshot(snapshot, (), "", 0, 0, 0, refused=f"snapshot failed: {error}")

    async def _scan(self, workspace: Path) -> Manifest | None:
        """The workspace before a call, to tell what the call changed; None if unreadable."""
        assert self._snapshots is not None
        try:
            return await self._snapshots.scan(workspace)
        except OSError as error:
            logger.warning("scan of %s failed: %s", workspace, error)
            return None

    async def _record(self, key: CallKey, events: list[Event]) -> None:
        try:
            await self._store.append_all(events)
        except Exception as error:
            # The call has run: keep its result for the redelivery rather than lose it.
            self._unrecorded[key] = events
            raise RetryableError(f"could not record the result of call {key[2]}") from error
        self._finished[key] = None


def _scanned(snapshot: Snapshot) -> Manifest | None:
    """The workspace a snapshot saw; None when taking it failed before it looked (its
    digest is then empty)."""
    return snapshot.manifest if snapshot.digest else None


def _cannot_put_back(missing: SnapshotMissing) -> ToolError:
    return ToolError(
        kind="not_found",
        message=f"the session's workspace was removed from the sandbox's disk when the session "
        f"ended, and cannot be put back: {missing}",
        suggestion="fork the session from a checkpoint whose snapshot is still stored",
    )
