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
    source_of,
)
from helmline.planner._domain import Decision
from helmline.planner._goal import (
    Aside,
    Purpose,
    aside,
    classify_request,
    intent_thought,
    interpret,
    is_turn,
    limit_reached,
    prepare,
    react,
    session_marker,
)
from helmline.planner._providers import ModelCall, ModelError, cost_usd
from helmline.planner._settings import PlannerSettings
from helmline.planner._spotlight import Spotlight, new_marker
from helmline.runtime import ERROR_MAX_BYTES, make_text_safe

logger = logging.getLogger(__name__)

SOURCE = source_of("planner")

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
        marker: Callable[[], str] = new_marker,
    ) -> None:
        """`marker` gives the spotlighting marker of a session whose log holds none yet:
        random, except in a shadow replay, which uses the recorded session's."""
        self._settings = settings
        self._model = model
        self._registry = registry
        self._source = source
        self._marker = marker

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
                (e for e in log if e.causation_id == cause.id and is_turn(e)), None
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
        registry = self._registry()
        classify = classify_request(state, log, registry, self._settings)
        if classify is not None:
            classification = await self._aside(
                "classify", classify, state, cause, log, append, spotlight=None
            )
            if classification is None:
                return None
            assert isinstance(classification.data, ModelExchangeRecorded)
            await self._append(classification, intent_thought(classification.data), log, append)
            state = fold(log)
        spotlight = Spotlight(session_marker(log) or self._marker())
        prepared = prepare(state, log, registry, self._settings, spotlight)
        if prepared.summarise is not None:
            summary = await self._aside(
                "summarise", prepared.summarise, state, cause, log, append, spotlight=spotlight
            )
            if summary is None:
                return None
            assert isinstance(summary.data, ModelExchangeRecorded)
            state = fold(log)
            prepared = prepare(state, log, registry, self._settings, spotlight, summary.data)
        if prepared.compaction is not None:
            identity = f"compact/{prepared.compaction.turn}"
            await self._append(cause, [Decision(prepared.compaction, identity)], log, append)
        return await self._exchange(
            purpose,
            prepared.request,
            prepared.tools,
            state,
            cause,
            log,
            append,
            key="model",
            spotlight=spotlight,
            spotlight_flagged=prepared.spotlight_flagged,
            untrusted_read=prepared.untrusted_read,
        )

    async def _aside(
        self,
        purpose: Aside,
        request: ModelRequestRecord,
        state: SessionState,
        cause: Event,
        log: list[Event],
        append: Append,
        *,
        spotlight: Spotlight | None,
    ) -> Event | None:
        """The answer of another model than the planning one, asked once per cause;
        `spotlight` delimits the tool results its request shows, if it shows any."""
        recorded = aside(log, purpose, cause.id)
        if recorded is not None:
            return recorded
        return await self._exchange(
            purpose, request, (), state, cause, log, append, key=purpose, spotlight=spotlight
        )

    async def _exchange(
        self,
        purpose: Purpose | Aside,
        request: ModelRequestRecord,
        tools: Sequence[ToolSpec],
        state: SessionState,
        cause: Event,
        log: list[Event],
        append: Append,
        *,
        key: str,
        spotlight: Spotlight | None,
        spotlight_flagged: tuple[str, ...] = (),
        untrusted_read: tuple[str, ...] = (),
    ) -> Event | None:
        """Ask, and record the answer; None when the model could not be asked (the session
        has failed, saying why). `state` is the session's as the log holds it now;
        `spotlight` delimited the request's tool results, if it shows any, and
        `spotlight_flagged` names the new ones that held a forged delimiter, `untrusted_read`
        the new ones from untrusted tools."""
        try:
            call = await self._model.complete(request, tools)
        except ModelError as error:
            # The message may quote what a provider sent back: as unsafe as any output.
            reason, _ = make_text_safe(
                f"the model could not be asked: {error}", max_bytes=ERROR_MAX_BYTES
            )
            logger.warning("session %s: %s", cause.session_id, reason)
            await self._append(cause, [Decision(SessionFailed(reason=reason), "end")], log, append)
            return None
        recorded = ModelExchangeRecorded(
            turn=state.model_calls + 1,
            purpose=purpose,
            provider=self._model.provider,
            request=request,
            reply=call.reply,
            cost_usd=cost_usd(self._settings, request.model, call.reply.usage),
            duration_ms=call.duration_ms,
            attempts=call.attempts,
            redacted_by=dict(call.redacted_by),
            neutralised_by=dict(call.neutralised_by),
            spotlight_marker=spotlight.marker if spotlight is not None else None,
            spotlight_flagged=spotlight_flagged,
            untrusted_read=untrusted_read,
        )
        exchange = cause.derive(recorded, source=self._source, key=key)
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
