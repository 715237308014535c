"""The state service's edge: a checkpoint after every completed step, and rollbacks driven
one compensation at a time, both off the critical path."""

from __future__ import annotations

from collections.abc import Mapping

from helmline.contracts import (
    CompensationCompleted,
    CompensationFailed,
    Event,
    RollbackRequested,
    RollbackState,
    SessionState,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolSpec,
    WorkspaceRestored,
    WorkspaceSnapshotted,
    fold,
)
from helmline.runtime import Delivery, EventStore, FoldedStates, SessionCache
from helmline.state._checkpoints import checkpoint_after
from helmline.state._rollback import call_outcome, is_undo_step, next_decisions, plan_rollback

SOURCE = "helmline/state"


class StateHandler:
    """Records checkpoints and drives rollbacks."""

    def __init__(
        self, store: EventStore, tools: Mapping[str, ToolSpec], states: FoldedStates
    ) -> None:
        self._store = store
        self._tools = tools
        self._states = states
        self._sessions = SessionCache(states)

    async def __call__(self, delivery: Delivery) -> None:
        event = delivery.event
        match event.data:
            case RollbackRequested() | CompensationCompleted() | CompensationFailed():
                await self._advance_rollbacks(event)
            case ToolCallFailed() | ToolCallDenied() as outcome if is_undo_step(outcome.step_id):
                await self._advance_rollbacks(event)
            case ToolCallCompleted() as completed:
                state = await self._sessions.advance(delivery)
                if _compensates(state, completed.call_id):
                    await self._advance_rollbacks(event)
                    return
                checkpoint = event.derive(
                    checkpoint_after(state, completed, delivery.seq, self._tools),
                    source=SOURCE,
                    identity=f"checkpoint/{completed.call_id}",
                )
                appended = await self._store.append(checkpoint)
                self._sessions.record(state, [checkpoint])
                # Now and then, the folded state too, for fast time travel.
                await self._states.keep_up(checkpoint.tenant, checkpoint.session_id, appended.seq)
            case WorkspaceSnapshotted() | WorkspaceRestored() if self._sessions.holds(
                event.tenant, event.session_id
            ):
                # Kept up in a state held in memory, for the next checkpoint; a session not
                # held is replayed at its next completion, this event included.
                await self._sessions.advance(delivery)
            case _:
                pass  # Other sessions' snapshots, and failures of the plan's own steps.

    async def _advance_rollbacks(self, cause: Event) -> None:
        """Take each rollback under way one decision further.

        Decides from the whole log rather than the cache: a rollback is rare, and the log
        shows every compensation already scheduled or finished, even after a crash.
        """
        tenant, session_id = cause.tenant, cause.session_id
        now = (await self._states.load(tenant, session_id)).state
        for rollback in [r for r in now.rollbacks.values() if r.active]:
            plan = plan_rollback(now, await self._at_checkpoint(now, rollback), rollback)
            outcome = call_outcome(plan, rollback, cause.data)
            decisions = [outcome] if outcome is not None else next_decisions(plan, rollback)
            while decisions:
                events = [
                    cause.derive(d.payload, source=SOURCE, identity=d.identity) for d in decisions
                ]
                await self._store.append_all(events)
                now = fold(events, now)
                decisions = next_decisions(plan, now.rollbacks[rollback.rollback_id])
        # Compensations change the session in ways this service does not consume.
        self._sessions.forget(tenant, session_id)

    async def _at_checkpoint(self, now: SessionState, rollback: RollbackState) -> SessionState:
        target = next(
            (c for c in now.checkpoints if c.checkpoint_id == rollback.checkpoint_id), None
        )
        if target is None:
            return now
        then = await self._states.load(now.tenant, now.session_id, up_to_seq=target.at_seq)
        return then.state


def _compensates(state: SessionState, call_id: str) -> bool:
    return any(call_id in rollback.compensations for rollback in state.rollbacks.values())
