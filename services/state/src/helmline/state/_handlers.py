"""The state service's edge: a checkpoint after every completed step, and rollbacks driven
one compensation at a time, both off the critical path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from helmline.contracts import (
    STATE_CONSUMER,
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
    source_of,
)
from helmline.runtime import Delivery, EventStore, FoldedStates, Router, SessionCache
from helmline.state._checkpoints import checkpoint_after, snapshots_beyond
from helmline.state._rollback import call_outcome, is_undo_step, next_decisions, plan_rollback

SOURCE = source_of("state")


class StateHandler:
    """Records checkpoints and drives rollbacks."""

    router = Router(STATE_CONSUMER)

    def __init__(
        self,
        store: EventStore,
        tools: Mapping[str, ToolSpec],
        states: FoldedStates,
        *,
        snapshots_kept: int,
    ) -> None:
        self._store = store
        self._tools = tools
        self._states = states
        self._snapshots_kept = snapshots_kept
        # What the cache folds on meeting a session, the stored states fold on from.
        self._sessions = SessionCache(states, on_load=states.note_folded)

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)

    @router.on(RollbackRequested, CompensationCompleted, CompensationFailed)
    async def _on_rollback(self, delivery: Delivery) -> None:
        await self._advance_rollbacks(delivery.event)

    @router.on(ToolCallFailed, ToolCallDenied)
    async def _on_failure(self, delivery: Delivery) -> None:
        outcome = delivery.event.data
        assert isinstance(outcome, ToolCallFailed | ToolCallDenied)
        if is_undo_step(outcome.step_id):
            await self._advance_rollbacks(delivery.event)
        else:
            await self.handle_gathered([delivery])

    @router.on(ToolCallCompleted, WorkspaceSnapshotted, WorkspaceRestored)
    async def _on_checkpointed(self, delivery: Delivery) -> None:
        """A completion (its checkpoint), or a snapshot it notes, handled alone: the
        gathering it was in failed, or its consumer does not gather."""
        await self.handle_gathered([delivery])

    def may_wait(self, event: Event) -> bool:
        """Checkpoints, and the snapshots they note, may be made late, and a plan step's
        failure (which calls for nothing) may wait with them; a rollback may not wait, nor
        may the outcome of one of its undo calls."""
        match event.data:
            case ToolCallCompleted() | ToolCallFailed() | ToolCallDenied() as outcome:
                return not is_undo_step(outcome.step_id)
            case WorkspaceSnapshotted() | WorkspaceRestored():
                return True
            case _:
                return False

    async def handle_gathered(self, deliveries: Sequence[Delivery]) -> None:
        """A checkpoint for each completed step (and the snapshots it leaves out of those a
        session keeps), all appended in one round trip."""
        checkpoints: list[Event] = []
        try:
            for delivery in deliveries:
                checkpoints += await self._checkpoint(delivery)
            # In one round trip. What fails there is a NATS outage or a full stream, which
            # fail every message after the first lost: those stored are the first ones, and
            # handling the events again (one by one) appends the rest after them, in order.
            appended = await self._store.append_pipelined(checkpoints)
        except BaseException:
            # The cache may hold checkpoints that were never stored.
            for delivery in deliveries:
                self._sessions.forget(delivery.event.tenant, delivery.event.session_id)
            raise
        # Now and then, the folded state too, for fast time travel.
        latest = {
            (c.tenant, c.session_id): a.seq for c, a in zip(checkpoints, appended, strict=True)
        }
        for (tenant, session_id), seq in latest.items():
            await self._states.keep_up(tenant, session_id, seq)

    async def _checkpoint(self, delivery: Delivery) -> list[Event]:
        """The checkpoint that a completion calls for (none for an undo call's, which takes
        its rollback further instead), kept in the session's cached state."""
        event = delivery.event
        match event.data:
            case ToolCallCompleted() as completed:
                state = await self._sessions.advance(delivery)
                if _compensates(state, completed.call_id):
                    await self._advance_rollbacks(event)
                    return []
                if any(made.call_id == completed.call_id for made in state.checkpoints):
                    # Recorded already (a redelivery, or history): once JetStream forgot its
                    # id, appending it again would store it twice.
                    return []
                checkpoint = event.derive(
                    checkpoint_after(state, completed, delivery.seq, self._tools),
                    source=SOURCE,
                    identity=f"checkpoint/{completed.call_id}",
                )
                made = [checkpoint]
                after = self._sessions.record(state, made)
                pruned = snapshots_beyond(after, self._snapshots_kept)
                if pruned is not None:
                    prune = event.derive(
                        pruned, source=SOURCE, identity=f"prune/{completed.call_id}"
                    )
                    self._sessions.record(after, [prune])
                    made.append(prune)
                return made
            case _ if self._sessions.holds(event.tenant, event.session_id):
                # A snapshot or a failure, kept up in a state held in memory for the next
                # checkpoint; a session not held is replayed at its next completion, this
                # event included.
                await self._sessions.advance(delivery)
        return []

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
            decisions = (
                [outcome]
                if outcome is not None
                else next_decisions(plan, now, rollback.rollback_id)
            )
            while decisions:
                events = [
                    cause.derive(d.payload, source=SOURCE, identity=d.identity) for d in decisions
                ]
                await self._store.append_all(events)
                now = fold(events, now)
                decisions = next_decisions(plan, now, rollback.rollback_id)
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
