"""The planner's edge: events in, decisions appended."""

from __future__ import annotations

from helmline.contracts import Event, RollbackCompleted, RollbackFailed
from helmline.planner._domain import decide
from helmline.planner._engine import SOURCE, GoalEngine
from helmline.runtime import Delivery, EventStore, FoldedStates, SessionCache


class PlannerHandler:
    """Folds each delivered event into the session's cached state and appends decisions.

    Goal sessions (a model plans) go to the goal engine, which reads the session's whole log:
    a model call costs far more than the read, and the log holds the conversation.
    """

    def __init__(self, store: EventStore, states: FoldedStates, goals: GoalEngine) -> None:
        self._store = store
        self._sessions = SessionCache(states)
        self._goals = goals

    async def __call__(self, delivery: Delivery) -> None:
        if isinstance(delivery.event.data, RollbackCompleted | RollbackFailed):
            # A rollback changed steps through events the planner does not consume.
            event = delivery.event
            self._sessions.forget(event.tenant, event.session_id)
        state = await self._sessions.advance(delivery)
        if state.mode != "playbook":
            event = delivery.event
            log = [s.event for s in await self._store.read_all(event.tenant, event.session_id)]
            await self._goals.handle(event, log, self._append)
            self._sessions.forget(event.tenant, event.session_id)
            return
        decisions = decide(state, delivery.event)
        appended = [
            delivery.event.derive(
                decision.payload, source=SOURCE, key=str(index), identity=decision.identity
            )
            for index, decision in enumerate(decisions)
        ]
        # Steps that became ready together are scheduled with one round trip.
        await self._store.append_pipelined(appended)
        self._sessions.record(state, appended)

    async def _append(self, event: Event) -> None:
        await self._store.append(event)
