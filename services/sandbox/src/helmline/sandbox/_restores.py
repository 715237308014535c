"""Restoring workspaces from snapshots: a rollback's `restore_workspace` compensation, and a
fork's workspace made from its origin's checkpoint.

A restore makes the workspace hold exactly what the snapshot held, so doing it again changes
nothing; still, a redelivery first asks the session's folded state (no scan of the log), and
a restore it records is not done a second time.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nats.errors import Error as NatsError

from helmline.contracts import (
    CompensationCompleted,
    CompensationFailed,
    CompensationScheduled,
    Event,
    SessionStarted,
    ToolError,
    WorkspaceRestored,
    source_of,
)
from helmline.runtime import Delivery, EventStore, LogStates, RetryableError
from helmline.sandbox._paths import workspace_of
from helmline.sandbox._reclaim import marker_of
from helmline.sandbox._snapshots import SnapshotMissing, WorkspaceSnapshots

logger = logging.getLogger(__name__)

SOURCE = source_of("sandbox")


class WorkspaceRestorer:
    """Restores session workspaces when a rollback or a fork asks for it."""

    def __init__(
        self,
        store: EventStore,
        workspaces_dir: Path,
        snapshots: WorkspaceSnapshots,
        log_states: LogStates | None = None,
    ) -> None:
        self._store = store
        self._log_states = log_states or LogStates(store)
        self._workspaces_dir = workspaces_dir
        self._snapshots = snapshots

    async def __call__(self, delivery: Delivery) -> None:
        event = delivery.event
        match event.data:
            case CompensationScheduled(kind="restore_workspace") as compensation:
                await self._compensate(delivery, compensation)
            case SessionStarted(fork_of=origin) if origin is not None and origin.snapshot_id:
                if delivery.maybe_handled and await self._forked_already(delivery):
                    return
                await self._restore(event, origin.session_id, origin.snapshot_id)
                # The fork's log names the origin's snapshot from now on: keep its manifest
                # under the fork too (its blobs are stored already), so that a rollback of
                # the fork to a checkpoint before its first change finds it.
                workspace = workspace_of(self._workspaces_dir, event.tenant, event.session_id)
                await self._snapshots.take(
                    workspace, event.tenant, event.session_id, origin.snapshot_id
                )
                restored = WorkspaceRestored(snapshot_id=origin.snapshot_id)
                await self._store.append(event.derive(restored, source=SOURCE))
            case _:
                pass  # Inverse tools run through the tool gateway; ordinary sessions start empty.

    async def _compensate(self, delivery: Delivery, compensation: CompensationScheduled) -> None:
        cause = delivery.event
        snapshot = compensation.snapshot_id
        ids = {
            "rollback_id": compensation.rollback_id,
            "compensation_id": compensation.compensation_id,
            "step_id": compensation.step_id,
        }
        if snapshot is None:
            missing = ToolError(kind="validation", message="no snapshot to restore was named")
            await self._store.append(
                cause.derive(CompensationFailed(**ids, error=missing), source=SOURCE)
            )
            return
        done = delivery.maybe_handled and await self._compensated_already(delivery, compensation)
        if not done:
            try:
                await self._restore(cause, cause.session_id, snapshot)
            except SnapshotMissing as missing:
                error = ToolError(kind="not_found", message=str(missing))
                await self._store.append(
                    cause.derive(CompensationFailed(**ids, error=error), source=SOURCE)
                )
                return
        restored = WorkspaceRestored(
            snapshot_id=snapshot, compensation_id=compensation.compensation_id
        )
        completed = CompensationCompleted(**ids, steps=compensation.steps)
        await self._store.append_all(
            [cause.derive(restored, source=SOURCE), cause.derive(completed, source=SOURCE)]
        )

    async def _restore(self, cause: Event, origin_session: str, snapshot: str) -> None:
        workspace = workspace_of(self._workspaces_dir, cause.tenant, cause.session_id)
        try:
            await self._snapshots.restore(workspace, cause.tenant, origin_session, snapshot)
            # Restored: a reclaimed workspace's marker no longer says what it holds.
            marker_of(workspace).unlink(missing_ok=True)
        except SnapshotMissing:
            raise  # Not there (pruned, or never stored): waiting will not bring it.
        except (TimeoutError, NatsError) as error:
            raise RetryableError(f"could not read snapshot {snapshot}: {error}") from error
        logger.info("restored %s/%s to %s", cause.tenant, cause.session_id, snapshot)

    async def _compensated_already(
        self, delivery: Delivery, compensation: CompensationScheduled
    ) -> bool:
        """Whether the session's state records this compensation done (a redelivery after a
        crash: its restore is not done again)."""
        state = await self._log_states.now(delivery)
        rollback = state.rollbacks.get(compensation.rollback_id)
        done = rollback.compensations.get(compensation.compensation_id) if rollback else None
        return done == "completed"

    async def _forked_already(self, delivery: Delivery) -> bool:
        """Whether the fork's workspace was made already: its session's state knows of a
        workspace (made by this restore first; a call's snapshots come after)."""
        return (await self._log_states.now(delivery)).latest_snapshot_id is not None
