"""The goal session loop: react, ask the model, record its answer, act on it.

The order is what makes it crash-safe: an answer is appended to the log before anything is
decided from it, with an id derived from the event that caused the question; a planner that
restarts (or gets the event again) finds the recorded answer and acts on it instead of asking
again. The same loop drives a shadow replay, with a model that answers from a recording.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from helmline.contracts import (
    Event,
    ModelExchangeRecorded,
    ModelRequestRecord,
    SessionFailed,
    SessionState,
    ToolSpec,
    fold,
)
from helmline.planner._domain import Decision
from helmline.planner._goal import Purpose, interpret, limit_reached, prepare, react
from helmline.planner._providers import ModelCall, ModelError, cost_usd
from helmline.planner._settings import PlannerSettings

logger = logging.getLogger(__name__)

SOURCE = "helmline/planner"

Append = Callable[[Event], Awaitable[None]]


class Model(Protocol):
    """Anything that answers a model request: a provider's client, or a recording."""

    provider: str

    async def complete(
        self, request: ModelRequestRecord, tools: Sequence[ToolSpec]
    ) -> ModelCall: ...


class GoalEngine:
    """Runs goal sessions: one call of `handle` per delivered event."""

    def __init__(
        self,
        settings: PlannerSettings,
        model: Model,
        registry: Callable[[], Sequence[ToolSpec]],
        *,
        source: str = SOURCE,
    ) -> None:
        self._settings = settings
        self._model = model
        self._registry = registry
        self._source = source

    async def handle(self, trigger: Event, log: list[Event], append: Append) -> None:
        """React to `trigger`. `log` is the session's whole log as read (it includes `trigger`,
        and after a redelivery perhaps what the planner appended then); it grows by every
        event appended. Decisions are taken on the log as it was at their cause, so a second
        run over the same events decides the same and appends nothing new."""
        reaction = react(_state_at(log, trigger), _up_to(log, trigger), trigger)
        await self._append(trigger, reaction.decisions, log, append)
        ask, cause = reaction.ask, trigger
        if ask is not None and _answered_later(log, trigger):
            return  # A later event already led to a model call that saw this one.
        while ask is not None and not fold(log).is_terminal:
            exchange = next(
                (
                    e
                    for e in log
                    if e.causation_id == cause.id and isinstance(e.data, ModelExchangeRecorded)
                ),
                None,
            ) or await self._ask(ask, cause, log, append)
            if exchange is None:
                return
            outcome = interpret(
                _state_at(log, exchange), _up_to(log, exchange), exchange, self._settings
            )
            await self._append(exchange, outcome.decisions, log, append)
            ask, cause = outcome.ask, exchange

    async def _ask(
        self, purpose: Purpose, cause: Event, log: list[Event], append: Append
    ) -> Event | None:
        state = fold(log)
        stop = limit_reached(state, self._settings, cause.time)
        if stop is not None:
            await self._append(cause, [Decision(stop, "end")], log, append)
            return None
        prepared = prepare(state, log, self._registry(), self._settings)
        if prepared.compaction is not None:
            identity = f"compact/{prepared.compaction.turn}"
            await self._append(cause, [Decision(prepared.compaction, identity)], log, append)
        try:
            call = await self._model.complete(prepared.request, prepared.tools)
        except ModelError as error:
            logger.warning("session %s: %s", cause.session_id, error)
            failed = SessionFailed(reason=f"the model could not be asked: {error}")
            await self._append(cause, [Decision(failed, "end")], log, append)
            return None
        recorded = ModelExchangeRecorded(
            turn=state.model_calls + 1,
            purpose=purpose,
            provider=self._model.provider,
            request=prepared.request,
            reply=call.reply,
            cost_usd=cost_usd(self._settings, prepared.request.model, call.reply.usage),
            duration_ms=call.duration_ms,
            attempts=call.attempts,
        )
        exchange = cause.derive(recorded, source=self._source, key="model")
        await append(exchange)
        log.append(exchange)
        return exchange

    async def _append(
        self, cause: Event, decisions: list[Decision], log: list[Event], append: Append
    ) -> None:
        present = {e.id for e in log}
        for index, decision in enumerate(decisions):
            event = cause.derive(
                decision.payload, source=self._source, key=str(index), identity=decision.identity
            )
            if event.id in present:
                continue  # Appended by an earlier run over the same event.
            await append(event)
            log.append(event)


def _position(log: Sequence[Event], event: Event) -> int:
    return next((i for i, e in enumerate(log) if e.id == event.id), len(log) - 1)


def _up_to(log: Sequence[Event], event: Event) -> Sequence[Event]:
    return log[: _position(log, event) + 1]


def _state_at(log: Sequence[Event], event: Event) -> SessionState:
    return fold(_up_to(log, event))


def _answered_later(log: Sequence[Event], trigger: Event) -> bool:
    """Whether a model call that this trigger did not lead to was recorded after it."""
    chain = {trigger.id}
    for event in log[_position(log, trigger) + 1 :]:
        if isinstance(event.data, ModelExchangeRecorded):
            if event.causation_id not in chain:
                return True
            chain.add(event.id)
    return False
