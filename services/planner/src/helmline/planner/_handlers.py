"""The planner's edge: events in, decisions appended."""

from __future__ import annotations

from helmline.planner._domain import decide
from helmline.runtime import Delivery, EventStore, SessionCache

SOURCE = "helmline/planner"


class PlannerHandler:
    """Folds each delivered event into the session's cached state and appends decisions."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._sessions = SessionCache(store)

    async def __call__(self, delivery: Delivery) -> None:
        state = await self._sessions.advance(delivery)
        decisions = decide(state, delivery.event)
        appended = []
        for index, decision in enumerate(decisions):
            event = delivery.event.derive(
                decision.payload, source=SOURCE, key=str(index), identity=decision.identity
            )
            await self._store.append(event)
            appended.append(event)
        self._sessions.record(state, appended)
