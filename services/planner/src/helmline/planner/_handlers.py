"""The planner's edge: events in, decisions appended."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from helmline.contracts import (
    PLANNER_CONSUMER,
    Event,
    PlanApproved,
    PlanRejected,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackRequested,
    SessionCancelRequested,
    SessionPauseRequested,
    SessionResumeRequested,
    SessionStarted,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolSpec,
    WorkspaceRestored,
)
from helmline.planner._circuits import CircuitWatch
from helmline.planner._domain import Decision, decide, retry_deferral
from helmline.planner._engine import SOURCE, GoalEngine
from helmline.runtime import Deferred, Delivery, EventStore, FoldedStates, Router, SessionCache


class PlannerHandler:
    """Folds each delivered event into the session's cached state and appends decisions.

    Goal sessions (a model plans) go to the goal engine, which reads the session's whole log:
    a model call costs far more than the read, and the log holds the conversation.
    """

    router = Router(PLANNER_CONSUMER)

    def __init__(
        self,
        store: EventStore,
        states: FoldedStates,
        goals: GoalEngine,
        tools: Mapping[str, ToolSpec],
        circuits: CircuitWatch,
    ) -> None:
        self._store = store
        self._sessions = SessionCache(states)
        self._goals = goals
        self._tools = tools
        self._circuits = circuits

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)

    @router.on(RollbackCompleted, RollbackFailed)
    async def _after_rollback(self, delivery: Delivery) -> None:
        # A rollback changed steps through events the planner does not consume.
        event = delivery.event
        self._sessions.forget(event.tenant, event.session_id)
        await self._decide(delivery)

    @router.on(
        SessionStarted,
        PlanApproved,
        PlanRejected,
        ToolCallCompleted,
        ToolCallFailed,
        ToolCallDenied,
        SessionPauseRequested,
        SessionResumeRequested,
        SessionCancelRequested,
        RollbackRequested,
        RollbackRefused,
        WorkspaceRestored,
    )
    async def _decide(self, delivery: Delivery) -> None:
        """Fold the event in and append what `decide` (or, for a goal session, the goal
        engine) makes of it."""
        state = await self._sessions.advance(delivery)
        if state.mode != "playbook":
            event = delivery.event
            log = [s.event for s in await self._store.read_all(event.tenant, event.session_id)]
            await self._goals.handle(event, log, self._append)
            self._sessions.forget(event.tenant, event.session_id)
            return
        decisions = decide(state, delivery.event)
        await self._defer_retry_until_it_may_succeed(delivery, decisions)
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

    async def _defer_retry_until_it_may_succeed(
        self, delivery: Delivery, decisions: list[Decision]
    ) -> None:
        """Record that the retry of a failed call waits (for the time the failure named, or
        for its server's open circuit), and raise `Deferred`: the failure is delivered again
        then, and the retry scheduled (once: a second delivery acts whatever the wait)."""
        failed = delivery.event.data
        if not isinstance(failed, ToolCallFailed) or delivery.deliveries > 1:
            return
        tool = self._tools.get(failed.tool)
        circuit = self._circuits.of(tool.server) if tool is not None else None
        deferral = retry_deferral(decisions, failed, circuit)
        if deferral is None or deferral.retry_at <= datetime.now(UTC):
            return
        await self._store.append(delivery.event.derive(deferral, source=SOURCE))
        raise Deferred(deferral.retry_at, deferral.reason)
